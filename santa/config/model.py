"""The ``model`` section: the backbone and how it turns a sequence into one vector."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from santa.config.common import (
    DECODER_POOLINGS,
    ENCODER_POOLINGS,
    MODEL_KINDS,
    PADDING_SIDES,
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
    random-init model sized by the ``tiny_*`` fields, with a locally trained tokenizer: a
    T5 for ``kind="t5"``, a Qwen2-shaped decoder for ``kind="decoder"``)."""

    kind: str = "t5"
    """``"t5"`` (T5/CodeT5 encoder-decoder; SDA + MEP), ``"encoder"`` (BERT/RoBERTa/
    MiniLM baselines; SDA/DR loss only) or ``"decoder"`` (a causal LM that ``AutoModel``
    loads: Llama, Qwen2, Mistral shapes, as RepLLaMA embeds; SDA/DR loss only, MEP is T5's
    objective)."""

    pooling: str | None = None
    """``"decoder0"`` for T5 (last decoder layer at position 0); ``"cls"`` or ``"mean"``
    for encoder-only; ``"last"`` (the last real token, an EOS appended: RepLLaMA) or
    ``"mean"`` for decoders. ``None`` picks ``"decoder0"``, ``"mean"`` and ``"last"``."""

    padding_side: str | None = None
    """``"left"`` or ``"right"``: where the tokenizer pads (decoder LLM tokenizers often
    pad left); ``None`` keeps the tokenizer's own. Either way an embedding does not depend
    on it: pooling finds the last real token and positions count real tokens only."""

    append_eos: bool = True
    """Decoders: end every text with the tokenizer's EOS token (its post-processor is set
    to add it, so a saved folder tokenizes the same way everywhere); with ``last`` pooling
    the EOS state is the embedding."""

    query_prefix: str = ""
    """Text put before every query before tokenizing (RepLLaMA: ``"query: "``); saved as
    the sentence-transformers prompt ``query``."""

    document_prefix: str = ""
    """Text put before every document (RepLLaMA: ``"passage: "``); the prompt
    ``document``."""

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

    lora_rank: int = 0
    """LoRA (through ``peft``): the rank of the adapters; 0 trains every weight. With a
    rank, only the adapters (and ``lora_trainable_modules``) train and are checkpointed;
    ``ray_jobs.export`` merges them into the weights."""

    lora_alpha: float = 16.0
    """LoRA's scaling numerator (the update is ``alpha / rank · B A``)."""

    lora_dropout: float = 0.0
    """Dropout on the adapters' input."""

    lora_target_modules: tuple[str, ...] = ()
    """Module names the adapters wrap (``q_proj,v_proj``; ``all-linear``); empty:
    ``peft``'s default for the model type (Qwen2/Llama: ``q_proj, v_proj``)."""

    lora_trainable_modules: tuple[str, ...] = ()
    """Modules trained in full beside the adapters and saved with them (``peft``'s
    ``modules_to_save``, e.g. ``embed_tokens``)."""

    tokenizer: str | None = None
    """Where the tokenizer lives when not beside the backbone's weights (``None``: the
    backbone's folder; for ``"tiny"``, one trained on the training texts)."""

    tiny_d_model: int = 128
    """``tiny`` only: hidden size."""

    tiny_num_layers: int = 2
    """``tiny`` only: layers in the encoder and, separately, in the decoder."""

    tiny_num_heads: int = 4
    """``tiny`` only: attention heads per layer (must divide ``tiny_d_model``)."""

    tiny_num_kv_heads: int | None = None
    """``tiny`` decoder only: key/value heads (grouped-query attention, as Qwen2; must
    divide ``tiny_num_heads``); ``None``: as many as ``tiny_num_heads``."""

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
            default = {"t5": "decoder0", "encoder": "mean", "decoder": "last"}[self.kind]
            object.__setattr__(self, "pooling", default)
        allowed = {"t5": T5_POOLINGS, "encoder": ENCODER_POOLINGS, "decoder": DECODER_POOLINGS}[
            self.kind
        ]
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
        if self.padding_side is not None and self.padding_side not in PADDING_SIDES:
            fail(
                f"ModelConfig.padding_side must be one of {PADDING_SIDES} or None, "
                f"got {self.padding_side!r}"
            )
        # Tuples from a stored dict come back as lists (JSON).
        for name in ("lora_target_modules", "lora_trainable_modules"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.lora_rank < 0:
            fail(f"ModelConfig.lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if not 0.0 <= self.lora_dropout < 1.0:
            fail(f"ModelConfig.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        check_positive(
            self,
            "temperature",
            "max_seq_length",
            "projection_dim",
            "tiny_d_model",
            "tiny_num_layers",
            "tiny_num_heads",
            "tiny_num_kv_heads",
            "tiny_d_ff",
            "lora_alpha",
            "tiny_vocab_size",
        )
        if not 0.0 <= self.tiny_dropout < 1.0:
            fail(f"ModelConfig.tiny_dropout must be in [0, 1), got {self.tiny_dropout}")
        if self.tiny_d_model % self.tiny_num_heads:
            fail(
                f"ModelConfig.tiny_num_heads={self.tiny_num_heads} must divide "
                f"tiny_d_model={self.tiny_d_model}"
            )
        if self.tiny_num_kv_heads is not None and self.tiny_num_heads % self.tiny_num_kv_heads:
            fail(
                f"ModelConfig.tiny_num_kv_heads={self.tiny_num_kv_heads} must divide "
                f"tiny_num_heads={self.tiny_num_heads}"
            )
        if self.backbone == TINY_BACKBONE and self.kind == "encoder":
            fail(
                "the 'tiny' backbone is a T5 (kind='t5') or a Qwen2-shaped decoder (kind='decoder')"
            )

    @property
    def is_tiny(self) -> bool:
        """Whether the backbone is a random-init model built from the ``tiny_*`` fields."""
        return self.backbone == TINY_BACKBONE

    @property
    def is_decoder(self) -> bool:
        """Whether the backbone is a decoder LLM (``kind="decoder"``)."""
        return self.kind == "decoder"

    @property
    def uses_lora(self) -> bool:
        """Whether LoRA adapters train instead of the weights (``lora_rank`` > 0)."""
        return self.lora_rank > 0

    def prefix(self, role: str | None) -> str:
        """The text put before a ``query`` or ``document`` (``None``: texts taken as
        given, no prefix)."""
        if role is None:
            return ""
        if role == "query":
            return self.query_prefix
        if role == "document":
            return self.document_prefix
        raise ValueError(f"role must be 'query', 'document' or None, got {role!r}")

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return section_from_dict(cls, values)
