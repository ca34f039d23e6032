"""Does false-negative filtering in the miner help? The ANCE stage with and without it.

The staged pipeline at tiny scale on the standard library (``tiny`` recipe): one base model
(pretraining, then fine-tuning with in-batch negatives), then for each seed and each
filter setting the paper's ANCE step: mine one negative per query from the base model's
top 100 (``negatives.max_score_ratio`` / ``min_margin`` as the variant says; positives
and their normalized-text copies are dropped in every variant), and fine-tune the base
model on the table at the ANCE learning rate. Every ANCE model is scored zero-shot
(MRR@100, 95 % bootstrap intervals over queries) on held-out standard-library files, and
the difference to the unfiltered run of the same seed is paired on the same queries; a
last row pools the seeds (per-query mean over seeds).

The mining counts (hits dropped by reason, queries left with fewer than one negative,
which the trainer fills with a random table document) are printed beside the scores: at
this scale a filter that drops most hits turns hard negatives into random ones.

    python bench/quality/negative_filtering.py [--seeds 0,1,2] [--filters none,0.95]

Prints tables and writes ``bench/results/negative_filtering.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import RESULTS_DIR, BenchRun  # noqa: E402
from bench.quality.scoring import bootstrap, per_query_rr  # noqa: E402

RESULTS = RESULTS_DIR / "negative_filtering.json"


def filter_overrides(name: str) -> list[str]:
    """``none`` → no score filter; ``0.95`` → that ratio; ``margin=0.05`` → that margin."""
    if name == "none":
        return ["negatives.max_score_ratio=none", "negatives.min_margin=none"]
    if name.startswith("margin="):
        return ["negatives.max_score_ratio=none", f"negatives.min_margin={name[7:]}"]
    return [f"negatives.max_score_ratio={float(name)}", "negatives.min_margin=none"]


def build_corpus(work: Path, max_files: int) -> tuple[str, str, dict[str, int]]:
    """Pretraining pairs of the train split and the held-out test BEIR folder."""
    import shutil

    from santa.data.plan import PreprocessConfig, run_preprocess
    from santa.data.source import default_source_root

    source = default_source_root()
    if max_files:
        tree = work / "stdlib"
        tree.mkdir()
        for path in sorted(Path(source).glob("*.py"))[:max_files]:
            shutil.copy(path, tree)
        source = str(tree)
    common = {"dataset": "source", "input": source, "languages": ("python",), "skip_tests": True}
    pairs = str(work / "pairs")
    report = run_preprocess(
        PreprocessConfig(output=pairs, stage="pretrain", split="train", **common)
    )
    sizes = {"train_pairs": report["rows_written"]}
    test = str(work / "test")
    report = run_preprocess(PreprocessConfig(output=test, stage="eval", split="test", **common))
    sizes["test_queries"] = report["rows_written"]
    print(f"corpus: {sizes}", flush=True)
    return pairs, test, sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--filters", default="none,0.95", help="none, a ratio, margin=M")
    parser.add_argument("--pretrain-steps", type=int, default=150)
    parser.add_argument("--finetune-steps", type=int, default=100)
    parser.add_argument("--ance-steps", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-files", type=int, default=0, help="stdlib files (0: all)")
    parser.add_argument("--bootstrap", type=int, default=10_000, help="resamples")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    bench = BenchRun(__file__, argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from santa.cluster.ray_utils import init_ray
    from santa.config.recipes import get_recipe
    from santa.eval import EvalConfig, evaluate
    from santa.files import storage
    from santa.negatives.corpus import load_mining_corpus
    from santa.negatives.offline import mine_negatives
    from santa.negatives.table import NO_NEGATIVE, read_negatives_table
    from santa.train.trainer import RunSpec, fit

    seeds = [int(s) for s in args.seeds.split(",")]
    filters = [f.strip() for f in args.filters.split(",")]
    work = Path(tempfile.mkdtemp(prefix="santa-filtering-"))
    print(init_ray(), flush=True)
    started = time.time()
    pairs, test, sizes = build_corpus(work, args.max_files)
    common = [f"train.num_workers={args.workers}", *args.overrides]

    def train(config, name: str, warm_start: str = "") -> str:
        clock = time.time()
        result = fit(
            config,
            RunSpec.of(
                data=pairs,
                storage=str(work / "runs"),
                name=name,
                cpus_per_worker=0.5,
                warm_start=warm_start,
            ),
        )
        if result.error is not None:
            raise RuntimeError(f"{name}: {result.error}")
        print(f"[{name}] {config.train.max_steps} steps in {time.time() - clock:.0f} s", flush=True)
        return storage.join(result.checkpoint.path, "model")

    def steps(count: int) -> list[str]:
        return [f"train.max_steps={count}", f"train.checkpoint_every={count}"]

    pretrained = train(
        get_recipe("tiny").with_overrides([*common, *steps(args.pretrain_steps)]), "pretrain"
    )
    base = train(
        get_recipe("tiny-finetune").with_overrides([*common, *steps(args.finetune_steps)]),
        "finetune",
        pretrained,
    )
    scores: dict[str, dict[str, float]] = {}
    mining: dict[str, dict] = {}
    for seed in seeds:
        for variant in filters:
            name = f"seed {seed}, {'no filter' if variant == 'none' else variant}"
            slug = f"s{seed}-{variant.replace('=', '-')}"
            config = get_recipe("tiny-ance").with_overrides(
                [*common, *steps(args.ance_steps), f"train.seed={seed}", *filter_overrides(variant)]
            )
            table_uri = mine_negatives(base, pairs, str(work / "tables" / slug), config)
            table = read_negatives_table(table_uri, load_mining_corpus(pairs))
            per_query = config.negatives.per_query
            counts = (table.negatives != NO_NEGATIVE).sum(axis=1)
            mining[name] = {
                "filtered": table.filtered,
                "queries": int(len(counts)),
                "queries_short": int((counts < per_query).sum()),
            }
            ance = config.with_overrides([f"negatives.source=table:{table_uri}"])
            model = train(ance, slug, base)
            folder = work / "eval" / slug
            evaluate(model, test, EvalConfig(baseline=None, progress=False, output=str(folder)))
            scores[name] = per_query_rr(test, str(folder / "run.model.trec"), "test")
    folder = work / "eval" / "base"
    evaluate(base, test, EvalConfig(baseline=None, progress=False, output=str(folder)))
    scores["base (fine-tuned, before ANCE)"] = per_query_rr(
        test, str(folder / "run.model.trec"), "test"
    )
    reference = filters[0]
    label = {f: "no filter" if f == "none" else f for f in filters}
    queries = sorted(scores["base (fine-tuned, before ANCE)"])
    for variant in filters:  # the seeds pooled: each query's mean over seeds
        scores[f"all seeds, {label[variant]}"] = {
            q: sum(scores[f"seed {s}, {label[variant]}"][q] for s in seeds) / len(seeds)
            for q in queries
        }
    pairs_compared = tuple(
        (f"{prefix}, {label[variant]}", f"{prefix}, {label[reference]}")
        for prefix in [*(f"seed {s}" for s in seeds), "all seeds"]
        for variant in filters[1:]
    )
    per_system, differences = bootstrap(scores, args.bootstrap, 0, pairs_compared)

    print(
        f"\n| tiny T5, ANCE {args.ance_steps} steps | held-out MRR@100 [95% CI] | "
        "hits dropped (ratio / margin / same text) | queries without a negative |"
    )
    print("|---|---:|---:|---:|")
    for name, row in per_system.items():
        counts = mining.get(name)
        dropped = (
            f"{counts['filtered'].get('score_ratio', 0):,} / "
            f"{counts['filtered'].get('score_margin', 0):,} / "
            f"{counts['filtered'].get('same_text', 0):,}"
            if counts
            else ""
        )
        short = f"{counts['queries_short']:,} of {counts['queries']:,}" if counts else ""
        print(
            f"| {name} | {row['mean']:.4f} [{row['ci_low']:.4f}, {row['ci_high']:.4f}] | "
            f"{dropped} | {short} |"
        )
    print("\n| paired difference | MRR@100 [95% CI] | share of resamples below 0 |")
    print("|---|---:|---:|")
    for pair, row in differences.items():
        print(
            f"| {pair} | {row['mean']:+.4f} [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}] | "
            f"{row['p_below_zero']:.3f} |"
        )
    bench.write_json(
        Path(args.output),
        {
            "settings": {k: v for k, v in vars(args).items() if k != "output"},
            "corpus": sizes,
            "results": per_system,
            "differences": differences,
            "mining": mining,
            "total_seconds": time.time() - started,
        },
    )
    print(f"wrote {args.output} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
