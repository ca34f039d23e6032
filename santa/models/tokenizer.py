"""A T5-style tokenizer trained locally, for tiny models built from a config.

Real backbones bring their own tokenizer (``AutoTokenizer.from_pretrained``); tests and the
demo cannot download one, so :func:`train_tokenizer` builds one from the training texts in
a second or two.

Choices, and why:

- **Byte-level BPE** (CodeT5's scheme, a RoBERTa-style byte-level BPE), not T5's
  SentencePiece with a Metaspace pre-tokenizer: SentencePiece's normalizer collapses runs of
  spaces and turns newlines into spaces, which erases indentation, and characters it has
  not seen become ``<unk>``. Byte-level BPE keeps every byte, so code decodes back exactly
  (indentation and newlines included) and no input is ever unknown.
- **Pre-tokenization** is GPT-2's regex (letters, digits, punctuation and whitespace runs
  are separate words): ``get_value`` becomes ``get`` ``_`` ``value`` before merges, camel
  case stays one letter run for BPE to split by frequency, and a newline or an indentation
  run is its own token instead of being glued to the next word. No prefix space is added,
  as in CodeT5.
- **Special tokens** follow T5: ``<pad>`` = 0, ``</s>`` = 1 (appended to every sequence by
  the post-processor), ``<unk>`` = 2, then the 100 sentinels ``<extra_id_0>`` ...
  ``<extra_id_99>`` (ids 3 to 102). The sentinels are special added tokens, so they are
  matched before pre-tokenization and never split, even when glued to code
  (``def <extra_id_0>(x):``). ``<pad>`` is also T5's ``decoder_start_token_id``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from santa.method.masking import MAX_SENTINELS, sentinel

__all__ = ["EOS_TOKEN", "PAD_TOKEN", "SENTINELS", "UNK_TOKEN", "train_tokenizer"]

PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SENTINELS = [sentinel(k) for k in range(MAX_SENTINELS)]

# Long enough for the longest configured input; truncation happens in the input pipeline.
_MODEL_MAX_LENGTH = 512


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with T5's special tokens on ``texts``."""
    special_tokens = [PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, *SENTINELS]
    if vocab_size < len(special_tokens) + 256:
        raise ValueError(
            f"vocab_size must leave room for {len(special_tokens)} special tokens and the "
            f"256 bytes, got {vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,  # in this order: ids 0, 1, 2, then the sentinels
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    # T5 ends every sequence (query, document, MEP target) with </s> and adds no BOS.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, eos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        # transformers 5 stores these as extra_special_tokens; the old name works in 4 and 5.
        additional_special_tokens=SENTINELS,
        model_max_length=_MODEL_MAX_LENGTH,
        padding_side="right",
    )
