"""IVF cells and probes against the exact search: build seconds, per-query search and recall.

    python bench/perf/ivf_cells.py                      # 1,000,000 clustered vectors of 128
    python bench/perf/ivf_cells.py --vectors 2000000 --data random

What ``negatives.index=auto`` and ``ray_jobs.index`` build from 500 k documents on: an
``IndexIVFFlat`` whose cells (``nlist``) and training points per cell decide how long the
build takes and how many vectors a query scans. Each setting ``CELLS:POINTS:PROBES,...``
(``CELLS`` 0: santa's default, :func:`santa.index.faiss_index.ivf_cells`) is trained and
filled once, then searched for the top ``-k`` of ``--queries`` queries at each probe count;
recall is the share of the exact top ``-k`` found. ``--data clustered`` draws unit vectors
around 20,000 topics (as embeddings are: IVF's cells follow them), ``random`` standard
normal ones (IVF's worst case). Results: a table and ``bench/results/ivf_cells.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common

RESULTS = common.RESULTS_DIR / "ivf_cells.json"


def vectors(count: int, dim: int, data: str, seed: int):
    """``count`` float32 vectors of ``dim``: clustered unit vectors or standard normal ones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if data == "random":
        return rng.standard_normal((count, dim), dtype=np.float32)
    topics = rng.standard_normal((20_000, dim), dtype=np.float32)
    points = topics[rng.integers(0, len(topics), count)]
    points += 0.7 * rng.standard_normal((count, dim), dtype=np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points


def parse_setting(text: str) -> tuple[int, int, list[int]]:
    """``CELLS:POINTS:PROBES[:PROBES...]`` → (cells, training points per cell, probes)."""
    cells, points, *probes = (int(part) for part in text.split(":"))
    if not probes or points < 1 or cells < 0 or min(probes) < 1:
        raise argparse.ArgumentTypeError(f"expected CELLS:POINTS:PROBES[:PROBES...], got {text!r}")
    return cells, points, probes


def measure(args: argparse.Namespace) -> dict:
    import faiss
    import numpy as np

    from santa.index.faiss_index import ivf_cells

    data = vectors(args.vectors, args.dim, args.data, args.seed)
    rows = np.random.default_rng(args.seed + 1).choice(len(data), args.queries, replace=False)
    queries = data[np.sort(rows)]
    exact = faiss.IndexFlatIP(args.dim)
    exact.add(data)
    started = time.perf_counter()
    _, truth = exact.search(queries, args.k)
    flat_ms = (time.perf_counter() - started) / args.queries * 1e3
    results = []
    for cells, points, probes in args.settings:
        cells = cells or ivf_cells(args.vectors)
        index = faiss.IndexIVFFlat(
            faiss.IndexFlatIP(args.dim), args.dim, cells, faiss.METRIC_INNER_PRODUCT
        )
        index.cp.max_points_per_centroid = points
        started = time.perf_counter()
        index.train(data)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        index.add(data)
        add_s = time.perf_counter() - started
        for probe in probes:
            index.nprobe = probe
            started = time.perf_counter()
            _, found = index.search(queries, args.k)
            search_ms = (time.perf_counter() - started) / args.queries * 1e3
            recall = np.mean(
                [len(set(a) & set(b)) / args.k for a, b in zip(found, truth, strict=True)]
            )
            results.append(
                {
                    "cells": cells,
                    "points_per_cell": points,
                    "probes": probe,
                    "train_s": round(train_s, 2),
                    "add_s": round(add_s, 2),
                    "search_ms_per_query": round(search_ms, 4),
                    f"recall@{args.k}": round(float(recall), 4),
                }
            )
            print(f"  {results[-1]}", flush=True)
    return {"flat_search_ms_per_query": round(flat_ms, 4), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vectors", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--data", choices=("clustered", "random"), default="clustered")
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("-k", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--settings",
        type=lambda text: [parse_setting(part) for part in text.split(",")],
        default=[parse_setting("1024:256:32"), parse_setting("0:64:16:32:64")],
        help="CELLS:POINTS:PROBES[:PROBES...],... (CELLS 0: santa's 4·√n); default: faiss's "
        "former 1,024 cells trained on 256 points each, then santa's default",
    )
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    payload = {"settings": {k: str(v) for k, v in vars(args).items() if k != "output"}}
    payload.update(measure(args))
    header = ["cells", "points/cell", "probes", "train s", "add s", "ms/query", f"recall@{args.k}"]
    rows = [list(row.values()) for row in payload["results"]]
    print(f"\nflat (exact): {payload['flat_search_ms_per_query']} ms/query")
    print(common.format_table(header, rows))
    bench.write_json(Path(args.output), payload)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
