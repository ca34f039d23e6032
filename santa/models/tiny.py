"""Tiny random-init backbones built from a config, for tests, benchmarks and the demo (no
download is possible on santa's development machines): a T5 (``kind="t5"``, the ``tiny``
recipes) or a Qwen2-shaped decoder (``kind="decoder"``, ``tiny-decoder``), sized by the
``model.tiny_*`` fields for a tokenizer trained locally (:mod:`santa.models.tokenizer`).
Each is seeded in a private RNG stream: the same seed gives the same weights whatever ran
before, and the caller's global RNG state is left alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from santa.config import ModelConfig

__all__ = [
    "build_tiny_backbone",
    "build_tiny_decoder",
    "build_tiny_t5",
    "use_qwen2_pretokenization",
]


def build_tiny_backbone(
    model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0
) -> PreTrainedModel:
    """The tiny backbone of ``model_config.kind``: a T5 or a decoder."""
    if model_config.kind == "decoder":
        return build_tiny_decoder(model_config, tokenizer, seed)
    if model_config.kind != "t5":
        raise ValueError("the tiny backbone is a T5 or a decoder; set kind='t5' or 'decoder'")
    return build_tiny_t5(model_config, tokenizer, seed)


def build_tiny_t5(
    model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0
) -> PreTrainedModel:
    """A random-init ``T5ForConditionalGeneration`` sized by ``model_config.tiny_*``."""
    from transformers import T5Config, T5ForConditionalGeneration

    t5_config = T5Config(
        vocab_size=len(tokenizer),
        d_model=model_config.tiny_d_model,
        d_kv=model_config.tiny_d_model // model_config.tiny_num_heads,
        d_ff=model_config.tiny_d_ff,
        num_layers=model_config.tiny_num_layers,
        num_decoder_layers=model_config.tiny_num_layers,
        num_heads=model_config.tiny_num_heads,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        dropout_rate=model_config.tiny_dropout,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return T5ForConditionalGeneration(t5_config)


def use_qwen2_pretokenization(tokenizer: PreTrainedTokenizerBase) -> None:
    """Give a byte-level BPE tokenizer Qwen2's normaliser and pre-tokenizer (in place).

    transformers 5 loads the tokenizer of a folder whose ``config.json`` is a Qwen2 as
    ``Qwen2Tokenizer``, which keeps ``tokenizer.json``'s vocabulary, merges and
    post-processor but sets its own NFC normaliser and pre-tokenizer: the tiny decoder's
    tokenizer takes them first, so that santa's training input (``tokenizer.json`` alone),
    ``AutoTokenizer`` and sentence-transformers split every text alike. Any byte-level
    pre-tokenization covers every input with the same byte alphabet.
    """
    from tokenizers import Regex, normalizers, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    backend = tokenizer.backend_tokenizer
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_tiny_decoder(
    model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0
) -> PreTrainedModel:
    """A random-init Qwen2-shaped decoder (``Qwen2Model``: no LM head) sized by
    ``model_config.tiny_*`` for ``tokenizer`` (seeded; the caller's RNG is left alone).
    The tokenizer takes Qwen2's pre-tokenization (:func:`use_qwen2_pretokenization`)."""
    from transformers import Qwen2Config, Qwen2Model

    use_qwen2_pretokenization(tokenizer)

    heads = model_config.tiny_num_heads
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=model_config.tiny_d_model,
        intermediate_size=model_config.tiny_d_ff,
        num_hidden_layers=model_config.tiny_num_layers,
        num_attention_heads=heads,
        num_key_value_heads=model_config.tiny_num_kv_heads or heads,
        max_position_embeddings=2048,  # rotary: positions cost nothing until used
        attention_dropout=model_config.tiny_dropout,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2Model(config)
