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

import numpy as np

from santa.config import TrainConfig

_END = object()


class ArrayShard:
    """Tokenized columns in memory, read in batches as a Ray Data shard reads them
    (``iter_batches`` with the same arguments; where a shuffle is asked for, it is a seeded
    permutation of every row, not a buffer)."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        lengths = {len(values) for values in columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self.columns = columns
        self.rows = lengths.pop()

    @classmethod
    def read(cls, shard, batch_size: int = 4096) -> ArrayShard:
        """Every row of a (Ray Data) shard, read once in its order, held in memory."""
        parts: dict[str, list[np.ndarray]] = {}
        for batch in shard.iter_batches(
            batch_size=batch_size, drop_last=False, batch_format="numpy"
        ):
            for key, values in batch.items():
                parts.setdefault(key, []).append(values)
        if not parts:
            raise ValueError("a worker's shard of the training set is empty")
        return cls({key: np.concatenate(values) for key, values in parts.items()})

    def iter_batches(
        self,
        *,
        batch_size: int,
        drop_last: bool = True,
        batch_format: str = "numpy",
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Batches of ``batch_size`` rows (numpy), shuffled when a buffer is asked for."""
        if batch_format != "numpy":
            raise ValueError(f"ArrayShard reads numpy batches, not {batch_format!r}")
        order = np.arange(self.rows)
        if local_shuffle_buffer_size:
            order = np.random.default_rng(local_shuffle_seed).permutation(self.rows)
        end = self.rows - self.rows % batch_size if drop_last else self.rows
        for start in range(0, end, batch_size):
            rows = order[start : start + batch_size]
            yield {key: values[rows] for key, values in self.columns.items()}


def holds_in_memory(train: TrainConfig, batch_format: str) -> bool:
    """Whether a worker holds its share in memory and permutes it every epoch
    (``train.shuffle="global"``, for tokenized numpy batches)."""
    return train.shuffle == "global" and batch_format == "numpy"


def epoch_batches(
    shard,
    train: TrainConfig,
    rank: int,
    epoch: int,
    batch_format: str = "numpy",
    world_size: int | None = None,
) -> Iterator[Any]:
    """One epoch of this worker's shard, in batches of the per-worker batch size (of the
    ``world_size`` workers present: an elastic run keeps its global batch).

    The order is seeded by (seed, rank, epoch), so a resumed run repeats the uninterrupted
    one. Held in memory (:class:`ArrayShard`, ``train.shuffle="global"``): a permutation of
    the worker's whole share every epoch. Streamed (``local``): pairs arrive in corpus order
    (all functions of a file together) and a buffer of ``train.shuffle_buffer`` rows mixes
    them.
    """
    seed = train.seed + 1000 * rank + epoch
    if isinstance(shard, ArrayShard) and train.shuffle == "global":
        buffer: int | None = shard.rows
    else:
        buffer = train.shuffle_buffer or None
    return iter(
        shard.iter_batches(
            batch_size=train.per_worker_batch_size(world_size),
            drop_last=True,
            batch_format=batch_format,
            local_shuffle_buffer_size=buffer,
            local_shuffle_seed=seed if buffer else None,
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
            if holds_in_memory(self._train, self._format) and not isinstance(shard, ArrayShard):
                shard = ArrayShard.read(shard)  # once: every epoch permutes it
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
