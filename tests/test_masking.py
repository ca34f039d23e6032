"""Tests for santa.method.masking: entity masking, random span masking and their inverse."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import re
from pathlib import Path

import pytest

from santa.method.entities import UnparsableCodeError, extract_code_entities, token_spans
from santa.method.masking import (
    MAX_SENTINELS,
    MaskedText,
    contains_sentinel,
    fill_sentinels,
    mask_entities,
    mask_random_spans,
    sentinel,
)


def word_spans(text: str, words: set[str]) -> list[tuple[int, int]]:
    """Spans of the whole-word occurrences of ``words`` in ``text``."""
    return [m.span() for m in re.finditer(r"\w+", text) if m.group() in words]


def test_sentinel() -> None:
    assert sentinel(0) == "<extra_id_0>"
    assert sentinel(99) == "<extra_id_99>"
    assert MAX_SENTINELS == 100


def test_small_example_exact_strings() -> None:
    text = "def add(a, b):\n    return a + b"
    masked = mask_entities(text, extract_code_entities(text, "python"))
    assert masked.masked_text == (
        "def <extra_id_0>(<extra_id_1>, <extra_id_2>):\n    return <extra_id_1> + <extra_id_2>"
    )
    assert masked.target == "<extra_id_0> add <extra_id_1> a <extra_id_2> b"
    assert masked.entities == ["add", "a", "b"]


def test_same_entity_same_sentinel() -> None:
    text = "total = total + price * count; price = count"
    masked = mask_entities(text, word_spans(text, {"total", "price", "count"}))
    assert masked.entities == ["total", "price", "count"]
    assert masked.masked_text == (
        "<extra_id_0> = <extra_id_0> + <extra_id_1> * <extra_id_2>; <extra_id_1> = <extra_id_2>"
    )


def test_ratio_hand_example() -> None:
    # Tokens: foo ( bar , foo ) + baz  -> 8 tokens; foo, bar, foo masked -> 3.
    text = "foo(bar, foo) + baz"
    masked = mask_entities(text, [(0, 3), (4, 7), (9, 12)])
    assert (masked.num_tokens, masked.num_masked_tokens) == (8, 3)
    assert masked.ratio == pytest.approx(3 / 8)
    # Ruby-style identifiers span several tokens ("valid", "?"), all inside the mask.
    ruby = "x.valid? && @y"
    masked = mask_entities(ruby, [(0, 1), (2, 8), (12, 14)])
    assert (masked.num_tokens, masked.num_masked_tokens) == (8, 5)
    assert MaskedText("", "", [], 0, 0).ratio == 0.0


def test_at_most_100_sentinels() -> None:
    names = [f"name{i}" for i in range(150)]
    text = " ".join(names + names)  # each entity twice
    masked = mask_entities(text, word_spans(text, set(names)))
    assert len(masked.entities) == MAX_SENTINELS
    assert masked.entities == names[:100]
    sentinels = set(re.findall(r"<extra_id_\d+>", masked.masked_text))
    assert sentinels == {sentinel(k) for k in range(100)}
    for name in names[100:]:  # the later entities stay in the text, literally
        assert masked.masked_text.count(name) == 2
    assert masked.num_masked_tokens == 200
    assert fill_sentinels(masked.masked_text, masked.target) == text
    # A smaller cap works the same way.
    assert mask_entities(text, word_spans(text, set(names)), max_entities=3).entities == names[:3]


def test_mask_entities_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        mask_entities("abcdef", [(0, 3), (2, 4)])
    with pytest.raises(ValueError, match="invalid span"):
        mask_entities("abc", [(1, 1)])
    with pytest.raises(ValueError, match="sentinel"):
        mask_entities("x <extra_id_3> y", [(0, 1)])
    with pytest.raises(ValueError, match="max_entities"):
        mask_entities("abc", [], max_entities=101)


def test_contains_sentinel() -> None:
    assert contains_sentinel("a <extra_id_12> b")
    assert not contains_sentinel("a <extra_id_> b <extra_id_x> extra_id_1")


@pytest.mark.parametrize(
    "spans",
    [
        [(0, 3), (9, 14)],  # plain words
        [(3, 9), (14, 17)],  # spans beginning/ending with a space and a newline
        [(0, 1), (1, 2), (2, 3)],  # adjacent spans
        [(0, 19)],  # the whole text
    ],
)
def test_entity_round_trip_with_whitespace(spans: list[tuple[int, int]]) -> None:
    text = "foo bar\n  baz\t\nqux "
    masked = mask_entities(text, spans)
    assert fill_sentinels(masked.masked_text, masked.target) == text


def test_round_trip_with_sentinel_like_text() -> None:
    # Masking "1" in "<extra_id_1>"-like fragments puts a sentinel next to "<extra_id_"
    # and ">"; parsing must still find only the sentinels it inserted.
    text = "<extra_id_x> <extra_id_ 1> a>"
    spans = [(10, 11), (24, 25), (27, 28)]
    assert [text[start:end] for start, end in spans] == ["x", "1", "a"]
    masked = mask_entities(text, spans)
    assert masked.masked_text == "<extra_id_<extra_id_0>> <extra_id_ <extra_id_1>> <extra_id_2>>"
    assert fill_sentinels(masked.masked_text, masked.target) == text


def test_fill_sentinels_rejects_unknown_sentinel() -> None:
    with pytest.raises(ValueError, match="not in the target"):
        fill_sentinels("<extra_id_1> x", "<extra_id_0> a")
    with pytest.raises(ValueError, match="start with a sentinel"):
        fill_sentinels("<extra_id_0> x", "a <extra_id_0> b")
    assert fill_sentinels("nothing masked", "") == "nothing masked"


def test_random_spans_reproducible_and_exact_count() -> None:
    text = " ".join(f"w{i}" for i in range(200))
    first = mask_random_spans(text, random.Random(7), num_tokens_to_mask=30)
    second = mask_random_spans(text, random.Random(7), num_tokens_to_mask=30)
    other = mask_random_spans(text, random.Random(8), num_tokens_to_mask=30)
    assert first == second
    assert first != other
    assert first.num_masked_tokens == 30
    # The masked spans really hold 30 tokens, in about 30 / 3 spans, in sentinel order.
    assert sum(len(token_spans(entity)) for entity in first.entities) == 30
    assert len(first.entities) == 10
    assert re.findall(r"<extra_id_(\d+)>", first.masked_text) == [
        str(k) for k in range(len(first.entities))
    ]
    assert first.ratio == pytest.approx(30 / 200)


def test_random_spans_target_format_and_inner_whitespace() -> None:
    text = "alpha beta\n\tgamma  delta"
    masked = mask_random_spans(text, random.Random(0), num_tokens_to_mask=4)
    # Everything masked: one span from the first token's start to the last token's end.
    assert masked.masked_text == "<extra_id_0>"
    assert masked.target == "<extra_id_0> alpha beta\n\tgamma  delta"
    assert fill_sentinels(masked.masked_text, masked.target) == text


def test_random_spans_edge_cases() -> None:
    assert mask_random_spans("", random.Random(0), 5) == MaskedText("", "", [], 0, 0)
    unmasked = mask_random_spans("a b c", random.Random(0), 0)
    assert (unmasked.masked_text, unmasked.target) == ("a b c", "")
    capped = mask_random_spans("a b c", random.Random(0), 10)  # more than the text has
    assert capped.num_masked_tokens == 3
    many = mask_random_spans(" ".join(["x"] * 1000), random.Random(0), 900, mean_span_length=1)
    assert len(many.entities) == MAX_SENTINELS  # 900 spans wanted, sentinels run out


@pytest.mark.parametrize("seed", range(20))
def test_random_spans_round_trip_synthetic(seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["foo", "bar_1", "(", ")", ".", "é", "x", "  ", "\n", "\t", " ", "\n  "]
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 80)))
    num_tokens = len(token_spans(text))
    for requested, mean in itertools.product({0, 1, num_tokens // 3, num_tokens}, (1.0, 3.0)):
        masked = mask_random_spans(text, rng, requested, mean_span_length=mean)
        assert masked.num_masked_tokens == min(requested, num_tokens)
        assert fill_sentinels(masked.masked_text, masked.target) == text


def test_round_trip_on_codesearchnet_ruby(shared_fixtures: Path) -> None:
    """CodeSearchNet Ruby (../shared's sample, else tests/datagen.py's stand-in)."""
    ruby = shared_fixtures / "csn" / "ruby" / "valid.jsonl.gz"
    with gzip.open(ruby, "rt", encoding="utf-8") as lines:
        codes = [json.loads(line)["code"] for line in itertools.islice(lines, 400)]
    rng = random.Random(0)
    checked = 0
    for code in codes:
        if contains_sentinel(code):
            continue
        try:
            spans = extract_code_entities(code, "ruby")
        except UnparsableCodeError:
            continue
        masked = mask_entities(code, spans)
        assert len(masked.entities) <= MAX_SENTINELS
        if len({code[start:end] for start, end in spans}) <= MAX_SENTINELS:  # all masked
            assert len(re.findall(r"<extra_id_\d+>", masked.masked_text)) == len(spans)
        assert fill_sentinels(masked.masked_text, masked.target) == code
        ablation = mask_random_spans(code, rng, masked.num_masked_tokens)
        assert ablation.num_masked_tokens == masked.num_masked_tokens
        assert fill_sentinels(ablation.masked_text, ablation.target) == code
        checked += 1
    assert checked >= 0.95 * len(codes)
