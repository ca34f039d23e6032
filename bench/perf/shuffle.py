"""How uniform a training batch is: in-batch pairs from one file or one repository under
each shuffle, and what a shuffle costs per epoch.

    python bench/perf/shuffle.py              # 100,000 rows, batch 128

Rows come in corpus order, as preprocessing writes them (CodeSearchNet-shaped: all the
functions of a file together, the files of a repository together; ``--functions-per-file``,
``--files-per-repo``). Three ways to draw an epoch's batches of ``--batch`` rows:

- ``corpus order``: no shuffle;
- ``local buffer``: Ray Data's ``iter_batches(local_shuffle_buffer_size=2048)`` over the
  rows as a real Ray dataset (santa's ``train.shuffle=local``);
- ``global``: santa's ``train.shuffle=global`` (:class:`~santa.train.epochs.ArrayShard`: a
  seeded permutation of every row, each epoch).

Figures: the share of in-batch pairs (two rows of one batch) from the same file and from the
same repository, beside what a uniform sample gives, and the seconds one epoch takes to
draw (with token columns of the paper's code lengths, 50 + 240 + 240 + 60 ids a row).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from bench import common  # noqa: E402

RESULTS = common.RESULTS_DIR / "shuffle.json"
TOKENS_PER_ROW = 50 + 240 + 240 + 60


def same_group_share(batches: list[dict[str, np.ndarray]], key: str) -> float:
    """The share of in-batch pairs whose rows have the same ``key`` (file or repository)."""
    same = pairs = 0
    for batch in batches:
        values = batch[key]
        equal = values[:, None] == values[None, :]
        same += (int(equal.sum()) - len(values)) // 2
        pairs += len(values) * (len(values) - 1) // 2
    return same / pairs if pairs else 0.0


def uniform_share(group_sizes: np.ndarray) -> float:
    """The same share for rows drawn uniformly: P(two random rows share a group)."""
    rows = group_sizes.sum()
    return float((group_sizes * (group_sizes - 1)).sum() / (rows * (rows - 1)))


def corpus(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """Rows in corpus order: file and repository ids, and token ids of the paper's lengths."""
    rng = np.random.default_rng(0)
    # Functions per file vary (geometric around the mean), as real files do.
    sizes = rng.geometric(1 / args.functions_per_file, size=args.rows)
    files = np.repeat(np.arange(len(sizes)), sizes)[: args.rows]
    repos = files // args.files_per_repo
    tokens = np.zeros((args.rows, TOKENS_PER_ROW), dtype=np.int64)  # (rows, tokens)
    return {"file": files, "repo": repos, "input_ids": tokens}


def draw_epoch(name: str, columns: dict[str, np.ndarray], args: argparse.Namespace):
    """One epoch's batches of one method, and the seconds it took."""
    from santa.train.epochs import ArrayShard

    started = time.perf_counter()
    if name == "corpus order":
        batches = list(ArrayShard(columns).iter_batches(batch_size=args.batch, drop_last=True))
    elif name == "global":
        batches = list(
            ArrayShard(columns).iter_batches(
                batch_size=args.batch,
                drop_last=True,
                local_shuffle_buffer_size=args.rows,
                local_shuffle_seed=1,
            )
        )
    else:  # a materialized Ray dataset, as the workers' splits stream it
        import pyarrow as pa
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        tokens = columns["input_ids"]
        table = pa.table(
            {
                "file": columns["file"],
                "repo": columns["repo"],
                "input_ids": pa.FixedSizeListArray.from_arrays(
                    pa.array(tokens.ravel()), tokens.shape[1]
                ),
            }
        )
        # Blocks of 256 rows, as the tokenize step writes them (map_batches, batch 256): the
        # buffer draws from the blocks it holds, not from the whole set.
        blocks = [table.slice(start, 256) for start in range(0, table.num_rows, 256)]
        dataset = ray.data.from_arrow(blocks).materialize()
        started = time.perf_counter()
        batches = list(
            dataset.iter_batches(
                batch_size=args.batch,
                drop_last=True,
                batch_format="numpy",
                local_shuffle_buffer_size=args.buffer,
                local_shuffle_seed=1,
            )
        )
        ray.shutdown()
    return batches, time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--buffer", type=int, default=2048)
    parser.add_argument("--functions-per-file", type=float, default=8.0)
    parser.add_argument("--files-per-repo", type=int, default=50)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    columns = corpus(args)
    uniform = {
        key: uniform_share(np.bincount(columns[key])[np.bincount(columns[key]) > 0])
        for key in ("file", "repo")
    }
    rows = []
    for name in ("corpus order", "local buffer", "global"):
        print(f"[bench] {name} ...", flush=True)
        batches, seconds = draw_epoch(name, columns, args)
        rows.append(
            {
                "method": name,
                "same_file_share": same_group_share(batches, "file"),
                "same_repo_share": same_group_share(batches, "repo"),
                "epoch_s": seconds,
            }
        )
    print(
        f"\n{args.rows:,} rows in corpus order, batch {args.batch}; uniform sample: "
        f"same file {uniform['file']:.2e}, same repository {uniform['repo']:.2e}\n"
    )
    print("| batches | same-file pairs | × uniform | same-repo pairs | × uniform | epoch s |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['method']} | {row['same_file_share']:.2e} | "
            f"{row['same_file_share'] / uniform['file']:.1f} | {row['same_repo_share']:.2e} | "
            f"{row['same_repo_share'] / uniform['repo']:.1f} | {row['epoch_s']:.2f} |"
        )
    result = {"rows": args.rows, "batch": args.batch, "uniform": uniform, "methods": rows}
    bench.write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
