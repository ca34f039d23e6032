"""How a backbone folder says it should be used: sentence-transformers module lists.

A folder saved by sentence-transformers (2.x to 6.x) lists its modules in ``modules.json``:
the transformer, a pooling module (``1_Pooling/config.json``), optionally a ``Dense``
projection and a ``Normalize`` step. santa reads that list so a model is encoded the way
its authors built it: the same pooling, the same projection, cosine similarity when the
embeddings are normalized, the same maximum length and lower-casing. A plain Hugging Face
folder (no ``modules.json``) keeps santa's defaults.

Two spellings of pooling are read: the older booleans (``pooling_mode_mean_tokens``,
``pooling_mode_cls_token``) and sentence-transformers 6's single ``pooling_mode``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["SentenceTransformersLayout", "read_sentence_transformers_layout"]

MODULES_FILE = "modules.json"
# Older folders keep max_seq_length and do_lower_case here; 6.x moves them to the tokenizer.
TRANSFORMER_CONFIG_FILE = "sentence_bert_config.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_SUPPORTED_POOLINGS = ("cls", "mean", "lasttoken")
# sentence-transformers' pooling names that santa spells otherwise.
_SANTA_POOLING = {"lasttoken": "last"}
_ACTIVATIONS = {
    "Identity": "identity",
    "Tanh": "tanh",
    "ReLU": "relu",
    "GELU": "gelu",
    "Sigmoid": "sigmoid",
}
# Transformer modules santa can run (any Hugging Face encoder through AutoModel).
_TRANSFORMER_TYPES = ("Transformer",)


@dataclass(frozen=True)
class SentenceTransformersLayout:
    """What a sentence-transformers folder declares, as ModelConfig fields and weights."""

    model_fields: dict[str, Any]
    """ModelConfig fields: pooling, similarity, max_seq_length, lowercase, projection_*,
    query_prefix / document_prefix (its prompts)."""

    projection_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    """The Dense layer's ``weight`` / ``bias``, when the folder has one."""


def read_sentence_transformers_layout(location: str | Path) -> SentenceTransformersLayout | None:
    """The layout of a local sentence-transformers folder, or None for a plain HF folder.

    Raises ``ValueError`` naming the folder for modules santa cannot reproduce (max pooling,
    a second transformer, ...) instead of silently encoding differently.
    """
    folder = Path(location)
    modules_file = folder / MODULES_FILE
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    fields: dict[str, Any] = {"similarity": _declared_similarity(folder), **_prompts(folder)}
    projection_state = None
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        path = folder / module.get("path", "")
        if kind in _TRANSFORMER_TYPES:
            fields.update(_transformer_settings(folder))
        elif kind == "Pooling":
            fields["pooling"] = _pooling(path / "config.json")
        elif kind == "Dense":
            if "projection_dim" in fields:
                raise ValueError(f"{folder}: more than one Dense module is not supported")
            dense_fields, projection_state = _dense(path)
            fields.update(dense_fields)
        elif kind == "Normalize":
            fields["similarity"] = "cosine"
        else:
            raise ValueError(f"{folder}: sentence-transformers module {kind!r} is not supported")
    return SentenceTransformersLayout(fields, projection_state)


def _declared_similarity(folder: Path) -> str:
    """sentence-transformers' similarity function: cosine unless the folder says dot."""
    config_file = folder / ST_CONFIG_FILE
    if config_file.is_file():
        name = json.loads(config_file.read_text()).get("similarity_fn_name")
        if name in ("dot", "dot_product"):
            return "dot"
    return "cosine"


def _prompts(folder: Path) -> dict[str, str]:
    """The folder's ``query`` and ``document`` (or ``passage``) prompts as santa's
    prefixes (none when the folder has none)."""
    config_file = folder / ST_CONFIG_FILE
    prompts = json.loads(config_file.read_text()).get("prompts") if config_file.is_file() else {}
    prompts = prompts or {}
    fields = {}
    if prompts.get("query"):
        fields["query_prefix"] = str(prompts["query"])
    document = prompts.get("document") or prompts.get("passage")
    if document:
        fields["document_prefix"] = str(document)
    return fields


def _transformer_settings(folder: Path) -> dict[str, Any]:
    """max_seq_length and do_lower_case, from the module config or (6.x) the tokenizer."""
    settings: dict[str, Any] = {}
    config_file = folder / TRANSFORMER_CONFIG_FILE
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    tokenizer_file = folder / TOKENIZER_CONFIG_FILE
    tokenizer = json.loads(tokenizer_file.read_text()) if tokenizer_file.is_file() else {}
    max_length = config.get("max_seq_length") or tokenizer.get("model_max_length")
    # Tokenizers without a limit store a huge sentinel (int(1e30)): that is no limit.
    if isinstance(max_length, int) and 0 < max_length < 1_000_000:
        settings["max_seq_length"] = max_length
    # In 6.x folders lower-casing lives in the tokenizer itself (it lower-cases when loaded).
    if config.get("do_lower_case"):
        settings["lowercase"] = True
    return settings


def _pooling(config_file: Path) -> str:
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    mode = config.get("pooling_mode")
    if mode is None:
        active = [name for key, name in _LEGACY_POOLING_KEYS.items() if config.get(key)]
        mode = active[0] if len(active) == 1 else active
    if isinstance(mode, list) or mode not in _SUPPORTED_POOLINGS:
        raise ValueError(
            f"{config_file}: pooling {mode!r} is not supported (santa pools by cls, mean or "
            "the last token)"
        )
    return _SANTA_POOLING.get(mode, mode)


def _dense(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config = json.loads((path / "config.json").read_text())
    activation_name = str(config.get("activation_function", "torch.nn.Tanh")).rsplit(".", 1)[-1]
    if activation_name not in _ACTIVATIONS:
        raise ValueError(f"{path}: Dense activation {activation_name!r} is not supported")
    state = _load_state(path)
    # Keys are "linear.weight" / "linear.bias" in every version that saved a Dense.
    state = {key.removeprefix("linear."): value for key, value in state.items()}
    fields = {
        "projection_dim": int(config["out_features"]),
        "projection_bias": bool(config.get("bias", True)),
        "projection_activation": _ACTIVATIONS[activation_name],
    }
    return fields, state


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    safetensors_file = path / "model.safetensors"
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors_file))
    bin_file = path / "pytorch_model.bin"
    if bin_file.is_file():
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise ValueError(f"{path}: the Dense module has no weights (model.safetensors)")
