"""Masking for Masked Entity Prediction (MEP) and its random-span ablation.

Masked text and target use T5 sentinels. The target format is

    "<extra_id_0> ent_0 <extra_id_1> ent_1 ... <extra_id_{K-1}> ent_{K-1}"

i.e. each sentinel is followed by exactly one space and its text, and pairs are joined by
exactly one space (an empty target when nothing is masked). With ``trailing_sentinel``
(SANTA's released ``build_code_entity.py``) the target ends with one more sentinel,
``... <extra_id_{K-1}> ent_{K-1} <extra_id_K>``, as T5's span corruption ends its targets.

Round-trip rule (:func:`fill_sentinels`): split the target on the sentinel pattern; the
piece after sentinel k is ``" " + ent_k + " "`` (``" " + ent_k`` for the last one), so we
remove exactly one leading space and, except for the last piece, exactly one trailing
space. Any other whitespace belongs to the entity, which makes the round trip exact even
for spans that begin or end with spaces or newlines. The only requirement is that the
original text contains no sentinel string itself (:func:`contains_sentinel`; the masking
functions reject such text): since a sentinel starts with ``<`` and ends with ``>`` and has
neither inside, every sentinel match in a masked text is then one we inserted.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from santa.method.entities import token_spans

__all__ = [
    "MAX_SENTINELS",
    "MaskedText",
    "contains_sentinel",
    "fill_sentinels",
    "mask_entities",
    "mask_random_spans",
    "sentinel",
]

# T5/CodeT5 vocabularies have 100 sentinels, <extra_id_0> ... <extra_id_99>.
MAX_SENTINELS = 100

_SENTINEL_RE = re.compile(r"<extra_id_(\d+)>")


@dataclass(frozen=True)
class MaskedText:
    """A text with spans replaced by sentinels, and the MEP decoder target."""

    masked_text: str
    target: str
    entities: list[str]  # index k is the text behind sentinel k
    num_tokens: int  # tokens of the original text, per token_spans
    num_masked_tokens: int  # of those, the tokens inside masked spans

    @property
    def ratio(self) -> float:
        """Share of the text's tokens that are masked (0.0 for an empty text)."""
        return self.num_masked_tokens / self.num_tokens if self.num_tokens else 0.0


def sentinel(k: int) -> str:
    """Return the T5 sentinel token ``<extra_id_{k}>``."""
    return f"<extra_id_{k}>"


def contains_sentinel(text: str) -> bool:
    """Return whether ``text`` already contains a ``<extra_id_N>`` string."""
    return _SENTINEL_RE.search(text) is not None


def _format_target(entities: list[str], trailing_sentinel: bool = False) -> str:
    target = " ".join(f"{sentinel(k)} {entity}" for k, entity in enumerate(entities))
    if trailing_sentinel and entities:
        target += f" {sentinel(len(entities))}"
    return target


def _check_text(text: str) -> None:
    if contains_sentinel(text):
        raise ValueError("text already contains a sentinel (<extra_id_N>); cannot mask it")


def _count_tokens_inside(tokens: list[tuple[int, int]], spans: list[tuple[int, int]]) -> int:
    """Count tokens lying entirely inside one of the sorted, disjoint ``spans``."""
    count = 0
    span_index = 0
    for token_start, token_end in tokens:
        # Spans and tokens are both sorted: skip the spans that end before this token.
        while span_index < len(spans) and spans[span_index][1] <= token_start:
            span_index += 1
        if span_index == len(spans):
            break
        span_start, span_end = spans[span_index]
        if span_start <= token_start and token_end <= span_end:
            count += 1
    return count


def _replace_spans(text: str, spans: list[tuple[int, int]], replacements: list[str]) -> str:
    pieces = []
    position = 0
    for (start, end), replacement in zip(spans, replacements, strict=True):
        pieces.append(text[position:start])
        pieces.append(replacement)
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def mask_entities(
    text: str,
    spans: list[tuple[int, int]],
    max_entities: int = MAX_SENTINELS,
    *,
    trailing_sentinel: bool = False,
) -> MaskedText:
    """Replace entity spans with sentinels, one sentinel per distinct entity string; with
    ``trailing_sentinel`` the target ends with the next sentinel (one fewer entity fits)."""
    if trailing_sentinel:
        max_entities = min(max_entities, MAX_SENTINELS - 1)
    if not 0 <= max_entities <= MAX_SENTINELS:
        raise ValueError(f"max_entities must be in [0, {MAX_SENTINELS}], got {max_entities}")
    _check_text(text)
    ordered = sorted(spans)
    previous_end = 0
    for start, end in ordered:
        if not 0 <= start < end <= len(text):
            raise ValueError(f"invalid span ({start}, {end}) for a text of length {len(text)}")
        if start < previous_end:
            raise ValueError(f"span ({start}, {end}) overlaps the previous span")
        previous_end = end

    # Sentinel numbers follow first appearance; entities past the limit stay in the text
    # (the paper caps at the 100 sentinels of the T5 vocabulary).
    sentinel_of: dict[str, int] = {}
    masked_spans: list[tuple[int, int]] = []
    replacements: list[str] = []
    for start, end in ordered:
        entity = text[start:end]
        k = sentinel_of.get(entity)
        if k is None:
            if len(sentinel_of) >= max_entities:
                continue
            k = sentinel_of[entity] = len(sentinel_of)
        masked_spans.append((start, end))
        replacements.append(sentinel(k))

    entities = list(sentinel_of)  # dicts keep insertion order: index k = sentinel k
    tokens = token_spans(text)
    return MaskedText(
        masked_text=_replace_spans(text, masked_spans, replacements),
        target=_format_target(entities, trailing_sentinel),
        entities=entities,
        num_tokens=len(tokens),
        num_masked_tokens=_count_tokens_inside(tokens, masked_spans),
    )


def _random_composition(rng: random.Random, total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` positive integers uniformly at random."""
    cuts = sorted(rng.sample(range(1, total), parts - 1))
    return [high - low for low, high in zip([0, *cuts], [*cuts, total], strict=True)]


def mask_random_spans(
    text: str,
    rng: random.Random,
    num_tokens_to_mask: int,
    mean_span_length: float = 3.0,
    max_spans: int = MAX_SENTINELS,
) -> MaskedText:
    """Mask ``num_tokens_to_mask`` tokens in random contiguous spans (T5-style ablation)."""
    if mean_span_length <= 0:
        raise ValueError(f"mean_span_length must be positive, got {mean_span_length}")
    if not 1 <= max_spans <= MAX_SENTINELS:
        raise ValueError(f"max_spans must be in [1, {MAX_SENTINELS}], got {max_spans}")
    _check_text(text)
    tokens = token_spans(text)
    num_tokens = len(tokens)
    num_noise = max(0, min(num_tokens_to_mask, num_tokens))
    if num_noise == 0:
        return MaskedText(text, "", [], num_tokens, 0)

    # As in T5's random_spans_noise_mask: choose the number of spans from the mean
    # length, then cut the masked and the unmasked tokens into that many random runs and
    # interleave them. Unmasked runs between spans need at least one token (otherwise two
    # spans would touch), so at most num_clean + 1 spans fit; the runs before the first
    # and after the last span may be empty.
    num_clean = num_tokens - num_noise
    num_spans = round(num_noise / mean_span_length)
    num_spans = max(1, min(num_spans, max_spans, num_noise, num_clean + 1))
    noise_lengths = _random_composition(rng, num_noise, num_spans)
    # num_spans + 1 clean runs whose two outer ones may be empty: compose num_clean + 2
    # into positive parts and take one token back from each end.
    clean_lengths = _random_composition(rng, num_clean + 2, num_spans + 1)
    clean_lengths[0] -= 1
    clean_lengths[-1] -= 1

    spans: list[tuple[int, int]] = []
    position = 0
    for clean_length, noise_length in zip(clean_lengths, noise_lengths, strict=False):
        position += clean_length
        first, last = tokens[position], tokens[position + noise_length - 1]
        # A span runs from its first token's start to its last token's end, so the
        # whitespace between its tokens moves into the target with them.
        spans.append((first[0], last[1]))
        position += noise_length

    entities = [text[start:end] for start, end in spans]
    return MaskedText(
        masked_text=_replace_spans(text, spans, [sentinel(k) for k in range(len(spans))]),
        target=_format_target(entities),
        entities=entities,
        num_tokens=num_tokens,
        num_masked_tokens=num_noise,
    )


def _parse_target(target: str) -> dict[str, str]:
    """Map each sentinel in a target to its text (see the module docstring for the rule)."""
    if not target:
        return {}
    pieces = _SENTINEL_RE.split(target)
    # split with one group gives [before, n0, text0, n1, text1, ...]
    if pieces[0]:
        raise ValueError(f"target must start with a sentinel: {target[:50]!r}")
    mapping: dict[str, str] = {}
    if pieces[-1] == "" and len(pieces) > 3 and pieces[-3].endswith(" "):
        pieces = pieces[:-2]  # a trailing sentinel: it stands for no text
        pieces[-1] = pieces[-1][:-1]
    last = len(pieces) - 1
    for index in range(1, len(pieces), 2):
        piece = pieces[index + 1]
        is_last = index + 1 == last
        if not piece.startswith(" ") or (not is_last and not piece.endswith(" ")):
            raise ValueError(f"malformed target around {sentinel(int(pieces[index]))}")
        text = piece[1:] if is_last else piece[1:-1]
        name = sentinel(int(pieces[index]))
        if name in mapping:
            raise ValueError(f"sentinel {name} appears twice in the target")
        mapping[name] = text
    return mapping


def fill_sentinels(masked_text: str, target: str) -> str:
    """Substitute the target's texts back for the sentinels: the inverse of masking."""
    mapping = _parse_target(target)

    def substitute(match: re.Match[str]) -> str:
        try:
            return mapping[sentinel(int(match.group(1)))]
        except KeyError:
            raise ValueError(f"{match.group()} is not in the target") from None

    return _SENTINEL_RE.sub(substitute, masked_text)
