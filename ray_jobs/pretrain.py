"""Pretrain a SANTA dual encoder (SDA + MEP) on preprocessed pairs with Ray Train.

python -m ray_jobs.pretrain --recipe tiny --data runs/stdlib --storage runs/ckpt --name demo
"""

from __future__ import annotations

import sys

from ray_jobs.train_cli import build_parser, run


def main(argv: list[str] | None = None) -> int:
    """Parse → fit → report."""
    parser = build_parser("python -m ray_jobs.pretrain", __doc__)
    return run(parser.parse_args(argv), stage="pretrain")


if __name__ == "__main__":
    sys.exit(main())
