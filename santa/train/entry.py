"""The workers' entry point: what the driver hands Ray Train as the training function.

Kept apart from :mod:`santa.train.loop` so that the driver and Ray Train's controller,
which only pickle and unpickle the entry point, never import transformers or the model:
on a small head node that import is seconds of start-up before any worker exists. The
worker imports the loop when it runs, and it starts reading its first epoch before that
import (:class:`~santa.train.epochs.EpochReader`): the data pipeline's start-up (preparing
the tokenized set once, :mod:`santa.train.ingest`, then the first batches) overlaps the
imports and the model loading instead of following them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from santa.train.epochs import EpochReader
from santa.train.loop_config import LoopConfig


def start_first_epoch(loop: LoopConfig) -> EpochReader | None:
    """Start reading from epoch 0 now, for a run that starts at step 0 (a resumed run
    continues another epoch, known once its checkpoint is loaded)."""
    import ray.train

    if ray.train.get_checkpoint() is not None:
        return None
    context = ray.train.get_context()
    return EpochReader(
        lambda: ray.train.get_dataset_shard("train"),
        loop.santa.train,
        context.get_world_rank(),
        loop.batch_format,
        world_size=context.get_world_size(),
        pin_memory=loop.santa.train.use_gpu,
    )


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: starts the data, then imports and runs the worker's loop."""
    entered_at = time.time()
    if os.environ.get("SANTA_QUIET"):
        from santa.runtime.quiet import quiet_ray_data_console

        quiet_ray_data_console()
    first_epoch = start_first_epoch(LoopConfig.from_dict(loop_config))
    from santa.train.loop import train_loop_per_worker as run

    run(loop_config, first_epoch=first_epoch, entered_at=entered_at)
