"""SCodeR's soft-labeled contrastive training (Algorithm 2) as one job.

    python -m ray_jobs.scoder --recipe tiny-scoder --data runs/pairs --storage runs --name s1
    python -m ray_jobs.scoder --recipe unixcoder-scoder --data s3://b/csn-asst \\
        --eval-data s3://b/csn-valid --eval-split valid --storage s3://b/runs --gpu

Preprocess the pairs with ``python -m ray_jobs.preprocess ... --asst`` to train the
code–code discriminator D_ψ on ASST pairs beside the text–code D_φ. Then:

1. warm-up: the dual encoder G_θ with in-batch negatives (santa's trainer, ``RUN/warmup``);
2. for each of ``scoder.iterations`` iterations ``i`` (``RUN/iter-<i>/``):
   mine top-K negatives with the current G_θ (``negatives/``), sample listwise examples
   (``examples/``), train D_φ and D_ψ (``discriminators/``, a Ray Train run), score the
   examples with them (``soft_labels/``, Ray Data; ``online``: in the training workers
   instead) and train G_θ with ``λ·L_adv + (1 − λ)·L_distill`` (``dual_encoder/``).
   ``manifest.json`` is written last: a rerun with the same ``--name`` skips the iterations
   that have one and resumes an unfinished stage from its latest checkpoint.

Per-iteration metrics (discriminators' held-out accuracy, soft-label entropy, losses,
dev MRR, seconds per phase) go to ``RUN/scoder_metrics.jsonl`` and a table at the end. The
algorithm itself is :mod:`santa.scoder.algorithm` (callable from Python).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from santa.config import SantaConfig
from santa.config.recipes import check_scoder_recipe
from santa.files import storage
from santa.files.layout import RunLayout
from santa.jobs.errors import exit_with, run_job, with_exit_codes
from santa.jobs.flags import recipe_config, refuse_workers_in_process, run_parser
from santa.jobs.lifecycle import Job
from santa.jobs.preflight import check_beir, check_pairs
from santa.train.tracking import Tracking

logger = logging.getLogger("santa.scoder")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The job's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.scoder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[
            run_parser(
                overrides_example="scoder.adversarial_weight=0.5",
                max_steps_help="steps of every stage (warm-up, discriminators, dual encoder)",
            )
        ],
    )
    parser.set_defaults(recipe="tiny-scoder")
    parser.add_argument("--data", required=True, help="preprocessed pairs (local or s3://)")
    parser.add_argument("--eval-data", default="", help="BEIR dev set for dev MRR per iteration")
    parser.add_argument("--eval-split", default="test", help="qrels split of --eval-data")
    parser.add_argument("--name", default="scoder", help="run name (same name = resume)")
    parser.add_argument("--storage", default="./runs", help="local path or s3:// URI")
    parser.add_argument("--iterations", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--soft-labels", choices=("offline", "online"), default=None)
    parser.add_argument("--force", action="store_true", help="take over a stale run lock")
    parser.add_argument("--verbose", action="store_true", help="show Ray's own logs")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="train every stage in this process on one worker, without Ray Train (one "
        "machine: the same loop and model; Ray still mines and scores)",
    )
    with_exit_codes(parser)
    args = parser.parse_args(argv)
    if args.max_steps is not None and args.max_steps < 1:
        parser.error("--max-steps must be a positive number of steps")
    refuse_workers_in_process(parser, args, argv)
    return args


def scoder_config(args: argparse.Namespace) -> SantaConfig:
    """The recipe with the cluster flags, --set, and the job's own flags on top."""
    then = []
    if args.max_steps:
        then += [
            f"scoder.warmup_steps={args.max_steps}",
            f"scoder.discriminator_steps={args.max_steps}",
            f"scoder.dual_encoder_steps={args.max_steps}",
        ]
    if args.iterations:
        then.append(f"scoder.iterations={args.iterations}")
    if args.soft_labels:
        then.append(f"scoder.soft_labels={args.soft_labels}")
    if args.in_process:
        then.append("train.num_workers=1")
    return recipe_config(args, then=then)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Take the run lock, start or join Ray, run Algorithm 2; returns the report."""
    from santa.scoder.algorithm import run_algorithm

    for name in ("storage", "data", "eval_data"):
        if getattr(args, name):
            setattr(args, name, storage.absolute(getattr(args, name)))
    config = scoder_config(args)  # fail fast, before Ray
    checks = [
        lambda: check_scoder_recipe(args.recipe, config),  # a recipe without negatives
        lambda: check_pairs(args.data),  # cheap checks before any Ray work (one line each)
    ]
    if args.eval_data:
        checks.append(lambda: check_beir(args.eval_data, args.eval_split))
    tracking = Tracking.from_args(args).to_dict()  # --mlflow / --wandb: each run tracked
    layout = RunLayout.of(args.storage, args.name)
    job = Job("scoder", run=layout.root, storage=args.storage, force=args.force)
    with job.running(checks):
        job.start_ray(args.address, verbose=args.verbose, progress=args.progress)
        return run_algorithm(
            config,
            data=args.data,
            layout=layout,
            recipe=args.recipe,
            eval_data=args.eval_data,
            eval_split=args.eval_split,
            cpus_per_worker=args.cpus_per_worker,
            tracking=tracking,
            in_process=args.in_process,
        )


def main(argv: list[str] | None = None) -> int:
    """Parse → run → print where the outputs are; errors as one line (``--debug``: more)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    return run_job(lambda: run(args) and 0, argv)


if __name__ == "__main__":
    exit_with(main())
