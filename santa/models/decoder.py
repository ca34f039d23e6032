"""Decoder LLMs as embedders (``kind="decoder"``): pooling, positions, the tokenizer's EOS
and the tiny random-init decoder.

A causal LM sees, at each position, only the tokens before it: the state of the *last*
token is the only one that has read the whole text, so RepLLaMA (Ma et al., 2023) appends
an EOS token and takes its final hidden state as the embedding (``pooling="last"``); the
mean of every state (``"mean"``) is the other choice. Three things make that correct
whatever the batch looks like:

- **the EOS is part of the tokenizer**: :func:`append_eos` sets the fast tokenizer's
  post-processor to add it after truncation (as T5's ``</s>``), so the training input, the
  evaluator, the index and an exported folder (transformers, sentence-transformers) all
  tokenize alike, and a text cut to ``max_length`` still ends with it;
- **pooling reads the attention mask**: :func:`last_token_states` takes, per row, the last
  position whose mask is 1, for left and right padding alike (sentence-transformers'
  ``lasttoken`` pooling does the same);
- **positions count real tokens only**: :func:`position_ids` numbers each row's tokens from
  0 at its first real token, so a left-padded text gets the positions a right-padded one
  gets (transformers numbers positions from the first column otherwise).

Single-device code, like :mod:`santa.models.dual_encoder` that uses it.

References:
    Ma et al., *Fine-Tuning LLaMA for Multi-Stage Text Retrieval* (RepLLaMA), SIGIR 2024;
    Tevatron's ``EncoderModel`` (``pooling="eos"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from santa.config import ModelConfig

__all__ = [
    "DECODER_MODEL_TYPES",
    "append_eos",
    "append_eos_to_backend",
    "is_decoder_config",
    "last_token_states",
    "mean_states",
    "position_ids",
    "prepare_decoder_tokenizer",
]

# Decoder-only families santa recognises in a folder without santa_config.json (its
# architectures name a *ForCausalLM otherwise).
DECODER_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "starcoder2",
)


def is_decoder_config(hf_config) -> bool:
    """Whether a transformers config is a decoder-only (causal) LM."""
    if getattr(hf_config, "is_encoder_decoder", False):
        return False
    architectures = getattr(hf_config, "architectures", None) or []
    if any(name.endswith("ForCausalLM") for name in architectures):
        return True
    return getattr(hf_config, "model_type", "") in DECODER_MODEL_TYPES


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only: ``(batch, length)`` 1/0 → ``(batch, length)``,
    0 at each row's first real token (padding gets its neighbours' positions; it is masked)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def last_token_states(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The state of each row's last real token: ``(batch, length, dim)`` → ``(batch, dim)``.

    The last position whose mask is 1, so right padding (``[t t t p p]``) and left padding
    (``[p p t t t]``) give the same token. A row without any real token gives position 0.
    """
    length = attention_mask.shape[1]
    columns = torch.arange(length, device=attention_mask.device)  # (length,)
    last = (attention_mask.bool() * columns).amax(dim=1)  # (batch,)
    rows = torch.arange(states.shape[0], device=states.device)  # (batch,)
    return states[rows, last]  # (batch, dim)


def mean_states(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean of the real tokens' states: ``(batch, length, dim)`` → ``(batch, dim)``."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)  # (batch, length, 1)
    # Padding must not dilute the mean; clamp guards an all-padding row.
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def append_eos_to_backend(backend, eos: str, eos_id: int) -> None:
    """Make a ``tokenizers.Tokenizer`` end every sequence with ``eos`` (in place): a
    ``TemplateProcessing`` step after its own post-processor (Llama's BOS and the byte-level
    offsets stay). The tokenizers library counts the added token when truncating, so a text
    cut to ``max_length`` keeps its EOS. A tokenizer that adds it already is left alone."""
    from tokenizers import processors

    def ends_with_eos() -> bool:
        ids = backend.encode("a", add_special_tokens=True).ids
        return bool(ids) and ids[-1] == eos_id

    if ends_with_eos():
        return
    template = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, eos_id)]
    )
    existing = backend.post_processor
    backend.post_processor = (
        template if existing is None else processors.Sequence([existing, template])
    )
    if not ends_with_eos():
        raise ValueError(f"could not make the tokenizer append {eos!r}")


def append_eos(tokenizer: PreTrainedTokenizerBase) -> None:
    """Make a transformers fast tokenizer end every sequence with its EOS token (in place;
    :func:`append_eos_to_backend` on its backend), so that its saved ``tokenizer.json``
    does too."""
    if tokenizer.eos_token is None or tokenizer.eos_token_id is None:
        raise ValueError(f"{type(tokenizer).__name__} has no EOS token to append")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"appending EOS needs a fast tokenizer, got {type(tokenizer).__name__} "
            "(set model.append_eos=false or use the backbone's tokenizer.json)"
        )
    append_eos_to_backend(backend, tokenizer.eos_token, tokenizer.eos_token_id)


def prepare_decoder_tokenizer(
    tokenizer: PreTrainedTokenizerBase, model_config: ModelConfig
) -> PreTrainedTokenizerBase:
    """A decoder's tokenizer as santa uses it (in place): a pad token (its EOS when it has
    none, as Llama's), the configured padding side, and the EOS appended."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model_config.padding_side is not None:
        tokenizer.padding_side = model_config.padding_side
    if model_config.append_eos:
        append_eos(tokenizer)
    return tokenizer
