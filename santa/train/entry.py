"""The workers' entry point: what the driver hands Ray Train as the training function.

Kept apart from :mod:`santa.train.loop` so that the driver and Ray Train's controller,
which only pickle and unpickle the entry point, never import transformers or the model:
on a small head node that import is seconds of start-up before any worker exists. The
worker imports the loop when it runs, and it starts opening the node's row file before
that import (:class:`~santa.train.epochs.BackgroundRows`): building it, the first time a
node trains on a data version, overlaps the imports and the model loading instead of
following them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from santa.train.epochs import BackgroundRows
from santa.train.loop_config import LoopConfig, training_data


def start_rows(loop: LoopConfig) -> BackgroundRows:
    """Start opening (building, once per node) the row file of ``loop``'s objective now."""
    return BackgroundRows(training_data(loop).source, loop.row_cache)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: starts the data, then imports and runs the worker's loop."""
    entered_at = time.time()
    if os.environ.get("SANTA_QUIET"):
        from santa.jobs.quiet import quiet_ray_data_console

        quiet_ray_data_console()
    rows = start_rows(LoopConfig.from_dict(loop_config))
    from santa.train.loop import train_loop_per_worker as run

    run(loop_config, rows=rows, entered_at=entered_at)
