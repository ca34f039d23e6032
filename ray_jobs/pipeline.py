"""The whole method in one job: corpus → preprocess → pretrain → fine-tune → ANCE → report.

    python -m ray_jobs.pipeline                      # the embedded default, on a local Ray
    python -m ray_jobs.pipeline --stages pretrain    # structure-aware pretraining only
    python -m ray_jobs.pipeline --storage s3://bucket/runs --name csn --recipe codet5-base-code \\
        --data s3://bucket/csn-pretrain --eval-data s3://bucket/csn-eval --gpu

The library side is :mod:`santa.pipeline` (callable from Python). The paper's staged recipe, each stage starting from the previous stage's checkpoint:
``pretrain`` (SDA + MEP, in-batch negatives only), ``finetune`` (the DR loss, in-batch
negatives) and ``ance`` (one hard negative per query sampled from the top 100 the fine-tuned
model retrieves, positives removed, at a lower learning rate; ``--hard-negatives async``
re-mines them while training goes on instead). Stage settings come from the recipe family
(``<recipe>``, ``<recipe>-finetune``, ``<recipe>-ance``).

With no arguments it builds the default corpus (this interpreter's standard library as
CodeSearchNet-format records), preprocesses it (train / valid / test split by file, held-out
rows never in the training pairs), runs the ``pretrain`` and ``finetune`` stages of the
``minilm`` recipe (all-MiniLM-L6-v2, shipped with santa's dependencies; 20/10 steps at
batch 32, lengths 32/128; ``--stages pretrain,finetune,ance`` adds ANCE; ``--recipe tiny``
is the one-million-parameter T5 of the tests, SDA + MEP) on 2 workers, evaluates every
stage's model on the held-out test split beside the untrained model and BM25, indexes the
held-out corpus with the final model and shows three of its queries' top hits, and writes
everything under ``./runs/<name>/``: ``data/`` (pairs, BEIR sets), one Ray Train run per
stage (``<stage>/checkpoint_*``, ``metrics.jsonl``, ``tensorboard/``), ``negatives/`` (the
mined table, with ANCE), ``eval/`` (TREC runs, metrics), ``index/`` (search it with
``ray_jobs.search``), ``report.md`` and ``report.html`` with their plots (PNG). Fine-tuning uses the pretraining
pairs' unmasked documents unless ``--finetune-data`` names other pairs.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from santa.jobs.errors import exit_with, run_job, with_exit_codes
from santa.jobs.flags import cluster_overrides, refuse_workers_in_process, run_parser
from santa.pipeline import DEFAULT_RECIPE, PipelineSpec, run_pipeline
from santa.pipeline.spec import checked_stages
from santa.train.tracking import Tracking

logger = logging.getLogger("santa.pipeline")


STAGES_HELP = (
    "comma-separated stages to run, in order (default: pretrain,finetune,ance; the default "
    "MiniLM run: pretrain,finetune)"
)
IN_PROCESS_HELP = (
    "train every stage in this process on one worker, without Ray Train (the model a "
    "one-worker Ray run computes); the corpus, mining and evaluation as without it"
)
NEGATIVES_HELP = (
    "ance stage: mine once with the fine-tuned model (table, the paper) or re-mine while "
    "training (async)"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The pipeline's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[
            run_parser(
                address_help="Ray address (default: RAY_ADDRESS, else a local Ray of its own)",
                max_steps_help="steps of every stage (default: the recipe's epochs; minilm: "
                "20/10/10, tiny: 150/100/50)",
            )
        ],
    )
    add = parser.add_argument
    add("--name", default="default", help="run name (same name = resume)")
    add("--storage", default="./runs", help="local path or s3:// URI")
    add("--stages", help=STAGES_HELP)
    add("--input", help="source tree for the corpus (default: this Python's stdlib)")
    add("--data", default="", help="existing preprocessed training pairs (skips the corpus)")
    add("--finetune-data", default="", help="finetune/ance pairs (default: the pretraining ones)")
    add("--eval-data", default="", help="existing BEIR eval set (with --data)")
    add("--eval-split", default="test")
    add("--hard-negatives", choices=("table", "async"), default="table", help=NEGATIVES_HELP)
    add("--baseline", choices=("bm25", "none"), default="bm25")
    add("--force", action="store_true", help="take over a stale run lock")
    add("--no-index", action="store_true", help="skip indexing the held-out corpus at the end")
    add("--verbose", action="store_true", help="show Ray's own logs")
    add("--in-process", action="store_true", help=IN_PROCESS_HELP)
    parser.set_defaults(recipe=DEFAULT_RECIPE)
    with_exit_codes(parser)
    args = parser.parse_args(argv)
    refuse_workers_in_process(parser, args, argv)
    if args.in_process and args.hard_negatives == "async":
        parser.error("--in-process mines once (--hard-negatives table): async needs Ray Train")
    if bool(args.data) != bool(args.eval_data):
        parser.error("--data and --eval-data go together (or neither: build the default corpus)")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error("--max-steps must be a positive number of steps")
    if args.stages is not None:  # None: the recipe's default stages (PipelineSpec decides)
        try:
            args.stages = checked_stages(s.strip() for s in args.stages.split(",") if s.strip())
        except ValueError as error:
            parser.error(f"--{error}")
    return args


def spec_from_args(args: argparse.Namespace) -> PipelineSpec:
    """The library's pipeline spec of the parsed command line."""
    return PipelineSpec(
        name=args.name,
        storage=args.storage,
        recipe=args.recipe,
        stages=args.stages,
        input=args.input or "",
        data=args.data,
        finetune_data=args.finetune_data,
        eval_data=args.eval_data,
        eval_split=args.eval_split,
        hard_negatives=args.hard_negatives,
        baseline=args.baseline,
        max_steps=args.max_steps,
        num_workers=1 if args.in_process else args.num_workers,
        cpus_per_worker=args.cpus_per_worker,
        cluster_overrides=tuple(cluster_overrides(args)),
        overrides=tuple(args.overrides),
        index=not args.no_index,
        in_process=args.in_process,
        tracking=Tracking.from_args(args).to_dict(),
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the pipeline of ``args``; returns the report dict (also report.json / .md)."""
    return run_pipeline(
        spec_from_args(args),
        address=args.address,
        verbose=args.verbose,
        progress=args.progress,
        force=args.force,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse → run → print where the outputs are; errors as one line (``--debug``: more)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    return run_job(lambda: run(args) and 0, argv)


if __name__ == "__main__":
    exit_with(main())
