"""Model weights as a sharded checkpoint (``torch.distributed.checkpoint``): what FSDP
training saves, read back by anything that loads a model folder.

Under ``train.strategy=fsdp`` no worker holds the whole model, so a checkpoint's
``model/`` folder keeps its weights in ``sharded/``: one file per worker and a
``.metadata`` index (DCP's format), beside the usual ``config.json``, tokenizer and
``santa_config.json``. :func:`save_sharded_weights` writes it from every worker at once;
:func:`load_sharded_weights` reads it into a model on any number of processes, one
included (evaluation, export, the next stage), re-sharding as DCP does. A LoRA model
keeps only its trainable tensors there (the adapters), its base named by
``adapter_config.json`` (:mod:`santa.models.lora`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

__all__ = [
    "SHARDED_DIR",
    "is_sharded_folder",
    "load_sharded_weights",
    "save_sharded_weights",
    "saved_keys",
    "single_process_quietly",
]

SHARDED_DIR = "sharded"
METADATA_FILE = ".metadata"


@contextlib.contextmanager
def single_process_quietly() -> Iterator[None]:
    """DCP in one process (``no_dist``) warns at every call that it assumes so: it is
    santa's intent (evaluation, export, a one-worker run)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def is_sharded_folder(folder: str | Path) -> bool:
    """Whether a local model folder keeps its weights in ``sharded/`` (DCP)."""
    return (Path(folder) / SHARDED_DIR / METADATA_FILE).is_file()


def saved_keys(directory: str | Path) -> set[str]:
    """The tensor names a DCP checkpoint folder holds."""
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


def _model_state(model: nn.Module, trainable_only: bool) -> dict[str, torch.Tensor]:
    """The module's state by fully qualified name (DTensor shards under FSDP)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model)
    if trainable_only:
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        state = {name: value for name, value in state.items() if name in trainable}
    return state


def save_sharded_weights(model: nn.Module, folder: str | Path, *, trainable_only: bool) -> None:
    """Write ``model``'s weights into ``folder/sharded`` (every rank of the process group
    calls it, each into its own ``folder``; rank 0 also writes ``.metadata``; the folders
    merged make the checkpoint). ``trainable_only``: the trainable tensors only (LoRA)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    target = Path(folder) / SHARDED_DIR
    target.mkdir(parents=True, exist_ok=True)
    with single_process_quietly():
        dcp.save(
            _model_state(model, trainable_only),
            checkpoint_id=str(target),
            no_dist=not (dist.is_available() and dist.is_initialized()),
        )


def load_sharded_weights(
    model: nn.Module, folder: str | Path, *, distributed: bool = False
) -> nn.Module:
    """Load ``folder/sharded`` into ``model`` (a plain module, or an FSDP one with
    ``distributed``: every rank calls it then) and return it. Every tensor of the
    checkpoint must find its place, and every trainable tensor of ``model`` must be in it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    source = Path(folder) / SHARDED_DIR
    stored = saved_keys(source)
    state = get_model_state_dict(model)
    missing_in_model = sorted(stored - set(state))
    if missing_in_model:
        raise ValueError(
            f"{source}: the checkpoint holds {missing_in_model[:3]} that the model has not "
            "(another model's checkpoint?)"
        )
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    not_saved = sorted(trainable - stored)
    if not_saved:
        raise ValueError(f"{source}: no weights for {not_saved[:3]} (incomplete checkpoint?)")
    wanted = {name: value for name, value in state.items() if name in stored}
    with single_process_quietly():
        dcp.load(wanted, checkpoint_id=str(source), no_dist=not distributed)
    set_model_state_dict(model, wanted, options=StateDictOptions(strict=False))
    return model
