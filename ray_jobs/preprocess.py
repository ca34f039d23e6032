"""Preprocess CodeSearchNet, AdvTest, ESCI or a local source tree into Parquet pairs / BEIR.

    python -m ray_jobs.preprocess --dataset source --output ./runs/corpus
    python -m ray_jobs.preprocess --dataset cosqa --input cosqa-dev.json --output ./runs/cosqa
    ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python -m ray_jobs.preprocess --dataset codesearchnet --input s3://b/csn --output s3://b/out
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from santa.data import esci
from santa.data.cosqa import publish_cosqa_beir
from santa.data.outputs import claim_output
from santa.data.pipeline import check_inputs, run_preprocess
from santa.data.preprocess_config import DATASETS, STAGES, PreprocessConfig
from santa.data.report import format_text
from santa.data.schema import CODE_LANGUAGES
from santa.data.source import default_source_root
from santa.method.entities import PRODUCT_ENTITY_RULES
from santa.runtime import interrupts
from santa.runtime.errors import exit_with, run_job, with_exit_codes
from santa.runtime.preflight import check_input, check_writable
from santa.runtime.quiet import PROGRESS_HELP
from santa.runtime.ray_utils import init_ray

# CoSQA is one small JSON file of labelled query-code pairs: converted to a BEIR retrieval
# set (its positive queries against every function) in-process, without Ray.
COSQA = "cosqa"
# Your own {query, positive, negatives?} JSON lines → training pairs (santa.data.pairs).
PAIRS = "pairs"
DEV_FRACTION_HELP = "ESCI: share of train queries carved out as --split valid (SANTA: 0.125)"
ENTITY_HELP = "ESCI entities: proper nouns as SANTA's scripts (scripts), or title nouns"


def parse_args(
    argv: list[str] | None = None,
) -> tuple[PreprocessConfig | argparse.Namespace, str | None, bool]:
    """Parse the command line into a :class:`PreprocessConfig`, the Ray address and
    ``--progress``."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.preprocess",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--dataset", choices=(*DATASETS, COSQA, PAIRS), required=True)
    add("--input", help="local path or s3:// URI (default for source: this Python's stdlib)")
    add("--output", required=True, help="local path or s3:// URI")
    add("--stage", choices=STAGES, default="pretrain")
    add("--split", choices=("train", "valid", "test"), default="")
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
    add("--max-actors", type=int, default=0, help="parser actors (default: one per CPU)")
    add("--batch-size", type=int, default=256, help="records per parser call (ESCI, source)")
    add("--address", help="Ray address (default: RAY_ADDRESS or local)")
    add("--debug", action="store_true", help="tracebacks on errors")
    add("--progress", action="store_true", help=PROGRESS_HELP)
    with_exit_codes(parser)
    args = parser.parse_args(argv)
    if args.input is None:
        if args.dataset != "source":
            parser.error("--input is required for this dataset")
        args.input = default_source_root()
    if args.asst and (args.dataset == "esci" or args.stage == "eval"):
        parser.error("--asst makes code–code training pairs: a code dataset, not --stage eval")
    if args.dataset == PAIRS:
        if args.stage == "eval" or args.asst:
            parser.error("pairs are training pairs: no --stage eval, no --asst")
        return args, args.address, args.progress
    if args.dataset == COSQA:
        if args.stage not in ("pretrain", "eval"):
            parser.error("cosqa is an evaluation set: use --stage eval")
        return args, args.address, args.progress
    names = {f.name for f in dataclasses.fields(PreprocessConfig)}
    config = PreprocessConfig(**{k: v for k, v in vars(args).items() if k in names})
    return config, args.address, args.progress


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse → start/join Ray → run → print the report (errors: one line)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config, address, progress = parse_args(argv)
    return run_job(lambda: _run(config, address, progress), argv)


def _run(config, address: str | None, progress: bool = False) -> int:
    check_input(config.input, "--input")  # before any work: one line naming the URI
    check_writable(config.output, "--output")
    # One writer per output, which holds nothing but a preprocess output; an interrupted
    # run leaves it as it was.
    with (
        claim_output(config.output, "preprocess"),
        interrupts.keeping(
            lambda: (
                f"nothing was published; {config.output} is as it was (run the same "
                "command to start over)"
            )
        ),
    ):
        return _write(config, address, progress)


def _write(config, address: str | None, progress: bool = False) -> int:
    if isinstance(config, argparse.Namespace) and config.dataset == PAIRS:
        from santa.data.pairs import run_pairs_preprocess

        print(init_ray(address, progress=progress), flush=True)
        report = run_pairs_preprocess(config.input, config.output)
        print(format_text({**report, "entity_ratio": {}}))
        print(json.dumps({key: report[key] for key in ("queries", "documents", "negatives")}))
        print(f"output: {config.output}")
        return 0
    if isinstance(config, argparse.Namespace):  # CoSQA: a file → a BEIR folder
        print(json.dumps(publish_cosqa_beir(config.input, config.output, config.split or "test")))
        print(f"output: {config.output}")
        return 0
    check_inputs(config)
    print(init_ray(address, progress=progress), flush=True)
    report = run_preprocess(config)
    print(format_text(report))
    print(f"output: {config.output}")
    return 0


if __name__ == "__main__":
    exit_with(main())
