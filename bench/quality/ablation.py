"""The direction of SANTA's ablation (paper Table 3) at this machine's scale.

A tiny T5 (the ``tiny`` recipe, random initialization, its tokenizer trained on the
training pairs) is pretrained from the *same* initial weights for the same steps on the
same standard-library docstring → code pairs five ways, then scored zero-shot (MRR@100,
95 % bootstrap intervals) on held-out standard-library files no variant trained on:

- ``baseline``: no training (the initial weights);
- ``w/ MEP``: Masked Entity Prediction alone (``train.sda_weight=0``);
- ``w/ SDA``: Structured Data Alignment alone (``train.mep_weight=0``);
- ``SDA + MEP (entity)``: both, identifiers masked (preprocessing ``--mask entity``);
- ``SDA + MEP (span)``: both, random spans masked as in T5 (``--mask span``).

The paper's finding (Table 3, CodeT5-base on CodeSearchNet): SDA brings most of the gain
over the baseline, MEP alone little, and entity masking beats span masking. Paired
intervals are printed for those comparisons.

    python bench/quality/ablation.py [--steps 150] [--workers 2]

Prints tables and writes ``bench/results/ablation.json`` and ``ablation.png``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.quality.scoring import bootstrap, format_interval, per_query_rr

RESULTS = common.RESULTS_DIR / "ablation.json"
# name → (training data: entity or span masks, config overrides); None: no training.
VARIANTS: dict[str, tuple[str, list[str]] | None] = {
    "baseline": None,
    "w/ MEP": ("entity", ["train.sda_weight=0"]),
    "w/ SDA": ("entity", ["train.mep_weight=0"]),
    "SDA + MEP (entity)": ("entity", []),
    "SDA + MEP (span)": ("span", []),
}
COMPARISONS = (
    ("w/ SDA", "baseline"),
    ("w/ MEP", "baseline"),
    ("SDA + MEP (entity)", "w/ SDA"),
    ("SDA + MEP (entity)", "SDA + MEP (span)"),
)


def slug(name: str) -> str:
    """A variant's name as a run/folder name: ``SDA + MEP (span)`` → ``sda-mep-span``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def build_corpus(work: Path, max_files: int) -> tuple[dict[str, str], str, dict[str, int]]:
    """Pretraining pairs with entity and with span masks, and the held-out test BEIR."""
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
    options = {"dataset": "source", "input": source, "languages": ("python",), "skip_tests": True}
    data, sizes = {}, {}
    for mask in ("entity", "span"):
        output = str(work / f"pairs-{mask}")
        report = run_preprocess(
            PreprocessConfig(output=output, stage="pretrain", split="train", mask=mask, **options)
        )
        data[mask], sizes[f"train_pairs_{mask}"] = output, report["rows_written"]
    test = str(work / "test")
    report = run_preprocess(PreprocessConfig(output=test, stage="eval", split="test", **options))
    sizes["test_queries"] = report["rows_written"]
    print(f"corpus: {sizes}", flush=True)
    return data, test, sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="train each variant in this process on one worker (santa.train.fit_in_process: "
        "the same loop and model as a one-worker Ray run, without Ray Train's start-up)",
    )
    parser.add_argument("--max-files", type=int, default=0, help="stdlib files (0: all)")
    parser.add_argument("--bootstrap", type=int, default=10_000, help="resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from santa.cluster.ray_utils import init_ray
    from santa.config.recipes import get_recipe
    from santa.eval import EvalConfig, evaluate
    from santa.files import storage
    from santa.train.trainer import RunSpec, fit, fit_in_process, prepare_initial_model

    bench = common.BenchRun(__file__, argv)
    work = Path(tempfile.mkdtemp(prefix="santa-ablation-"))
    print(init_ray(), flush=True)
    started = time.time()
    data, test, sizes = build_corpus(work, args.max_files)
    base = get_recipe("tiny").with_overrides(
        [
            f"train.num_workers={1 if args.in_process else args.workers}",
            f"train.max_steps={args.steps}",
            f"train.checkpoint_every={args.steps}",
            *args.overrides,
        ]
    )
    # One initial model (weights and tokenizer) for every variant.
    init = prepare_initial_model(
        base, RunSpec.of(data=data["entity"], storage=str(work / "runs"), name="init")
    )
    base = base.with_overrides([f"model.backbone={init}"])
    models, seconds = {}, {}
    for name, variant in VARIANTS.items():
        if variant is None:
            models[name], seconds[name] = init, 0.0
            continue
        mask, overrides = variant
        print(f"[{name}] {args.steps} steps on {mask}-masked pairs", flush=True)
        clock = time.time()
        result = (fit_in_process if args.in_process else fit)(
            base.with_overrides(overrides),
            RunSpec.of(
                data=data[mask],
                storage=str(work / "runs"),
                name=slug(name),
                cpus_per_worker=0.5,
            ),
        )
        if result.error is not None:
            raise RuntimeError(f"{name}: {result.error}")
        models[name] = storage.join(result.checkpoint.path, "model")
        seconds[name] = time.time() - clock
    scores = {}
    for name, model in models.items():
        folder = work / "eval" / slug(name)
        evaluate(model, test, EvalConfig(baseline=None, progress=False, output=str(folder)))
        scores[name] = per_query_rr(test, str(folder / "run.model.trec"), "test")
    per_system, differences = bootstrap(scores, args.bootstrap, args.seed, COMPARISONS)

    print("\n" + format_tables(per_system, differences, seconds, args.steps))
    payload = {
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "corpus": sizes,
        "results": per_system,
        "differences": differences,
        "training_seconds": seconds,
        "total_seconds": time.time() - started,
    }
    output = Path(args.output)
    bench.write_json(output, payload)
    plot(per_system, output.with_suffix(".png"), f"tiny T5, {args.steps} steps, held-out stdlib")
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


def format_tables(
    per_system: dict[str, dict], differences: dict[str, dict], seconds: dict[str, float], steps: int
) -> str:
    """Markdown: MRR@100 [95 % CI] and training seconds per variant, then the paired
    differences with the share of resamples below 0."""
    variants = common.format_table(
        [f"tiny T5, {steps} steps", "held-out MRR@100 [95% CI]", "training s"],
        [[name, format_interval(row), f"{seconds[name]:.0f}"] for name, row in per_system.items()],
    )
    paired = common.format_table(
        ["paired difference", "MRR@100 [95% CI]", "share of resamples below 0"],
        [
            [pair, format_interval(row, signed=True), f"{row['p_below_zero']:.3f}"]
            for pair, row in differences.items()
        ],
    )
    return f"{variants}\n\n{paired}"


def plot(per_system: dict[str, dict], path: Path, title: str) -> None:
    """Bars of MRR@100 per variant with the 95 % intervals."""
    common.plot_intervals(
        {name: {"MRR@100": row} for name, row in per_system.items()},
        path,
        title,
        ylabel="MRR@100 (95% bootstrap CI)",
        figsize=(7, 3.8),
        rotation=15,
    )


if __name__ == "__main__":
    sys.exit(main())
