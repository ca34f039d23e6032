"""The mining corpus at any size (:class:`MiningCorpus`): the pairs' rows in the node's row
file (:mod:`santa.train.rows`, every row, judged-only ESCI products included), numbered: its
distinct documents and training queries are numbers, each with its row, and what mining
needs of them (positives, near-duplicates) is integer arrays; texts and ids are read from
the file when they are embedded or written."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from santa.data.kinds import embedded_document, kind_column, training_mask
from santa.data.published import pair_files
from santa.method.duplicates import text_key
from santa.negatives.rules import POSITIVE_MIN_LABEL
from santa.train.rows import RowFile, RowSource, open_rows

__all__ = [
    "CORPUS_COLUMNS",
    "MiningCorpus",
    "corpus_source",
    "load_mining_corpus",
]


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
