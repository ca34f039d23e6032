"""Listwise examples: a query, its positive first and ``n`` hard negatives after it.

Built from the preprocessed pairs and a mined negatives table (``santa.negatives``): each
training pair becomes one row ``(query, candidates = [x⁺, x⁻_1, ..., x⁻_n], kind)``, the
negatives drawn from the pair's mined pool (seeded; topped up with random documents when
the pool is short). A fixed share of queries is held out of discriminator training, by
hash of the query id, to measure the discriminators on pairs they never saw.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from santa.data.kinds import embedded_document, is_training_row, row_kind
from santa.data.published import iter_pairs, parquet_dataset, read_parquet
from santa.negatives.mining import MiningCorpus, NegativesTable
from santa.runtime import storage
from santa.scoder.discriminator import discriminator_kind
from santa.scoder.rows import LISTWISE, LISTWISE_SCHEMA

__all__ = [
    "LISTWISE_SCHEMA",
    "build_listwise_rows",
    "is_heldout",
    "read_listwise",
    "read_listwise_dataset",
    "write_listwise",
]

ROWS_PER_FILE = 10_000


def is_heldout(query_id: str, fraction: float) -> bool:
    """Whether ``query_id`` is held out of discriminator training (stable across runs)."""
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(query_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def _pair_rows(data_uri: str):
    """The training pairs under ``data_uri/data``: (query id, query, doc id, kind) rows."""
    columns = ["dataset", "query_id", "query", "doc_id", "label", "mep_target"]
    for table in iter_pairs(data_uri, columns, optional=["kind"]):
        for row in table.to_pylist():
            kind = row_kind(row.get("kind"), row["dataset"], row["mep_target"])
            if is_training_row(kind, row["label"]):
                yield row["query_id"], row["query"], row["doc_id"], kind


def build_listwise_rows(
    data_uri: str,
    corpus: MiningCorpus,
    table: NegativesTable,
    *,
    n: int,
    seed: int,
    heldout_fraction: float,
    include: str = "all",
) -> list[dict[str, Any]]:
    """One listwise row per training pair (``include``: ``all``, ``train`` = not held out).

    The ``n`` negatives are a seeded sample of the pair's mined pool (the paper samples
    X⁻ from the top K); a short pool is topped up with random other documents.
    """
    if include not in ("all", "train"):
        raise ValueError(f"include must be 'all' or 'train', got {include!r}")
    doc_ids = list(corpus.documents)
    rows = []
    for query_id, query, doc_id, kind in _pair_rows(data_uri):
        heldout = is_heldout(query_id, heldout_fraction)
        if heldout and include == "train":
            continue
        rng = random.Random(f"{seed}:{query_id}:{doc_id}")
        pool = list(table.negatives.get(query_id, []))
        negatives = rng.sample(pool, min(n, len(pool)))
        positives = corpus.positives.get(query_id, {doc_id})
        while len(negatives) < n and len(doc_ids) > len(positives):
            candidate = doc_ids[rng.randrange(len(doc_ids))]
            if candidate not in positives and candidate not in negatives:
                negatives.append(candidate)
        if len(negatives) < n:
            raise ValueError(f"the corpus has too few documents for {n} negatives per query")
        positive = embedded_document(kind, "", corpus.documents[doc_id])
        rows.append(
            {
                "query_id": query_id,
                "kind": discriminator_kind(kind),
                "query": query,
                "candidates": [positive, *(corpus.documents[d] for d in negatives)],
                "heldout": heldout,
            }
        )
    return rows


def write_listwise(rows: list[dict[str, Any]], uri: str) -> str:
    """Write listwise rows as Parquet shards under ``uri/data``; returns ``uri``."""
    if not rows:
        raise ValueError(f"no listwise examples to write to {uri}")
    storage.delete_dir(storage.join(uri, "data"))
    for part, start in enumerate(range(0, len(rows), ROWS_PER_FILE)):
        table = pa.Table.from_pylist(rows[start : start + ROWS_PER_FILE], schema=LISTWISE_SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        storage.write_bytes(
            storage.join(uri, "data", f"part-{part:05d}.parquet"), sink.getvalue().to_pybytes()
        )
    return uri


def read_listwise(uri: str) -> pa.Table:
    """All listwise rows (and any extra columns, e.g. ``scores``) under ``uri/data``."""
    return read_parquet(storage.join(uri, "data"), LISTWISE)


def read_listwise_dataset(uri: str):
    """The listwise Parquet rows under ``uri/data`` as a Ray Dataset (scored by the
    discriminators in Ray Data, :mod:`santa.scoder.soft_labels`)."""
    return parquet_dataset(storage.join(uri, "data"), LISTWISE)


def pair_kinds(data_uri: str) -> set[str]:
    """The pair kinds of the training pairs under ``data_uri``."""
    return {kind for _, _, _, kind in _pair_rows(data_uri)}
