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

        if checkpoint_dir is None:
            ray.train.report(metrics)
            return
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_upload_fn=upload_checkpoint)


def upload_checkpoint(checkpoint: Any, name: str) -> Any:
    """Ray Train's own checkpoint upload (``StorageContext.persist_current_checkpoint``), its
    faults one santa line (``ray.train.report``'s ``checkpoint_upload_fn``)."""
    import ray.train

    context = ray.train.get_context().get_storage()
    destination = context.build_checkpoint_path_from_name(name)
    filesystem = context.storage_filesystem
    persist_checkpoint(
        checkpoint.path, checkpoint.filesystem, filesystem, context.experiment_fs_path, destination
    )
    return ray.train.Checkpoint(filesystem=filesystem, path=destination)


def persist_checkpoint(
    source: str, source_filesystem: Any, filesystem: Any, run_path: str, destination: str
) -> None:
    """Copy the checkpoint folder ``source`` to ``destination`` as Ray Train does: the run's
    storage marker checked first (storage that this node cannot see, a head node's local
    folder, fails here), then the files copied.

    Ray Train 2.60 tries an upload whose error reads "AWS Error NETWORK_CONNECTION" three
    times, each with all of pyarrow's attempts: an endpoint gone silent held a checkpoint
    ~63 s (3 x 20 s with santa's timeouts, and two backoffs) where santa bounds each S3 call
    by its own attempts (~20 s). Here every fault is santa's one line naming the URI, which
    Ray Train does not try again.
    """
    import pyarrow.fs as pafs

    from santa.runtime import storage

    on_s3 = isinstance(filesystem, pafs.S3FileSystem)

    def uri(path: str) -> str:
        return f"s3://{path}" if on_s3 else path

    marker = f"{run_path}/.validate_storage_marker"  # Ray Train's, written by its controller
    found = storage.classified(lambda: filesystem.get_file_info(marker), uri(marker), "read")
    if found.type == pafs.FileType.NotFound:
        raise storage.StorageError(
            f"the run's storage {uri(run_path)} cannot be seen from this node (no "
            f"{uri(marker)}): use an s3:// URI or a folder that every node shares for --storage"
        )

    def copy() -> None:
        filesystem.create_dir(destination)
        pafs.copy_files(
            source,
            destination,
            source_filesystem=source_filesystem,
            destination_filesystem=filesystem,
            # Ray Train's settings: no threads for uploads to S3 (apache/arrow#32372), large
            # chunks for large checkpoints.
            use_threads=not on_s3,
            chunk_size=64 * 1024 * 1024,
        )

    storage.classified(copy, uri(destination), "upload to")


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
