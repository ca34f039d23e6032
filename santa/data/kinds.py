"""What a pair row is, and so what it trains on and what text it embeds: one module.

Every row the preprocessing writes says what it is in its ``kind`` column:

- ``code_pair``: docstring ↔ code (CodeSearchNet, AdvTest, source trees). Embeds the code
  alone: the title is the function name, and for AdvTest that is the answer.
- ``product_pretrain``: one bullet point ↔ the product description (SANTA's structured
  pretraining pair). Embeds the description alone. A description that shares no noun with
  its title has no entity to mask: the pair still trains (SDA only; its MEP target is empty
  and ignored by the loss).
- ``asst``: a code sub-tree ↔ the rest of its function (SCodeR's ASST, Algorithm 1; a
  code–code pair). Embeds the remaining code; the query is the cut-out sub-tree.
- ``text_pair``: a user's own query ↔ positive pair (``ray_jobs.preprocess --dataset pairs``,
  :mod:`santa.data.pairs`). Embeds the positive's text alone.
- ``product_judgment``: an ESCI query → product judgment with a graded label. Embeds
  ``title + " " + text``, as evaluation embeds the BEIR corpus; only Exact judgments are
  training pairs (Substitutes and Complements are neither positives nor negatives).

Corpora written before the ``kind`` column existed get their kind inferred from the
dataset and the MEP target, the rule used until then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from santa.data.schema import CODE_LANGUAGES, ESCI_EXACT

__all__ = [
    "ASST",
    "CODE_PAIR",
    "KINDS",
    "PRODUCT_JUDGMENT",
    "PRODUCT_PRETRAIN",
    "TEXT_PAIR",
    "document_text",
    "embedded_document",
    "is_training_row",
    "kind_column",
    "product_document",
    "row_kind",
    "training_mask",
]

CODE_PAIR = "code_pair"
PRODUCT_PRETRAIN = "product_pretrain"
PRODUCT_JUDGMENT = "product_judgment"
ASST = "asst"
TEXT_PAIR = "text_pair"
KINDS = (CODE_PAIR, PRODUCT_PRETRAIN, PRODUCT_JUDGMENT, ASST, TEXT_PAIR)
# Kinds whose query is code (SCodeR scores them with the code–code discriminator D_ψ).
CODE_QUERY_KINDS = (ASST,)


def row_kind(kind: str | None, dataset: str | None = None, mep_target: str | None = None) -> str:
    """A row's kind: its ``kind`` column, else inferred (corpora from before the column)."""
    if kind:
        if kind not in KINDS:
            raise ValueError(f"unknown pair kind {kind!r}; kinds are {KINDS}")
        return kind
    if dataset == "esci":
        return PRODUCT_PRETRAIN if mep_target else PRODUCT_JUDGMENT
    return CODE_PAIR


def is_training_row(kind: str, label: int | None) -> bool:
    """Whether a row is a training pair: every code and product pretraining pair, and of
    the graded product judgments only the Exact ones."""
    return kind != PRODUCT_JUDGMENT or label == ESCI_EXACT


def kind_column(table) -> Any:
    """Every row's kind as an Arrow string array (:func:`row_kind`, vectorized): the ``kind``
    column where set, else inferred from ``dataset`` and ``mep_target``; an unknown kind is a
    ValueError naming it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = table.num_rows
    given = table.column("kind") if "kind" in table.column_names else pa.nulls(rows, pa.string())
    if isinstance(given, pa.ChunkedArray):
        given = given.combine_chunks()
    given = given.cast(pa.string())
    unknown = set(pc.unique(given.drop_null()).to_pylist()) - set(KINDS) - {""}
    if unknown:
        raise ValueError(f"unknown pair kind {sorted(unknown)[0]!r}; kinds are {KINDS}")
    dataset = pc.fill_null(table.column("dataset"), "")
    target = pc.fill_null(table.column("mep_target"), "")
    inferred = pc.if_else(
        pc.equal(dataset, "esci"),
        pc.if_else(pc.equal(target, ""), PRODUCT_JUDGMENT, PRODUCT_PRETRAIN),
        CODE_PAIR,
    )
    present = pc.and_(pc.is_valid(given), pc.not_equal(pc.fill_null(given, ""), ""))
    kinds = pc.if_else(present, given, inferred)
    return kinds.combine_chunks() if isinstance(kinds, pa.ChunkedArray) else kinds


def training_mask(table) -> Any:
    """Which rows are training pairs (:func:`is_training_row`, vectorized): a numpy bool
    array; ``table`` has ``dataset``, ``label``, ``mep_target`` and maybe ``kind``."""
    import numpy as np
    import pyarrow.compute as pc

    judgment = pc.equal(kind_column(table), PRODUCT_JUDGMENT)
    exact = pc.fill_null(pc.equal(table.column("label"), ESCI_EXACT), False)
    keep = pc.or_(pc.invert(judgment), exact)
    return np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool)


def product_document(title: str, text: str) -> str:
    """What a product is embedded as, in training and in evaluation: ``title + " " + text``
    (the title alone when there is no text, the text alone when there is no title)."""
    title = (title or "").strip()
    if not title:
        return text
    return f"{title} {text}" if text else title


def embedded_document(kind: str, title: str, document: str) -> str:
    """The text a pair row's document is embedded as during training and mining."""
    if kind == PRODUCT_JUDGMENT:
        return product_document(title, document)
    return document


def document_text(doc: Mapping[str, Any]) -> str:
    """The text a BEIR corpus document is embedded as in evaluation.

    A corpus row with a ``kind`` follows :func:`embedded_document`; older corpora: code
    (a code ``language``) embeds the text alone, products ``title + " " + text``.
    """
    text = doc.get("text") or ""
    kind = doc.get("kind")
    if not kind:
        kind = CODE_PAIR if doc.get("language") in CODE_LANGUAGES else PRODUCT_JUDGMENT
    return embedded_document(row_kind(kind), doc.get("title") or "", text)
