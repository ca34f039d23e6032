"""The arguments every training command line shares (pipeline, pretrain/finetune, sweep).

Each command builds its parser with ``parents=[run_parser(...)]`` and adds its own flags.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from santa.config import SantaConfig
from santa.config.recipes import RECIPES, get_recipe, with_recipes_that_fit
from santa.jobs.quiet import PROGRESS_HELP
from santa.train.tracking import add_tracking_flags


class WorkerCount(int):
    """``--num-workers``: ``N`` (a fixed size) or ``MIN-MAX`` (elastic: as an int, MAX)."""

    minimum: int = 0

    def __new__(cls, text: str | int) -> WorkerCount:
        low, _, high = str(text).partition("-")
        try:
            most, least = int(high or low), int(low) if high else 0
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--num-workers takes N or MIN-MAX (e.g. 2, or 1-4), got {text!r}"
            ) from None
        if most < 1 or (high and not 1 <= least <= most):
            raise argparse.ArgumentTypeError(
                f"--num-workers: need 1 <= MIN <= MAX and MAX >= 1, got {text!r}"
            )
        count = super().__new__(cls, most)
        count.minimum = least
        return count


def run_parser(
    *,
    address_help: str = "Ray address (default: RAY_ADDRESS or local)",
    overrides_example: str = "train.learning_rate=1e-4",
    cpus_per_worker_help: str | None = None,
    max_steps_help: str | None = None,
) -> argparse.ArgumentParser:
    """A parent parser: recipe, workers, GPU, CPUs per worker, max steps, Ray address,
    --debug, --progress, MLflow / W&B, --set."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="tiny")
    parser.add_argument(
        "--num-workers",
        type=WorkerCount,
        default=WorkerCount(2),
        metavar="N|MIN-MAX",
        help="training workers; MIN-MAX: elastic (Ray Train goes on with the workers left "
        "when nodes are lost, at the same global batch, and grows back to MAX)",
    )
    parser.add_argument("--cpus-per-worker", type=float, default=0.0, help=cpus_per_worker_help)
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="one GPU per worker, NCCL, bf16 autocast (float32 where the recipe sets "
        "train.bf16=false, as the table recipes do)",
    )
    parser.add_argument("--max-steps", type=int, default=None, help=max_steps_help)
    parser.add_argument("--address", default=None, help=address_help)
    parser.add_argument(
        "--miner-actors",
        type=int,
        default=None,
        help="async hard negatives: encoder actors per refresh "
        "(negatives.encoder_actors, default 1)",
    )
    parser.add_argument(
        "--miner-gpus",
        type=float,
        default=None,
        help="async hard negatives: GPUs per encoder actor (negatives.encoder_gpus, default "
        "0: CPU); a fraction such as 0.25 shares a training worker's GPU, which then asks "
        "for the rest",
    )
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors")
    parser.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    add_tracking_flags(parser)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"config override, e.g. {overrides_example}",
    )
    return parser


def cluster_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of the cluster flags: ``--gpu``, ``--miner-actors``, ``--miner-gpus``."""
    overrides = ["train.use_gpu=true"] if args.gpu else []
    minimum = getattr(getattr(args, "num_workers", None), "minimum", 0)
    if minimum and minimum < int(args.num_workers):
        overrides.append(f"train.min_workers={minimum}")
    if getattr(args, "miner_actors", None) is not None:
        overrides.append(f"negatives.encoder_actors={args.miner_actors}")
    if getattr(args, "miner_gpus", None) is not None:
        overrides.append(f"negatives.encoder_gpus={args.miner_gpus}")
    return overrides


def recipe_config(
    args: argparse.Namespace, overrides: Sequence[str] = (), *, then: Sequence[str] = ()
) -> SantaConfig:
    """``args.recipe`` with the workers/GPU flags and ``overrides``, then the user's --set,
    then ``then`` (which wins over --set)."""
    cluster = [f"train.num_workers={args.num_workers}", *cluster_overrides(args)]
    return with_recipes_that_fit(
        args.recipe,
        lambda: get_recipe(args.recipe).with_overrides(
            [*cluster, *overrides, *args.overrides, *then]
        ),
    )


def refuse_workers_in_process(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None
) -> None:
    """``--in-process`` with a ``--num-workers`` other than 1 on the command line is a usage
    error (exit 2): an in-process run trains on one worker."""
    given = argv if argv is not None else sys.argv[1:]
    named = any(a.split("=")[0] == "--num-workers" for a in given)
    if args.in_process and named and args.num_workers != 1:
        parser.error("--in-process trains on one worker: drop --num-workers")
