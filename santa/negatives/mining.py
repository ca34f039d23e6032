"""Hard-negative mining (ANCE): top-K hits of the current model, minus every positive.

Plain functions and plain classes: no Ray here (see :mod:`santa.negatives.miner` for the
actor that runs them while training goes on).

At any size: the corpus (:class:`MiningCorpus`) is the pairs' rows in the node's row file
(:mod:`santa.train.rows`, every row, judged-only ESCI products included), numbered: its
distinct documents and training queries are numbers, each with its row, and what mining
needs of them (positives, near-duplicates) is integer arrays; texts and ids are read from
the file when they are embedded or written. A table (:class:`NegativesTable`) holds each
query's negatives as document numbers of the corpus it was mined on; on disk
(``negatives.parquet``) it is ids (``query_id``, ``negative_ids``), read back into numbers
of the reader's corpus.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from santa.data.kinds import embedded_document, kind_column, training_mask
from santa.data.published import pair_files
from santa.method.duplicates import text_key
from santa.runtime import storage
from santa.train.rows import RowFile, RowSource, open_rows

__all__ = [
    "FILTER_REASONS",
    "FalseNegativeFilter",
    "MiningCorpus",
    "NegativesTable",
    "corpus_source",
    "load_mining_corpus",
    "mine_hard_negatives",
    "positive_scores",
    "read_filtered_counts",
    "publish_table",
    "published_table",
    "read_negatives_table",
    "write_id_table",
]

TABLE_FILE = "negatives.parquet"

# Labels that make a judged document a positive of its query (code pairs: 1; ESCI E/S/C
# are 3/2/1: Substitutes and Complements are too close to the query to be safe negatives).
POSITIVE_MIN_LABEL = 1
NEGATIVES_SCHEMA = pa.schema([("query_id", pa.string()), ("negative_ids", pa.list_(pa.string()))])
# Written when the table carries its documents: the text of each negative, aligned with ids.
TEXTS_FIELD = pa.field("negative_texts", pa.list_(pa.string()))


# Why a hit was not a candidate negative, as counted in a table's ``filtered``: a judged
# positive of the query; a document whose normalized text equals a positive's; a repeat of
# an earlier hit's text; a score too close to the positive's (ratio, absolute margin).
FILTER_REASONS = ("positive", "same_text", "duplicate_hit", "score_ratio", "score_margin")


@dataclass(frozen=True)
class FalseNegativeFilter:
    """Positive-aware removal of likely false negatives (NV-Retriever, Moreira et al., 2024,
    arXiv:2407.15831: TopK-PercPos and TopK-MarginPos).

    A hit is dropped when it scores above ``max_score_ratio`` × its query's positive score
    or within ``min_margin`` of it. The ratio is NV-Retriever's for positive scores; for a
    negative positive score ``p`` (raw dot products can be) the threshold is
    ``p - (1 - ratio)·|p|``, the same distance below the positive, where ``ratio·p`` would
    lie above it. ``None`` turns a rule off.
    """

    max_score_ratio: float | None = None
    min_margin: float | None = None

    @property
    def active(self) -> bool:
        """Whether any rule is on."""
        return self.max_score_ratio is not None or self.min_margin is not None

    def reason(self, score: float, positive_score: float) -> str | None:
        """Why a hit scoring ``score`` is dropped (a :data:`FILTER_REASONS` entry), or None."""
        ratio = self.max_score_ratio
        if ratio is not None and score > positive_score - (1.0 - ratio) * abs(positive_score):
            return "score_ratio"
        if self.min_margin is not None and score > positive_score - self.min_margin:
            return "score_margin"
        return None


def mine_hard_negatives(
    query_ids: Sequence[str],
    hit_ids: Sequence[Sequence[str]],
    positives: Mapping[str, set[str]],
    *,
    n: int,
    seed: int = 0,
    skip_top: int = 0,
    duplicate_of: Mapping[Any, Any] | np.ndarray | None = None,
    hit_scores: Sequence[Sequence[float]] | np.ndarray | None = None,
    positive_scores: Mapping[str, float] | None = None,
    score_filter: FalseNegativeFilter | None = None,
    filtered: dict[str, int] | None = None,
) -> dict[str, list[Any]]:
    """Sample ``n`` negatives per query from its ranked hits.

    Every positive of the query is dropped (all of its judged positives, not only the pair it
    came from), and so is every document whose content duplicates a positive
    (``duplicate_of`` maps a document id to a canonical id shared by documents whose
    normalized text is equal, :func:`santa.method.duplicates.normalized_text`). With
    ``score_filter``, ``hit_scores`` (aligned with ``hit_ids``) and ``positive_scores``
    (query id → its positive's score), hits scoring too close to the positive are dropped
    as likely false negatives (:class:`FalseNegativeFilter`). Of what remains, in rank
    order, the first ``skip_top`` hits are skipped and ``n`` are drawn without replacement
    from the rest, kept in rank order. The draw depends only on ``seed`` and the query id,
    so it is reproducible and independent of the order queries come in. A query with fewer
    candidates gets fewer negatives. ``filtered`` (if given) counts the dropped hits by
    reason (:data:`FILTER_REASONS`).
    """
    if n < 0 or skip_top < 0:
        raise ValueError(f"n and skip_top must be >= 0, got n={n}, skip_top={skip_top}")
    if len(query_ids) != len(hit_ids):
        raise ValueError(f"{len(query_ids)} query ids but {len(hit_ids)} hit lists")
    scoring = score_filter is not None and score_filter.active
    if scoring and (hit_scores is None or positive_scores is None):
        raise ValueError("a score filter needs hit_scores and positive_scores")
    if scoring and len(hit_scores) != len(hit_ids):
        raise ValueError(f"{len(hit_ids)} hit lists but {len(hit_scores)} score lists")
    if duplicate_of is None:
        canonical: Any = {}
    elif isinstance(duplicate_of, np.ndarray):
        canonical = _ArrayKeys(duplicate_of)
    else:
        canonical = duplicate_of
    counts = dict.fromkeys(FILTER_REASONS, 0)
    mined: dict[str, list[str]] = {}
    for row, (query_id, hits) in enumerate(zip(query_ids, hit_ids, strict=True)):
        positive_ids = positives.get(query_id, set())
        positive_keys = {canonical.get(doc, doc) for doc in positive_ids}
        positive_score = positive_scores.get(query_id) if scoring else None
        scores = hit_scores[row] if positive_score is not None else None
        seen: set[str] = set()
        candidates: list[str] = []
        for rank, doc in enumerate(hits):
            key = canonical.get(doc, doc)
            if doc in positive_ids:
                reason = "positive"
            elif key in positive_keys:
                reason = "same_text"
            elif key in seen:
                reason = "duplicate_hit"
            elif scores is not None:
                reason = score_filter.reason(float(scores[rank]), positive_score)
            else:
                reason = None
            if reason is not None:
                counts[reason] += 1
                continue
            seen.add(key)
            candidates.append(doc)
        candidates = candidates[skip_top:]
        rng = random.Random(f"{seed}:{query_id}")
        picked = sorted(rng.sample(range(len(candidates)), min(n, len(candidates))))
        mined[query_id] = [candidates[i] for i in picked]
    if filtered is not None:
        for reason, count in counts.items():
            filtered[reason] = filtered.get(reason, 0) + count
    return mined


class _ArrayKeys:
    """``duplicate_of`` as an array of document numbers, read as the mapping mining reads."""

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = keys

    def get(self, doc: int, default: Any = None) -> int:
        return int(self.keys[doc])


def positive_scores(
    query_ids: Sequence[Any],
    query_vectors: np.ndarray,
    positives: Mapping[Any, Any],
    doc_rows: Mapping[Any, int] | None,
    doc_vectors: np.ndarray,
    block: int = 65_536,
) -> dict[Any, float]:
    """Each query's best positive score (inner product, as the index scores hits).

    The best of its positives: a hit is a likely false negative when it comes close to any
    of them (an ESCI query's Complements score below its Exact matches; measured against
    the weakest positive, most true negatives would go). Queries without an embedded
    positive are left out (nothing to filter against). ``doc_rows`` maps a document to its
    row of ``doc_vectors``; None: documents are those rows' numbers.
    """
    pairs = [
        (row, doc if doc_rows is None else doc_rows[doc])
        for row, query_id in enumerate(query_ids)
        for doc in positives.get(query_id, ())
        if doc_rows is None or doc in doc_rows
    ]
    if not pairs:
        return {}
    index = np.asarray(pairs, dtype=np.int64)  # (pairs, 2)
    best = np.full(len(query_ids), -np.inf, dtype=np.float32)
    for start in range(0, len(index), block):  # bounded memory whatever the corpus
        rows, docs = index[start : start + block, 0], index[start : start + block, 1]
        scores = np.einsum("ij,ij->i", query_vectors[rows], doc_vectors[docs])  # (block,)
        np.maximum.at(best, rows, scores.astype(np.float32))
    return {
        query_id: float(best[row])
        for row, query_id in enumerate(query_ids)
        if np.isfinite(best[row])
    }


# --------------------------------------------------------------------------- the corpus

CORPUS_COLUMNS = (
    "dataset",
    "label",
    "query_id",
    "query",
    "doc_id",
    "title",
    "document",
    "mep_target",
)
_TEXT_BLOCK = 65_536  # rows whose texts are read (and hashed, encoded) at once


def corpus_source(data_uri: str) -> RowSource:
    """Every pair row of the preprocess output ``data_uri`` (judged-only products too): what
    mining and the trainers' hard negatives read, as a row file."""
    return RowSource(
        files=tuple(pair_files(data_uri)),
        columns=CORPUS_COLUMNS,
        optional=("kind",),
        filter_name="all_pairs",
    )


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Each row's number among the distinct values of ``column`` (numbered in order of first
    appearance) and those values."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column.cast(pa.string()))
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return codes, encoded.dictionary


class MiningCorpus:
    """What mining needs of the pairs: the node's row file of every pair row, numbered.

    - documents: the distinct ``doc_id`` values, numbered in order of first appearance;
      ``doc_rows[d]`` is document ``d``'s first row (its text: :meth:`doc_texts`, embedded
      as training embeds it, title + text for ESCI judgments);
    - queries: the training queries (those with a training row, an Exact judgment for
      ESCI), numbered in order of first appearance; ``query_rows[q]`` is its first
      training row;
    - :attr:`query_of_training_row` / :attr:`doc_of_training_row`: the query and document of
      each row of the *training* row file (``santa.train.data.pairs_source``: the training
      rows, in the same order), which is what a trainer's batch rows are numbered by;
    - :meth:`positives`: each query's judged positives (every row of it with a label of
      :data:`POSITIVE_MIN_LABEL` or more, or none: code pairs);
    - :attr:`duplicate_of`: each document's first document with the same normalized text
      (near-duplicates, :func:`santa.method.duplicates.text_key`), computed on first use.

    Memory: a few integer arrays (tens of bytes a row) and the mapped file, whatever the
    size; no text is held.
    """

    def __init__(self, rows: RowFile) -> None:
        self.rows = rows
        table = rows.columns(["dataset", "label", "query_id", "doc_id", "mep_target", "kind"])
        doc_codes, _ = _codes(table.column("doc_id"))
        query_codes, query_values = _codes(table.column("query_id"))
        _, self.doc_rows = np.unique(doc_codes, return_index=True)  # codes follow first rows
        train_rows = np.flatnonzero(training_mask(table))
        # Training queries, numbered by first training row.
        codes_first, first_rows = np.unique(query_codes[train_rows], return_index=True)
        order = np.argsort(first_rows, kind="stable")
        number_of_code = np.full(len(query_values), -1, dtype=np.int64)
        number_of_code[codes_first[order]] = np.arange(len(order))
        self.query_rows = train_rows[first_rows[order]]
        self.training_rows = train_rows
        """Each training row's row in this file (the training row file is these rows)."""
        self.query_of_training_row = number_of_code[query_codes[train_rows]]
        self.doc_of_training_row = doc_codes[train_rows]
        # Positives: (query, document) of each row with a positive label of a training query.
        labels = table.column("label").combine_chunks()
        positive = pc.fill_null(pc.greater_equal(labels, POSITIVE_MIN_LABEL), True)
        positive_rows = np.flatnonzero(np.asarray(positive.to_numpy(zero_copy_only=False)))
        queries = number_of_code[query_codes[positive_rows]]
        kept = queries >= 0
        pairs = np.unique(
            np.stack([queries[kept], doc_codes[positive_rows][kept]], axis=1), axis=0
        ).reshape(-1, 2)  # (pairs, 2), sorted by query
        self._positive_docs = pairs[:, 1].copy()
        counts = np.bincount(pairs[:, 0], minlength=len(self.query_rows))
        self._positive_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.key = os.path.basename(rows.path)
        """The row file's name: which data version (and so which numbering) this is."""

    @classmethod
    def load(cls, data_uri: str, cache_dir: str = "") -> MiningCorpus:
        """The corpus of the preprocess output ``data_uri`` (its row file on this node,
        built on first use)."""
        return cls(open_rows(corpus_source(data_uri), cache_dir))

    @property
    def most_positives(self) -> int:
        """The most positives any query has (at least 1)."""
        return int(np.diff(self._positive_offsets).max(initial=1))

    @property
    def num_docs(self) -> int:
        return len(self.doc_rows)

    @property
    def num_queries(self) -> int:
        return len(self.query_rows)

    def positives(self, query: int) -> np.ndarray:
        """Query ``query``'s positive documents (numbers)."""
        return self._positive_docs[
            self._positive_offsets[query] : self._positive_offsets[query + 1]
        ]

    def positive_sets(self, queries: Sequence[int]) -> dict[int, set[int]]:
        """``{query: its positives}`` for ``queries`` (a block's, as mining reads them)."""
        return {int(q): set(self.positives(int(q)).tolist()) for q in queries}

    def doc_ids(self, docs: Sequence[int] | np.ndarray) -> list[str]:
        """The ids of documents ``docs`` (read from the row file)."""
        rows = self.doc_rows[np.asarray(docs, dtype=np.int64)]
        return self.rows.take(rows).column("doc_id").to_pylist()

    def query_ids(self, queries: Sequence[int] | np.ndarray) -> list[str]:
        """The ids of queries ``queries`` (read from the row file)."""
        rows = self.query_rows[np.asarray(queries, dtype=np.int64)]
        return self.rows.take(rows).column("query_id").to_pylist()

    def doc_texts(self, docs: Sequence[int] | np.ndarray) -> list[str]:
        """What documents ``docs`` are embedded as (read from the row file)."""
        taken = self.rows.take(self.doc_rows[np.asarray(docs, dtype=np.int64)])
        return [
            embedded_document(kind, title or "", document or "")
            for kind, title, document in zip(
                kind_column(taken).to_pylist(),
                taken.column("title").to_pylist(),
                taken.column("document").to_pylist(),
                strict=True,
            )
        ]

    def query_texts(self, queries: Sequence[int] | np.ndarray) -> list[str]:
        """The texts of queries ``queries``."""
        rows = self.query_rows[np.asarray(queries, dtype=np.int64)]
        return self.rows.take(rows).column("query").to_pylist()

    def _numbers(self, ids: Any, column: str, first_rows: np.ndarray) -> np.ndarray:
        """The numbers of ``ids`` among ``column``'s values at ``first_rows`` (-1: absent):
        one hash lookup over the corpus's ids, built for the call and dropped."""
        values = self.rows.columns([column]).column(column).combine_chunks()
        values = values.take(pa.array(first_rows))
        found = pc.index_in(pa.array(ids, pa.string()), value_set=values)
        return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)

    def doc_numbers(self, ids: pa.Array | Sequence[str]) -> np.ndarray:
        """The numbers of documents named ``ids`` (-1 where not in the corpus)."""
        return self._numbers(ids, "doc_id", self.doc_rows)

    def query_numbers(self, ids: pa.Array | Sequence[str]) -> np.ndarray:
        """The numbers of training queries named ``ids`` (-1 where none)."""
        return self._numbers(ids, "query_id", self.query_rows)

    @functools.cached_property
    def duplicate_of(self) -> np.ndarray:
        """Each document's first document with the same normalized text ``(docs,)``."""
        keys = np.empty(self.num_docs, dtype=np.int64)
        for start in range(0, self.num_docs, _TEXT_BLOCK):
            block = np.arange(start, min(self.num_docs, start + _TEXT_BLOCK))
            keys[block] = [text_key(text) for text in self.doc_texts(block)]
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return first[inverse]


def load_mining_corpus(data_uri: str, cache_dir: str = "") -> MiningCorpus:
    """The corpus of the preprocess output ``data_uri`` (:meth:`MiningCorpus.load`)."""
    return MiningCorpus.load(data_uri, cache_dir)


# --------------------------------------------------------------------------- the table

NO_NEGATIVE = -1
"""A table's padding where a query has fewer than ``n`` negatives."""


@dataclass
class NegativesTable:
    """One published set of hard negatives: each training query's negative documents.

    ``negatives`` ``(queries, n)`` int64 holds document numbers of the corpus it was mined
    on (``corpus_key``), :data:`NO_NEGATIVE` where a query has fewer; a document that is
    not in the corpus (a user's own negatives file) is ``-2 - k`` with its text in
    ``extra_texts[k]``. ``step`` is the training step of the weights it was mined with
    (tables are ordered by it, across miner restarts too); ``version`` counts the tables
    one miner built; ``build_s`` is the refresh's wall time.
    """

    negatives: np.ndarray
    corpus_key: str = ""
    step: int = 0
    version: int = 0
    built_at: float = field(default_factory=time.time)
    build_s: float = 0.0
    encode_s: float = 0.0
    """The part of ``build_s`` spent encoding the corpus and the queries."""
    filtered: dict[str, int] = field(default_factory=dict)
    """Hits dropped while mining, by reason (:data:`FILTER_REASONS`)."""
    extra_texts: list[str] = field(default_factory=list)
    extra_ids: list[str] = field(default_factory=list)

    @property
    def queries_with_negatives(self) -> int:
        """Queries the table names at least one negative for."""
        return int((self.negatives != NO_NEGATIVE).any(axis=1).sum()) if self.negatives.size else 0

    def of(self, query: int) -> list[int]:
        """Query ``query``'s negatives (numbers, in rank order)."""
        if query < 0 or query >= len(self.negatives):
            return []
        return [int(d) for d in self.negatives[query] if d != NO_NEGATIVE]

    def metadata(self) -> dict[str, str]:
        """What goes into the Parquet file's key-value metadata."""
        return {
            "santa.step": str(self.step),
            "santa.version": str(self.version),
            "santa.built_at": str(self.built_at),
            "santa.build_s": str(self.build_s),
            "santa.encode_s": str(self.encode_s),
            "santa.filtered": json.dumps(self.filtered, sort_keys=True),
        }

    def to_arrow(self, corpus: MiningCorpus) -> pa.Table:
        """The table by ids (``query_id``, ``negative_ids``, and ``negative_texts`` for
        negatives not in the corpus), its provenance in the schema metadata."""
        named = np.flatnonzero((self.negatives != NO_NEGATIVE).any(axis=1))
        query_ids = corpus.query_ids(named)
        negative_ids = []
        texts = []
        for query in named.tolist():
            docs = self.of(query)
            inside = [d for d in docs if d >= 0]
            ids = dict(zip(inside, corpus.doc_ids(inside), strict=True)) if inside else {}
            negative_ids.append([ids[d] if d >= 0 else self.extra_ids[-2 - d] for d in docs])
            texts.append([None if d >= 0 else self.extra_texts[-2 - d] for d in docs])
        columns: dict[str, Any] = {"query_id": query_ids, "negative_ids": negative_ids}
        schema = NEGATIVES_SCHEMA
        if self.extra_texts:
            columns["negative_texts"] = texts
            schema = schema.append(TEXTS_FIELD)
        return pa.table(columns, schema=schema).replace_schema_metadata(self.metadata())

    def write_parquet(self, uri: str, corpus: MiningCorpus) -> str:
        """Write ``negatives.parquet`` under ``uri`` (local or s3://); returns its URI."""
        return _write_arrow(self.to_arrow(corpus), uri)


def _write_arrow(table: pa.Table, uri: str) -> str:
    target = storage.join(uri, TABLE_FILE)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    storage.write_bytes(target, sink.getvalue().to_pybytes())
    return target


def write_id_table(
    negatives: Mapping[str, Sequence[str]], documents: Mapping[str, str] | None, uri: str
) -> str:
    """A table of ids written from mappings (``query_id`` → negative ids, id → text): a
    user's own negatives (``ray_jobs.preprocess --dataset pairs``), whose documents need
    not be in the corpus, so their texts go with them (``documents`` None: ids only, every
    one in the corpus the table is read with). Returns the file's URI."""
    columns: dict[str, Any] = {
        "query_id": list(negatives),
        "negative_ids": [list(ids) for ids in negatives.values()],
    }
    schema = NEGATIVES_SCHEMA
    if documents is not None:
        columns["negative_texts"] = [[documents[d] for d in ids] for ids in negatives.values()]
        schema = schema.append(TEXTS_FIELD)
    return _write_arrow(pa.table(columns, schema=schema), uri)


def publish_table(table: NegativesTable, uri: str, corpus: MiningCorpus) -> str:
    """Write ``table`` as the output folder ``uri``, published whole (a staged folder
    renamed in, or on S3 a prefix named by the manifest); returns the table's URI."""
    from santa.data.outputs import published_root, staged_output

    with staged_output(uri, tool="mine_negatives") as staged:
        table.write_parquet(staged.staging, corpus)
        staged.publish({"queries": table.queries_with_negatives, "step": table.step})
    return storage.join(published_root(uri), TABLE_FILE)


def published_table(uri: str) -> str | None:
    """The table of the output folder ``uri`` (published, or written by an older santa
    straight into the folder), or None when there is none."""
    from santa.data.outputs import published_root

    target = storage.join(published_root(uri), TABLE_FILE)
    return target if storage.exists(target) else None


def table_file(uri: str) -> str:
    """The ``negatives.parquet`` of ``uri`` (the file itself, or a published folder's)."""
    if uri.endswith(".parquet"):
        return uri
    from santa.data.outputs import published_root

    return storage.join(published_root(uri), TABLE_FILE)


def read_id_table(uri: str) -> pa.Table:
    """A table's Parquet as written (ids), checked: one line naming what is wrong."""
    target = table_file(uri)
    if not storage.exists(target):
        raise FileNotFoundError(f"no hard-negatives table at {target}")
    filesystem, path = storage.resolve(target)
    table = storage.classified(lambda: pq.read_table(path, filesystem=filesystem), target, "read")
    missing = {"query_id", "negative_ids"} - set(table.column_names)
    if missing:
        raise ValueError(f"{target} is not a hard-negatives table: no column(s) {sorted(missing)}")
    return table


def read_negatives_table(uri: str, corpus: MiningCorpus) -> NegativesTable:
    """Read a table :meth:`NegativesTable.write_parquet` (or :func:`write_id_table`) wrote,
    the folder or the file, as numbers of ``corpus``: its queries and negatives by id
    (vectorized lookups, no per-row Python). A negative not in the corpus must come with its
    text (``negative_texts``); one without is an error naming it."""
    table = read_id_table(uri)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    queries = corpus.query_numbers(table.column("query_id").combine_chunks())
    lists = table.column("negative_ids").combine_chunks()
    flat_ids = pc.list_flatten(lists)
    docs = corpus.doc_numbers(flat_ids)
    lengths = np.asarray(pc.list_value_length(lists).to_numpy(zero_copy_only=False), np.int64)
    extra_texts: list[str] = []
    extra_ids: list[str] = []
    outside = np.flatnonzero(docs < 0)
    if len(outside):
        if "negative_texts" not in table.column_names:
            name = flat_ids[int(outside[0])].as_py()
            raise ValueError(
                f"the negatives table {table_file(uri)} names documents not in the corpus: {name!r}"
            )
        texts = pc.list_flatten(table.column("negative_texts").combine_chunks())
        ids = flat_ids.take(pa.array(outside)).to_pylist()
        numbered: dict[str, int] = {}
        for position, doc_id in zip(outside.tolist(), ids, strict=True):
            if doc_id not in numbered:
                numbered[doc_id] = len(extra_ids)
                extra_ids.append(doc_id)
                extra_texts.append(texts[position].as_py())
            docs[position] = -2 - numbered[doc_id]
    width = int(lengths.max(initial=0))
    negatives = np.full((corpus.num_queries, width), NO_NEGATIVE, dtype=np.int64)
    # Each flat negative's table row and place in its list, scattered at once.
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    place = np.arange(len(docs)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    known = queries[row_of] >= 0
    negatives[queries[row_of][known], place[known]] = docs[known]
    return NegativesTable(
        negatives=negatives,
        corpus_key=corpus.key,
        step=int(meta.get("santa.step", 0)),
        version=int(meta.get("santa.version", 0)),
        built_at=float(meta.get("santa.built_at", 0.0)),
        build_s=float(meta.get("santa.build_s", 0.0)),
        encode_s=float(meta.get("santa.encode_s", 0.0)),
        filtered=json.loads(meta.get("santa.filtered", "{}")),
        extra_texts=extra_texts,
        extra_ids=extra_ids,
    )


def read_filtered_counts(uri: str) -> dict[str, int]:
    """What mining dropped for a table, by reason (its Parquet metadata only); ``{}`` for
    a table written before santa counted it."""
    target = table_file(uri)
    filesystem, path = storage.resolve(target)
    metadata = pq.read_schema(path, filesystem=filesystem).metadata or {}
    return json.loads(metadata.get(b"santa.filtered", b"{}").decode())
