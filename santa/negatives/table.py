"""A hard-negatives table (:class:`NegativesTable`): each training query's negatives as
document numbers of the corpus it was mined on (:mod:`santa.negatives.corpus`); on disk
(``negatives.parquet``) it is ids (``query_id``, ``negative_ids``), read back into numbers
of the reader's corpus."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from santa.files import storage
from santa.negatives.corpus import MiningCorpus

__all__ = [
    "NEGATIVES_SCHEMA",
    "TABLE_FILE",
    "TEXTS_FIELD",
    "NO_NEGATIVE",
    "NegativesTable",
    "publish_table",
    "published_table",
    "read_filtered_counts",
    "read_id_table",
    "read_negatives_table",
    "table_file",
    "write_id_table",
]


TABLE_FILE = "negatives.parquet"
NEGATIVES_SCHEMA = pa.schema([("query_id", pa.string()), ("negative_ids", pa.list_(pa.string()))])
# Written when the table carries its documents: the text of each negative, aligned with ids.
TEXTS_FIELD = pa.field("negative_texts", pa.list_(pa.string()))


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
    from santa.files.outputs import published_root, staged_output

    with staged_output(uri, tool="mine_negatives") as staged:
        table.write_parquet(staged.staging, corpus)
        staged.publish({"queries": table.queries_with_negatives, "step": table.step})
    return storage.join(published_root(uri), TABLE_FILE)


def published_table(uri: str) -> str | None:
    """The table of the output folder ``uri`` (published, or written by an older santa
    straight into the folder), or None when there is none."""
    from santa.files.outputs import published_root

    target = storage.join(published_root(uri), TABLE_FILE)
    return target if storage.exists(target) else None


def table_file(uri: str) -> str:
    """The ``negatives.parquet`` of ``uri`` (the file itself, or a published folder's)."""
    if uri.endswith(".parquet"):
        return uri
    from santa.files.outputs import published_root

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
