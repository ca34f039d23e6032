"""Benchmark of hard-negative mining (issue 4).

1. Index build and search throughput for 100,000 x 768 float32 documents and 10,000
   queries: faiss exact inner product (santa.index.faiss_index.EmbeddingIndex) vs torch brute force.
2. Trainer step time with and without a concurrent refresh: the same tiny fine-tuning run
   on 2 workers with a static table (``table:``, no miner) and with ``async`` negatives (the
   miner re-encodes the corpus every few steps on the same 2 cores), and trainer wait time.

    python bench/perf/negatives.py [--docs 100000 --queries 10000 --dim 768] [--steps 120]

Writes bench/results/negatives.json and prints tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common

RESULTS = common.RESULTS_DIR / "negatives.json"


def bench_search(docs: int, queries: int, dim: int, k: int) -> dict:
    """faiss exact vs torch brute force: build (vectors/s) and search (queries/s)."""
    from santa.index.faiss_index import EmbeddingIndex

    rng = np.random.default_rng(0)
    doc_vectors = rng.standard_normal((docs, dim), dtype=np.float32)
    query_vectors = rng.standard_normal((queries, dim), dtype=np.float32)
    ids = [f"d{i}" for i in range(docs)]
    threads = torch.get_num_threads()

    started = time.perf_counter()
    index = EmbeddingIndex.build(doc_vectors, ids, kind="flat", use_gpu=False)
    faiss_build = time.perf_counter() - started
    started = time.perf_counter()
    faiss_hits, _ = index.search(query_vectors, k)
    faiss_search = time.perf_counter() - started

    started = time.perf_counter()
    doc_tensor = torch.from_numpy(doc_vectors)  # "building" = holding the matrix
    torch_build = time.perf_counter() - started
    started = time.perf_counter()
    torch_top = []
    for chunk in torch.from_numpy(query_vectors).split(1024):
        torch_top.append(torch.topk(chunk @ doc_tensor.T, k, dim=1).indices)
    torch_indices = torch.cat(torch_top).numpy()
    torch_search = time.perf_counter() - started
    agreement = float(
        np.mean(
            [
                len(set(f) & {ids[j] for j in t}) / k
                for f, t in zip(faiss_hits, torch_indices, strict=True)
            ]
        )
    )
    return {
        "docs": docs,
        "queries": queries,
        "dim": dim,
        "k": k,
        "threads": threads,
        "faiss_build_s": faiss_build,
        "faiss_vectors_per_s": docs / faiss_build,
        "faiss_search_s": faiss_search,
        "faiss_queries_per_s": queries / faiss_search,
        "torch_build_s": torch_build,
        "torch_search_s": torch_search,
        "torch_queries_per_s": queries / torch_search,
        "top_k_agreement": agreement,
    }


def bench_training(steps: int, refresh_every: int, pairs: int, batch: int) -> dict:
    """Step time of a 2-worker tiny run: static table vs async refresh."""
    import ray

    from bench.corpora import write_stdlib_pairs
    from ray_jobs import mine_negatives
    from santa.config import SantaConfig
    from santa.config.recipes import get_recipe
    from santa.train.trainer import RunSpec, fit

    def tiny_config(negatives: dict | None = None, **train: object) -> SantaConfig:
        overrides = [f"train.{key}={value}" for key, value in train.items()]
        overrides += [f"negatives.{key}={value}" for key, value in (negatives or {}).items()]
        return get_recipe("tiny-ci").with_overrides(overrides)

    ray.init(address="local", num_cpus=2, log_to_driver=False)
    work = Path(tempfile.mkdtemp(prefix="santa-bench-neg-"))
    data = write_stdlib_pairs(work, limit=pairs)  # what the miner re-encodes at each refresh
    settings = {
        "stage": "finetune",
        "log_every": 10,
        "global_batch_size": batch,
    }
    # The table's model: a short warm start, trained in this process (not measured).
    warm = fit(
        tiny_config(max_steps=2, checkpoint_every=2, global_batch_size=8, stage="finetune"),
        RunSpec.of(data=data, storage=str(work), name="warm", in_process=True),
    )
    table_dir = work / "table"
    mine_negatives.main(
        ["--checkpoint", warm.checkpoint.path, "--data", data, "--output", str(table_dir)]
    )
    runs = {}
    # Train V2 keeps metrics per checkpoint only: one per window (10 steps, fewer for a
    # short run, which still needs a window after the first), all kept.
    window = max(1, min(10, steps // 4))
    for label, source in (("static table", f"table:{table_dir}"), ("async refresh", "async")):
        config = tiny_config(
            max_steps=steps,
            checkpoint_every=window,
            negatives={
                "source": source,
                "per_query": 1,
                "refresh_every": refresh_every,
                "wait_for_first": True,
            },
            num_workers=2,
            **settings,
        )
        spec = RunSpec.of(
            data=data,
            storage=str(work),
            name=label.replace(" ", "-"),
            cpus_per_worker=0.5,
            num_to_keep=steps // window + 1,
        )
        started = time.perf_counter()
        result = fit(config, spec)
        wall = time.perf_counter() - started
        frame = result.metrics_dataframe
        # The first window includes start-up and the first table; leave it out.
        steady = frame[frame["step"] > frame["step"].min()]
        runs[label] = {
            "wall_s": wall,
            "step_time_s": float(steady["step_time_s"].mean()),
            "pairs_per_s": float(steady["pairs_per_s"].mean()),
            "swaps": float(result.metrics.get("negatives_swaps", 0)),
            "wait_s_after_first": float(result.metrics.get("negatives_wait_s", 0)),
            "wait_first_s": float(result.metrics.get("negatives_wait_first_s", 0)),
            "poll_s": float(result.metrics.get("negatives_poll_s", 0)),
            "refresh_s": float(result.metrics.get("negatives_refresh_s", 0)),
            "staleness": float(result.metrics.get("negatives_staleness", 0)),
            "corpus": pairs,
            "global_batch": batch,
        }
    ray.shutdown()
    base = runs["static table"]["step_time_s"]
    runs["slowdown"] = runs["async refresh"]["step_time_s"] / base if base else None
    return runs


def main(argv: list[str] | None = None) -> int:
    """Run the search and training parts; print the tables and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--refresh-every", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=2000, help="training pairs = corpus")
    parser.add_argument("--batch", type=int, default=32, help="global batch")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    common.use_shared_nltk_data()
    bench = common.BenchRun(__file__, argv)

    # A part skipped keeps its earlier figures (the meta describes this run).
    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results.pop("meta", None)
    if not args.skip_search:
        search = bench_search(args.docs, args.queries, args.dim, args.k)
        print(f"\n{args.docs:,} x {args.dim} documents, {args.queries:,} queries, top {args.k}")
        rows = [
            [
                "faiss exact",
                f"{search['faiss_build_s']:.2f}",
                f"{search['faiss_vectors_per_s']:,.0f}",
                f"{search['faiss_search_s']:.2f}",
                f"{search['faiss_queries_per_s']:,.0f}",
            ],
            [
                "torch brute force",
                f"{search['torch_build_s']:.2f}",
                "-",
                f"{search['torch_search_s']:.2f}",
                f"{search['torch_queries_per_s']:,.0f}",
            ],
        ]
        header = ["method", "build s", "vectors/s", "search s", "queries/s"]
        print(common.format_table(header, rows))
        print(f"top-{args.k} agreement: {search['top_k_agreement']:.4f}")
        results["search"] = search
    if not args.skip_training:
        training = bench_training(args.steps, args.refresh_every, args.pairs, args.batch)
        results["training"] = training
        rows = [
            [
                label,
                f"{training[label]['step_time_s']:.3f}",
                f"{training[label]['pairs_per_s']:.1f}",
                f"{training[label]['swaps']:.0f}",
                f"{training[label]['wait_s_after_first']:.3f}",
                f"{training[label]['wait_first_s']:.2f}",
            ]
            for label in ("static table", "async refresh")
        ]
        header = ["run", "step s", "pairs/s", "swaps", "wait after first s", "first wait s"]
        print("\n" + common.format_table(header, rows))
        print(f"slowdown with a concurrent refresh: {training['slowdown']:.2f}x")
    bench.write_json(args.output, results)
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
