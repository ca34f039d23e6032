"""``torch.compile`` for the training step: the whole model, or each repeated block.

Compiling the whole dual encoder hands Dynamo one graph of every layer of the encoder and
the decoder (T5-base: 24 blocks, the loss around them): on a fresh H100 node that took
193 s before the first step. Regional compilation (PyTorch's recipe for transformer
stacks) compiles the repeated block instead: every block of a stack runs the same code
with its own weights, and since Dynamo treats a module's parameters as graph inputs, the
blocks of one kind share one compiled graph. What is compiled is a few small graphs (T5:
the first block of each stack, which computes the position bias, and the others; one per
input shape the step feeds them) instead of one large one, while the kernels that matter
(attention, the feed-forward layers, their norms) are fused all the same. What runs
between blocks (embeddings, masks, the loss) stays eager.

The price is paid at every step: each compiled block call runs Dynamo's guards and
AOTAutograd's wrappers on the host, forward and backward. At T5-base on an H100 (batch 128,
lengths 50/240/60; bench/RESULTS.md) the blocks compiled in 60 s instead of 193 s, and the
plain step ran at 536 pairs/s instead of 1,012 whole-model (238 eager). So the default
stays ``model``; ``blocks`` is for short runs, where the compile is most of the time.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from santa.config import COMPILE_SCOPES

logger = logging.getLogger(__name__)

__all__ = ["COMPILE_SCOPES", "compile_for_training", "repeated_blocks"]

# Graphs a block's code may get: (block kind) x (input shapes of a step: queries,
# documents, decoder lengths) x (grad mode, GradCache's first pass has none). Dynamo's
# default (8 per code object) would fall back to eager past it.
_RECOMPILE_LIMIT = 64


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of every stack in ``model``: the members of each ``ModuleList`` whose
    modules are all of one class (T5's ``block``, BERT's ``layer``)."""
    blocks: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            kinds = {type(member) for member in module}
            if len(kinds) == 1:
                blocks.extend(module)
    return blocks


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), _RECOMPILE_LIMIT))


def compile_for_training(
    model: nn.Module, wrapped: nn.Module, *, scope: str, backend: str
) -> nn.Module:
    """What the step calls: ``wrapped`` (``model`` under DDP, or ``model`` itself) compiled
    whole (``scope="model"``), or ``wrapped`` as it is with each of ``model``'s repeated
    blocks compiled in place (``scope="blocks"``; a model without blocks is compiled
    whole)."""
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile scope must be one of {COMPILE_SCOPES}, got {scope!r}")
    if scope == "blocks":
        blocks = repeated_blocks(model)
        if blocks:
            _raise_recompile_limit()
            for block in blocks:
                block.compile(backend=backend, dynamic=False)
            logger.info("compiling %d blocks (%s)", len(blocks), type(blocks[0]).__name__)
            return wrapped
    return torch.compile(wrapped, backend=backend)
