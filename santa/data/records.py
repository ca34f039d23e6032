"""Plain-Python record handling: parse raw inputs, validate, and build training pairs.

Every function here works on one record and raises :class:`DropRow` with a reason when the
record is bad, so the Ray pipeline can count drops by reason and never die on one row.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from santa.data.cleaning import (
    choose_bullet_point,
    clean_docstring,
    has_markup,
    remove_docstring,
    split_bullet_points,
    strip_html,
)
from santa.data.kinds import CODE_PAIR, PRODUCT_JUDGMENT, PRODUCT_PRETRAIN
from santa.data.schema import CODE_LANGUAGES, ESCI_LABEL_GRADES
from santa.method.entities import (
    UnparsableCodeError,
    extract_code_entities,
    extract_product_entities,
)
from santa.method.masking import contains_sentinel, mask_entities, mask_random_spans

CSN_FIELDS = (
    "repo",
    "path",
    "func_name",
    "original_string",
    "language",
    "code",
    "code_tokens",
    "docstring",
    "docstring_tokens",
    "url",
    "partition",
)
# Fields without which no pair can be built; the rest are kept when present.
CSN_REQUIRED = ("code", "docstring", "language")
ADVTEST_REQUIRED = ("function", "docstring_tokens", "url")


class Reason:
    """Names of the reasons a row is dropped (bad input) or filtered (not selected)."""

    MALFORMED_JSON = "malformed_json"
    MISSING_FIELD = "missing_field"
    UNDECODABLE_BYTES = "undecodable_bytes"
    UNPARSABLE_CODE = "unparsable_code"
    EMPTY_DOCSTRING = "empty_docstring"
    EMPTY_DOCUMENT = "empty_document"
    TOO_LONG = "too_long"
    DUPLICATE = "duplicate"
    HELDOUT_LEAK = "heldout_leak"
    SENTINEL_IN_TEXT = "sentinel_in_text"
    UNSUPPORTED_LANGUAGE = "unsupported_language"
    UNREADABLE_FILE = "unreadable_file"
    # A file that breaks off (truncated or corrupt gzip, read error): the lines before the
    # fault are kept, the rest of the file counts as one corrupt_file row naming it.
    CORRUPT_FILE = "corrupt_file"
    # Filters: rows that are fine but not part of the requested selection.
    OTHER_LANGUAGE = "other_language"
    OTHER_SPLIT = "other_split"
    OTHER_LOCALE = "other_locale"
    OTHER_VERSION = "other_version"
    # ESCI pretraining by SANTA's scripts (esci_pretrain="paper"): only Exact judgments, and
    # only products whose description holds HTML markup, make pairs.
    OTHER_LABEL = "other_label"
    PLAIN_DESCRIPTION = "plain_description"

    FILTERS = frozenset(
        {OTHER_LANGUAGE, OTHER_SPLIT, OTHER_LOCALE, OTHER_VERSION, OTHER_LABEL, PLAIN_DESCRIPTION}
    )


class DropRow(Exception):
    """Raised for a row that must be dropped; ``reason`` is one of :class:`Reason`."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class PairOptions:
    """How pairs are built from records (a plain, picklable subset of the job config)."""

    stage: str = "pretrain"  # pretrain | finetune | eval
    mask: str = "entity"  # entity | span
    seed: int = 0
    max_query_chars: int = 4_096
    max_document_chars: int = 16_384
    max_entities: int = 100
    product_entities: str = "scripts"  # santa.method.entities.PRODUCT_ENTITY_RULES
    code_text: str = "raw"  # CODE_TEXTS
    mep_targets: str = "all"  # MEP_TARGETS

    def __post_init__(self) -> None:
        if self.stage not in ("pretrain", "finetune", "eval"):
            raise ValueError(f"stage must be pretrain, finetune or eval, not {self.stage!r}")
        if self.mask not in ("entity", "span"):
            raise ValueError(f"mask must be entity or span, not {self.mask!r}")
        if self.code_text not in CODE_TEXTS:
            raise ValueError(f"code_text must be one of {CODE_TEXTS}, not {self.code_text!r}")
        if self.mep_targets not in MEP_TARGETS:
            raise ValueError(f"mep_targets must be one of {MEP_TARGETS}, not {self.mep_targets!r}")


CODE_TEXTS = ("raw", "tokens")
"""A code pair's texts: ``raw`` (santa's: the code without its docstring, and the cleaned
docstring in pretraining) or ``tokens`` (SANTA's released code: ``' '.join(code_tokens)``
and ``' '.join(docstring_tokens)`` in every stage, the text CodeXGLUE evaluates on)."""
MEP_TARGETS = ("all", "released")
"""Which identifiers code pretraining masks: ``all`` (santa's: every one) or ``released``
(SANTA's ``build_code_entity.py``: every one in Python; in the other languages the names of
a seeded random sample of the occurrences, ``int(max(ratio·(n − 1), 1))`` of ``n``, ratio 0.1
for JavaScript and 0.5 otherwise; the target ends with a trailing sentinel)."""
# The two choices as the preprocess job's --help says them (argparse: %% is a percent sign).
CODE_TEXT_HELP = (
    "code pairs' texts: raw (code without its docstring; default) or tokens (the joined code "
    "and docstring tokens, as SANTA's released code and CodeXGLUE's evaluation)"
)
MEP_TARGETS_HELP = (
    "identifiers code pretraining masks: all (default) or released (SANTA's per-language "
    "sample: Python all, JavaScript 10 %%, others 50 %%; a trailing sentinel)"
)
RELEASED_MASK_RATIO = {"python": 1.0, "javascript": 0.1}
RELEASED_MASK_RATIO_OTHERS = 0.5


def released_entity_sample(
    text: str,
    spans: list[tuple[int, int]],
    language: str,
    rng: random.Random,
    population: list[str] | None = None,
) -> list[tuple[int, int]]:
    """The identifier occurrences SANTA's released ``build_code_entity.py`` masks: all in
    Python; else every span of ``text`` whose name is among ``int(max(ratio·(n − 1), 1))``
    of the ``n`` identifier occurrences ``population`` (the function's own, in its code;
    default: the spans' names) drawn by ``rng`` (``random.sample``, as the script draws)."""
    ratio = RELEASED_MASK_RATIO.get(language, RELEASED_MASK_RATIO_OTHERS)
    names = [text[start:end] for start, end in spans]
    population = names if population is None else population
    if ratio >= 1.0 or not population:
        return spans
    drawn = set(rng.sample(population, k=int(max(ratio * (len(population) - 1), 1))))
    return [span for span, name in zip(spans, names, strict=True) if name in drawn]


def stable_hash(*parts: Any) -> str:
    """A short hex digest of ``parts`` that is the same in every process (unlike hash())."""
    text = "\x1f".join(str(part) for part in parts)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def parse_json_line(raw: bytes) -> dict[str, Any]:
    """Decode one JSON line, raising DropRow for undecodable bytes or malformed JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DropRow(Reason.UNDECODABLE_BYTES, str(error)) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise DropRow(Reason.MALFORMED_JSON, str(error)) from None
    if not isinstance(obj, dict):
        raise DropRow(Reason.MALFORMED_JSON, f"expected an object, got {type(obj).__name__}")
    return obj


def _require(obj: dict[str, Any], fields: tuple[str, ...]) -> None:
    for field in fields:
        value = obj.get(field)
        if value is None:
            raise DropRow(Reason.MISSING_FIELD, field)


def normalize_codesearchnet(obj: dict[str, Any]) -> dict[str, Any]:
    """A CodeSearchNet record with every field present (missing optional ones empty)."""
    _require(obj, CSN_REQUIRED)
    if not isinstance(obj["code"], str) or not isinstance(obj["docstring"], str):
        raise DropRow(Reason.MISSING_FIELD, "code/docstring must be strings")
    record = {field: obj.get(field) for field in CSN_FIELDS}
    record["language"] = str(record["language"]).lower()
    for field in ("repo", "path", "func_name", "url", "partition"):
        record[field] = str(record[field] or "")
    record["original_string"] = record["original_string"] or record["code"]
    record["code_tokens"] = list(record["code_tokens"] or [])
    record["docstring_tokens"] = [str(t) for t in (record["docstring_tokens"] or [])]
    if not record["url"]:
        record["url"] = "sha:" + stable_hash(record["code"])
    return record


def normalize_advtest(obj: dict[str, Any]) -> dict[str, Any]:
    """A CodeXGLUE AdvTest record mapped onto CodeSearchNet fields (language python).

    AdvTest's train split is already CodeSearchNet-shaped; its valid/test splits carry the
    (name-obfuscated) code in ``function`` and the identifier in ``identifier``.
    """
    if "code" in obj and "function" not in obj:
        obj = {**obj, "language": obj.get("language") or "python"}
        return normalize_codesearchnet(obj)
    _require(obj, ADVTEST_REQUIRED)
    tokens = obj["docstring_tokens"]
    if not isinstance(tokens, list) or not isinstance(obj["function"], str):
        raise DropRow(Reason.MISSING_FIELD, "function/docstring_tokens have the wrong type")
    return normalize_codesearchnet(
        {
            "repo": obj.get("nwo") or obj.get("repo") or "",
            "path": obj.get("path", ""),
            "func_name": obj.get("identifier") or obj.get("func_name") or "",
            "original_string": obj["function"],
            "language": "python",
            "code": obj["function"],
            "code_tokens": obj.get("function_tokens") or [],
            "docstring": obj.get("docstring") or " ".join(tokens),
            "docstring_tokens": tokens,
            "url": obj["url"],
            "partition": obj.get("partition", ""),
        }
    )


def _check_lengths(query: str, document: str, options: PairOptions) -> None:
    if len(query) > options.max_query_chars:
        raise DropRow(Reason.TOO_LONG, f"query has {len(query)} characters")
    if len(document) > options.max_document_chars:
        raise DropRow(Reason.TOO_LONG, f"document has {len(document)} characters")


def empty_pair_row() -> dict[str, Any]:
    """A pair row with every column at its empty value (see ``schema.PAIR_SCHEMA``)."""
    return {
        "id": "",
        "dataset": "",
        "kind": "",
        "language": "",
        "query_id": "",
        "query": "",
        "doc_id": "",
        "title": "",
        "document": "",
        "label": 1,
        "entities": [],
        "masked_document": "",
        "mep_target": "",
        "num_tokens": 0,
        "num_masked_tokens": 0,
        "url": "",
        "dedup_key": "",
    }


def _mask(document: str, spans: list[tuple[int, int]], key: str, options: PairOptions):
    released = options.mep_targets == "released"
    masked = mask_entities(
        document, spans, max_entities=options.max_entities, trailing_sentinel=released
    )
    if options.mask == "span":
        # The ablation masks random spans at the same rate as entity masking would have.
        rng = random.Random(stable_hash(options.seed, key))
        masked = mask_random_spans(
            document, rng, masked.num_masked_tokens, max_spans=options.max_entities
        )
    return masked


def _token_entity_spans(
    record: dict[str, Any], document: str, language: str
) -> tuple[list[tuple[int, int]], list[str]]:
    """Identifier spans of the joined code tokens (``document``), as SANTA's released code
    finds them, and the identifier occurrences they come from: Python's NAME tokens of the
    joined text itself; in the other languages the tokens equal to an identifier that
    tree-sitter finds in the function's own code (those occurrences, in code order)."""
    if language == "python":
        spans = extract_code_entities(document, language)
        return spans, [document[start:end] for start, end in spans]
    code = record["code"]
    found = [code[start:end] for start, end in extract_code_entities(code, language)]
    names = set(found)
    spans, position = [], 0
    for token in record["code_tokens"]:
        if token in names:
            spans.append((position, position + len(token)))
        position += len(token) + 1
    return spans, found


def build_code_pair(record: dict[str, Any], dataset: str, options: PairOptions) -> dict[str, Any]:
    """A docstring ↔ code pair (with entity masking for pretraining) from a CSN record."""
    language = record["language"]
    if language not in CODE_LANGUAGES:
        raise DropRow(Reason.UNSUPPORTED_LANGUAGE, language)
    tokens = options.code_text == "tokens"
    if options.stage == "pretrain" and not tokens:
        query = clean_docstring(record["docstring"])
    else:
        # Fine-tuning and evaluation follow CodeXGLUE: the query is the docstring tokens.
        query = " ".join(record["docstring_tokens"]) or clean_docstring(record["docstring"])
    if not query.strip():
        raise DropRow(Reason.EMPTY_DOCSTRING)
    if tokens:
        if not record.get("code_tokens"):
            raise DropRow(Reason.MISSING_FIELD, "code_tokens")
        document = " ".join(record["code_tokens"])
    else:
        try:
            document = remove_docstring(record["code"], record["docstring"], language)
        except (ValueError, SyntaxError) as error:
            raise DropRow(Reason.UNPARSABLE_CODE, str(error)) from None
    if not document.strip():
        raise DropRow(Reason.EMPTY_DOCUMENT)
    _check_lengths(query, document, options)
    if contains_sentinel(document) or contains_sentinel(query):
        raise DropRow(Reason.SENTINEL_IN_TEXT)
    row = empty_pair_row()
    doc_id = record["url"]
    row.update(
        kind=CODE_PAIR,
        id=stable_hash(dataset, doc_id, query),
        dataset=dataset,
        language=language,
        query_id=stable_hash("q", doc_id),
        query=query,
        doc_id=doc_id,
        title=record["func_name"],
        document=document,
        url=record["url"],
        dedup_key=stable_hash(language, document),
    )
    if options.stage == "pretrain":
        try:
            if tokens:
                spans, population = _token_entity_spans(record, document, language)
            else:
                spans = extract_code_entities(document, language)
                population = None
        except UnparsableCodeError as error:
            raise DropRow(Reason.UNPARSABLE_CODE, str(error)) from None
        if options.mep_targets == "released":
            rng = random.Random(stable_hash(options.seed, doc_id, "mep"))
            spans = released_entity_sample(document, spans, language, rng, population)
        masked = _mask(document, spans, doc_id, options)
        row.update(
            entities=list(masked.entities),
            masked_document=masked.masked_text,
            mep_target=masked.target,
            num_tokens=masked.num_tokens,
            num_masked_tokens=masked.num_masked_tokens,
        )
    return row


def product_text(product: dict[str, Any]) -> str:
    """A product's searchable text: description and bullet points, HTML stripped."""
    description = strip_html(product.get("product_description") or "")
    bullets = split_bullet_points(strip_html_keep_lines(product.get("product_bullet_point") or ""))
    return " ".join(part for part in [description, *bullets] if part)


def strip_html_keep_lines(text: str) -> str:
    """Strip HTML from each line separately, so bullet points stay one per line."""
    return "\n".join(strip_html(line) for line in text.splitlines())


def build_product_pretrain_pair(
    product: dict[str, Any], options: PairOptions, judgment: str | None = None
) -> dict[str, Any]:
    """One seeded random bullet point ↔ the product description, with its entities masked.

    ``judgment`` (a query id): the pair of that Exact judgment, by the rule of SANTA's
    ``build_product_entity.py`` (:mod:`santa.data.esci`): the description must hold HTML
    markup and two words at least, and the bullet point is drawn among all lines of the
    field (an empty line drawn leaves no pair), per judgment.
    """
    product_id = product.get("product_id")
    if not product_id:
        raise DropRow(Reason.MISSING_FIELD, "product_id")
    title = strip_html(product.get("product_title") or "")
    raw_description = product.get("product_description") or ""
    description = strip_html(raw_description)
    raw_bullets = product.get("product_bullet_point") or ""
    if judgment is None:
        bullets = split_bullet_points(strip_html_keep_lines(raw_bullets))
        query = choose_bullet_point(product_id, bullets, options.seed) if bullets else None
    else:
        if raw_description and not has_markup(raw_description):
            raise DropRow(Reason.PLAIN_DESCRIPTION)
        lines = [strip_html(line) for line in raw_bullets.split("\n")] if raw_bullets else []
        key = f"{judgment}\x1f{product_id}"
        query = choose_bullet_point(key, lines, options.seed) if lines else None
        if len(description.split()) < 2:
            description = ""  # the scripts skip descriptions of fewer than two words
    if not query:
        raise DropRow(Reason.EMPTY_DOCSTRING, "no bullet point")
    if not description:
        raise DropRow(Reason.EMPTY_DOCUMENT, "no description")
    _check_lengths(query, description, options)
    if contains_sentinel(description) or contains_sentinel(query):
        raise DropRow(Reason.SENTINEL_IN_TEXT)
    spans = extract_product_entities(title, description, options.product_entities)
    masked = _mask(description, spans, product_id, options)
    row = empty_pair_row()
    pair_key = product_id if judgment is None else f"{judgment}:{product_id}"
    row.update(
        kind=PRODUCT_PRETRAIN,
        id=stable_hash("esci", pair_key, query),
        dataset="esci",
        language=product.get("product_locale") or "",
        query_id=stable_hash("bullet", pair_key, query),
        query=query,
        doc_id=product_id,
        title=title,
        document=description,
        entities=list(masked.entities),
        masked_document=masked.masked_text,
        mep_target=masked.target,
        num_tokens=masked.num_tokens,
        num_masked_tokens=masked.num_masked_tokens,
        url=product_id,
        dedup_key=stable_hash(pair_key),
    )
    return row


def build_product_judgment_row(example: dict[str, Any], options: PairOptions) -> dict[str, Any]:
    """A query → product row with its graded ESCI label (E/S/C/I kept as 3/2/1/0)."""
    label = ESCI_LABEL_GRADES.get(str(example.get("esci_label") or ""))
    if label is None:
        raise DropRow(Reason.MISSING_FIELD, f"esci_label {example.get('esci_label')!r}")
    query = str(example.get("query") or "").strip()
    if not query:
        raise DropRow(Reason.EMPTY_DOCSTRING, "empty query")
    title = strip_html(example.get("product_title") or "")
    text = product_text(example)
    if not (title or text):
        raise DropRow(Reason.EMPTY_DOCUMENT)
    _check_lengths(query, text, options)
    product_id = str(example["product_id"])
    row = empty_pair_row()
    row.update(
        kind=PRODUCT_JUDGMENT,
        id=stable_hash("esci", example.get("query_id"), product_id),
        dataset="esci",
        language=str(example.get("product_locale") or ""),
        query_id=str(example.get("query_id")),
        query=query,
        doc_id=product_id,
        title=title,
        document=text,
        label=label,
        url=product_id,
        dedup_key=stable_hash(example.get("query_id"), product_id),
    )
    return row
