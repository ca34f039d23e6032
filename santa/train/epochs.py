"""Reading a worker's shard: one epoch's batches, and epoch 0 read ahead of the model.

Pulling the first batch is what starts the data pipeline (Ray Data's split coordinator, its
read and tokenize tasks, each a fresh process on a fresh cluster): :class:`FirstEpoch`
starts it in a background thread while the worker imports the loop and loads the model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
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
