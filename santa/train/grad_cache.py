"""GradCache: a contrastive step over a batch larger than activation memory, exactly.

Gao et al., *Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup*
(RepL4NLP 2021). The contrastive loss couples every query with every document of the
global batch, so the batch cannot simply be split into accumulated micro-batches; but the
loss depends on the encoder only through the embeddings. One step is therefore:

1. **embed** each chunk of the worker's batch under ``torch.no_grad`` (no activations
   kept), after recording the RNG state the chunk starts from;
2. **the loss of the whole batch** from those embeddings, all-gathered across workers as
   in a plain step, and its gradient with respect to this worker's embeddings (the
   all-gather's backward hands every worker the gradient of every worker's loss);
3. **re-run** each chunk with activations from its recorded RNG state (dropout draws the
   same masks, so the embeddings are those of step 1) and back-propagate
   ``<embeddings, cached gradient>`` plus the chunk's share of any per-example loss
   (MEP), which only the chunk needs.

The parameter gradients are those of the whole batch in one pass: the chain rule through
the embeddings, nothing approximated. Memory holds one chunk's activations and the
batch's embeddings; the price is the forward of step 1 (about a third more compute).

Under DDP every chunk but the last is run and back-propagated inside ``no_sync``, so
gradients accumulate locally and are all-reduced once, with the last chunk's backward.

This module is the machinery; what a chunk is and what the loss is belong to the
objective (:func:`santa.train.santa_objective.santa_grad_cache_step`,
:class:`santa.scoder.objectives.SoftLabelObjective`). sentence-transformers'
``CachedMultipleNegativesRankingLoss`` (``sentence_transformers/base/losses/gradcache.py``)
and Tevatron's ``GradCache`` wrapper do the same; santa's runs inside its own step so that
DDP, ``torch.compile`` and bf16 autocast are the loop's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "ChunkForward",
    "RngState",
    "chunk_inputs",
    "chunk_slices",
    "ddp_no_sync",
    "grad_cache_backward",
]


@dataclass
class ChunkForward:
    """What one chunk's forward gives the step."""

    embeddings: dict[str, torch.Tensor]
    """Named embeddings of the chunk's rows, e.g. ``{"query": (rows, dim), "doc": ...}``;
    concatenated over chunks in order, they are the batch's."""

    loss: torch.Tensor | None = None
    """A per-example part of the loss (MEP), already scaled to the chunk's share of the
    batch's loss; back-propagated with the chunk, summed over chunks for the metrics."""

    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """Scalars summed over chunks (detached) into the step's metrics."""


class RngState:
    """The CPU RNG and, on CUDA, the device's RNG, recorded now and replayable later.

    Replaying is what makes the re-run chunk draw the dropout masks of its first run (as
    ``torch.utils.checkpoint`` and sentence-transformers' ``RandContext`` do). The state
    outside :meth:`replayed` is left as it was.
    """

    def __init__(self, device: torch.device) -> None:
        self.cpu = torch.get_rng_state()
        self.devices: list[int] = []
        self.device_states: list[torch.Tensor] = []
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.devices = [index]
            self.device_states = [torch.cuda.get_rng_state(index)]

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the block from the recorded state; restore the current one afterwards."""
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            for index, state in zip(self.devices, self.device_states, strict=True):
                torch.cuda.set_rng_state(state, index)
            yield


def chunk_slices(rows: int, chunk_size: int) -> list[slice]:
    """``rows`` cut into consecutive slices of ``chunk_size`` (the last may be shorter)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return [slice(start, min(start + chunk_size, rows)) for start in range(0, rows, chunk_size)]


def chunk_inputs(
    inputs: dict[str, torch.Tensor],
    rows: int,
    chunk_size: int,
    grouped: str = "",
    per_row: int = 0,
) -> list[dict[str, torch.Tensor]]:
    """The batch's tensors cut into chunks of ``chunk_size`` rows. Tensors whose key starts
    with ``grouped`` hold ``per_row`` entries per row, row-major (a query's hard negatives,
    an example's candidates): a chunk of rows owns their block."""
    return [
        {
            key: value[part.start * per_row : part.stop * per_row]
            if grouped and key.startswith(grouped)
            else value[part]
            for key, value in inputs.items()
        }
        for part in chunk_slices(rows, chunk_size)
    ]


def ddp_no_sync(model: torch.nn.Module) -> Callable[[], contextlib.AbstractContextManager]:
    """``model.no_sync`` for a DDP module, compiled or not (gradients accumulate without
    all-reduce); a do-nothing context otherwise."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync
    return contextlib.nullcontext


def grad_cache_backward(
    chunks: Sequence[Any],
    forward: Callable[[Any], ChunkForward],
    loss_from_embeddings: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    *,
    device: torch.device,
    autocast: contextlib.AbstractContextManager | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One GradCache step: gradients of the whole batch accumulated into the parameters.

    Args:
        chunks: the worker's batch cut into chunks, whatever ``forward`` takes.
        forward: one chunk through the (DDP-wrapped, maybe compiled) model.
        loss_from_embeddings: the batch's embedding loss (gathering across workers inside,
            as in a plain step) from the concatenated embeddings of every chunk.
        device: where the model runs (whose RNG is replayed).
        autocast: the step's autocast context (reused, not nested); ``None``: none.
        no_sync: a context that defers DDP's all-reduce (:func:`ddp_no_sync`); every chunk
            but the last runs inside it.

    Returns:
        ``(embedding loss, sums)``, both detached: the value of ``loss_from_embeddings``,
        and each chunk's ``loss`` (key ``"loss"``) and ``metrics`` summed over chunks.
    """
    if not chunks:
        raise ValueError("grad_cache_backward needs at least one chunk")
    autocast = autocast if autocast is not None else contextlib.nullcontext()
    states: list[RngState] = []
    parts: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, list[int]] = {}
    # 1. Embeddings without activations.
    for chunk in chunks:
        states.append(RngState(device))
        with torch.no_grad(), autocast:
            output = forward(chunk)
        for name, embeddings in output.embeddings.items():
            parts.setdefault(name, []).append(embeddings.detach())
            sizes.setdefault(name, []).append(embeddings.shape[0])
    # 2. The whole batch's loss and its gradient with respect to the embeddings; fp32
    # leaves, so the cached gradient keeps full precision under bf16 autocast.
    leaves = {
        name: torch.cat(tensors).float().requires_grad_(True)  # (batch rows, dim)
        for name, tensors in parts.items()
    }
    with autocast:
        loss = loss_from_embeddings(leaves)
    loss.backward()
    cached = {
        name: (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)).split(sizes[name])
        for name, leaf in leaves.items()
    }
    # 3. Each chunk again, with activations, from its recorded RNG state.
    sums: dict[str, torch.Tensor] = {}
    last = len(chunks) - 1
    for index, (chunk, state) in enumerate(zip(chunks, states, strict=True)):
        with no_sync() if index < last else contextlib.nullcontext():
            with state.replayed(), autocast:
                output = forward(chunk)
            surrogate = sum(
                torch.sum(embeddings.float() * cached[name][index])
                for name, embeddings in output.embeddings.items()
            )
            if output.loss is not None:
                surrogate = surrogate + output.loss.float()
                _add(sums, "loss", output.loss)
            surrogate.backward()
        for key, value in output.metrics.items():
            _add(sums, key, value)
    return loss.detach(), sums


def _add(sums: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    value = value.detach().float()
    sums[key] = sums[key] + value if key in sums else value
