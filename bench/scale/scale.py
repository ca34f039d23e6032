"""The real size: santa's stages on CodeSearchNet-shaped data of 10 k to 2 M pairs and on
ESCI-shaped data of its real size, each stage's seconds and every process's peak memory.

    python bench/scale/scale.py [--sizes 10000,100000,1000000,2000000] [--esci]
                                [--restart-sizes 10000,1000000] [--workdir /tmp/santa-scale]
    python bench/scale/scale.py tokenize     # pairs tokenized per second per core (T5-base)

For each size ``n`` (data from :mod:`bench.scale.data`, ``n`` training functions and
``n / 20`` test functions; a folder kept between runs):

1. ``preprocess``: ``ray_jobs.preprocess --stage pretrain`` of the training split, and
   ``--stage eval`` of the test split (a BEIR folder);
2. ``pretrain``: the ``tiny`` recipe's first 50 steps on one worker
   (``ray_jobs.pretrain``), twice: ``cold``, a node that has never read this data (its
   row file is built, :mod:`santa.train.rows`), then ``warm`` (found): the first-batch
   wait, the row file's build, the worker's ``max_rss_mb``, steps per second;
3. ``refresh``: one hard-negative refresh over the whole corpus with the trained model
   (``santa.negatives.miner.refresh_table``: encode every document and training query,
   build the index, flat below 500 k documents and IVF from there as
   ``negatives.index=auto`` says, mine), in a process of its own. Above
   ``--model-refresh-max`` pairs the texts are embedded by :class:`HashedEncoder` (seeded
   vectors of the model's width, no network): everything but the encoding is measured at
   full size, and the encoding's seconds are the model's measured rate at the largest size
   it ran times the texts (written as such);
4. ``evaluate``: ``ray_jobs.evaluate`` of the trained model on the test split;
5. ``restart`` (``--restart-sizes``): a pretrain whose worker is killed (SIGKILL) after
   step 20: the seconds from the kill to the restarted group's first new step.

Every stage runs as its own process tree, sampled twice a second
(:class:`bench.scale.sample.TreeSampler`): the peak RSS of each role (driver, Ray Train
worker, Ray Data tasks, ...). The tables give each figure per size and its growth from
size to size; ``bench/results/scale.json`` keeps everything, ``bench/SCALING.md`` the
reading and the extrapolation to a GPU node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/scale/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil

from bench import common
from bench.scale import data as scale_data
from bench.scale.sample import TreeSampler, role

ROOT = common.ROOT
STEPS = 50


def job_env(row_cache: str) -> dict[str, str]:
    """A job's environment: santa's code, its NLTK tagger, quiet Ray Data, the row cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    nltk = ROOT.parent / "shared" / "nltk_data"
    if nltk.is_dir():
        env.setdefault("NLTK_DATA", str(nltk))
    env["SANTA_ROW_CACHE"] = row_cache
    return env


def run_job(command: list[str], env: dict[str, str], log: Path, watch=None) -> dict[str, Any]:
    """Run ``command`` (a job) with its tree sampled; its seconds, exit and peaks.
    ``watch(process, started)`` runs in a thread beside it (the restart probe)."""
    started = time.perf_counter()
    with open(log, "w") as output:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
        sampler = TreeSampler(process.pid)
        watcher = None
        if watch is not None:
            watcher = threading.Thread(target=watch, args=(process, started), daemon=True)
            watcher.start()
        code = process.wait()
        peaks = sampler.stop()
        private = sampler.by_role("private_mb")
        if watcher is not None:
            watcher.join(5)
    seconds = time.perf_counter() - started
    if code:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"{' '.join(command[:4])} … exited {code}: {tail}")
    return {"seconds": round(seconds, 1), "peak_mb": peaks, "private_mb": private}


def python_job(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def preprocess(
    work: Path, dataset: str, corpus: Path, jobs: list[tuple[str, str]], env: dict[str, str]
) -> dict[str, Any]:
    """The preprocess runs of a size, ``(stage, split)`` each into ``pre-<stage>`` (kept
    when done: their outputs are reused by the next bench of the same size)."""
    results: dict[str, Any] = {}
    for stage, split in jobs:
        output = work / f"pre-{stage}"
        marker = work / f"pre-{stage}.json"
        if marker.exists():
            results[stage] = json.loads(marker.read_text())
            continue
        result = run_job(
            python_job(
                "ray_jobs.preprocess",
                "--dataset",
                dataset,
                "--input",
                str(corpus),
                "--stage",
                stage,
                "--split",
                split,
                "--output",
                str(output),
            ),
            env,
            work / f"preprocess-{stage}.log",
        )
        report = json.loads((output / "report.json").read_text())
        result["rows_read"] = report.get("rows_read")
        result["rows_written"] = report.get("rows_written")
        marker.write_text(json.dumps(result))
        results[stage] = result
    return results


def pretrain(work: Path, name: str, env: dict[str, str], extra: list[str] = (), watch=None):
    """The tiny recipe's first steps on one worker; its figures from ``metrics.jsonl``."""
    storage = work / "runs"
    result = run_job(
        python_job(
            "ray_jobs.pretrain",
            "--recipe",
            "tiny",
            "--data",
            str(work / "pre-pretrain"),
            "--storage",
            str(storage),
            "--name",
            name,
            "--num-workers",
            "1",
            "--max-steps",
            str(STEPS),
            "--force",
            *extra,
        ),
        env,
        work / f"pretrain-{name}.log",
        watch=watch,
    )
    rows = common.logged_windows(storage / name)
    last = rows[-1]
    keys = (
        "startup_first_batch_wait_s",
        "startup_rows_build_s",
        "startup_rows_wait_s",
        "startup_total_s",
        "startup_data_ready_s",
        "startup_rows_read_at_first_step",
        "max_rss_mb",
        "run_pairs_per_s",
    )
    result.update({key: round(float(last[key]), 3) for key in keys if key in last})
    steady = [row["pairs_per_s"] for row in rows[1:]]
    result["steady_pairs_per_s"] = round(sorted(steady)[len(steady) // 2], 1) if steady else None
    return result


class HashedEncoder:
    """The refresh's encoder interface (``encode(jobs)``) giving each text a seeded unit
    vector of ``dim`` floats: the bench's stand-in for the model where encoding millions of
    texts on two CPU cores would take hours (its cost is extrapolated instead)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def encode(self, jobs):
        import hashlib

        import numpy as np

        out = []
        for texts, _ in jobs:
            vectors = np.empty((len(texts), self.dim), dtype=np.float32)  # (texts, dim)
            for row, text in enumerate(texts):
                seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest())
                vectors[row] = np.random.default_rng(seed).standard_normal(self.dim)
            out.append(vectors)
        return out


def refresh(work: Path, env: dict[str, str], encoder: str, data: str) -> dict[str, Any]:
    """One refresh over the whole corpus of ``pre-<data>``, in a process of its own."""
    output = work / f"refresh-{encoder}.json"
    result = run_job(
        [
            sys.executable,
            str(Path(__file__)),
            "refresh-once",
            "--data",
            str(work / f"pre-{data}"),
            "--run",
            str(work / "runs" / "warm"),
            "--encoder",
            encoder,
            "--output",
            str(output),
        ],
        env,
        work / f"refresh-{encoder}.log",
    )
    result.update(json.loads(output.read_text()))
    return result


def refresh_once(args: argparse.Namespace) -> None:
    """(In its own process.) Load the corpus and the model, refresh once, write figures."""
    import resource

    from santa.config import SantaConfig
    from santa.index.faiss_index import index_kind
    from santa.models.checkpoints import resolve_model
    from santa.models.dual_encoder import DualEncoder
    from santa.negatives.corpus import load_mining_corpus
    from santa.negatives.miner import refresh_table

    started = time.perf_counter()
    corpus = load_mining_corpus(args.data)
    loaded_s = time.perf_counter() - started
    resolved = resolve_model(args.run)
    model = DualEncoder.from_pretrained(resolved.model_uri).eval()
    config = SantaConfig.from_dict(resolved.santa_config).with_overrides(
        # IVF from AUTO_IVF_MIN_DOCUMENTS on (the recipe's default is the released flat
        # search: over a million queries and documents it ran 16 min here and was stopped).
        ["negatives.per_query=1", "negatives.top_k=100", "negatives.index=auto"]
    )
    encoder = None if args.encoder == "model" else HashedEncoder(model.embedding_dim)
    table = refresh_table(model, corpus, config, encoder=encoder)
    figures = {
        "encoder": args.encoder,
        "documents": corpus.num_docs,
        "queries": corpus.num_queries,
        "index": index_kind(config.negatives.index, corpus.num_docs),
        "load_s": round(loaded_s, 1),
        "encode_s": round(table.encode_s, 1),
        "refresh_s": round(table.build_s, 1),
        "search_and_mine_s": round(table.build_s - table.encode_s, 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    Path(args.output).write_text(json.dumps(figures))


def evaluate(work: Path, env: dict[str, str]) -> dict[str, Any]:
    return run_job(
        python_job(
            "ray_jobs.evaluate",
            "--checkpoint",
            str(work / "runs" / "warm"),
            "--data",
            str(work / "pre-eval"),
            "--baseline",
            "none",
            "--output",
            str(work / "eval"),
        ),
        env,
        work / "evaluate.log",
    )


def restart(work: Path, env: dict[str, str]) -> dict[str, Any]:
    """A worker killed after step 20: seconds from the kill to the next new step."""
    storage = work / "runs"
    name = "restart"
    probe: dict[str, Any] = {}

    def steps_logged() -> int:
        path = storage / name / "metrics.jsonl"
        if not path.exists():
            return 0
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return max((int(json.loads(line)["step"]) for line in lines), default=0)

    def watch(process: subprocess.Popen, started: float) -> None:
        while process.poll() is None and steps_logged() < 20:
            time.sleep(0.2)
        workers = [
            p
            for p in psutil.Process(process.pid).children(recursive=True)
            if role(p).startswith("ray::RayTrainWorker")
        ]
        if not workers:
            return
        at_kill = steps_logged()
        killed = time.perf_counter()
        os.kill(workers[0].pid, signal.SIGKILL)
        while process.poll() is None and steps_logged() <= at_kill:
            time.sleep(0.1)
        probe["killed_at_step"] = at_kill
        probe["restart_to_next_step_s"] = round(time.perf_counter() - killed, 1)

    extra = [
        "--max-failures",
        "2",
        "--set",
        "train.log_every=1",
        "--set",
        "train.checkpoint_every=10",
    ]
    result = pretrain(work, name, env, extra, watch=watch)
    result.update(probe)
    return result


def tokenize_rate(args: argparse.Namespace) -> dict[str, Any]:
    """Pairs collated per second on one core at the T5-base table recipe's lengths (50/240,
    the masked document and a 35-token target), with a T5 tokenizer: tokenized from the
    row file, and read from a warm token cache (:mod:`santa.train.tokens`), in random
    batches of 128 as an epoch reads them."""
    import numpy as np
    import torch

    from bench.corpora import write_stdlib_pairs
    from santa.train.data import PairCollator, pairs_source
    from santa.train.rows import open_rows
    from santa.train.tokens import open_token_cache

    torch.set_num_threads(1)
    os.environ["RAYON_NUM_THREADS"] = "1"
    tokenizer = args.tokenizer or _t5_tokenizer_folder()
    work = Path(tempfile.mkdtemp(prefix="santa-tokenize-"))
    pairs = write_stdlib_pairs(work, limit=getattr(args, "pairs", 8000))
    rows = open_rows(pairs_source(pairs), str(work))
    settings = {
        "max_query_length": 50,
        "max_document_length": 240,
        "max_target_length": 35,
        "with_mep": True,
        "with_document": False,
        "lowercase": False,
    }
    collate = PairCollator(tokenizer, settings)
    batch = 128
    generator = np.random.default_rng(0)

    def rate(read) -> float:
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            read(generator.choice(rows.num_rows, batch, replace=False))
            done += batch
        return round(done / (time.perf_counter() - started), 1)

    collate(rows.take(np.arange(batch)))  # loads the tokenizer
    tokenized = rate(lambda numbers: collate(rows.take(numbers)))
    tokens = open_token_cache(rows, collate, str(work))
    for start in range(0, rows.num_rows, 1024):  # every row in the cache
        tokens.collate(rows, np.arange(start, min(rows.num_rows, start + 1024)), collate)
    cached = rate(lambda numbers: tokens.collate(rows, numbers, collate))
    assert tokens.rows_collated == rows.num_rows, "a warm cache tokenized rows again"
    tokens.close()
    return {
        "tokenizer": tokenizer,
        "rows": rows.num_rows,
        "batch": batch,
        "pairs_per_s_per_core": tokenized,
        "cached_pairs_per_s_per_core": cached,
        "token_record_bytes": int(tokens._record_dtype.itemsize),
    }


def _t5_tokenizer_folder() -> str:
    """A T5-style SentencePiece tokenizer built here (no download): the T5 vocabulary's
    size and special tokens over this repository's text."""
    from santa.models.tokenizer import train_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="santa-t5tok-"))
    from bench.corpora import stdlib_pair_rows

    rows = stdlib_pair_rows()
    texts = [row["query"] for row in rows] + [row["document"] for row in rows]
    train_tokenizer(texts, vocab_size=32_100).save_pretrained(str(folder))
    return str(folder)


def growth(rows: list[dict[str, Any]], key: str) -> list[str]:
    """Each size's figure over the previous size's (``-`` for the first)."""
    out, previous = [], None
    for row in rows:
        value = row.get(key)
        out.append("-" if previous in (None, 0) or value is None else f"{value / previous:.2f}x")
        previous = value
    return out


def flat(result: dict[str, Any]) -> dict[str, Any]:
    """One size's headline figures."""
    pre, cold, warm = result["preprocess"]["pretrain"], result["cold"], result["warm"]
    row = {
        "size": result["size"],
        "preprocess_s": pre["seconds"],
        "preprocess_rows_s": round(pre["rows_read"] / pre["seconds"], 1)
        if pre["seconds"]
        else None,
        "rows_build_s": cold.get("startup_rows_build_s"),
        "first_batch_wait_cold_s": cold.get("startup_first_batch_wait_s"),
        "first_batch_wait_s": warm.get("startup_first_batch_wait_s"),
        "worker_rss_mb": warm.get("max_rss_mb"),
        "steady_pairs_per_s": warm.get("steady_pairs_per_s"),
        "refresh_s": result.get("refresh", {}).get("refresh_s"),
        "refresh_rss_mb": result.get("refresh", {}).get("max_rss_mb"),
        "evaluate_s": result.get("evaluate", {}).get("seconds"),
        "restart_s": result.get("restart", {}).get("restart_to_next_step_s"),
    }
    for figure, key in (("peak_mb", "largest_process"), ("private_mb", "largest_private")):
        peaks: dict[str, float] = {}
        for stage in ("preprocess", "cold", "warm", "refresh", "evaluate"):
            part = result.get(stage, {})
            groups = [part] if stage != "preprocess" else list(part.values())
            for group in groups:
                for name, mb in (group.get(figure) or {}).items():
                    peaks[f"{stage}:{name}"] = max(peaks.get(f"{stage}:{name}", 0), mb)
        row[key] = max(peaks.items(), key=lambda item: item[1]) if peaks else None
    return row


def print_tables(results: list[dict[str, Any]]) -> None:
    rows = [flat(result) for result in results]
    if not rows:
        return
    keys = [
        "preprocess_s",
        "rows_build_s",
        "first_batch_wait_cold_s",
        "first_batch_wait_s",
        "worker_rss_mb",
        "steady_pairs_per_s",
        "refresh_s",
        "refresh_rss_mb",
        "evaluate_s",
        "restart_s",
    ]
    table = []
    for key in keys:
        ratios = growth(rows, key)
        table.append(
            [key]
            + [
                f"{row[key]}" + ("" if ratio == "-" else f" ({ratio})")
                for row, ratio in zip(rows, ratios, strict=True)
            ]
        )
    table.append(["largest process"] + [f"{r['largest_process']}" for r in rows])
    table.append(["largest private"] + [f"{r['largest_private']}" for r in rows])
    print(common.format_table(["figure", *[f"{r['size']}" for r in rows]], table))


def run_stages(
    work: Path,
    label: Any,
    args: argparse.Namespace,
    refresh_data: str,
    encoder: str,
    restart_too: bool,
    preprocessed: dict[str, Any],
    env: dict[str, str],
) -> dict[str, Any]:
    """Pretrain (cold, warm), refresh, evaluate, restart of one preprocessed size."""
    result: dict[str, Any] = {"size": label, "preprocess": preprocessed}
    print(f"[scale] {label}: pretrain (cold, then warm)", flush=True)
    result["cold"] = pretrain(work, "cold", env)
    result["warm"] = pretrain(work, "warm", env)
    if not args.skip_refresh:
        print(f"[scale] {label}: refresh ({encoder} encoder)", flush=True)
        result["refresh"] = refresh(work, env, encoder, refresh_data)
    print(f"[scale] {label}: evaluate", flush=True)
    result["evaluate"] = evaluate(work, env)
    if restart_too:
        print(f"[scale] {label}: restart", flush=True)
        result["restart"] = restart(work, env)
    print(json.dumps(flat(result)), flush=True)
    return result


def fresh_work(args: argparse.Namespace, name: str) -> tuple[Path, dict[str, str]]:
    """A size's folder (its data kept, its runs cleared) and a job environment whose row
    cache no node has built yet."""
    work = Path(args.workdir) / name
    work.mkdir(parents=True, exist_ok=True)
    # Runs start over (a run folder left by an earlier bench would be resumed, finished);
    # the data (generated, preprocessed) is kept.
    shutil.rmtree(work / "runs", ignore_errors=True)
    row_cache = tempfile.mkdtemp(prefix=f"rows-{name}-", dir=args.workdir)
    return work, job_env(row_cache)


def run_size(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """CodeSearchNet-shaped data of ``size`` training functions."""
    work, env = fresh_work(args, f"csn-{size}")
    corpus = work / "csn"
    scale_data.write_codesearchnet(corpus, size, test=max(200, size // 20))
    print(f"[scale] {size:,}: preprocess", flush=True)
    jobs = [("pretrain", "train"), ("eval", "test")]
    preprocessed = preprocess(work, "codesearchnet", corpus, jobs, env)
    encoder = "model" if size <= args.model_refresh_max else "hashed"
    return run_stages(
        work, size, args, "pretrain", encoder, size in args.restart_sizes, preprocessed, env
    )


def run_esci(args: argparse.Namespace) -> dict[str, Any]:
    """ESCI-shaped data at the release's size: products pretraining (one pair per product),
    the fine-tuning pairs (the corpus the refresh mines) and the test queries' BEIR set."""
    products, judgments = args.esci_products, args.esci_judgments
    label = f"esci-{products}-{judgments}"
    work, env = fresh_work(args, label)
    corpus = work / "esci"
    print(f"[scale] {label}: generate", flush=True)
    started = time.perf_counter()
    scale_data.write_esci(corpus, products, judgments)
    generate_s = round(time.perf_counter() - started, 1)
    print(f"[scale] {label}: preprocess", flush=True)
    jobs = [("pretrain", "train"), ("finetune", "train"), ("eval", "test")]
    preprocessed = preprocess(work, "esci", corpus, jobs, env)
    encoder = "model" if judgments <= args.model_refresh_max else "hashed"
    result = run_stages(work, label, args, "finetune", encoder, False, preprocessed, env)
    result["generate_s"] = generate_s
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command", nargs="?", default="run", choices=("run", "tokenize", "refresh-once")
    )
    parser.add_argument("--sizes", default="10000,100000,1000000,2000000")
    parser.add_argument("--restart-sizes", default="10000,1000000")
    parser.add_argument("--esci", action="store_true", help="also ESCI-shaped data")
    parser.add_argument("--esci-products", type=int, default=1_800_000)
    parser.add_argument("--esci-judgments", type=int, default=2_600_000)
    parser.add_argument("--workdir", default="/tmp/santa-scale")
    parser.add_argument("--skip-refresh", action="store_true")
    parser.add_argument(
        "--model-refresh-max",
        type=int,
        default=100_000,
        help="largest size whose refresh encodes with the model (above: hashed vectors)",
    )
    parser.add_argument("--encoder", default="model", help="refresh-once: model or hashed")
    parser.add_argument("--output", default=str(common.RESULTS_DIR / "scale.json"))
    parser.add_argument("--data", help="refresh-once: the preprocessed pairs")
    parser.add_argument("--run", help="refresh-once: the trained run folder")
    parser.add_argument("--tokenizer", default="", help="tokenize: a tokenizer folder")
    parser.add_argument("--seconds", type=float, default=20.0, help="tokenize: seconds to run")
    parser.add_argument("--pairs", type=int, default=8000, help="tokenize: standard-library pairs")
    args = parser.parse_args(argv)
    if args.command == "refresh-once":
        refresh_once(args)
        return 0
    run = common.BenchRun(__file__, argv)
    if args.command == "tokenize":
        result = tokenize_rate(args)
        print(json.dumps(result))
        run.write_json(Path(args.output).with_name("scale_tokenize.json"), result)
        return 0
    args.restart_sizes = {int(s) for s in args.restart_sizes.split(",") if s}
    output = Path(args.output)
    previous = json.loads(output.read_text()) if output.exists() else {}
    results = {r["size"]: r for r in previous.get("sizes", [])}
    esci = {r["size"]: r for r in previous.get("esci", [])}

    def write() -> None:
        # Written after every size: a size that runs out of room keeps the others.
        run.write_json(
            output,
            {"sizes": [results[s] for s in sorted(results)], "esci": list(esci.values())},
        )

    for size in (int(s) for s in args.sizes.split(",") if s):
        results[size] = run_size(size, args)
        write()
    if args.esci:
        result = run_esci(args)
        esci[result["size"]] = result
        write()
    print_tables([results[s] for s in sorted(results)])
    print_tables(list(esci.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
