"""Does the shuffle change what a model learns? Held-out MRR@100 after training with the old
streaming buffer (``train.shuffle=local``) and with the global per-epoch shuffle
(``train.shuffle=global``, the default now), issue 38.

A local buffer leaves batches far from uniform (many in-batch pairs from one file or
repository; the shares are printed first); this asks whether that shows in retrieval.

Data: the CodeSearchNet Ruby valid sample (``--data``, 1,400 functions in corpus order: the
functions of a file together, the files of a repository together), split by repository:
every ``--test-every``-th repository in corpus order is held out (its functions become the
test BEIR folder, ``stage=eval``), the others are the training pairs (``stage=finetune``,
docstring → code), both through ``ray_jobs.preprocess``'s pipeline, which keeps corpus
order. Held-out queries never share a repository with a training pair.

Model: the ``tiny`` T5 (about 1 M parameters, its tokenizer trained on the training pairs,
random initial weights shared by every run) trained with in-batch negatives only (the
``tiny-finetune`` recipe: DR loss, no MEP) at the tiny recipe's from-scratch learning rate
(``--lr`` 5e-4; the recipe's 2e-4 is meant for a pretrained start), 1 Ray Train worker,
batch ``--batch`` (32), ``--epochs`` passes (8, about 270 steps). Why not
all-MiniLM-L6-v2, which learns faster: on this shared 2-core machine one MiniLM step at
batch 32 and its 50/240-token lengths took about 25 s (a trial run, 2026-11-27), so six
runs of even one epoch would not fit the hour this bench was given; and MiniLM starts at
MRR@100 0.81 on these held-out queries, which leaves little to move. The tiny T5 trains
a step in a fraction of a second, scores 0.10 untrained and about 0.18 after eight epochs
(2026-11-27), so a difference the batch composition makes has room to show. The
untrained model is scored too, as the reference both runs start from.

Buffer: ``--buffer`` rows (64, two batches of 32). The default 2,048 rows is larger than
this training set (1,077 pairs), so it would shuffle everything and the two runs would be
the same experiment. Keeping the default's ratio to CodeSearchNet's ~1.9 M pairs (about
1 : 900) would leave about one row here: no shuffle at all, which is not what the old
default did either. What matters to training is how many in-batch negatives come from the
query's own file or repository. On 100,000 CodeSearchNet-shaped rows with the 2,048-row
buffer at batch 128, 0.34 % of in-batch pairs shared a file and 9.5 % a repository
(issue 38's measurement); a 64-row buffer at batch 32 over these 1,077 rows gives about 1.7 % and
5 % (printed first by this script): the same order of magnitude, where 128 rows would
halve the repository share again and 32 would be no buffer at all (one batch). Those
shares are measured on the first ``--check-batches`` batches that the trainer's own input
path draws (the row file, :class:`santa.train.order.EpochPlan`'s global batches) for each
shuffle, beside corpus order and a uniform sample: the rows
are seen to reach training in corpus order (``train.shuffle_buffer=0``: ~28× uniform).

Each shuffle trains once per seed (``--seeds``; ``train.seed`` changes the batch order
only: the initial weights are shared and the tiny recipe has no dropout); each model is
scored on the held-out queries (MRR@100). Per shuffle: the mean over seeds with a 95 %
t-interval (n − 1 degrees of freedom), and the difference global − local with Welch's
t-interval. A last row pools the seeds (each query's RR averaged over seeds) and gives a
paired bootstrap interval over queries: the query-sampling uncertainty, which the seed
interval does not include.

    python bench/quality/shuffle_mrr.py [--seeds 0,1,2] [--epochs 8] [--buffer 64]

Prints tables and writes ``bench/results/shuffle_mrr.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from bench import common  # noqa: E402
from bench.quality.scoring import bootstrap, format_interval, per_query_rr  # noqa: E402

RESULTS = common.RESULTS_DIR / "shuffle_mrr.json"
DATA = common.ROOT.parent / "shared" / "fixtures" / "csn" / "ruby" / "valid.jsonl.gz"
SHUFFLES = ("local", "global")
ZERO = "zero-shot"
# Two-sided 95 % quantiles of Student's t by degrees of freedom (used without scipy).
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def t_quantile(df: float) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: scipy's where it is
    installed, else the table's at the largest tabulated df not above ``df`` (conservative
    for a fractional Welch df); 1.96 past 30."""
    try:
        from scipy import stats
    except ImportError:
        if df > 30:
            return 1.96
        return T_975[max(k for k in T_975 if k <= max(1, math.floor(df)))]
    return float(stats.t.ppf(0.975, df))


def t_interval(values: Sequence[float]) -> dict[str, float]:
    """Mean of ``values`` with its 95 % t-interval (n − 1 df); no interval for one value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci_low": math.nan, "ci_high": math.nan, "sd": math.nan}
    sd = statistics.stdev(values)
    half = t_quantile(len(values) - 1) * sd / math.sqrt(len(values))
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "sd": sd}


def welch_interval(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """``mean(a) − mean(b)`` with Welch's 95 % t-interval (Welch–Satterthwaite df)."""
    mean = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return {"mean": mean, "ci_low": math.nan, "ci_high": math.nan, "df": math.nan}
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return {"mean": mean, "ci_low": mean, "ci_high": mean, "df": math.inf}
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(df) * se
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "df": df}


def split_by_repository(source: Path, folder: Path, every: int) -> dict[str, int]:
    """``train.jsonl.gz`` and ``test.jsonl.gz`` under ``folder``: every ``every``-th
    repository (in order of first appearance) held out; rows keep the corpus order."""
    with gzip.open(source, "rt") as handle:
        rows = [json.loads(line) for line in handle]
    repos = list(dict.fromkeys(row["repo"] for row in rows))
    held_out = set(repos[every - 1 :: every])
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, test in (("train", False), ("test", True)):
        kept = [row for row in rows if (row["repo"] in held_out) == test]
        with gzip.open(folder / f"{split}.jsonl.gz", "wt") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in kept)
        counts[f"{split}_functions"] = len(kept)
        counts[f"{split}_repositories"] = len({row["repo"] for row in kept})
    return counts


def build_data(work: Path, source: Path, every: int) -> tuple[str, str, dict[str, int]]:
    """Training pairs and the held-out test BEIR folder, through the preprocess pipeline."""
    from santa.data.plan import PreprocessConfig, run_preprocess

    raw = work / "raw"
    sizes = split_by_repository(source, raw, every)
    common_options = {"dataset": "codesearchnet", "input": str(raw)}
    pairs, test = str(work / "pairs"), str(work / "test")
    report = run_preprocess(
        PreprocessConfig(output=pairs, stage="finetune", split="train", **common_options)
    )
    sizes["train_pairs"] = report["rows_written"]
    report = run_preprocess(
        PreprocessConfig(output=test, stage="eval", split="test", **common_options)
    )
    sizes["test_queries"] = report["rows_written"]
    print(f"data: {sizes}", flush=True)
    return pairs, test, sizes


def file_and_repository(doc_id: str) -> tuple[str, str]:
    """A CodeSearchNet url ``https://github.com/o/r/blob/SHA/path#L1-L9`` → (file, repo)."""
    repo, _, rest = doc_id.partition("/blob/")
    path = rest.partition("/")[2].partition("#")[0]
    return f"{repo}/{path}", repo


def same_share(batches: list[list[str]]) -> float:
    """The share of in-batch pairs (two rows of one batch) with the same key."""
    same = pairs = 0
    for keys in batches:
        counts = np.array(list(Counter(keys).values()))
        same += int((counts * (counts - 1)).sum()) // 2
        pairs += len(keys) * (len(keys) - 1) // 2
    return same / pairs if pairs else 0.0


def uniform_share(keys: Sequence[str]) -> float:
    """The same share for two rows drawn uniformly from ``keys``."""
    counts = np.array(list(Counter(keys).values()))
    return float((counts * (counts - 1)).sum() / (len(keys) * (len(keys) - 1)))


def batch_mix(config, pairs: str, tokenizer: str, count: int) -> dict[str, dict[str, float]]:
    """Same-file and same-repository shares of the first ``count`` global batches of epoch
    0, as the trainer's input path draws them (its row file and epoch order), for corpus
    order and each shuffle. (``tokenizer`` is unused: the order does not depend on it.)"""
    import tempfile

    from santa.train.data import pairs_source
    from santa.train.order import EpochPlan
    from santa.train.rows import open_rows

    with tempfile.TemporaryDirectory(prefix="santa-mix-") as cache:
        rows = open_rows(pairs_source(pairs), cache)
        doc_ids = rows.columns(["doc_id"]).column("doc_id").to_pylist()
        rows.close()
    variants = {
        "corpus order": ["train.shuffle=local", "train.shuffle_buffer=0"],
        "local": ["train.shuffle=local"],
        "global": ["train.shuffle=global"],
    }
    every = [file_and_repository(d) for d in doc_ids]
    mix = {
        "uniform": {
            "same_file": uniform_share([f for f, _ in every]),
            "same_repo": uniform_share([r for _, r in every]),
        }
    }
    for name, overrides in variants.items():
        train = config.with_overrides(overrides).train
        plan = EpochPlan(
            rows=len(doc_ids),
            global_batch=train.global_batch_size,
            seed=train.seed,
            shuffle=train.shuffle,
            buffer=train.shuffle_buffer,
        )
        order = plan.epoch(0)
        batches = [
            [every[row] for row in order.batch_rows(batch).tolist()]
            for batch in range(min(count, plan.batches_per_epoch))
        ]
        mix[name] = {
            "same_file": same_share([[f for f, _ in b] for b in batches]),
            "same_repo": same_share([[r for _, r in b] for b in batches]),
            "batches": len(batches),
        }
    return mix


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps (0: --epochs)")
    parser.add_argument("--buffer", type=int, default=64, help="train.shuffle_buffer (local)")
    parser.add_argument("--batch", type=int, default=32, help="global batch size")
    parser.add_argument("--recipe", default="tiny-finetune")
    parser.add_argument("--lr", type=float, default=5e-4, help="learning rate (0: recipe's)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--data", default=str(DATA), help="CodeSearchNet .jsonl.gz split file")
    parser.add_argument("--test-every", type=int, default=5, help="hold out every N-th repo")
    parser.add_argument("--check-batches", type=int, default=8, help="batches measured")
    parser.add_argument("--bootstrap", type=int, default=10_000, help="resamples")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from santa.cluster.ray_utils import init_ray
    from santa.config.recipes import get_recipe
    from santa.eval import EvalConfig, evaluate
    from santa.files import storage
    from santa.train.trainer import RunSpec, fit, prepare_initial_model

    bench = common.BenchRun(__file__, argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(tempfile.mkdtemp(prefix="santa-shuffle-mrr-"))
    print(init_ray(), flush=True)
    started = time.time()
    pairs, test, sizes = build_data(work, Path(args.data), args.test_every)
    length = (
        [f"train.max_steps={args.steps}", f"train.checkpoint_every={args.steps}"]
        if args.steps
        else [f"train.epochs={args.epochs}"]
    )
    base = get_recipe(args.recipe).with_overrides(
        [
            f"train.num_workers={args.workers}",
            f"train.global_batch_size={args.batch}",
            f"train.shuffle_buffer={args.buffer}",
            *([f"train.learning_rate={args.lr}"] if args.lr else []),
            *length,
            *args.overrides,
        ]
    )
    init = prepare_initial_model(
        base, RunSpec.of(data=pairs, storage=str(work / "runs"), name="init")
    )
    base = base.with_overrides([f"model.backbone={init}"])
    mix = batch_mix(base, pairs, init, args.check_batches)
    print("\n" + format_mix(mix, args) + "\n", flush=True)

    def score(model: str, name: str) -> dict[str, float]:
        folder = work / "eval" / name
        evaluate(model, test, EvalConfig(baseline=None, progress=False, output=str(folder)))
        return per_query_rr(test, str(folder / "run.model.trec"), "test")

    scores = {ZERO: score(init, "zero-shot")}
    runs = []
    for seed in seeds:
        for shuffle in SHUFFLES:
            name = f"{shuffle}-s{seed}"
            config = base.with_overrides([f"train.shuffle={shuffle}", f"train.seed={seed}"])
            clock = time.time()
            result = fit(config, RunSpec.of(data=pairs, storage=str(work / "runs"), name=name))
            if result.error is not None:
                raise RuntimeError(f"{name}: {result.error}")
            seconds = time.time() - clock
            model = storage.join(result.checkpoint.path, "model")
            scores[name] = score(model, name)
            mrr = statistics.fmean(scores[name].values())
            runs.append(
                {
                    "shuffle": shuffle,
                    "seed": seed,
                    "mrr@100": mrr,
                    "steps": int(result.metrics.get("step", 0)),
                    "train_s": seconds,
                }
            )
            print(f"[{name}] MRR@100 {mrr:.4f}, trained in {seconds:.0f} s", flush=True)

    by_shuffle = {s: [r["mrr@100"] for r in runs if r["shuffle"] == s] for s in SHUFFLES}
    summary = {s: t_interval(values) for s, values in by_shuffle.items()}
    difference = welch_interval(by_shuffle["global"], by_shuffle["local"])
    queries = sorted(scores[ZERO])
    for shuffle in SHUFFLES:  # each query's RR averaged over seeds
        scores[f"all seeds, {shuffle}"] = {
            q: statistics.fmean(scores[f"{shuffle}-s{s}"][q] for s in seeds) for q in queries
        }
    pooled, paired = bootstrap(
        {k: scores[k] for k in (ZERO, "all seeds, local", "all seeds, global")},
        args.bootstrap,
        0,
        (("all seeds, global", "all seeds, local"),),
    )
    payload = {
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "data": sizes,
        "batch_mix": mix,
        "zero_shot": pooled[ZERO],
        "runs": runs,
        "summary": summary,
        "difference": difference,
        "pooled": {s: pooled[f"all seeds, {s}"] for s in SHUFFLES},
        "pooled_difference": paired["all seeds, global - all seeds, local"],
        "total_seconds": time.time() - started,
    }
    print("\n" + format_tables(payload))
    bench.write_json(Path(args.output), payload)
    print(f"wrote {args.output} ({time.time() - started:.0f} s)")
    return 0


def format_mix(mix: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    """Markdown: same-file / same-repository pair shares of the first batches, × uniform."""
    uniform = mix["uniform"]
    labels = {
        "corpus order": "corpus order (no shuffle)",
        "local": f"local, {args.buffer}-row buffer",
        "global": "global permutation",
    }
    rows = [
        [
            labels[name],
            f"{row['same_file']:.4f}",
            f"{row['same_file'] / uniform['same_file']:.1f}",
            f"{row['same_repo']:.4f}",
            f"{row['same_repo'] / uniform['same_repo']:.1f}",
        ]
        for name, row in mix.items()
        if name != "uniform"
    ]
    rows.append(["uniform sample", f"{uniform['same_file']:.4f}", "1.0"])
    rows[-1] += [f"{uniform['same_repo']:.4f}", "1.0"]
    return common.format_table(
        [
            f"first {args.check_batches} batches of {args.batch}",
            "same-file pairs",
            "× uniform",
            "same-repo pairs",
            "× uniform",
        ],
        rows,
    )


def format_tables(payload: dict) -> str:
    """Markdown: one row per run, then per shuffle the mean [95 % t-interval] over seeds, the
    difference global − local (Welch), and the seeds pooled per query (bootstrap)."""
    runs = common.format_table(
        ["shuffle", "seed", "held-out MRR@100", "steps", "training s"],
        [
            [r["shuffle"], r["seed"], f"{r['mrr@100']:.4f}", r["steps"], f"{r['train_s']:.0f}"]
            for r in payload["runs"]
        ],
    )
    rows = [[ZERO, format_interval(payload["zero_shot"]), "1 model, bootstrap over queries"]]
    seeds = len(payload["runs"]) // len(SHUFFLES)
    for shuffle in SHUFFLES:
        rows.append(
            [shuffle, format_interval(payload["summary"][shuffle]), f"{seeds} seeds, t (n − 1)"]
        )
    rows.append(
        [
            "global − local",
            format_interval(payload["difference"], signed=True),
            f"Welch t, df {payload['difference']['df']:.1f}",
        ]
    )
    for shuffle in SHUFFLES:
        rows.append(
            [
                f"{shuffle}, seeds pooled per query",
                format_interval(payload["pooled"][shuffle]),
                "bootstrap over queries",
            ]
        )
    rows.append(
        [
            "global − local, seeds pooled per query",
            format_interval(payload["pooled_difference"], signed=True),
            f"paired bootstrap; share below 0: {payload['pooled_difference']['p_below_zero']:.3f}",
        ]
    )
    summary = common.format_table(["shuffle", "held-out MRR@100 [95% CI]", "interval"], rows)
    return f"{runs}\n\n{summary}"


if __name__ == "__main__":
    sys.exit(main())
