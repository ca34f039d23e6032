"""The dual encoder: one shared backbone embeds queries and documents.

T5 family (T5, CodeT5, mT5): the embedding is the last decoder layer's hidden state at
position 0 with the decoder fed the single ``decoder_start_token_id`` (SANTA / OpenMatch).
Because the decoder is causal, position 0 cannot see the decoder inputs after it, so one
pass over a masked document with the MEP target as ``labels`` gives both the MEP loss and
the same embedding :meth:`DualEncoder.encode` gives for that input.

Encoder-only (BERT, RoBERTa, MiniLM): CLS or attention-mask-aware mean pooling; SDA/DR
loss only.

Decoder LLMs (Llama, Qwen2, Mistral; ``kind="decoder"``): the last real token's state with
an EOS appended by the tokenizer (RepLLaMA), or the mean; positions count real tokens, so
left and right padding embed alike (:mod:`santa.models.decoder`); SDA/DR loss only.

Any of them may train LoRA adapters instead of its weights (``model.lora_rank``,
:mod:`santa.models.lora`); a folder may keep its weights as a sharded checkpoint written by
FSDP training (:mod:`santa.models.sharded`).

Single-device code: parallelism (DDP, gathering) lives in the training loop and in
:mod:`santa.method.distributed`; nothing here calls ``torch.distributed``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSeq2SeqLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from santa.config import ModelConfig, SantaConfig
from santa.files import storage
from santa.files.layout import SANTA_CONFIG_FILE
from santa.method import losses
from santa.models import decoder, lora, sharded
from santa.models.backbones import read_sentence_transformers_layout
from santa.models.folders import (
    PROJECTION_FILE,
    explain_load_failure,
    infer_model_config,
    load_tokenizer,
    saved_projection,
    with_folder_structure,
    without_pooler,
)
from santa.models.tiny import build_tiny_backbone

__all__ = ["SANTA_CONFIG_FILE", "T5_MODEL_TYPES", "DualEncoder", "DualEncoderOutput"]

_ACTIVATIONS = {
    "identity": nn.Identity,
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
}
# Encoder-decoder families whose stacks and LM head follow T5ForConditionalGeneration
# (CodeT5 checkpoints are model_type "t5").
T5_MODEL_TYPES = ("t5", "mt5", "umt5")


def _takes_prepared_masks() -> bool:
    """Whether transformers' T5 builds its masks with ``masking_utils`` (transformers 5),
    which passes a prepared 4D mask through as it is (older T5 code rejects one)."""
    try:
        from transformers.models.t5 import modeling_t5
    except ImportError:
        return False
    return hasattr(modeling_t5, "create_bidirectional_mask")


_PREPARED_MASKS = _takes_prepared_masks()
_MASK_READY_ATTENTION = ("sdpa", "eager")


@dataclass
class DualEncoderOutput:
    """What one training forward pass produces (a dataclass, so DDP finds its tensors)."""

    query_embeddings: torch.Tensor  # (batch, dim)
    doc_embeddings: torch.Tensor | None = None  # (batch, dim)
    hard_negative_embeddings: torch.Tensor | None = None  # (batch * n, dim)
    mep_loss: torch.Tensor | None = None  # scalar


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Make a transformers model recompute its activations in backward (non-reentrant,
    which works under DDP)."""
    kwargs = {"use_reentrant": False}
    # transformers 5.x renamed it (the old name warns); 4.x only has the old one.
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class DualEncoder(nn.Module):
    """A shared backbone that maps token ids to one vector per sequence."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        model_config: ModelConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        super().__init__()
        is_seq2seq = bool(getattr(backbone.config, "is_encoder_decoder", False))
        if model_config.kind == "t5":
            model_type = backbone.config.model_type
            if not is_seq2seq or model_type not in T5_MODEL_TYPES:
                raise ValueError(
                    f"kind='t5' needs a T5-family encoder-decoder ({T5_MODEL_TYPES}), "
                    f"got model_type={model_type!r}"
                )
        elif is_seq2seq and model_config.kind == "decoder":
            raise ValueError("kind='decoder' needs a decoder-only LM (Llama, Qwen2, Mistral, ...)")
        elif is_seq2seq:
            raise ValueError("kind='encoder' needs an encoder-only backbone (BERT, RoBERTa, ...)")
        elif getattr(backbone, "pooler", None) is not None:
            # BERT's pooler (a tanh layer over CLS) feeds neither CLS nor mean pooling; left
            # in, its parameters never get gradients and DDP waits for them forever.
            backbone.pooler = None
        if model_config.uses_lora and not lora.is_lora_model(backbone):
            backbone = lora.add_adapters(backbone, model_config)
        self.backbone = backbone
        self.model_config = model_config
        if tokenizer is not None and model_config.is_decoder:
            decoder.prepare_decoder_tokenizer(tokenizer, model_config)
        elif tokenizer is not None and model_config.padding_side is not None:
            tokenizer.padding_side = model_config.padding_side
        self.tokenizer = tokenizer
        # Where the base weights were loaded from: a LoRA folder names it as the adapters'
        # base (None: built here, e.g. a tiny model).
        self.base_location: str | None = None
        # The adapter settings once merged into the weights (merge_adapters), for the card.
        self.merged_lora: dict[str, Any] | None = None
        # A linear layer after pooling (a sentence-transformers Dense); None: none.
        self.projection: nn.Linear | None = None
        self.projection_activation: nn.Module = nn.Identity()
        if model_config.projection_dim is not None:
            self.projection = nn.Linear(
                backbone.config.hidden_size,
                model_config.projection_dim,
                bias=model_config.projection_bias,
            )
            self.projection_activation = _ACTIVATIONS[model_config.projection_activation]()
        if model_config.gradient_checkpointing:
            self.gradient_checkpointing_enable()

    # ----------------------------------------------------------------- properties

    @property
    def is_t5(self) -> bool:
        """Whether the backbone is a T5-family encoder-decoder (MEP is possible)."""
        return self.model_config.kind == "t5"

    @property
    def is_lora(self) -> bool:
        """Whether LoRA adapters train instead of the backbone's weights."""
        return lora.is_lora_model(self.backbone)

    @property
    def embedding_dim(self) -> int:
        """Size of the vectors :meth:`encode` returns."""
        config = self.backbone.config
        if self.projection is not None:
            return self.projection.out_features
        return config.d_model if self.is_t5 else config.hidden_size

    @property
    def embed_unmasked_document(self) -> bool:
        """Whether document embeddings come from a separate pass over the unmasked text."""
        return self.model_config.embed_unmasked_document

    @property
    def decoder_start_token_id(self) -> int:
        """The token the T5 decoder starts from (T5 and CodeT5: the pad token, id 0)."""
        config = self.backbone.config
        start = config.decoder_start_token_id
        if start is None:
            start = config.pad_token_id  # T5's convention when the config leaves it out
        if start is None:
            raise ValueError("the backbone config has neither decoder_start_token_id nor pad")
        return int(start)

    # ----------------------------------------------------------------- encoding

    def prepare_texts(self, texts: list[str], role: str | None = None) -> list[str]:
        """Texts as the backbone expects them: after the ``query`` or ``document`` prefix
        of ``role`` (``None``: no prefix), lower-cased when its folder says so."""
        prefix = self.model_config.prefix(role)
        texts = [prefix + text for text in texts] if prefix else list(texts)
        if self.model_config.lowercase:
            return [text.lower() for text in texts]
        return texts

    def token_limit(self, max_length: int) -> int:
        """``max_length`` capped by the backbone's own limit (``max_seq_length``)."""
        limit = self.model_config.max_seq_length
        return max_length if limit is None else min(max_length, limit)

    def tokenize(
        self,
        texts: list[str],
        max_length: int,
        padding: bool | str = True,
        role: str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Tokenize for :meth:`encode`: the prefix of ``role`` (``query``/``document``;
        ``None``: none), lower-casing and length limit of the backbone."""
        if self.tokenizer is None:
            raise ValueError("the model has no tokenizer: load it from a folder that has one")
        return self.tokenizer(
            self.prepare_texts(texts, role),
            max_length=self.token_limit(max_length),
            truncation=True,
            padding=padding,
            return_tensors="pt",
        )

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Embed a batch of sequences: ``(batch, length)`` ids → ``(batch, dim)``."""
        if self.is_t5:
            batch = input_ids.shape[0]
            start = torch.full(
                (batch, 1), self.decoder_start_token_id, dtype=torch.long, device=input_ids.device
            )  # (batch, 1)
            hidden = self._t5_decoder_states(input_ids, attention_mask, start)  # (batch, 1, dim)
            return hidden[:, 0]
        if self.model_config.is_decoder:
            return self._pool_decoder(input_ids, attention_mask)
        return self._pool_encoder(input_ids, attention_mask)

    def encode_with_mep(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        reduction: str = "token_mean",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over a masked document: ``(embeddings (batch, dim), MEP loss)``.

        ``labels`` ``(batch, target_length)`` are the target ids
        ``<extra_id_0> ent_0 ... </s>``, padded with the pad token or ``-100`` (both ignored
        by the loss). The decoder input is ``labels`` shifted right, so position 0 is
        ``decoder_start_token_id`` and its last-layer state is exactly :meth:`encode`'s.
        ``reduction``: see :func:`santa.method.losses.mep_loss` (``train.mep_reduction``).
        """
        if not self.is_t5:
            kind = "decoder" if self.model_config.is_decoder else "encoder-only"
            raise ValueError(
                f"MEP needs a T5-family backbone: {kind} backbones train with the SDA/DR "
                "loss only (set train.mep_weight=0)"
            )
        loss_labels = self.mep_loss_labels(labels)  # (batch, target_length)
        decoder_input_ids = self._shift_right(loss_labels)  # (batch, target_length)
        hidden = self._t5_decoder_states(input_ids, attention_mask, decoder_input_ids)
        logits = self._lm_logits(hidden)  # (batch, target_length, vocab)
        return hidden[:, 0], losses.mep_loss(logits, loss_labels, reduction=reduction)

    def mep_loss_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """MEP targets as the loss counts them: the pad token is ignored (``-100``)."""
        return labels.masked_fill(labels == self.backbone.config.pad_token_id, -100)

    def mep_token_count(self, labels: torch.Tensor, reduction: str = "token_mean") -> torch.Tensor:
        """What the MEP loss of ``labels`` ``(batch, target_length)`` divides by: its
        counted target tokens (``token_mean``) or its documents with a target (``sum``); a
        scalar (chunks of a batch weigh their MEP loss by it, GradCache)."""
        counted = self.mep_loss_labels(labels) != -100  # (batch, target_length)
        if reduction == "sum":
            return counted.any(dim=1).sum()
        return counted.sum()

    def similarity(
        self, query_embeddings: torch.Tensor, doc_embeddings: torch.Tensor
    ) -> torch.Tensor:
        """Scores ``(queries, docs)`` by the configured similarity and temperature."""
        return losses.similarity_scores(
            query_embeddings,
            doc_embeddings,
            similarity=self.model_config.similarity,
            temperature=self.model_config.temperature,
        )

    def forward(
        self,
        query_input_ids: torch.Tensor,
        query_attention_mask: torch.Tensor,
        document_input_ids: torch.Tensor | None = None,
        document_attention_mask: torch.Tensor | None = None,
        masked_document_input_ids: torch.Tensor | None = None,
        masked_document_attention_mask: torch.Tensor | None = None,
        mep_labels: torch.Tensor | None = None,
        hard_negative_input_ids: torch.Tensor | None = None,
        hard_negative_attention_mask: torch.Tensor | None = None,
        mep_reduction: str = "token_mean",
    ) -> DualEncoderOutput:
        """Everything one training step needs, in one call (so DDP sees one forward).

        With ``mep_labels``, the masked document gives the MEP loss and, unless
        ``embed_unmasked_document``, the document embeddings too (one pass). Otherwise, or
        in the two-pass variant, documents are embedded from ``document_*``.
        """
        output = DualEncoderOutput(self.encode(query_input_ids, query_attention_mask))
        if mep_labels is not None:
            if masked_document_input_ids is None or masked_document_attention_mask is None:
                raise ValueError("mep_labels need masked_document_input_ids and its mask")
            masked_embeddings, output.mep_loss = self.encode_with_mep(
                masked_document_input_ids,
                masked_document_attention_mask,
                mep_labels,
                reduction=mep_reduction,
            )
            if not self.embed_unmasked_document:
                output.doc_embeddings = masked_embeddings
        if output.doc_embeddings is None and document_input_ids is not None:
            if document_attention_mask is None:
                raise ValueError("document_input_ids need document_attention_mask")
            output.doc_embeddings = self.encode(document_input_ids, document_attention_mask)
        if hard_negative_input_ids is not None:
            if hard_negative_attention_mask is None:
                raise ValueError("hard_negative_input_ids need hard_negative_attention_mask")
            output.hard_negative_embeddings = self.encode(
                hard_negative_input_ids, hard_negative_attention_mask
            )
        return output

    def gradient_checkpointing_enable(self) -> None:
        """Recompute activations in backward; non-reentrant, which works under DDP."""
        enable_activation_checkpointing(self.backbone)

    @property
    def is_gradient_checkpointing(self) -> bool:
        """Whether activations are recomputed in the backward pass."""
        return any(getattr(module, "gradient_checkpointing", False) for module in self.modules())

    # ----------------------------------------------------------------- internals

    def padding_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(batch, length)`` 1/0 → the ``(batch, 1, 1, length)`` mask the backbone's
        attention takes (boolean for SDPA, additive for eager attention).

        Given the 2D mask, transformers reads it (``padding_mask.all()``) at every encoder
        and cross-attention to decide whether it can drop it: a host-device sync in every
        forward of an eager (or regionally compiled) GPU step. The prepared mask is used
        as it is. Other attention implementations, and transformers without
        ``masking_utils``, take the 2D mask.
        """
        implementation = getattr(self.backbone.config, "_attn_implementation", None)
        if not _PREPARED_MASKS or implementation not in _MASK_READY_ATTENTION:
            return attention_mask
        keep = attention_mask[:, None, None, :].bool()  # (batch, 1, 1, length)
        if implementation == "sdpa":
            return keep
        dtype = self.backbone.get_input_embeddings().weight.dtype
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(
            ~keep, torch.finfo(dtype).min
        )

    def _t5_decoder_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Last decoder layer's states ``(batch, decoder_length, dim)``; no LM head."""
        attention_mask = self.padding_mask(attention_mask)
        encoder_states = self.backbone.encoder(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state  # (batch, length, dim)
        return self.backbone.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_states,
            encoder_attention_mask=attention_mask,
            use_cache=False,  # training and one-shot embedding: a KV cache only costs memory
        ).last_hidden_state

    def _shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Decoder inputs for teacher forcing: start token, then labels[:-1] (-100 → pad)."""
        shifted = labels.new_full(labels.shape, self.backbone.config.pad_token_id)
        shifted[:, 1:] = labels[:, :-1]
        shifted[:, 0] = self.decoder_start_token_id
        return shifted.masked_fill(shifted == -100, self.backbone.config.pad_token_id)

    def _lm_logits(self, decoder_states: torch.Tensor) -> torch.Tensor:
        """The LM head over decoder states, scaled as T5ForConditionalGeneration does."""
        config = self.backbone.config
        # Original T5 (and CodeT5) shares the output embedding and rescales by d_model^-0.5
        # first; T5 v1.1 does not. transformers 5 names this scale_decoder_outputs,
        # transformers 4 read it from tie_word_embeddings.
        scale = getattr(config, "scale_decoder_outputs", None)
        if scale is None:
            scale = config.tie_word_embeddings
        if scale:
            decoder_states = decoder_states * (config.d_model**-0.5)
        return self.backbone.lm_head(decoder_states)

    def _pool_encoder(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state  # (batch, length, dim)
        if self.model_config.pooling == "cls":
            pooled = states[:, 0]  # (batch, hidden)
        else:
            pooled = decoder.mean_states(states, attention_mask)  # (batch, hidden)
        return self._project(pooled)

    def _pool_decoder(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=decoder.position_ids(attention_mask),  # left padding as right
            use_cache=False,  # one-shot embedding: a KV cache only costs memory
        ).last_hidden_state  # (batch, length, dim)
        if self.model_config.pooling == "last":
            pooled = decoder.last_token_states(states, attention_mask)  # (batch, hidden)
        else:
            pooled = decoder.mean_states(states, attention_mask)  # (batch, hidden)
        return self._project(pooled)

    def _project(self, pooled: torch.Tensor) -> torch.Tensor:
        if self.projection is None:
            return pooled
        return self.projection_activation(self.projection(pooled))  # (batch, projection_dim)

    # ----------------------------------------------------------------- building and loading

    @classmethod
    def build_tiny(
        cls, model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0
    ) -> DualEncoder:
        """A random-init model sized by ``model_config.tiny_*`` for ``tokenizer`` (seeded):
        a T5, or with ``kind="decoder"`` a Qwen2-shaped decoder (:mod:`santa.models.tiny`)."""
        return cls(build_tiny_backbone(model_config, tokenizer, seed), model_config, tokenizer)

    def merge_adapters(self) -> DualEncoder:
        """Add the LoRA adapters into the weights (in place; no peft left) and return the
        model; its config no longer asks for adapters, the settings are kept for the card."""
        if not self.is_lora:
            return self
        self.merged_lora = lora.adapter_settings(self.model_config, self.base_location)
        self.backbone = lora.merge_adapters(self.backbone)
        self.model_config = dataclasses.replace(self.model_config, lora_rank=0)
        return self

    @classmethod
    def from_config(
        cls,
        model_config: ModelConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        seed: int = 0,
    ) -> DualEncoder:
        """Build ``model_config.backbone``: a tiny T5 (needs ``tokenizer``) or a load."""
        if model_config.is_tiny:
            if tokenizer is None:
                raise ValueError("the 'tiny' backbone needs a tokenizer (santa.models.tokenizer)")
            return cls.build_tiny(model_config, tokenizer, seed=seed)
        model = cls.from_pretrained(model_config.backbone, model_config)
        if tokenizer is not None:
            model.tokenizer = tokenizer
        return model

    @classmethod
    def from_pretrained(
        cls, uri_or_name: str, model_config: ModelConfig | None = None
    ) -> DualEncoder:
        """Load from a local HF folder, an ``s3://`` URI, a santa checkpoint or a hub name.

        The config comes from ``model_config`` if given, else from the folder's
        ``santa_config.json`` (a santa checkpoint), else it is inferred from the HF config
        (encoder-decoder → T5 with decoder-0 pooling; encoder-only → the pooling of a
        sentence-transformers folder, else CLS). The tokenizer is loaded when the folder has
        one (or from ``model_config.tokenizer``).
        """
        try:
            if storage.is_s3(uri_or_name):
                with tempfile.TemporaryDirectory(prefix="santa-model-") as local_dir:
                    storage.download_dir(uri_or_name, local_dir, what="model")
                    model = cls._load(local_dir, model_config)
            else:
                model = cls._load(uri_or_name, model_config)
        except Exception as error:  # safetensors' SafetensorError is none of OSError & co.
            explain_load_failure(uri_or_name, error)
            raise
        # A LoRA folder's base is where its adapters say; any other folder is its own base.
        model.base_location = model.base_location or uri_or_name
        return model

    @classmethod
    def _load(cls, location: str, model_config: ModelConfig | None) -> DualEncoder:
        is_local = os.path.isdir(location)
        saved_config_path = Path(location) / SANTA_CONFIG_FILE
        if model_config is None and is_local and saved_config_path.is_file():
            model_config = ModelConfig.from_dict(json.loads(saved_config_path.read_text())["model"])
        if is_local and lora.is_adapter_folder(location):
            return lora.load_lora_model(cls, location, model_config)
        layout = read_sentence_transformers_layout(location) if is_local else None
        if model_config is None:
            model_config = infer_model_config(location, layout)
        elif layout is not None:
            model_config = with_folder_structure(model_config, layout.model_fields)
        auto_class = AutoModelForSeq2SeqLM if model_config.kind == "t5" else AutoModel
        # santa saves no pooler: build none for its own checkpoints (others carry theirs)
        saved_by_santa = is_local and saved_config_path.is_file()
        extra = without_pooler(location, model_config) if saved_by_santa else {}
        if model_config.is_decoder:
            # transformers 5 loads a checkpoint in its own dtype (bf16 for most LLMs):
            # training keeps fp32 weights (autocast or FSDP's policy computes in bf16).
            extra["dtype"] = torch.float32
        tokenizer = load_tokenizer(location, model_config, is_local)
        if is_local and sharded.is_sharded_folder(location):
            # Written by FSDP training: the architecture from config.json, the weights
            # from the sharded checkpoint.
            backbone = auto_class.from_config(AutoConfig.from_pretrained(location), **extra)
            return sharded.load_sharded_weights(cls(backbone, model_config, tokenizer), location)
        backbone = auto_class.from_pretrained(location, **extra)
        model = cls(backbone, model_config, tokenizer)
        if model.projection is not None:
            state = saved_projection(location) or (layout and layout.projection_state)
            if not state:
                raise ValueError(f"{location}: the config has a projection but no weights for it")
            model.projection.load_state_dict(state)
        return model

    def save_pretrained(self, uri: str, santa_config: SantaConfig | None = None) -> None:
        """Write HF weights (safetensors), the tokenizer and ``santa_config.json`` to ``uri``.

        The folder loads back with :meth:`from_pretrained` and with plain transformers
        (``AutoModelForSeq2SeqLM`` / ``AutoModel`` and ``AutoTokenizer``). With
        ``santa_config`` its train section is recorded too.
        """
        if storage.is_s3(uri):
            with tempfile.TemporaryDirectory(prefix="santa-model-") as local_dir:
                self._save_local(local_dir, santa_config)
                storage.upload_dir(local_dir, uri)
            return
        self._save_local(uri, santa_config)

    def _save_local(self, directory: str, santa_config: SantaConfig | None) -> None:
        os.makedirs(directory, exist_ok=True)
        if self.is_lora:  # the adapters only; their base is named in adapter_config.json
            lora.save_adapters(self.backbone, directory, self.base_location)
        else:
            self.backbone.save_pretrained(directory)
        self.save_companions(directory, santa_config)

    def save_structure(self, directory: str, santa_config: SantaConfig | None = None) -> None:
        """A model folder without weights: the backbone's ``config.json`` (and a LoRA
        model's ``adapter_config.json``) and :meth:`save_companions`; a sharded checkpoint
        adds the weights (:func:`santa.models.sharded.save_sharded_weights`)."""
        os.makedirs(directory, exist_ok=True)
        if self.is_lora:
            for config in self.backbone.peft_config.values():
                config.base_model_name_or_path = self.base_location
                config.save_pretrained(directory)
            self.backbone.get_base_model().config.save_pretrained(directory)
        else:
            self.backbone.config.save_pretrained(directory)
        self.save_companions(directory, santa_config)

    def save_companions(self, directory: str, santa_config: SantaConfig | None) -> None:
        """Everything of a model folder but the backbone's weights: the tokenizer,
        ``santa_config.json``, the projection and the merged adapters' record (a sharded
        checkpoint writes its weights apart, :mod:`santa.models.sharded`)."""
        os.makedirs(directory, exist_ok=True)
        if self.merged_lora is not None:
            text = json.dumps(self.merged_lora, indent=2, sort_keys=True) + "\n"
            (Path(directory) / lora.MERGED_ADAPTERS_FILE).write_text(text)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)
        if santa_config is None:
            payload: dict[str, Any] = {"model": self.model_config.to_dict()}
        else:
            # The model section is this model's config, whatever the run config said.
            payload = dataclasses.replace(santa_config, model=self.model_config).to_dict()
        text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
        (Path(directory) / SANTA_CONFIG_FILE).write_text(text)
        if self.projection is not None:
            from safetensors.torch import save_file

            state = {
                key: value.detach().cpu().contiguous()
                for key, value in self.projection.state_dict().items()
            }
            save_file(state, str(Path(directory) / PROJECTION_FILE))
