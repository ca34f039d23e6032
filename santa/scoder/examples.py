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
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from santa.data.kinds import kind_column, training_mask
from santa.data.published import iter_pairs, parquet_dataset, read_parquet
from santa.files import storage
from santa.negatives.corpus import MiningCorpus
from santa.negatives.table import NegativesTable
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


def build_listwise_rows(
    corpus: MiningCorpus,
    table: NegativesTable,
    *,
    n: int,
    seed: int,
    heldout_fraction: float,
    include: str = "all",
    block: int = 8192,
) -> Iterator[dict[str, Any]]:
    """One listwise row per training pair (``include``: ``all``, ``train`` = not held out),
    in the pairs' order, streamed (``block`` pairs read at a time).

    The ``n`` negatives are a seeded sample of the pair's mined pool (the paper samples
    X⁻ from the top K); a short pool is topped up with random other documents (not a
    positive of the query).
    """
    if include not in ("all", "train"):
        raise ValueError(f"include must be 'all' or 'train', got {include!r}")
    documents = corpus.num_docs
    training = len(corpus.training_rows)
    for start in range(0, training, block):
        part = np.arange(start, min(training, start + block))
        taken = corpus.rows.take(corpus.training_rows[part])
        kinds = kind_column(taken).to_pylist()
        query_ids = taken.column("query_id").to_pylist()
        queries = taken.column("query").to_pylist()
        doc_ids = taken.column("doc_id").to_pylist()
        chosen: list[list[int]] = []
        kept: list[int] = []
        for offset, (query_id, doc_id) in enumerate(zip(query_ids, doc_ids, strict=True)):
            heldout = is_heldout(query_id, heldout_fraction)
            if heldout and include == "train":
                continue
            query = int(corpus.query_of_training_row[start + offset])
            rng = random.Random(f"{seed}:{query_id}:{doc_id}")
            pool = table.of(query)
            negatives = rng.sample(pool, min(n, len(pool)))
            positives = set(corpus.positives(query).tolist())
            while len(negatives) < n and documents > len(positives):
                candidate = rng.randrange(documents)
                if candidate not in positives and candidate not in negatives:
                    negatives.append(candidate)
            if len(negatives) < n:
                raise ValueError(f"the corpus has too few documents for {n} negatives per query")
            own = int(corpus.doc_of_training_row[start + offset])
            chosen.append([own, *negatives])
            kept.append(offset)
        texts = iter(corpus.doc_texts([d for docs in chosen for d in docs]))
        for offset, docs in zip(kept, chosen, strict=True):
            yield {
                "query_id": query_ids[offset],
                "kind": discriminator_kind(kinds[offset]),
                "query": queries[offset],
                "candidates": [next(texts) for _ in docs],  # the positive first
                "heldout": is_heldout(query_ids[offset], heldout_fraction),
            }


def write_listwise(rows: Iterable[dict[str, Any]], uri: str) -> int:
    """Write listwise rows as Parquet shards of :data:`ROWS_PER_FILE` under ``uri/data``
    (streamed: one shard's rows in memory); returns how many were written."""
    storage.delete_dir(storage.join(uri, "data"))
    written, part, shard = 0, 0, []
    for row in rows:
        shard.append(row)
        if len(shard) == ROWS_PER_FILE:
            _write_shard(shard, uri, part)
            written, part, shard = written + len(shard), part + 1, []
    if shard:
        _write_shard(shard, uri, part)
        written += len(shard)
    if not written:
        raise ValueError(f"no listwise examples to write to {uri}")
    return written


def _write_shard(rows: list[dict[str, Any]], uri: str, part: int) -> None:
    table = pa.Table.from_pylist(rows, schema=LISTWISE_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    storage.write_bytes(
        storage.join(uri, "data", f"part-{part:05d}.parquet"), sink.getvalue().to_pybytes()
    )


def read_listwise(uri: str) -> pa.Table:
    """All listwise rows (and any extra columns, e.g. ``scores``) under ``uri/data``."""
    return read_parquet(storage.join(uri, "data"), LISTWISE)


def read_listwise_dataset(uri: str):
    """The listwise Parquet rows under ``uri/data`` as a Ray Dataset (scored by the
    discriminators in Ray Data, :mod:`santa.scoder.soft_labels`)."""
    return parquet_dataset(storage.join(uri, "data"), LISTWISE)


def pair_kinds(data_uri: str) -> set[str]:
    """The pair kinds of the training pairs under ``data_uri`` (its columns, not its text)."""
    kinds: set[str] = set()
    for table in iter_pairs(data_uri, ["dataset", "label", "mep_target"], optional=["kind"]):
        trains = training_mask(table)
        kinds.update(kind_column(table).filter(pa.array(trains)).unique().to_pylist())
    return kinds
