"""The config sections' shared parts: the allowed values, validation helpers, from_dict."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

TINY_BACKBONE = "tiny"
MODEL_KINDS = ("t5", "encoder", "decoder")
T5_POOLINGS = ("decoder0",)
ENCODER_POOLINGS = ("cls", "mean")
# Decoder LLMs: the last real token's state (an EOS appended first), or the mean.
DECODER_POOLINGS = ("last", "mean")
PADDING_SIDES = ("left", "right")
# How the training loop spreads the model over its workers (santa.train.sharding).
STRATEGIES = ("ddp", "fsdp")
SIMILARITIES = ("dot", "cosine")
# Activations a projection after pooling may use (sentence-transformers' Dense: tanh).
PROJECTION_ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid")
STAGES = ("pretrain", "finetune")
COMPILE_MODES = ("gpu", "always", "never")
COMPILE_SCOPES = ("blocks", "model")
SHUFFLES = ("global", "local")
EPOCH_UNITS = ("pair", "query")
DISTRIBUTED_BACKENDS = ("auto", "nccl", "gloo")
SOFT_LABEL_MODES = ("offline", "online")
SECTIONS = ("model", "train", "negatives", "scoder")
NEGATIVE_INDEXES = ("flat", "ivf", "hnsw", "auto")
OPTIMIZERS = ("adamw", "adam")
# How the MEP cross-entropy is reduced over a batch (see santa.losses.mep_loss).
MEP_REDUCTIONS = ("token_mean", "sum")


def fail(message: str) -> None:
    """Refuse a config: a ValueError whose message is the user's one line."""
    raise ValueError(message)


def check_positive(owner: object, *names: str) -> None:
    """Refuse ``owner``'s fields ``names`` when set and not positive (None passes)."""
    for name in names:
        value = getattr(owner, name)
        if value is not None and value <= 0:
            fail(f"{type(owner).__name__}.{name} must be positive, got {value}")


def section_from_dict(cls: type, values: Mapping[str, Any]) -> Any:
    """A section ``cls`` from its stored dict; an unknown key is an error."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
        fail(f"unknown {cls.__name__} keys {sorted(unknown)}; known keys: {sorted(names)}")
    return cls(**values)
