"""Encode + index throughput with 1 and 2 CPU actors, and search latency through Ray Serve.

    python bench/perf/index_search.py                       # 50,000 documents, tiny T5
    python bench/perf/index_search.py --model minilm --documents 10000

The corpus is the standard library's source cut into chunks of 12 lines (code, about as
long as a function), as ``{"id", "text"}`` lines. ``--model tiny`` is a random-init tiny T5
(throughput does not depend on the weights), ``minilm`` the shipped all-MiniLM-L6-v2.
Each actor count indexes the corpus into a fresh output (``ray_jobs.index``'s library
call; shards of ``--shard-size``), on a local Ray of ``--cpus`` CPUs. Then one Serve
replica holds the last index, without batching (``--max-batch-size 1``) and with it
(``--batch-sizes``' last), and 1, 4 and 20 concurrent clients send ``--requests`` POST
/search each; latency is measured at the client, batch sizes read from the replica's
``/healthz``. Results: a table and
``bench/results/index_search[-<model>].json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402

QUERIES = [
    "read a file line by line",
    "parse a date string",
    "compress data with gzip",
    "send an email message",
    "join path components",
    "convert a string to bytes",
    "sort a dictionary by value",
    "check whether a path is a directory",
    "format a number with commas",
    "create a temporary directory",
]


def write_corpus(path: Path, documents: int) -> None:
    """``documents`` chunks of 12 source lines of the standard library, as jsonl."""
    from santa.data.source import default_source_root

    written = 0
    with open(path, "w") as out:
        while written < documents:
            for file in sorted(Path(default_source_root()).rglob("*.py")):
                try:
                    lines = file.read_text(encoding="utf-8").splitlines()
                except (UnicodeDecodeError, OSError):
                    continue
                for start in range(0, len(lines) - 11, 12):
                    text = "\n".join(lines[start : start + 12])
                    if len(text.strip()) < 80:
                        continue
                    out.write(json.dumps({"id": f"d{written}", "text": text}) + "\n")
                    written += 1
                    if written == documents:
                        return


def model_folder(kind: str, root: Path) -> str:
    """A model folder for ``kind``: the tiny T5 (saved here) or MiniLM."""
    if kind == "minilm":
        from santa.config.recipes import minilm_path

        return minilm_path()
    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer

    texts = (root / "corpus.jsonl").read_text().splitlines()[:3000]
    tokenizer = train_tokenizer(texts, vocab_size=1000)
    DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer).save_pretrained(
        str(root / "tiny"), santa_config=get_recipe("tiny")
    )
    return str(root / "tiny")


def latency(url: str, clients: int, requests: int, k: int) -> dict:
    """p50/p99 milliseconds of POST /search with ``clients`` concurrent clients."""

    def client(offset: int) -> list[float]:
        seconds = []
        for i in range(requests):
            body = json.dumps({"query": QUERIES[(offset + i) % len(QUERIES)], "k": k}).encode()
            request = urllib.request.Request(f"{url}/search", data=body, method="POST")
            started = time.perf_counter()
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()
            seconds.append(time.perf_counter() - started)
        return seconds

    client(0)  # warm-up
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        samples = [s for part in pool.map(client, range(clients)) for s in part]
    wall = time.perf_counter() - started
    samples.sort()
    return {
        "clients": clients,
        "requests": len(samples),
        "p50_ms": round(1000 * statistics.median(samples), 1),
        "p99_ms": round(1000 * samples[min(len(samples) - 1, int(0.99 * len(samples)))], 1),
        "requests_per_s": round(len(samples) / wall, 2),
    }


def batch_sizes(url: str) -> dict[str, int]:
    """The replica's count of searches by batch size so far (its ``/healthz``)."""
    with urllib.request.urlopen(f"{url}/healthz", timeout=60) as response:
        return json.loads(response.read())["batches"]["sizes"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--model", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--requests", type=int, default=50, help="per client")
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--clients", default="1,4,20")
    parser.add_argument("--batch-sizes", default="1,16", help="the replica's max batch sizes")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)

    import ray
    from ray import serve

    from santa.cluster.ray_utils import init_ray
    from santa.search.indexing import IndexConfig, build_index
    from santa.search.serve import ServeOptions, deploy

    root = Path(tempfile.mkdtemp(prefix="santa-bench-index-"))
    write_corpus(root / "corpus.jsonl", args.documents)
    model = model_folder(args.model, root)
    print(init_ray(None, num_cpus=args.cpus), flush=True)
    result = {
        "model": args.model,
        "documents": args.documents,
        "cpus": args.cpus,
        "shard_size": args.shard_size,
        "index": [],
    }
    last = None
    for actors in [int(a) for a in args.actors.split(",")]:
        output = root / f"index-{actors}"
        manifest = build_index(
            IndexConfig(
                checkpoint=model,
                corpus=str(root / "corpus.jsonl"),
                output=str(output),
                shard_size=args.shard_size,
                batch_size=args.batch_size,
                num_actors=actors,
                progress=True,
            )
        )
        run = {"actors": actors, **manifest["throughput"], "load_after": common.load_average()[0]}
        result["index"].append(run)
        last = str(output)
    base = result["index"][0]["documents_per_s"]
    for run in result["index"]:
        run["speedup"] = round(run["documents_per_s"] / base, 2)
    if not args.skip_serve:
        result["serve"] = []
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            options = ServeOptions(
                index=last, port=8123, cpus_per_replica=1, name="bench", max_batch_size=batch
            )
            url = deploy(options)
            for clients in [int(c) for c in args.clients.split(",")]:
                before = batch_sizes(url)
                row = latency(url, clients, args.requests, args.k)
                after = batch_sizes(url)  # the replica's batches during this client count
                grown = [int(size) for size, n in after.items() if n > before.get(size, 0)]
                row["largest_batch"] = max(grown, default=0)
                result["serve"].append({"max_batch_size": batch, **row})
                print(f"batch {batch}, {clients} clients: {row}", flush=True)
            serve.delete("bench")
        serve.shutdown()
    ray.shutdown()

    print(f"\n{args.documents:,} documents, {args.model}, {args.cpus} CPUs")
    rows = [
        [
            run["actors"],
            f"{run['encode_s']:.1f}",
            f"{run['documents_per_s']:.0f}",
            f"{run['speedup']:.2f}×",
            f"{run['index_s']:.1f}",
            f"{run['total_s']:.1f}",
        ]
        for run in result["index"]
    ]
    header = ["actors", "encode s", "documents/s", "speed-up", "index s", "total s"]
    print(common.format_table(header, rows))
    if result.get("serve"):
        serve_rows = [
            [
                row["max_batch_size"],
                row["clients"],
                row["p50_ms"],
                row["p99_ms"],
                row["requests_per_s"],
                row.get("largest_batch", "-"),
            ]
            for row in result["serve"]
        ]
        header = ["max batch", "clients", "p50 ms", "p99 ms", "requests/s", "largest batch"]
        print(common.format_table(header, serve_rows))
    suffix = "" if args.model == "tiny" else f"-{args.model}"
    target = args.output or common.RESULTS_DIR / f"index_search{suffix}.json"
    print(f"wrote {bench.write_json(target, result)}")


if __name__ == "__main__":
    main()
