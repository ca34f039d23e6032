"""LoRA adapters on a backbone, through ``peft``: added, saved, loaded back and merged.

With ``model.lora_rank`` > 0 the backbone is wrapped in a :class:`peft.PeftModel`: every
weight of the backbone is frozen, low-rank adapters ``B A`` (``A`` random, ``B`` zero: the
model starts as the base) train beside the target modules, and so do the modules named in
``lora_trainable_modules`` (peft's ``modules_to_save``: a trainable copy of each).

A LoRA model folder holds what trains and nothing else: peft's ``adapter_config.json``
(whose ``base_model_name_or_path`` names the base model folder or hub name, as santa loaded
it) and ``adapter_model.safetensors``, with the base's ``config.json``, the tokenizer and
``santa_config.json`` beside them, so that checkpoints of a 1.5 B model weigh megabytes.
:meth:`santa.models.dual_encoder.DualEncoder.from_pretrained` loads the base and the
adapters from it; ``ray_jobs.export`` merges the adapters into the weights (``W + α/r·BA``)
and writes a plain folder that loads without peft, recording the adapter settings in
:data:`MERGED_ADAPTERS_FILE` for the model card.

References:
    Hu et al., *LoRA: Low-Rank Adaptation of Large Language Models*, ICLR 2022.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from santa.config import ModelConfig

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_WEIGHTS_FILE",
    "MERGED_ADAPTERS_FILE",
    "adapter_base",
    "adapter_settings",
    "add_adapters",
    "is_adapter_folder",
    "is_lora_model",
    "load_adapters",
    "load_lora_model",
    "merge_adapters",
    "save_adapters",
    "trainable_parameter_count",
]

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# Written by the export beside merged weights: which adapters were merged into them.
MERGED_ADAPTERS_FILE = "santa_lora.json"


def _lora_config(model_config: ModelConfig):
    from peft import LoraConfig

    targets: str | list[str] | None = list(model_config.lora_target_modules) or None
    if targets == ["all-linear"]:
        targets = "all-linear"  # peft's shorthand is a string: every linear layer but the head
    return LoraConfig(
        r=model_config.lora_rank,
        lora_alpha=model_config.lora_alpha,
        lora_dropout=model_config.lora_dropout,
        # None: peft's default modules for the model type (its own table).
        target_modules=targets,
        modules_to_save=list(model_config.lora_trainable_modules) or None,
        bias="none",
    )


def is_lora_model(backbone: nn.Module) -> bool:
    """Whether ``backbone`` carries peft adapters."""
    from peft import PeftModel

    return isinstance(backbone, PeftModel)


def add_adapters(backbone: nn.Module, model_config: ModelConfig) -> nn.Module:
    """``backbone`` wrapped with new LoRA adapters (``A`` drawn from torch's global RNG,
    ``B`` zero); only the adapters and ``lora_trainable_modules`` train."""
    from peft import get_peft_model

    try:
        return get_peft_model(backbone, _lora_config(model_config))
    except ValueError as error:  # peft's message names the modules it looked for
        first_line = str(error).strip().splitlines()[0]
        raise ValueError(
            f"LoRA on {type(backbone).__name__}: {first_line} (set model.lora_target_modules)"
        ) from error


def is_adapter_folder(folder: str | Path) -> bool:
    """Whether a local folder is a LoRA model folder (``adapter_config.json``)."""
    return (Path(folder) / ADAPTER_CONFIG_FILE).is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model a LoRA folder's adapters belong to (folder, ``s3://`` or hub name)."""
    config = json.loads((Path(folder) / ADAPTER_CONFIG_FILE).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{folder}: {ADAPTER_CONFIG_FILE} names no base model")
    return str(base)


def load_adapters(backbone: nn.Module, folder: str | Path, *, weights: bool = True) -> nn.Module:
    """The base ``backbone`` with the adapters of ``folder``, trainable as when saved.

    ``weights=False`` builds the adapters from the folder's config only (their weights come
    from elsewhere: a sharded checkpoint, :mod:`santa.models.sharded`).
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    if not weights:
        config = LoraConfig.from_pretrained(str(folder))
        config.inference_mode = False
        return get_peft_model(backbone, config)
    return PeftModel.from_pretrained(backbone, str(folder), is_trainable=True)


def load_lora_model(model_class: type, location: str, model_config: ModelConfig | None):
    """A LoRA folder as a ``model_class`` (:class:`~santa.models.dual_encoder.DualEncoder`):
    its base model (loaded as any folder), then its adapters (from
    :data:`ADAPTER_WEIGHTS_FILE`, or a sharded checkpoint: :mod:`santa.models.sharded`)."""
    from santa.config import ModelConfig
    from santa.files.layout import SANTA_CONFIG_FILE
    from santa.models import sharded
    from santa.models.folders import PROJECTION_FILE, load_tokenizer, saved_projection

    if model_config is None:
        saved = Path(location) / SANTA_CONFIG_FILE
        if not saved.is_file():
            raise ValueError(f"{location}: a LoRA folder without {SANTA_CONFIG_FILE}")
        model_config = ModelConfig.from_dict(json.loads(saved.read_text())["model"])
    base_uri = adapter_base(location)
    base = model_class.from_pretrained(base_uri, dataclasses.replace(model_config, lora_rank=0))
    in_shards = sharded.is_sharded_folder(location)
    backbone = load_adapters(base.backbone, location, weights=not in_shards)
    tokenizer = load_tokenizer(location, model_config, True) or base.tokenizer
    model = model_class(backbone, model_config, tokenizer)
    model.base_location = base_uri
    if in_shards:
        return sharded.load_sharded_weights(model, location)
    if model.projection is not None:
        state = saved_projection(location)
        if not state:
            raise ValueError(f"{location}: the config has a projection but no {PROJECTION_FILE}")
        model.projection.load_state_dict(state)
    return model


def save_adapters(backbone: nn.Module, folder: str | Path, base: str | None) -> None:
    """Write the adapters (and the unfrozen modules) of ``backbone`` into ``folder``, with
    ``base`` as their base model, and the base's ``config.json``."""
    if base:
        for config in backbone.peft_config.values():
            config.base_model_name_or_path = base
    card = Path(folder) / "README.md"
    had_card = card.exists()
    backbone.save_pretrained(str(folder), save_embedding_layers=False)
    if not had_card:
        card.unlink(missing_ok=True)  # peft's template card: the export writes santa's
    backbone.get_base_model().config.save_pretrained(str(folder))


def merge_adapters(backbone: nn.Module) -> nn.Module:
    """The base model with the adapters added into its weights (no peft left)."""
    return backbone.merge_and_unload()


def adapter_settings(model_config: ModelConfig, base: str | None = None) -> dict[str, Any]:
    """The adapter settings, as the model card and :data:`MERGED_ADAPTERS_FILE` say them."""
    settings: dict[str, Any] = {
        "rank": model_config.lora_rank,
        "alpha": model_config.lora_alpha,
        "dropout": model_config.lora_dropout,
        "target_modules": list(model_config.lora_target_modules) or "peft default",
        "trainable_modules": list(model_config.lora_trainable_modules),
    }
    if base is not None:
        settings["base_model"] = base
    return settings


def trainable_parameter_count(model: nn.Module) -> tuple[int, int]:
    """``(trainable, all)`` parameters of ``model``."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
