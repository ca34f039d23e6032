"""Preprocess a dataset of santa's registry (santa.data.datasets) into Parquet pairs / BEIR.

    python -m ray_jobs.preprocess --dataset source --output ./runs/corpus
    python -m ray_jobs.preprocess --dataset cosqa --input cosqa-dev.json --output ./runs/cosqa
    ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python -m ray_jobs.preprocess --dataset codesearchnet --input s3://b/csn --output s3://b/out
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from santa.config.preprocess import SPLITS, STAGES, PreprocessConfig
from santa.config.table_recipes import TABLE_RECIPES
from santa.data import esci
from santa.data.datasets import DATASETS, check_inputs, dataset, run_preprocess
from santa.data.records import CODE_TEXT_HELP, CODE_TEXTS, MEP_TARGETS, MEP_TARGETS_HELP
from santa.data.schema import CODE_LANGUAGES
from santa.jobs.errors import exit_with, with_exit_codes
from santa.jobs.lifecycle import Job
from santa.jobs.preflight import check_input
from santa.jobs.quiet import PROGRESS_HELP
from santa.method.entities import PRODUCT_ENTITY_RULES

DATASET_HELP = "; ".join(f"{entry.name}: {entry.about}" for entry in DATASETS.values())
DEV_FRACTION_HELP = "ESCI: share of train queries carved out as --split valid (SANTA: 0.125)"
ENTITY_HELP = "ESCI entities: proper nouns as SANTA's scripts (scripts), or title nouns"
SPLIT_HELP = "default: train (eval: test); train+test merges a code dataset's two for training"
MIN_ACTORS_HELP = (
    "parsers to hold from the start (default 1); more than the cluster's CPUs, on an "
    "autoscaling cluster, asks it for nodes at once (a pool of parser actors)"
)
RECIPE_HELP = "a table recipe whose data options (--code-text, --mep-targets, --split) apply"
MERGED_SPLIT_WARNING = (
    "santa: warning: training on CodeSearchNet's test split: CodeXGLUE's AdvTest test set is "
    "made of those python test functions (names obfuscated), so an AdvTest evaluation of this "
    "model may score code it was trained on"
)


def parse_args(argv: list[str] | None = None) -> tuple[PreprocessConfig, str | None, bool]:
    """Parse the command line into a :class:`PreprocessConfig`, the Ray address and
    ``--progress``."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.preprocess",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--dataset", choices=tuple(DATASETS), required=True, help=DATASET_HELP)
    add("--input", help="local path or s3:// URI (default for source: this Python's stdlib)")
    add("--output", required=True, help="local path or s3:// URI")
    add("--stage", choices=STAGES, default="", help="default: the dataset's first stage")
    add("--split", choices=SPLITS, default="", help=SPLIT_HELP)
    add("--languages", nargs="*", choices=CODE_LANGUAGES, default=[])
    add("--mask", choices=("entity", "span"), default="entity")
    add("--seed", type=int, default=0)
    add("--esci-version", choices=("small", "large"), default="small")
    add("--locale", default="us")
    add(
        "--esci-pretrain",
        choices=esci.PRETRAIN_RULES,
        default="product",
        help="ESCI pretraining pairs: one per product, held-out products left out "
        "(product), or one per Exact judgment as SANTA's scripts, test products included "
        "(paper; use with --esci-version large)",
    )
    add("--esci-dev-fraction", type=float, default=esci.DEV_FRACTION, help=DEV_FRACTION_HELP)
    add("--esci-dev-seed", type=int, default=esci.DEV_SEED, help="ESCI: seed of the dev carve")
    add("--product-entities", choices=PRODUCT_ENTITY_RULES, default="scripts", help=ENTITY_HELP)
    add("--skip-tests", action="store_true", help="source: skip test directories")
    add("--asst", action="store_true", help="code: also write SCodeR's ASST code–code pairs")
    add("--code-text", choices=CODE_TEXTS, default=None, help=CODE_TEXT_HELP)
    add("--mep-targets", choices=MEP_TARGETS, default=None, help=MEP_TARGETS_HELP)
    add("--recipe", choices=sorted(TABLE_RECIPES), default=None, help=RECIPE_HELP)
    add("--max-actors", type=int, default=0, help="parsers at once (default: one per CPU)")
    add("--min-actors", type=int, default=None, help=MIN_ACTORS_HELP)
    add("--batch-size", type=int, default=256, help="records per parser call (ESCI, source)")
    add("--address", help="Ray address (default: RAY_ADDRESS or local)")
    add("--debug", action="store_true", help="tracebacks on errors")
    add("--progress", action="store_true", help=PROGRESS_HELP)
    with_exit_codes(parser)
    args = parser.parse_args(argv)
    entry = dataset(args.dataset)
    if args.input is None:
        if not entry.default_input:
            parser.error("--input is required for this dataset")
        args.input = entry.function("default_input")()
    names = {f.name for f in dataclasses.fields(PreprocessConfig)}
    given = {k: v for k, v in vars(args).items() if k in names and v not in (None, "")}
    if args.recipe:  # a table recipe's data options, unless given here
        recipe = TABLE_RECIPES[args.recipe].preprocess
        given = {**{key: setting.value for key, setting in recipe.items()}, **given}
    try:
        config = PreprocessConfig(**given)
    except ValueError as error:
        parser.error(str(error))
    return config, args.address, args.progress


def split_warning(config: PreprocessConfig) -> str | None:
    """The line a training run on CodeSearchNet's test split gets (AdvTest's test code)."""
    training = config.stage != "eval" and config.dataset == "codesearchnet"
    return MERGED_SPLIT_WARNING if training and "test" in config.wanted_splits else None


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse → check → lock the output → start/join Ray → run → the report."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config, address, progress = parse_args(argv)
    # One writer per output, which holds nothing but a preprocess output; an interrupted
    # run leaves it as it was.
    job = Job(
        "preprocess",
        output=config.output,
        kept=lambda: (
            f"nothing was published; {config.output} is as it was (run the same command to "
            "start over)"
        ),
    )
    checks = [lambda: check_input(config.input, "--input"), lambda: check_inputs(config)]
    return job.main(lambda: _write(job, config, address, progress), argv, checks)


def _write(job: Job, config: PreprocessConfig, address: str | None, progress: bool) -> int:
    entry = dataset(config.dataset)
    warning = split_warning(config)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if entry.uses_ray:
        job.start_ray(address, progress=progress)
    report = run_preprocess(config)
    print(entry.function("summary")(report))
    print(f"output: {config.output}")
    return 0


if __name__ == "__main__":
    exit_with(main())
