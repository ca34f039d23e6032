"""Reading a model folder santa did not write, or did: the structure a folder declares
(sentence-transformers modules, santa's saved projection), its tokenizer, the loading
arguments a backbone class takes, and one line naming the broken file when loading fails."""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from santa.config import ModelConfig
from santa.files import storage

__all__ = [
    "PROJECTION_FILE",
    "explain_load_failure",
    "infer_model_config",
    "load_tokenizer",
    "saved_projection",
    "with_folder_structure",
    "without_pooler",
]

# The projection after pooling (a sentence-transformers Dense), saved beside the weights.
PROJECTION_FILE = "santa_projection.safetensors"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "vocab.json")


# Fields that describe the weights and tokenizer of a folder (not choices of a recipe).
_STRUCTURE_FIELDS = (
    "max_seq_length",
    "lowercase",
    "query_prefix",
    "document_prefix",
    "projection_dim",
    "projection_bias",
    "projection_activation",
)


def infer_model_config(location: str, layout=None) -> ModelConfig:
    """A ModelConfig for a folder or hub name that has no santa_config.json.

    Encoder-decoder → T5 with decoder-0 pooling; a decoder LLM → last-token pooling with an
    EOS appended (RepLLaMA), unless it is a sentence-transformers folder, whose modules and
    tokenizer say how it embeds; a sentence-transformers folder → its own module list
    (pooling, projection, normalization → cosine, length, lower-casing, prompts); any other
    encoder → CLS pooling and dot product.
    """
    from santa.models.decoder import is_decoder_config

    hf_config = AutoConfig.from_pretrained(location)
    if getattr(hf_config, "is_encoder_decoder", False):
        return ModelConfig(backbone=location, kind="t5")
    if is_decoder_config(hf_config):
        fields = {"pooling": "last"} if layout is None else layout.model_fields
        # A sentence-transformers folder's tokenizer adds (or not) the EOS its authors used.
        return ModelConfig(backbone=location, kind="decoder", append_eos=layout is None, **fields)
    fields = {"pooling": "cls"} if layout is None else layout.model_fields
    return ModelConfig(backbone=location, kind="encoder", **fields)


def with_folder_structure(model_config: ModelConfig, folder_fields: dict[str, Any]) -> ModelConfig:
    """``model_config`` with the structure a sentence-transformers folder declares.

    A recipe chooses pooling and similarity; the projection, length limit and lower-casing
    belong to the weights and tokenizer, so they come from the folder unless set.
    """
    defaults = ModelConfig()
    changes = {
        name: folder_fields[name]
        for name in _STRUCTURE_FIELDS
        if name in folder_fields and getattr(model_config, name) == getattr(defaults, name)
    }
    return dataclasses.replace(model_config, **changes) if changes else model_config


def saved_projection(location: str) -> dict[str, torch.Tensor] | None:
    """The projection santa saved beside the weights, if any."""
    path = Path(location) / PROJECTION_FILE
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(path))


def without_pooler(location: str, model_config: ModelConfig) -> dict[str, Any]:
    """``add_pooling_layer=False`` for encoder-only classes that take it (BERT and kin).

    santa never uses a pooler (see ``DualEncoder.__init__``) and does not save one, so
    loading a santa checkpoint would otherwise make transformers build it afresh and
    report its weights as missing.
    """
    if model_config.kind == "t5":
        return {}
    try:
        model_class = AutoModel._model_mapping[type(AutoConfig.from_pretrained(location))]
    except (KeyError, OSError, ValueError):
        return {}
    if "add_pooling_layer" in inspect.signature(model_class.__init__).parameters:
        return {"add_pooling_layer": False}
    return {}


def load_tokenizer(
    location: str, model_config: ModelConfig, is_local: bool
) -> PreTrainedTokenizerBase | None:
    if is_local and any((Path(location) / name).is_file() for name in _TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(location)
    if model_config.tokenizer is not None:
        return AutoTokenizer.from_pretrained(model_config.tokenizer)
    if not is_local:
        return AutoTokenizer.from_pretrained(location)  # a hub name: its own tokenizer
    return None


def explain_load_failure(uri: str, error: BaseException) -> None:
    """Raise a ``ValueError`` naming the broken file of a model folder that failed to load
    (the libraries' own messages, such as safetensors' ``HeaderTooLarge``, name none)."""
    if not (storage.is_s3(uri) or os.path.isdir(uri)):
        return  # a hub name: the library's message is the one to see
    if isinstance(error, storage.StorageError):
        return  # no model there, or storage unreachable: already one line naming the URI
    from santa.models.weights import model_folder_problem

    try:
        problem = model_folder_problem(uri)
    except Exception:  # noqa: BLE001 - the original error is the one to raise then
        return
    if problem is not None:
        file_uri, reason = problem
        raise ValueError(f"cannot load checkpoint {file_uri}: {reason}") from error
