"""The discriminators: cross-encoders ``D(x, y) = wᵀ mean_pool(E([x; y]))`` (SCodeR Eq. 2-3).

D_φ scores text–code pairs and D_ψ code–code pairs; both read the concatenation of the two
texts in one sequence (the tokenizer's own pair format: ``[CLS] x [SEP] y [SEP]`` for BERT,
``x </s> y </s>`` for T5), so self-attention sees both at once, unlike the dual encoder.
The encoder is the backbone's encoder stack (a T5's encoder alone; an encoder-only model
as it is), mean-pooled over real tokens, followed by one linear layer.

Single-device code: the training objectives live in :mod:`santa.scoder.objectives`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, T5EncoderModel

from santa.files import storage
from santa.models.dual_encoder import T5_MODEL_TYPES, enable_activation_checkpointing

__all__ = [
    "CODE_CODE",
    "DISCRIMINATOR_KINDS",
    "TEXT_CODE",
    "Discriminator",
    "DiscriminatorPair",
    "discriminator_kind",
]

TEXT_CODE = "text_code"  # D_φ: the query is natural language
CODE_CODE = "code_code"  # D_ψ: the query is code (ASST pairs)
DISCRIMINATOR_KINDS = (TEXT_CODE, CODE_CODE)
HEAD_FILE = "discriminator_head.pt"
INFO_FILE = "discriminator.json"


def discriminator_kind(pair_kind: str) -> str:
    """Which discriminator scores a pair row of ``pair_kind`` (``santa.data.kinds``)."""
    from santa.data.kinds import CODE_QUERY_KINDS

    return CODE_CODE if pair_kind in CODE_QUERY_KINDS else TEXT_CODE


class Discriminator(nn.Module):
    """One cross-encoder: token ids of ``[x; y]`` → a relevance score."""

    def __init__(self, encoder: nn.Module, tokenizer, seed: int = 0) -> None:
        super().__init__()
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # BERT's pooler feeds nothing here (DDP would wait on it)
        self.encoder = encoder
        self.tokenizer = tokenizer
        hidden = encoder.config.d_model if _is_t5(encoder.config) else encoder.config.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = nn.Linear(hidden, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores of ``(..., length)`` pair sequences: ``(...)``."""
        shape = input_ids.shape[:-1]
        input_ids = input_ids.reshape(-1, input_ids.shape[-1])  # (pairs, length)
        attention_mask = attention_mask.reshape(-1, attention_mask.shape[-1])
        states = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state  # (pairs, length, hidden)
        mask = attention_mask.unsqueeze(-1).to(states.dtype)  # (pairs, length, 1)
        pooled = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (pairs, hidden)
        return self.head(pooled).squeeze(-1).reshape(shape)

    def tokenize_pairs(
        self, firsts: list[str], seconds: list[str], *, max_first: int, max_length: int
    ) -> dict[str, torch.Tensor]:
        """``[x; y]`` for each pair, ``(pairs, max_length)``: ``x`` cut to ``max_first``
        tokens, ``y`` to what is left of ``max_length`` after ``x`` and the special tokens.
        """
        if len(firsts) != len(seconds):
            raise ValueError(f"{len(firsts)} first texts but {len(seconds)} second ones")
        cut = self.tokenizer(
            list(firsts),
            add_special_tokens=False,
            truncation=True,
            max_length=max_first,
            return_offsets_mapping=True,
        )["offset_mapping"]
        # The first text cut at its last kept token: the pair encoder then only shortens y.
        firsts = [
            text[: offsets[-1][1]] if offsets else text
            for text, offsets in zip(firsts, cut, strict=True)
        ]
        return dict(
            self.tokenizer(
                firsts,
                list(seconds),
                truncation="only_second",
                max_length=max_length,
                padding="max_length",
                return_tensors="pt",
            )
        )

    def score_lists(
        self,
        queries: list[str],
        candidates: list[list[str]],
        *,
        max_first: int,
        max_length: int,
    ) -> torch.Tensor:
        """``D(x, y)`` of every query with each of its candidates: ``(queries, candidates)``."""
        width = len(candidates[0]) if candidates else 0
        if any(len(row) != width for row in candidates):
            raise ValueError("every query needs the same number of candidates")
        firsts = [query for query in queries for _ in range(width)]
        seconds = [text for row in candidates for text in row]
        encoded = self.tokenize_pairs(firsts, seconds, max_first=max_first, max_length=max_length)
        device = self.head.weight.device
        scores = self(encoded["input_ids"].to(device), encoded["attention_mask"].to(device))
        return scores.reshape(len(queries), width)  # (queries, 1 + n)

    def gradient_checkpointing_enable(self) -> None:
        """Recompute the encoder's activations in backward (non-reentrant: DDP-safe)."""
        enable_activation_checkpointing(self.encoder)

    # ----------------------------------------------------------------- saving and loading

    @classmethod
    def from_backbone(cls, location: str, tokenizer: str | None = None, seed: int = 0):
        """A discriminator on ``location``'s encoder (HF folder, hub name, santa model or
        ``s3://``) with a new head (seeded)."""
        with _local(location) as folder:
            encoder = _load_encoder(folder)
            tokenizer_object = AutoTokenizer.from_pretrained(tokenizer or folder)
            return cls(encoder, tokenizer_object, seed=seed)

    @classmethod
    def from_pretrained(cls, location: str) -> Discriminator:
        """Load what :meth:`save_pretrained` wrote (local or ``s3://``)."""
        with _local(location) as folder:
            model = cls(_load_encoder(folder), AutoTokenizer.from_pretrained(folder))
            model.head.load_state_dict(torch.load(Path(folder) / HEAD_FILE, weights_only=True))
            return model

    def save_pretrained(self, uri: str) -> None:
        """Write encoder (HF), tokenizer and head into ``uri`` (local or ``s3://``)."""
        if storage.is_s3(uri):
            with tempfile.TemporaryDirectory(prefix="santa-discriminator-") as directory:
                self.save_pretrained(directory)
                storage.upload_dir(directory, uri)
            return
        os.makedirs(uri, exist_ok=True)
        self.encoder.save_pretrained(uri)
        self.tokenizer.save_pretrained(uri)
        torch.save(self.head.state_dict(), Path(uri) / HEAD_FILE)
        info = {"head": "linear over mean-pooled encoder states", "input": "[x; y]"}
        (Path(uri) / INFO_FILE).write_text(json.dumps(info) + "\n")


class DiscriminatorPair(nn.Module):
    """D_φ and (when there are code–code pairs) D_ψ, trained together as one DDP module."""

    def __init__(self, discriminators: dict[str, Discriminator]) -> None:
        super().__init__()
        unknown = set(discriminators) - set(DISCRIMINATOR_KINDS)
        if unknown or not discriminators:
            raise ValueError(f"discriminator kinds are {DISCRIMINATOR_KINDS}, got {unknown}")
        self.by_kind = nn.ModuleDict(discriminators)

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{kind}_input_ids`` / ``{kind}_attention_mask`` ``(batch, 1 + n, length)`` of the
        kinds present → ``{kind: scores (batch, 1 + n)}``; one call, so DDP sees one forward."""
        return {
            kind: model(inputs[f"{kind}_input_ids"], inputs[f"{kind}_attention_mask"])
            for kind, model in self.by_kind.items()
            if f"{kind}_input_ids" in inputs
        }

    def gradient_checkpointing_enable(self) -> None:
        """Recompute every discriminator's activations in backward."""
        for model in self.by_kind.values():
            model.gradient_checkpointing_enable()

    def save_pretrained(self, uri: str) -> None:
        """One folder per discriminator: ``uri/text_code``, ``uri/code_code``."""
        for kind, model in self.by_kind.items():
            model.save_pretrained(storage.join(uri, kind))

    @classmethod
    def from_pretrained(cls, uri: str) -> DiscriminatorPair:
        """Load the discriminators :meth:`save_pretrained` wrote."""
        found = {
            kind: Discriminator.from_pretrained(storage.join(uri, kind))
            for kind in DISCRIMINATOR_KINDS
            if storage.exists(storage.join(uri, kind, HEAD_FILE))
        }
        if not found:
            raise FileNotFoundError(f"no discriminators under {uri}")
        return cls(found)


def _is_t5(config) -> bool:
    return getattr(config, "model_type", "") in T5_MODEL_TYPES


def _load_encoder(folder: str) -> nn.Module:
    """The encoder stack of a backbone: a T5's encoder, or the encoder-only model."""
    if _is_t5(AutoConfig.from_pretrained(folder)):
        return T5EncoderModel.from_pretrained(folder)
    return AutoModel.from_pretrained(folder)


class _local:
    """A local folder with ``location``'s files (downloaded from S3 when needed)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.temporary: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> str:
        if not storage.is_s3(self.location):
            return self.location
        self.temporary = tempfile.TemporaryDirectory(prefix="santa-discriminator-")
        storage.download_dir(self.location, self.temporary.name, what="discriminator")
        return self.temporary.name

    def __exit__(self, *exc_info) -> None:
        if self.temporary is not None:
            self.temporary.cleanup()
