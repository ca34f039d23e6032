"""Fine-tune a dual encoder with the DR loss (in-batch negatives) on query–document pairs.

    python -m ray_jobs.finetune --recipe tiny --data runs/csn-finetune --storage runs/ckpt \\
        --name ft --init-checkpoint runs/ckpt/demo/checkpoint_.../model
"""

from __future__ import annotations

from ray_jobs.train_cli import build_parser, parse_args, run
from santa.jobs.errors import exit_with, run_job


def main(argv: list[str] | None = None) -> int:
    """Parse → fit → report."""
    parser = build_parser("python -m ray_jobs.finetune", __doc__)
    parser.add_argument(
        "--init-checkpoint",
        default="",
        help="warm start: a model folder or checkpoint's model/ (local or s3://)",
    )
    args = parse_args(parser, argv)
    return run_job(lambda: run(args, stage="finetune", warm_start=args.init_checkpoint), argv)


if __name__ == "__main__":
    exit_with(main())
