"""Where a worker loop runs: under Ray Train, or in a plain process.

:class:`~santa.train.loop.WorkerTrainer` touches its surroundings only through a session:
its rank and world, the checkpoint to resume from, wrapping the model for data parallelism,
its shard of the training set, and reporting metrics (with a checkpoint folder). Under Ray
Train that is :class:`RaySession` (``ray.train``'s context, ``prepare_model``, the dataset
shard, ``ray.train.report``); :class:`LocalSession` runs the same loop, step and reports in
one process without Ray, over tokenized columns held in memory (:class:`ArrayShard`), so
benchmarks and tests call the real step instead of a copy of it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Protocol

import torch

from santa.train.epochs import ArrayShard

__all__ = ["ArrayShard", "LocalSession", "RaySession", "Session"]


class Session(Protocol):
    """What the worker loop asks of where it runs."""

    rank: int
    world_size: int

    def checkpoint(self) -> Any:
        """The checkpoint to resume from, or None for a fresh run."""

    def device(self) -> torch.device:
        """The worker's device."""

    def prepare_model(
        self, model: torch.nn.Module, *, use_gpu: bool, find_unused_parameters: bool
    ) -> torch.nn.Module:
        """The model on its device, wrapped for data parallelism where there are peers."""

    def open_shard(self) -> Any:
        """The worker's shard: ``iter_batches(batch_size=..., ...)`` as Ray Data's."""

    def report(self, metrics: dict[str, float], checkpoint_dir: str | None = None) -> None:
        """Report a window's metrics, with rank 0's checkpoint folder when there is one."""


class RaySession:
    """The worker's Ray Train context (Train V2)."""

    def __init__(self) -> None:
        import ray.train

        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()

    def checkpoint(self) -> Any:
        """The run's latest registered checkpoint (``ray.train.Checkpoint``), or None."""
        import ray.train

        return ray.train.get_checkpoint()

    def device(self) -> torch.device:
        """This worker's device as Ray Train assigned it."""
        import ray.train.torch

        return ray.train.torch.get_device()

    def prepare_model(
        self, model: torch.nn.Module, *, use_gpu: bool, find_unused_parameters: bool
    ) -> torch.nn.Module:
        """The model on the worker's device, wrapped in DDP when there are several workers."""
        import ray.train.torch

        return ray.train.torch.prepare_model(
            model,
            # A GPU-shaped request on a worker without CUDA (gloo, a fake GPU resource)
            # trains on the CPU.
            move_to_device=True if use_gpu else torch.device("cpu"),
            parallel_strategy_kwargs={"find_unused_parameters": find_unused_parameters},
        )

    def open_shard(self) -> Any:
        """This worker's shard of the training set (waits for the dataset to be prepared)."""
        import ray.train

        return ray.train.get_dataset_shard("train")

    def report(self, metrics: dict[str, float], checkpoint_dir: str | None = None) -> None:
        """``ray.train.report`` (a barrier on every rank); ``checkpoint_dir`` from rank 0."""
        import ray.train

        checkpoint = (
            None if checkpoint_dir is None else ray.train.Checkpoint.from_directory(checkpoint_dir)
        )
        ray.train.report(metrics, checkpoint=checkpoint)


class LocalSession:
    """One worker in this process, without Ray: rank 0 of 1, the model unwrapped, reports
    kept in :attr:`reports`; checkpoint folders copied under ``checkpoint_root`` when one is
    given (``checkpoint_<step>``), else dropped. Starts fresh (no resume)."""

    rank = 0
    world_size = 1

    def __init__(
        self, shard: ArrayShard, *, device: str | torch.device = "cpu", checkpoint_root: str = ""
    ) -> None:
        self.shard = shard
        self._device = torch.device(device)
        self.checkpoint_root = checkpoint_root
        self.reports: list[dict[str, float]] = []

    def checkpoint(self) -> None:
        """A local run starts fresh."""
        return None

    def device(self) -> torch.device:
        return self._device

    def prepare_model(
        self, model: torch.nn.Module, *, use_gpu: bool, find_unused_parameters: bool
    ) -> torch.nn.Module:
        """The model on the session's device (one process: no DDP)."""
        return model.to(self._device if use_gpu else torch.device("cpu"))

    def open_shard(self) -> ArrayShard:
        return self.shard

    def report(self, metrics: dict[str, float], checkpoint_dir: str | None = None) -> None:
        """Keep the metrics; copy the checkpoint folder when there is a root to keep it in."""
        self.reports.append(dict(metrics))
        if checkpoint_dir is not None and self.checkpoint_root:
            target = Path(self.checkpoint_root) / f"checkpoint_{int(metrics['step']):06d}"
            shutil.copytree(checkpoint_dir, target, dirs_exist_ok=True)


def local_shard(data_uri: str, tokenizer_path: str, config) -> ArrayShard:
    """The preprocessed pairs under ``data_uri`` tokenized as the streaming training input
    tokenizes them (:func:`santa.train.data.tokenize_pairs`), held in memory."""
    from santa.data.published import read_pairs
    from santa.train.data import tokenization_settings, tokenize_pairs

    pairs = read_pairs(data_uri)
    return ArrayShard(
        tokenize_pairs(pairs, tokenizer_path=tokenizer_path, **tokenization_settings(config))
    )
