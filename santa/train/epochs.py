"""Reading a worker's shard: one epoch's batches, and every epoch read ahead.

Pulling the first batch is what starts the data pipeline (Ray Data's split coordinator, its
read and tokenize tasks, each a fresh process on a fresh cluster). :class:`EpochReader`
does it in a background thread from the worker's first moment on, while the worker imports
the loop and loads the model, and keeps a few batches ahead of the training thread from
then on, across epoch boundaries: the next epoch's first batches are read while the last
steps of the current one train. (:class:`FirstEpoch` reads ahead epoch 0 only.)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from santa.config import TrainConfig

_END = object()


def epoch_batches(
    shard,
    train: TrainConfig,
    rank: int,
    epoch: int,
    batch_format: str = "numpy",
    world_size: int | None = None,
) -> Iterator[Any]:
    """One epoch of this worker's shard, in batches of the per-worker batch size (of the
    ``world_size`` workers present: an elastic run keeps its global batch)."""
    return iter(
        shard.iter_batches(
            batch_size=train.per_worker_batch_size(world_size),
            drop_last=True,
            batch_format=batch_format,
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


def pin_batch(batch: Any) -> Any:
    """A numpy batch's integer columns as tensors in pinned (page-locked) host memory, so
    the training thread copies them to the GPU without waiting (``non_blocking``); other
    columns (ids, texts) and other batch formats stay as they are."""
    import numpy as np
    import torch

    if not isinstance(batch, dict):
        return batch
    return {
        key: torch.from_numpy(np.ascontiguousarray(value, dtype=np.int64)).pin_memory()
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu"
        else value
        for key, value in batch.items()
    }


PREFETCH_BATCHES = 4
"""Batches an :class:`EpochReader` holds ahead of the training thread."""
_EPOCH_END = object()


class EpochReader:
    """A worker's shard, epoch after epoch, read ahead in a background thread.

    ``open_shard`` gives the shard (``ray.train.get_dataset_shard``; called in the thread,
    since it waits for the dataset to be prepared). Epochs start at ``start_epoch``; the
    first skips ``skip`` batches (those trained before a resume). :meth:`epoch` yields the
    next epoch's batches; errors of the pipeline are raised there. The thread keeps
    ``prefetch`` batches queued, running into the next epoch while the current one's last
    batches train. Batches are the per-worker size of ``world_size`` workers (those
    present, in an elastic run). With ``pin_memory`` (training on a GPU) the thread puts
    each batch's token ids in pinned memory (:func:`pin_batch`), off the training thread.
    """

    def __init__(
        self,
        open_shard: Callable[[], Any],
        train: TrainConfig,
        rank: int,
        batch_format: str = "numpy",
        *,
        world_size: int | None = None,
        start_epoch: int = 0,
        skip: int = 0,
        prefetch: int = PREFETCH_BATCHES,
        pin_memory: bool = False,
    ) -> None:
        self._open_shard = open_shard
        self._pin = pin_memory
        self._train, self._rank, self._format = train, rank, batch_format
        self._world_size = world_size  # of the workers present (elastic runs)
        self._epoch, self._skip = start_epoch, skip
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self.first_batch_at: float | None = None
        """``time.time()`` when the first batch was ready (the data pipeline's start-up)."""
        self._thread = threading.Thread(target=self._read, name="santa-epochs", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        import time

        try:
            if self._pin:  # asked for a GPU; a worker without CUDA has no pinned memory
                import torch

                self._pin = torch.cuda.is_available()
            shard = self._open_shard()
            epoch, skip = self._epoch, self._skip
            while not self._stop.is_set():
                batches = epoch_batches(
                    shard, self._train, self._rank, epoch, self._format, self._world_size
                )
                for batch in batches:
                    if skip:
                        skip -= 1
                        continue
                    if self._pin:
                        batch = pin_batch(batch)
                    if self.first_batch_at is None:
                        self.first_batch_at = time.time()
                    if not self._put((epoch, batch)):
                        return
                if not self._put((epoch, _EPOCH_END)):
                    return
                epoch += 1
        except BaseException as error:  # handed to the training thread in epoch()
            self._put((None, error))

    def epoch(self) -> Iterator[Any]:
        """The next epoch's batches, in order."""
        while True:
            epoch, item = self._queue.get()
            if epoch is None:
                raise item
            if item is _EPOCH_END:
                return
            yield item

    def close(self) -> None:
        """Stop reading ahead (the thread ends at its next batch)."""
        self._stop.set()
