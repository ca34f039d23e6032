"""What the driver hands Ray Train: the workers' entry point and their settings.

Kept apart from :mod:`santa.train.loop` so that the driver and Ray Train's controller,
which only pickle and unpickle the entry point, never import transformers or the model:
on a small head node that import is seconds of start-up before any worker exists. The
worker imports the loop when it runs, and it starts reading its first epoch before that
import (:class:`FirstEpoch`): the data pipeline's start-up (Ray Data's coordinator and read
tasks, often seconds) then overlaps the imports and the model loading instead of
following them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from santa.config import SantaConfig, TrainConfig

_END = object()


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """What the driver hands every training worker; travels through Ray as a plain dict."""

    santa: SantaConfig
    init_model: str
    """The model folder every worker starts from (see ``trainer.prepare_initial_model``)."""
    train_rows: int | None = None
    """Pairs in the training data, when counted (an epoch-based schedule needs it)."""
    torch_threads: int = 1
    """Intra-op threads of each worker's torch."""
    tensorboard_dir: str = ""
    """Where rank 0 writes TensorBoard events; empty: none."""
    tensorboard_uri: str = ""
    """Storage copy of ``tensorboard_dir`` (S3 runs), refreshed at every checkpoint, so the
    curves outlive the rank-0 node; empty: the events are written in storage already."""
    metrics_uri: str = ""
    """Rank 0 keeps every logged step's metrics here as JSON lines (the run's whole history;
    Ray keeps metrics only with checkpoints); empty: not kept."""
    stop_at_step: int = 0
    """Stop (with a checkpoint) at this step though the schedule spans the run; 0: no."""
    data_uri: str = ""
    """The preprocessed pairs (hard negatives look their documents up there)."""
    miner_name: str = ""
    """The named actor of ``async`` hard negatives."""
    eval_data: str = ""
    """A BEIR folder for dev metrics; empty: none."""
    eval_split: str = "test"
    """The qrels split of ``eval_data``."""
    registered_checkpoints: tuple[str, ...] = ()
    """The run's registered checkpoints, newest first: resume falls back along them when
    the latest does not load (``santa.train.resume``)."""

    def __post_init__(self) -> None:
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be at least 1, got {self.torch_threads}")
        if self.stop_at_step < 0:
            raise ValueError(f"stop_at_step must not be negative, got {self.stop_at_step}")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict for Ray's ``train_loop_config``."""
        payload = {f.name: getattr(self, f.name) for f in fields(self)}
        payload["santa"] = self.santa.to_dict()
        return payload

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> LoopConfig:
        """Rebuild from :meth:`to_dict`, rejecting unknown keys."""
        unknown = set(payload) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown loop config keys: {sorted(unknown)}")
        return cls(**{**payload, "santa": SantaConfig.from_dict(payload["santa"])})


def epoch_batches(shard, train: TrainConfig, rank: int, epoch: int) -> Iterator[Any]:
    """One epoch of this worker's shard, in numpy batches of the per-worker batch size."""
    return iter(
        shard.iter_batches(
            batch_size=train.per_worker_batch_size(),
            drop_last=True,
            batch_format="numpy",
            # Pairs arrive in corpus order (all functions of a file together); a seeded
            # local shuffle makes in-batch negatives come from across the corpus and keeps
            # the order reproducible (so a resumed run repeats the uninterrupted one).
            local_shuffle_buffer_size=train.shuffle_buffer or None,
            local_shuffle_seed=(train.seed + 1000 * rank + epoch if train.shuffle_buffer else None),
        )
    )


class FirstEpoch:
    """Epoch 0's batches, the first one pulled in a background thread from construction on.

    Pulling the first batch is what starts the pipeline (Ray Data's split coordinator, its
    read and tokenize tasks, each a fresh process on a fresh cluster). :meth:`batches`
    waits for it and re-raises what the pipeline raised.
    """

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self._first: Any = _END
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._pull, name="santa-first-batch", daemon=True)
        self._thread.start()

    def _pull(self) -> None:
        try:
            self._first = next(self._batches, _END)
        except BaseException as error:  # handed to the training thread in batches()
            self._error = error

    def batches(self) -> Iterator[Any]:
        """The epoch's batches: the prefetched first, then the rest."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._first is _END:
            return
        first, self._first = self._first, _END
        yield first
        yield from self._batches


def start_first_epoch(loop: LoopConfig) -> FirstEpoch | None:
    """Start reading epoch 0 now, for a run that starts at step 0 (a resumed run continues
    another epoch, known once its checkpoint is loaded)."""
    import ray.train

    if ray.train.get_checkpoint() is not None:
        return None
    shard = ray.train.get_dataset_shard("train")
    rank = ray.train.get_context().get_world_rank()
    return FirstEpoch(epoch_batches(shard, loop.santa.train, rank, epoch=0))


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: starts the data, then imports and runs the worker's loop."""
    first_epoch = start_first_epoch(LoopConfig.from_dict(loop_config))
    from santa.train.loop import train_loop_per_worker as run

    run(loop_config, first_epoch=first_epoch)
