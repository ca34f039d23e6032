"""Shared command line of the training jobs (pretrain and finetune)."""

from __future__ import annotations

import argparse
import logging

from santa.files import storage
from santa.files.layout import RunLayout
from santa.jobs.errors import with_exit_codes
from santa.jobs.flags import recipe_config, refuse_workers_in_process, run_parser
from santa.jobs.lifecycle import Job
from santa.jobs.preflight import check_beir, check_model, check_negatives_table, check_pairs
from santa.train.kept import RESUME_HINT, final_metrics_lines, kept_checkpoint
from santa.train.tracking import Tracking


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments every training job takes."""
    parser = with_exit_codes(
        argparse.ArgumentParser(prog=prog, description=description, parents=[run_parser()])
    )
    parser.add_argument("--data", required=True, help="preprocessed pairs: local path or s3://")
    parser.add_argument("--storage", required=True, help="checkpoints: local path or s3://")
    parser.add_argument("--name", required=True, help="run name (same name = resume)")
    parser.add_argument("--max-failures", type=int, default=1)
    parser.add_argument("--force", action="store_true", help="take over a stale run lock")
    parser.add_argument("--verbose", action="store_true", help="show Ray's own logs")
    parser.add_argument("--num-to-keep", type=int, default=2)
    parser.add_argument(
        "--eval-data", default="", help="BEIR folder for dev metrics during training (dev_mrr)"
    )
    parser.add_argument("--eval-split", default="test", help="qrels split of --eval-data")
    parser.add_argument(
        "--hard-negatives",
        default="none",
        metavar="{none,table:URI,async}",
        help="hard negatives: none (in-batch only), a mined table, or an async miner actor",
    )
    parser.add_argument(
        "--negatives-per-query", type=int, default=1, help="hard negatives per query (n)"
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="train in this process on one worker, without Ray (one machine, a debugger: "
        "the same loop, the model a one-worker Ray run computes)",
    )
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments; ``--in-process`` with ``--num-workers`` other than 1 is a
    usage error (exit 2)."""
    args = parser.parse_args(argv)
    refuse_workers_in_process(parser, args, argv)
    return args


def run(args: argparse.Namespace, stage: str, warm_start: str = "") -> int:
    """Build the config and run spec from ``args``, train, and print the result."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    overrides = [f"train.stage={stage}"]
    if args.max_steps is not None:  # 0 is a value (and an error), not "unset"
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.hard_negatives != "none":
        overrides += [
            f"negatives.source={args.hard_negatives}",
            f"negatives.per_query={args.negatives_per_query}",
        ]
    then = ["train.num_workers=1"] if args.in_process else []  # (parse_args checked it)
    config = recipe_config(args, overrides, then=then)  # a bad value: one line, exit 2
    # Cheap checks before any Ray work, and before importing torch and Ray (seconds): each
    # failure is one line naming the URI.
    eval_data = storage.absolute(args.eval_data)
    checks = [lambda: check_pairs(storage.absolute(args.data))]
    if eval_data:
        checks.append(lambda: check_beir(eval_data, args.eval_split))
    if warm_start:  # config and weights: a corrupt file is named here, not in the workers
        checks.append(lambda: check_model(warm_start))
    if args.hard_negatives.startswith("table:"):
        table = args.hard_negatives.removeprefix("table:")
        checks.append(lambda: check_negatives_table(table))
    tracking = Tracking.from_args(args)  # a missing package: one line before Ray starts
    layout = RunLayout.of(args.storage, args.name)
    job = Job(
        stage,
        run=layout.root,
        storage=storage.absolute(args.storage),
        force=args.force,
        kept=lambda: "",  # fit() says what was kept
        hint=RESUME_HINT,
    )
    with job.running(checks):
        from santa.train.trainer import FIT_IMPORTS, RunSpec, fit

        spec = RunSpec(
            data=args.data,
            layout=layout,
            cpus_per_worker=args.cpus_per_worker,
            max_failures=args.max_failures,
            num_to_keep=args.num_to_keep,
            warm_start=warm_start,
            eval_data=args.eval_data,
            eval_split=args.eval_split,
            tracking=tracking.to_dict(),
            in_process=args.in_process,
        )
        if not args.in_process:
            job.start_ray(
                args.address, verbose=args.verbose, progress=args.progress, preload=FIT_IMPORTS
            )
        result = fit(config, spec)
    # A short table, not every metric: the whole history is in the run's metrics.jsonl.
    print("\n".join(final_metrics_lines(result.metrics or {}, spec.layout.metrics)))
    if result.checkpoint is not None:
        kept = kept_checkpoint(result, config.train)
        # s3:// kept in the URI; with train.keep_best_by, the best, and why.
        print(f"checkpoint: {spec.layout.checkpoint_uri(kept.checkpoint)} ({kept.describe()})")
    if result.error is not None:
        raise RuntimeError(f"training failed: {result.error}")
    return 0
