"""The order of the training rows: one global order per epoch, cut into global batches.

Every worker computes the same order from the seed and the epoch alone, and takes its
slice of each global batch: global batch ``b`` is the rows at positions
``b·G … (b+1)·G − 1`` of the epoch's order (``G`` = ``train.global_batch_size``), and of
``W`` workers, worker ``r`` takes positions ``b·G + r·G/W … b·G + (r+1)·G/W − 1``. So 1, 2
or 64 workers train on the same rows in every global batch, and a run resumed on another
number of workers (an elastic resize) goes on from the next global batch it has not
trained: within an epoch no row is trained twice and none is skipped.

The order of an epoch (:class:`EpochPlan`):

- ``shuffle="global"``: a seeded permutation of every row, new each epoch: NumPy's
  (``Generator.shuffle`` of the row numbers, 4 bytes a row) up to :data:`EXACT_ROWS` rows,
  and past that a pseudorandom permutation computed position by position
  (:class:`IndexPermutation`), so that a worker never holds the order of a set of a
  hundred million rows. Any global batch is found at once (a resume, a resize).
- ``shuffle="local"``: the rows in corpus order through a seeded shuffle buffer of
  ``train.shuffle_buffer`` rows (:func:`buffered_order`), as a streamed dataset is shuffled
  (SANTA's released code streams its files through a 10,000-row buffer, OpenMatch's
  ``StreamTrainDatasetMixin`` / Hugging Face's ``IterableDataset.shuffle``); buffer 0 keeps
  corpus order.

An epoch has ``rows // G`` global batches, or with ``drop_last=False`` (the released
code's setting) ``ceil(rows / G)``, the last one completed with the epoch's first rows, as
``torch.utils.data.DistributedSampler`` pads its last batch: every step keeps one shape.

With units (``groups``: ESCI's one example per query and epoch, the released code's
epoch), a position names a unit, and unit ``u`` trains its row
``(seed + epoch) mod len(u)`` that epoch, as SANTA's ``Sdataset`` rotates a query's
positives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["EXACT_ROWS", "EpochOrder", "EpochPlan", "IndexPermutation", "buffered_order"]

EXACT_ROWS = 1 << 22
"""Up to this many rows (16 MB of int32 a worker) an epoch's order is NumPy's permutation;
past it, :class:`IndexPermutation`'s (constant memory)."""
_ROUNDS = 8
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijective 64-bit mixer (Steele et al., 2014)."""
    with np.errstate(over="ignore"):
        z = values + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


class IndexPermutation:
    """A seeded pseudorandom permutation of ``range(n)``, evaluated position by position.

    A balanced Feistel network of eight rounds (Luby and Rackoff: four rounds of a
    pseudorandom function give a strong pseudorandom permutation; eight keep small
    domains, whose halves have few bits, statistically uniform too) over the smallest
    power-of-four domain that holds ``n``, whose round function is SplitMix64 keyed by
    ``seed``; a position mapped outside ``range(n)`` is mapped again until it lands inside
    (cycle walking, Black and Rogaway), which keeps it a bijection of ``range(n)``. The
    same construction shuffles TensorFlow's ``index_shuffle`` and Grain's global shuffle:
    O(1) memory whatever ``n``, where ``numpy.random.permutation`` holds 8 bytes a row.

    Example::

        >>> order = IndexPermutation(10, seed=[42, 0])
        >>> sorted(order(np.arange(10)).tolist()) == list(range(10))
        True
    """

    def __init__(self, n: int, seed: int | Sequence[int]) -> None:
        if n < 1:
            raise ValueError(f"a permutation needs at least one row, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        keys = np.random.default_rng(seed).integers(0, 2**63, size=_ROUNDS, dtype=np.int64)
        self._keys = keys.astype(np.uint64)

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        left, right = values >> self._half, values & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix(right ^ key) & self._mask)
        return (left << self._half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The rows at ``positions`` (each in ``range(n)``) of the permutation, int64."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n):
            raise IndexError(f"positions must be in [0, {self.n})")
        values = self._encrypt(positions.astype(np.uint64))
        outside = values >= np.uint64(self.n)
        while outside.any():
            values[outside] = self._encrypt(values[outside])
            outside = values >= np.uint64(self.n)
        return values.astype(np.int64)


def buffered_order(n: int, buffer: int, seed: int | Sequence[int]) -> Iterator[np.ndarray]:
    """``range(n)`` in corpus order through a seeded shuffle buffer of ``buffer`` rows, in
    chunks (int64 arrays); ``buffer`` 0 or 1 keeps corpus order.

    The algorithm of Hugging Face's ``IterableDataset.shuffle`` (and Ray Data's local
    shuffle buffer): fill the buffer, then for each next row emit a random buffered one and
    put the new row in its place; at the end emit the rest of the buffer shuffled.
    """
    chunk = 65_536
    if buffer <= 1:
        for start in range(0, n, chunk):
            yield np.arange(start, min(n, start + chunk), dtype=np.int64)
        return
    rng = np.random.default_rng(seed)
    held = list(range(min(buffer, n)))
    position = len(held)
    while position < n:
        count = min(chunk, n - position)
        # The slots drawn in blocks: one call per block, not per row.
        slots = rng.integers(0, len(held), size=count)
        out: list[int] = []
        for offset, slot in enumerate(slots.tolist()):
            out.append(held[slot])
            held[slot] = position + offset
        position += count
        yield np.asarray(out, dtype=np.int64)
    rng.shuffle(held)
    if held:
        yield np.asarray(held, dtype=np.int64)


@dataclass(frozen=True)
class EpochPlan:
    """Which rows each global batch of each epoch holds, and each worker's slice of it.

    ``rows``: the training rows (or units, with ``groups``); ``global_batch``: rows per
    optimizer step over all workers; ``shuffle`` and ``buffer`` as ``train.shuffle`` and
    ``train.shuffle_buffer``; ``drop_last``: an epoch's incomplete last batch is dropped
    (else completed with the epoch's first rows). ``groups``: optional
    ``(offsets, members)``, a CSR list of the rows of each unit (unit ``u`` owns
    ``members[offsets[u]:offsets[u + 1]]``).
    """

    rows: int
    global_batch: int
    seed: int
    shuffle: str = "global"
    buffer: int = 0
    drop_last: bool = True
    groups: tuple[np.ndarray, np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise ValueError(f"global_batch must be positive, got {self.global_batch}")
        if self.shuffle not in ("global", "local"):
            raise ValueError(f"shuffle must be 'global' or 'local', got {self.shuffle!r}")
        if self.groups is not None and len(self.groups[0]) != self.rows + 1:
            raise ValueError(f"{len(self.groups[0]) - 1} groups for {self.rows} units")

    @property
    def batches_per_epoch(self) -> int:
        """Global batches (optimizer steps) in one epoch."""
        if self.drop_last:
            return self.rows // self.global_batch
        return math.ceil(self.rows / self.global_batch)

    def epoch(self, epoch: int) -> EpochOrder:
        """The order of ``epoch``."""
        return EpochOrder(self, epoch)


class EpochOrder:
    """One epoch's order (:meth:`EpochPlan.epoch`): the rows of any worker's slice of any
    global batch. Drawn once per epoch as an array of row numbers (int32 where they fit),
    or, for a global shuffle of more than :data:`EXACT_ROWS` rows, computed position by
    position."""

    def __init__(self, plan: EpochPlan, epoch: int) -> None:
        self.plan, self.epoch = plan, epoch
        seed = [plan.seed, epoch]
        self._permutation: IndexPermutation | None = None
        self._array: np.ndarray | None = None
        dtype = np.int32 if plan.rows < 2**31 else np.int64
        if plan.shuffle == "global" and plan.rows > EXACT_ROWS:
            self._permutation = IndexPermutation(plan.rows, seed)
        elif plan.shuffle == "global":
            self._array = np.arange(plan.rows, dtype=dtype)
            np.random.default_rng(seed).shuffle(self._array)
        else:
            parts = list(buffered_order(plan.rows, plan.buffer, seed))
            self._array = np.concatenate(parts).astype(dtype)

    def positions(self, batch: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """The epoch positions of worker ``rank``'s slice (of ``world_size``) of global
        batch ``batch``; positions past the last row wrap to the epoch's first ones."""
        plan = self.plan
        if plan.global_batch % world_size:
            raise ValueError(
                f"global batch {plan.global_batch} is not divisible by {world_size} workers"
            )
        if not 0 <= batch < plan.batches_per_epoch:
            raise IndexError(f"batch {batch} of an epoch of {plan.batches_per_epoch}")
        size = plan.global_batch // world_size
        start = batch * plan.global_batch + rank * size
        return np.arange(start, start + size, dtype=np.int64) % plan.rows

    def rows_at(self, positions: np.ndarray) -> np.ndarray:
        """The row indices at epoch ``positions`` (units resolved to their row)."""
        if self._permutation is not None:
            units = self._permutation(positions)
        else:
            units = self._array[positions].astype(np.int64)
        if self.plan.groups is None:
            return units
        offsets, members = self.plan.groups
        sizes = offsets[units + 1] - offsets[units]
        return members[offsets[units] + (self.plan.seed + self.epoch) % sizes].astype(np.int64)

    def batch_rows(self, batch: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """The rows of worker ``rank``'s slice of global batch ``batch``."""
        return self.rows_at(self.positions(batch, rank, world_size))
