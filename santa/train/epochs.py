"""A worker's batches, epoch after epoch: its slice of each global batch, read by row number
from the node's row file (:mod:`santa.train.rows`) in the epoch's global order
(:mod:`santa.train.order`), collated (tokenized) ahead of the training thread.

:class:`BackgroundRows` opens the row file (building it once per node) in a thread from the
worker's first moment on, while the worker imports the loop and loads the model.
:class:`EpochReader` then keeps a few collated batches ahead of the training thread, across
epoch boundaries, collating in ``threads`` threads (the tokenizers release the GIL), so the
next steps' batches are ready while the current one trains.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from santa.train.order import EpochPlan
from santa.train.rows import RowFile, RowSource, open_rows
from santa.train.tokens import TokenCache

__all__ = ["PREFETCH_BATCHES", "BackgroundRows", "EpochReader", "pin_batch"]

PREFETCH_BATCHES = 4
"""Batches an :class:`EpochReader` holds ahead of the training thread."""
_EPOCH_END = object()


class BackgroundRows:
    """This node's row file of ``source``, opened (built, the first time on a node) in a
    background thread from construction on; :meth:`result` waits for it."""

    def __init__(self, source: RowSource, cache_dir: str = "") -> None:
        self.started_at = time.time()
        self.ready_at: float | None = None
        self._future: Future = Future()
        self._thread = threading.Thread(
            target=self._open, args=(source, cache_dir), name="santa-rows", daemon=True
        )
        self._thread.start()

    def _open(self, source: RowSource, cache_dir: str) -> None:
        try:
            rows = open_rows(source, cache_dir)
        except BaseException as error:  # handed to the training thread in result()
            self._future.set_exception(error)
        else:
            self._future.set_result(rows)
        self.ready_at = time.time()

    def result(self) -> RowFile:
        """The row file (re-raising what opening it raised)."""
        return self._future.result()


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


class EpochReader:
    """A worker's batches from epoch ``start_epoch`` on, past its first ``skip`` global
    batches (those trained before a resume), read ahead in a background thread.

    Each batch is this worker's slice (``rank`` of ``world_size``, the workers present in
    an elastic run) of the next global batch of ``plan``: rows read from ``rows`` and handed
    to ``collate`` (a Table → the objective's batch). :meth:`epoch` yields the next epoch's
    batches; errors of reading or collating are raised there. Up to ``prefetch`` batches
    wait ahead, collated by ``threads`` threads. With ``pin_memory`` (training on a GPU)
    each batch's token ids go to pinned memory (:func:`pin_batch`), off the training thread.
    With ``tokens`` (the node's :class:`~santa.train.tokens.TokenCache`) rows collated
    before are read from it, and the others collated and kept there.
    """

    def __init__(
        self,
        rows: RowFile,
        plan: EpochPlan,
        collate: Callable[[Any], Any],
        *,
        rank: int = 0,
        world_size: int = 1,
        start_epoch: int = 0,
        skip: int = 0,
        prefetch: int = PREFETCH_BATCHES,
        threads: int = 1,
        pin_memory: bool = False,
        tokens: TokenCache | None = None,
    ) -> None:
        self.rows, self.plan, self._collate = rows, plan, collate
        self.tokens = tokens
        self._rank, self._world_size = rank, world_size
        self._pin = pin_memory
        self._epoch, self._skip = start_epoch, skip
        self._threads = max(1, threads)
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self.first_batch_at: float | None = None
        """``time.time()`` when the first batch was ready."""
        self.rows_read = 0
        """Rows this reader has read from the row file (collated or queued)."""
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

    def _load(self, order, batch: int) -> Any:
        """Worker ``rank``'s slice of global batch ``batch``: read, collated (a dict batch
        also gets its ``row`` numbers: what hard negatives are looked up by), pinned."""
        rows = order.batch_rows(batch, self._rank, self._world_size)
        if self.tokens is not None:
            collated = self.tokens.collate(self.rows, rows, self._collate)
        else:
            collated = self._collate(self.rows.take(rows))
        if isinstance(collated, dict):
            collated["row"] = np.asarray(rows, dtype=np.int64)  # (batch,)
        return pin_batch(collated) if self._pin else collated

    def _schedule(self) -> Iterator[tuple[int, Any, int]]:
        """``(epoch, order, batch)`` from the start on; ``batch`` -1 ends an epoch."""
        epoch, skip = self._epoch, self._skip
        if self.plan.batches_per_epoch < 1:
            raise ValueError(
                f"the training set has {self.plan.rows} rows: less than one global batch of "
                f"train.global_batch_size={self.plan.global_batch}"
            )
        while True:
            order = self.plan.epoch(epoch)
            for batch in range(skip, self.plan.batches_per_epoch):
                yield epoch, order, batch
            yield epoch, order, -1
            epoch, skip = epoch + 1, 0

    def _read(self) -> None:
        try:
            if self._pin:  # asked for a GPU; a worker without CUDA has no pinned memory
                import torch

                self._pin = torch.cuda.is_available()
            with ThreadPoolExecutor(self._threads, thread_name_prefix="santa-collate") as pool:
                pending: deque[tuple[int, Future | None]] = deque()
                for epoch, order, batch in self._schedule():
                    if self._stop.is_set():
                        return
                    if batch < 0:
                        pending.append((epoch, None))
                    else:
                        pending.append((epoch, pool.submit(self._load, order, batch)))
                        self.rows_read += self.plan.global_batch // self._world_size
                    while len(pending) > self._threads or (
                        pending and (pending[0][1] is None or pending[0][1].done())
                    ):
                        done_epoch, future = pending.popleft()
                        item = _EPOCH_END if future is None else future.result()
                        if item is not _EPOCH_END and self.first_batch_at is None:
                            self.first_batch_at = time.time()
                        if not self._put((done_epoch, item)):
                            return
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
