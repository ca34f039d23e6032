"""Pretrain a SANTA dual encoder (SDA + MEP) on preprocessed pairs with Ray Train.

python -m ray_jobs.pretrain --recipe tiny --data runs/stdlib --storage runs/ckpt --name demo
"""

from __future__ import annotations

from ray_jobs.train_cli import build_parser, parse_args, run
from santa.jobs.errors import exit_with, run_job


def main(argv: list[str] | None = None) -> int:
    """Parse → fit → report."""
    parser = build_parser("python -m ray_jobs.pretrain", __doc__)
    args = parse_args(parser, argv)
    return run_job(lambda: run(args, stage="pretrain"), argv)


if __name__ == "__main__":
    exit_with(main())
