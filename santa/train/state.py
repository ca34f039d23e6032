"""Training state on disk: model, optimizer, scheduler, RNG and loop counters.

A checkpoint folder is ``model/`` (HF ``save_pretrained`` + ``santa_config.json``),
``optimizer.pt``, ``scheduler.pt``, ``rng_state.pt`` and ``trainer_state.json``; resuming
from it repeats the uninterrupted run. Also the learning-rate schedule and the run length.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from santa.config import SantaConfig
from santa.files.layout import STATE_FILE

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng_state.pt"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def linear_warmup_schedule(optimizer, warmup_steps: int, total_steps: int):
    """Linear warm-up from 0 to the peak learning rate over ``warmup_steps``, then linear
    decay to zero at ``total_steps``: Hugging Face's ``get_linear_schedule_with_warmup``
    itself (SANTA's released Trainer's schedule; its first step has a learning rate of 0
    when there is a warm-up)."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)


def save_loop_state(
    directory: str, optimizer: torch.optim.Optimizer | None, scheduler, state: dict[str, Any]
) -> None:
    """Write optimizer, scheduler, RNG and loop state into a checkpoint ``directory``
    (``optimizer=None``: the optimizer is saved apart, sharded: santa.train.sharding)."""
    if optimizer is not None:
        torch.save(optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))
    torch.save(scheduler.state_dict(), os.path.join(directory, SCHEDULER_FILE))
    # Dropout draws from these: a resumed run repeats the uninterrupted one only with them.
    rng = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, os.path.join(directory, RNG_FILE))
    with open(os.path.join(directory, STATE_FILE), "w") as handle:
        json.dump(state, handle)


def load_loop_state(
    directory: str, optimizer: torch.optim.Optimizer | None, scheduler
) -> dict[str, Any]:
    """Restore what :func:`save_loop_state` wrote; returns the loop state."""
    if optimizer is not None:
        optimizer.load_state_dict(
            torch.load(os.path.join(directory, OPTIMIZER_FILE), weights_only=False)
        )
    scheduler.load_state_dict(
        torch.load(os.path.join(directory, SCHEDULER_FILE), weights_only=False)
    )
    rng = torch.load(os.path.join(directory, RNG_FILE), weights_only=False)
    torch.set_rng_state(rng["torch"])
    # Checkpoints of SCodeR's discriminators from before the one loop kept torch's only.
    if "numpy" in rng:
        np.random.set_state(rng["numpy"])
    if "python" in rng:
        random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    with open(os.path.join(directory, STATE_FILE)) as handle:
        return json.load(handle)


def total_steps(config: SantaConfig, batches_per_epoch: int) -> int:
    """Steps to run: ``max_steps``, else epochs × the global batches per epoch."""
    if config.train.max_steps:
        return config.train.max_steps
    return max(1, config.train.epochs * batches_per_epoch)


@contextmanager
def local_checkpoint(checkpoint: Any) -> Iterator[str]:
    """A local directory with the checkpoint's files, private to this process.

    ``Checkpoint.as_directory`` shares one download directory among the processes of a
    node, and a process that finds it unlocked downloads into it again (Ray 2.60,
    ``Checkpoint.to_directory``), rewriting files that another rank is still reading:
    ranks of one node resuming from S3 read truncated files. A checkpoint on a local
    filesystem is read in place.
    """
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield checkpoint.path
        return
    with tempfile.TemporaryDirectory(prefix="santa-resume-") as directory:
        yield checkpoint.to_directory(directory)
