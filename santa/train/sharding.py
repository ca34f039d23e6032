"""``train.strategy=fsdp``: the model sharded over the workers (PyTorch's FSDP2), and its
sharded checkpoints.

With DDP every worker holds the whole model, its gradients and its optimizer state (16
bytes a parameter in fp32 AdamW): a 1.5 B model needs 24 GB before any activation.
``fully_shard`` (``torch.distributed.fsdp``, FSDP2) keeps 1/W of each on each of W workers:
every transformer block (the backbone's ``_no_split_modules``: ``Qwen2DecoderLayer``,
``T5Block``, ``BertLayer``) is its own unit whose parameters are all-gathered just before it
runs and freed after, gradients are reduce-scattered (averaged, as DDP averages them), and
the optimizer steps on the local shards. On GPU the parameters compute in bf16 and the
gradients are reduced in fp32 (``MixedPrecisionPolicy``); activation checkpointing is the
model's (``model.gradient_checkpointing``). The contrastive loss gathers every worker's
embeddings as under DDP (:mod:`santa.method.distributed`): sharding changes where the
weights live, not what the step computes.

A checkpoint is written by every worker at once with ``torch.distributed.checkpoint``:
``model/`` holds the model folder's files (rank 0) and its weights in ``model/sharded/``
(:mod:`santa.models.sharded`; only the trainable tensors of a LoRA model), ``optimizer/``
the optimizer's sharded state; rank 0 adds the scheduler, RNG and loop state as for DDP
(:mod:`santa.train.state`). Each worker writes into its own folder and reports it; the
folders merged (Ray Train uploads every worker's files to the one checkpoint, the local
session copies them into one) make the checkpoint. DCP stores each tensor by name with its
global shape, so it loads on any number of workers, one included (a plain unsharded model:
evaluation, export, the next stage).

Without a process group (one process), the model is not sharded and checkpoints keep the
same sharded format.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from santa.files.layout import checkpoint_model
from santa.models.sharded import (
    load_sharded_weights,
    save_sharded_weights,
    single_process_quietly,
)
from santa.train.state import load_loop_state, save_loop_state

if TYPE_CHECKING:
    from santa.train.loop import WorkerTrainer

__all__ = [
    "OPTIMIZER_DIR",
    "load_sharded_checkpoint",
    "save_sharded_checkpoint",
    "shard_model",
    "transformer_blocks",
]

logger = logging.getLogger(__name__)

OPTIMIZER_DIR = "optimizer"


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP shards one by one: those whose class the backbone names in
    ``_no_split_modules`` (its repeated blocks), outermost first."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(
            f"train.strategy=fsdp: {type(model).__name__} names no transformer blocks to shard "
            "(transformers' _no_split_modules)"
        )
    return [module for module in model.modules() if type(module).__name__ in names]


def shard_model(model: nn.Module, device: torch.device, *, bf16: bool) -> nn.Module:
    """``model`` on ``device`` with FSDP2 (in place: the same object, now sharded), or as
    it is without a process group. ``bf16``: bf16 parameters in compute, fp32 reductions."""
    from santa.models.dual_encoder import DualEncoder

    if not isinstance(model, DualEncoder):
        raise ValueError(
            f"train.strategy=fsdp trains the dual encoder; {type(model).__name__} (SCodeR's "
            "discriminators) trains with train.strategy=ddp"
        )
    model.to(device)
    if not _distributed():
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    blocks = transformer_blocks(model)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    logger.info("FSDP: %d blocks and the root sharded", len(blocks))
    return model


def save_sharded_checkpoint(directory: str, trainer: WorkerTrainer) -> None:
    """Every rank: this rank's part of the checkpoint into its own ``directory``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model = trainer.model
    folder = checkpoint_model(directory)
    if trainer.rank == 0:
        model.save_structure(folder, santa_config=trainer.config)
        save_loop_state(directory, None, trainer.scheduler, trainer.state)
    save_sharded_weights(model, folder, trainable_only=model.is_lora)
    optimizer_dir = Path(directory) / OPTIMIZER_DIR
    optimizer_dir.mkdir(parents=True, exist_ok=True)
    with single_process_quietly():
        dcp.save(
            {"optimizer": get_optimizer_state_dict(model, trainer.optimizer)},
            checkpoint_id=str(optimizer_dir),
            no_dist=not _distributed(),
        )


def load_sharded_checkpoint(directory: str, trainer: WorkerTrainer) -> dict[str, Any]:
    """Every rank: restore what :func:`save_sharded_checkpoint` wrote (on any number of
    workers); returns the loop state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    optimizer_dir = os.path.join(directory, OPTIMIZER_DIR)
    if not os.path.isfile(os.path.join(optimizer_dir, ".metadata")):
        raise ValueError(
            f"{directory} is not a sharded checkpoint (train.strategy=fsdp resumes from the "
            "checkpoints it wrote)"
        )
    model, optimizer = trainer.model, trainer.optimizer
    load_sharded_weights(model, checkpoint_model(directory), distributed=_distributed())
    # The optimizer's state as this run shards it (initialised), filled from the files.
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    with single_process_quietly():
        dcp.load(state, checkpoint_id=optimizer_dir, no_dist=not _distributed())
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    return load_loop_state(directory, None, trainer.scheduler)
