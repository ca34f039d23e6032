"""The ``model`` section: the backbone and how it turns a sequence into one vector."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from santa.config.common import (
    ENCODER_POOLINGS,
    MODEL_KINDS,
    PROJECTION_ACTIVATIONS,
    SIMILARITIES,
    T5_POOLINGS,
    TINY_BACKBONE,
    check_positive,
    fail,
    section_from_dict,
)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which backbone to load and how it turns a sequence into one vector."""

    backbone: str = TINY_BACKBONE
    """Hub name, local HF directory, ``s3://`` URI, santa checkpoint, or ``"tiny"`` (a
    random-init T5 sized by the ``tiny_*`` fields, with a locally trained tokenizer)."""

    kind: str = "t5"
    """``"t5"`` (T5/CodeT5 encoder-decoder; SDA + MEP) or ``"encoder"`` (BERT/RoBERTa/
    MiniLM baselines; SDA/DR loss only)."""

    pooling: str | None = None
    """``"decoder0"`` for T5 (last decoder layer at position 0); ``"cls"`` or ``"mean"``
    for encoder-only. ``None`` picks ``"decoder0"`` for T5 and ``"mean"`` otherwise."""

    similarity: str = "dot"
    """``"dot"`` (the paper) or ``"cosine"`` (unit vectors, divided by ``temperature``)."""

    temperature: float = 1.0
    """Scores are divided by this before the softmax; meant for cosine (1.0 = off)."""

    max_seq_length: int | None = None
    """The backbone's own input limit (a sentence-transformers folder's ``max_seq_length``):
    texts are cut to at most this many tokens whatever length training or evaluation asks
    for. ``None``: no limit of its own."""

    lowercase: bool = False
    """Lower-case texts before tokenizing (a sentence-transformers folder's
    ``do_lower_case``)."""

    projection_dim: int | None = None
    """Encoder-only: output size of a linear layer after pooling (a sentence-transformers
    ``Dense`` module); ``None``: no projection."""

    projection_bias: bool = True
    """Whether the projection has a bias."""

    projection_activation: str = "identity"
    """Activation after the projection, one of ``PROJECTION_ACTIVATIONS``."""

    embed_unmasked_document: bool = False
    """False: the document embedding comes from the same pass over the *masked* document
    that gives the MEP loss (the paper's reference). True: embed the unmasked document in
    a second pass."""

    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""

    tokenizer: str | None = None
    """Where the tokenizer lives when not beside the backbone's weights (``None``: the
    backbone's folder; for ``"tiny"``, one trained on the training texts)."""

    tiny_d_model: int = 128
    """``tiny`` only: hidden size."""

    tiny_num_layers: int = 2
    """``tiny`` only: layers in the encoder and, separately, in the decoder."""

    tiny_num_heads: int = 4
    """``tiny`` only: attention heads per layer (must divide ``tiny_d_model``)."""

    tiny_d_ff: int = 256
    """``tiny`` only: feed-forward inner size."""

    tiny_vocab_size: int = 8000
    """``tiny`` only: vocabulary size the local tokenizer is trained to."""

    tiny_dropout: float = 0.0
    """``tiny`` only: T5 dropout rate. 0: a random-init model trained for a few hundred
    steps does not overfit, and dropout slows it enough that held-out retrieval gets worse."""

    def __post_init__(self) -> None:
        if not self.backbone:
            fail("ModelConfig.backbone must name a model (hub name, path, s3:// or 'tiny')")
        if self.kind not in MODEL_KINDS:
            fail(f"ModelConfig.kind must be one of {MODEL_KINDS}, got {self.kind!r}")
        if self.pooling is None:
            # Frozen dataclass: set the resolved default the one sanctioned way.
            object.__setattr__(self, "pooling", "decoder0" if self.kind == "t5" else "mean")
        allowed = T5_POOLINGS if self.kind == "t5" else ENCODER_POOLINGS
        if self.pooling not in allowed:
            fail(
                f"ModelConfig.pooling={self.pooling!r} does not fit kind={self.kind!r}; "
                f"use one of {allowed}"
            )
        if self.similarity not in SIMILARITIES:
            fail(f"ModelConfig.similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        if self.projection_activation not in PROJECTION_ACTIVATIONS:
            fail(
                f"ModelConfig.projection_activation must be one of {PROJECTION_ACTIVATIONS}, "
                f"got {self.projection_activation!r}"
            )
        if self.projection_dim is not None and self.kind == "t5":
            fail("ModelConfig.projection_dim is for encoder-only backbones (kind='encoder')")
        check_positive(
            self,
            "temperature",
            "max_seq_length",
            "projection_dim",
            "tiny_d_model",
            "tiny_num_layers",
            "tiny_num_heads",
            "tiny_d_ff",
            "tiny_vocab_size",
        )
        if not 0.0 <= self.tiny_dropout < 1.0:
            fail(f"ModelConfig.tiny_dropout must be in [0, 1), got {self.tiny_dropout}")
        if self.tiny_d_model % self.tiny_num_heads:
            fail(
                f"ModelConfig.tiny_num_heads={self.tiny_num_heads} must divide "
                f"tiny_d_model={self.tiny_d_model}"
            )
        if self.backbone == TINY_BACKBONE and self.kind != "t5":
            fail("the 'tiny' backbone is a T5; set kind='t5'")

    @property
    def is_tiny(self) -> bool:
        """Whether the backbone is a random-init T5 built from the ``tiny_*`` fields."""
        return self.backbone == TINY_BACKBONE

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return section_from_dict(cls, values)
