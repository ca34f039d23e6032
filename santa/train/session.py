"""Where a worker loop runs: under Ray Train, or in plain processes.

:class:`~santa.train.loop.WorkerTrainer` touches its surroundings only through a session:
its rank and world, the checkpoint to resume from, wrapping the model for data parallelism,
and reporting metrics (with a checkpoint folder). Under Ray Train that is
:class:`RaySession` (``ray.train``'s context, ``prepare_model``, ``ray.train.report``);
:class:`LocalSession` runs the same loop, step, reports, checkpoints and resumes without
Ray: in one process, or as one of several processes of a ``torch.distributed`` group
(gloo on CPU), so that tests and benchmarks call the real step instead of a copy of it.
Both read the training rows the same way, from the node's row file
(:mod:`santa.train.epochs`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

__all__ = ["LocalCheckpoint", "LocalSession", "RaySession", "Session"]


class Session(Protocol):
    """What the worker loop asks of where it runs."""

    rank: int
    world_size: int

    def checkpoint(self) -> Any:
        """The checkpoint to resume from, or None for a fresh run."""

    def resume_candidates(self, registered: list[str]) -> list[Any]:
        """The checkpoints to try, newest first, when resuming (``registered``: the run's
        registered checkpoint URIs, newest first)."""

    def device(self) -> torch.device:
        """The worker's device."""

    def prepare_model(
        self, model: torch.nn.Module, *, use_gpu: bool, find_unused_parameters: bool
    ) -> torch.nn.Module:
        """The model on its device, wrapped for data parallelism where there are peers."""

    def report(self, metrics: dict[str, float], checkpoint_dir: str | None = None) -> None:
        """Report a window's metrics, with rank 0's checkpoint folder when there is one."""

    def barrier(self) -> None:
        """Wait for every other rank to get here."""


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

    def resume_candidates(self, registered: list[str]) -> list[Any]:
        """Ray's latest checkpoint, then the older registered ones."""
        from santa.train.resume import ray_candidates

        return ray_candidates(self.checkpoint(), registered)

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

    def report(self, metrics: dict[str, float], checkpoint_dir: str | None = None) -> None:
        """``ray.train.report`` (a barrier on every rank); ``checkpoint_dir`` from rank 0."""
        import ray.train

        if checkpoint_dir is None:
            ray.train.report(metrics)
            return
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_upload_fn=upload_checkpoint)

    def barrier(self) -> None:
        """The workers' process group's barrier (Ray Train set it up; none alone)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()


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

    from santa.files import storage

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


class LocalCheckpoint:
    """A checkpoint folder on this machine, as the loop reads Ray Train's checkpoints
    (``path`` and ``filesystem``)."""

    def __init__(self, path: str) -> None:
        import pyarrow.fs

        self.path = path
        self.filesystem = pyarrow.fs.LocalFileSystem()

    def __repr__(self) -> str:
        return f"LocalCheckpoint({self.path!r})"


class LocalSession:
    """The loop without Ray: rank ``rank`` of ``world_size`` processes (more than one: a
    ``torch.distributed`` group must be up, and the model is wrapped in DDP), reports kept
    in :attr:`reports`. Checkpoint folders are copied under ``checkpoint_root``
    (``checkpoint_<step>``) when one is given, and a session over a root that holds some
    resumes from the newest, as Ray Train resumes a run from its storage. ``on_report``
    (rank 0's) gets each report's metrics and the folder its checkpoint was kept in (None
    without one), once kept: a Tune trial training in process forwards them to Tune."""

    def __init__(
        self,
        *,
        device: str | torch.device = "cpu",
        checkpoint_root: str = "",
        rank: int = 0,
        world_size: int = 1,
        on_report: Callable[[dict[str, float], str | None], None] | None = None,
    ) -> None:
        self._device = torch.device(device)
        self.checkpoint_root = checkpoint_root
        self.rank, self.world_size = rank, world_size
        self.on_report = on_report
        self.reports: list[dict[str, float]] = []
        # The checkpoint folders this session copied, with the metrics reported beside each.
        self.saved: list[tuple[str, dict[str, float]]] = []

    def checkpoints(self) -> list[str]:
        """The checkpoint folders under the root, newest first."""
        root = Path(self.checkpoint_root) if self.checkpoint_root else None
        if root is None or not root.is_dir():
            return []
        return [str(p) for p in sorted(root.glob("checkpoint_*"), reverse=True)]

    def checkpoint(self) -> LocalCheckpoint | None:
        """The newest checkpoint under the root, or None (a fresh run)."""
        found = self.checkpoints()
        return LocalCheckpoint(found[0]) if found else None

    def resume_candidates(self, registered: list[str]) -> list[Any]:
        """Every checkpoint under the root, newest first."""
        return [LocalCheckpoint(path) for path in self.checkpoints()]

    def device(self) -> torch.device:
        return self._device

    def prepare_model(
        self, model: torch.nn.Module, *, use_gpu: bool, find_unused_parameters: bool
    ) -> torch.nn.Module:
        """The model on the session's device, in DDP when there are peers."""
        model = model.to(self._device if use_gpu else torch.device("cpu"))
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, find_unused_parameters=find_unused_parameters)

    def report(self, metrics: dict[str, float], checkpoint_dir: str | None = None) -> None:
        """Keep the metrics; copy the checkpoint folder when there is a root to keep it in
        (rank 0's, or every rank's part of a sharded one, merged). The ranks meet here, as
        at Ray Train's report. The copy appears whole or not at all: written under a hidden
        name, then renamed, so that a run interrupted mid-copy resumes from (and names) the
        checkpoint before it."""
        self.reports.append(dict(metrics))
        target = partial = None
        if self.checkpoint_root:
            target = Path(self.checkpoint_root) / f"checkpoint_{int(metrics['step']):06d}"
            partial = target.with_name(f".{target.name}.partial")
        # Rank 0 holds a checkpoint whenever one is reported; the other ranks may hold none
        # (only rank 0 saves an unsharded model), so every rank meets at every report.
        keeps = partial is not None and self.rank == 0 and checkpoint_dir is not None
        if keeps:
            shutil.rmtree(partial, ignore_errors=True)
        self.barrier()
        if partial is not None and checkpoint_dir is not None:
            # The ranks write disjoint files (a sharded checkpoint's parts), so they merge.
            shutil.copytree(checkpoint_dir, partial, dirs_exist_ok=True)
        self.barrier()
        if keeps:
            if target.exists():
                shutil.rmtree(target)
            partial.rename(target)
            self.saved.append((str(target), dict(metrics)))
        self.barrier()
        if self.on_report is not None and self.rank == 0:
            self.on_report(dict(metrics), str(target) if keeps else None)

    def barrier(self) -> None:
        """Wait for the other ranks (nothing to wait for alone)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()
