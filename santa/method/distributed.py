"""Cross-worker collectives: gathering embeddings for the contrastive loss, and agreeing on
a value (:func:`all_reduce_min`).

The only santa module that touches ``torch.distributed``. A *gather* function maps a local
``(local_batch, dim)`` tensor to ``(gathered, offset)``: the tensors of every worker
concatenated in rank order, and the row where this worker's part starts. Losses take one
as an argument and default to :func:`identity_gather`, so the same loss code runs on one
process and on many.

Gradient scaling (see :func:`all_gather_with_grad`): with N workers, each worker's loss is
the mean over its own queries, and DDP averages the gradients of the N workers. The mean of
the N per-worker losses is the single-process loss on the combined batch, so DDP's average
is exactly that loss's gradient, **provided each worker's embeddings receive the gradient
of every worker's loss** (worker j's documents are negatives for worker i's queries).
``torch.distributed.nn.functional.all_gather`` does that: its backward sums the gathered
gradient over all ranks (a reduce-scatter) and hands each rank the slice of its own
rows. No other rescaling is needed. Gathering with gradient to the *local* rows only
(replacing this rank's slice of a plain ``all_gather``) would drop the other workers'
terms, and no loss scale can put them back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_functional

__all__ = [
    "Gather",
    "all_gather_with_grad",
    "all_reduce_min",
    "identity_gather",
    "is_distributed",
    "mean_over_ranks",
    "share_of_global_mean",
]

Gather = Callable[[torch.Tensor], tuple[torch.Tensor, int]]
"""``gather(local) -> (gathered, offset)``: rows of all workers, and where ours start."""


def identity_gather(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Single process: the tensor itself, starting at row 0."""
    return tensor, 0


def is_distributed() -> bool:
    """Whether a ``torch.distributed`` process group is up with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_gather_with_grad(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Concatenate every rank's ``tensor`` (equal shapes) with gradient flowing to all ranks.

    Returns ``(gathered, rank * local_rows)``; ``gathered`` is ``(world * local_rows, ...)``.
    Falls back to :func:`identity_gather` when no multi-rank process group is up. Every
    rank must call it, with the same shape, the same number of times (it is a collective).
    """
    if not is_distributed():
        return identity_gather(tensor)
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    _check_equal_shapes(tensor, world_size)
    # all_gather of torch.distributed.nn has a backward (sum over ranks of the gradient of
    # each rank's rows); the plain dist.all_gather has none.
    parts = dist_functional.all_gather(tensor)
    gathered = torch.cat(parts, dim=0)  # (world * local_rows, ...)
    return gathered, rank * tensor.shape[0]


def all_reduce_min(value: int, device: torch.device | str) -> int:
    """The smallest ``value`` over all ranks (a collective: every rank must call it)."""
    tensor = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def share_of_global_mean(local_count: torch.Tensor) -> torch.Tensor:
    """The factor that turns this rank's mean over its ``local_count`` items (a scalar
    tensor) into its part of the mean over every rank's items, as DDP averages gradients:
    ``local_count · world / Σ_ranks local_count`` (1 on one process).

    A loss that is a mean over a variable number of items per rank (MEP's target tokens)
    times this factor, averaged over the ranks by DDP, is the mean over all the global
    batch's items: what one process computes on the whole batch. A collective on a scalar
    that stays on the device (nothing is read back).
    """
    if not is_distributed():
        return torch.ones((), device=local_count.device)
    total = local_count.detach().to(torch.float32).clone()
    dist.all_reduce(total)
    return local_count.to(torch.float32) * dist.get_world_size() / total.clamp(min=1)


def mean_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """``values`` averaged over the ranks (a collective; the tensor itself on one process):
    what a logged window reports, so that the loss a run logs is the global batch's."""
    if not is_distributed():
        return values
    total = values.detach().clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


_CHECKED_SHAPES: set[tuple[int, ...]] = set()
"""Shapes every rank was seen to gather alike: checked once, not at every step (the check
reads the device, which would stop the host at every gather of a GPU step)."""


def _check_equal_shapes(tensor: torch.Tensor, world_size: int) -> None:
    """Fail clearly instead of hanging or mixing rows when local batches differ."""
    # One tiny collective; a mismatched all_gather would otherwise error obscurely (gloo)
    # or silently read the wrong rows (NCCL). Fixed-size batches keep a run's shapes few:
    # each is checked on its first gather. A rank that sees a new shape while the others
    # see a known one is not caught here (the loop's batches are all one size: drop_last).
    key = (world_size, *tensor.shape)
    if key in _CHECKED_SHAPES:
        return
    shape = torch.tensor(list(tensor.shape), dtype=torch.long, device=tensor.device)
    shapes = [torch.empty_like(shape) for _ in range(world_size)]
    dist.all_gather(shapes, shape)
    if any(not torch.equal(other, shape) for other in shapes):
        found = [tuple(other.tolist()) for other in shapes]
        raise ValueError(
            f"all_gather_with_grad needs the same shape on every rank, got {found}: "
            "use equal local batches (drop the last incomplete batch)"
        )
    _CHECKED_SHAPES.add(key)
