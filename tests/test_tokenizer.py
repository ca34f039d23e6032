"""The locally trained T5-style tokenizer: special ids, sentinels, code, offline round trip."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from santa.method.masking import MAX_SENTINELS, mask_entities, sentinel
from santa.models.tokenizer import train_tokenizer

CODE = [
    'def add_one(value):\n    """Add one to a value."""\n    return value + 1\n',
    "class HttpClient:\n    def getValue(self, key):\n        return self.cache[key]\n",
    "for index in range(10):\n\tprint(index, end=' ')\n",
    "Return the number of items in the container.",
    "A stainless steel water bottle, 750 ml, keeps drinks cold for 24 hours.",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    # Repeat the texts so BPE finds merges; a few thousand short docs train in well under 1 s.
    return train_tokenizer(CODE * 50, vocab_size=1000)


def test_t5_special_token_ids(tokenizer: PreTrainedTokenizerBase) -> None:
    assert tokenizer.pad_token == "<pad>" and tokenizer.pad_token_id == 0
    assert tokenizer.eos_token == "</s>" and tokenizer.eos_token_id == 1
    assert tokenizer.unk_token == "<unk>" and tokenizer.unk_token_id == 2


def test_sentinels_are_single_special_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = [tokenizer.convert_tokens_to_ids(sentinel(k)) for k in range(MAX_SENTINELS)]
    assert ids == list(range(3, 3 + MAX_SENTINELS))
    assert set(map(sentinel, range(MAX_SENTINELS))) <= set(tokenizer.all_special_tokens)
    for k in (0, 7, 99):
        # Glued to code on both sides, still one token, never split.
        encoded = tokenizer(f"x.{sentinel(k)}(y)", add_special_tokens=False).input_ids
        assert ids[k] in encoded
        assert tokenizer.convert_ids_to_tokens(ids[k]) == sentinel(k)


def test_eos_is_appended(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer("return value").input_ids
    assert ids[-1] == tokenizer.eos_token_id
    assert ids.count(tokenizer.eos_token_id) == 1
    batch = tokenizer(["a", "return value + 1"], padding=True).input_ids
    assert batch[0][-1] == tokenizer.pad_token_id  # right padding


def test_code_round_trips_exactly(tokenizer: PreTrainedTokenizerBase) -> None:
    # Byte-level: indentation, tabs and newlines survive; nothing becomes <unk>.
    for text in [*CODE, "naïve → ünïcode ✓ 漢字"]:
        ids = tokenizer(text).input_ids
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_masked_document_and_target(tokenizer: PreTrainedTokenizerBase) -> None:
    text = CODE[0]
    start = text.index("value")
    spans = [(start, start + 5), (text.index("add_one"), text.index("add_one") + 7)]
    masked = mask_entities(text, spans)
    document_ids = tokenizer(masked.masked_text).input_ids
    target_ids = tokenizer(masked.target).input_ids
    for k in range(len(masked.entities)):
        assert tokenizer.convert_tokens_to_ids(sentinel(k)) in document_ids
    assert target_ids[0] == tokenizer.convert_tokens_to_ids(sentinel(0))
    assert tokenizer.decode(document_ids[:-1]) == masked.masked_text


def test_identifiers_split_on_underscores_and_punctuation(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    tokens = tokenizer.tokenize("self.cache[key]")
    assert "." in tokens and "[" in tokens
    assert "".join(tokens) == "self.cache[key]"


def test_save_and_load_offline(tokenizer: PreTrainedTokenizerBase, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in CODE:
        assert loaded(text).input_ids == tokenizer(text).input_ids
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2)
    assert loaded.convert_tokens_to_ids(sentinel(99)) == 102
    assert len(loaded) == len(tokenizer)


def test_vocab_size_is_bounded() -> None:
    tokenizer = train_tokenizer(CODE * 50, vocab_size=600)
    assert len(tokenizer) <= 600
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(CODE, vocab_size=100)
