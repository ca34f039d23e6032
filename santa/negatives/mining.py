"""Hard-negative mining (ANCE): top-K hits of the current model, minus every positive.

Plain functions and a plain table class: no Ray here (see :mod:`santa.negatives.miner` for
the actor that runs them while training goes on).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from santa.data.kinds import embedded_document, is_training_row, row_kind
from santa.data.published import iter_pairs
from santa.method.duplicates import text_key
from santa.runtime import storage

__all__ = [
    "FILTER_REASONS",
    "FalseNegativeFilter",
    "MiningCorpus",
    "NegativesTable",
    "load_documents",
    "load_mining_corpus",
    "mine_hard_negatives",
    "positive_scores",
    "read_filtered_counts",
    "publish_table",
    "published_table",
    "read_negatives_table",
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
    duplicate_of: Mapping[str, str] | None = None,
    hit_scores: Sequence[Sequence[float]] | np.ndarray | None = None,
    positive_scores: Mapping[str, float] | None = None,
    score_filter: FalseNegativeFilter | None = None,
    filtered: dict[str, int] | None = None,
) -> dict[str, list[str]]:
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
    canonical = duplicate_of or {}
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


def positive_scores(
    query_ids: Sequence[str],
    query_vectors: np.ndarray,
    positives: Mapping[str, set[str]],
    doc_rows: Mapping[str, int],
    doc_vectors: np.ndarray,
    block: int = 65_536,
) -> dict[str, float]:
    """Each query's best positive score (inner product, as the index scores hits).

    The best of its positives: a hit is a likely false negative when it comes close to any
    of them (an ESCI query's Complements score below its Exact matches; measured against
    the weakest positive, most true negatives would go). Queries without an embedded
    positive are left out (nothing to filter against).
    """
    pairs = [
        (row, doc_rows[doc])
        for row, query_id in enumerate(query_ids)
        for doc in positives.get(query_id, ())
        if doc in doc_rows
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


@dataclass
class NegativesTable:
    """One published set of hard negatives: query id → negative document ids.

    ``step`` is the training step of the weights the table was mined with (tables are
    ordered by it, across miner restarts too); ``version`` counts the tables one miner
    built; ``build_s`` is the refresh's wall time. ``documents`` maps every negative id to
    its text (as embedded), so trainers look negatives up without the corpus; it is empty
    for a table written without texts.
    """

    negatives: dict[str, list[str]]
    step: int = 0
    version: int = 0
    built_at: float = field(default_factory=time.time)
    build_s: float = 0.0
    documents: dict[str, str] = field(default_factory=dict)
    encode_s: float = 0.0
    """The part of ``build_s`` spent encoding the corpus and the queries."""
    filtered: dict[str, int] = field(default_factory=dict)
    """Hits dropped while mining, by reason (:data:`FILTER_REASONS`)."""

    def referenced_ids(self) -> set[str]:
        """Every document id some query's negatives name."""
        return {doc for negatives in self.negatives.values() for doc in negatives}

    def missing_texts(self) -> set[str]:
        """Referenced ids whose text the table does not carry."""
        return self.referenced_ids() - self.documents.keys()

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

    def to_arrow(self) -> pa.Table:
        """The table as Arrow, with its provenance in the schema metadata."""
        columns = {"query_id": list(self.negatives), "negative_ids": list(self.negatives.values())}
        schema = NEGATIVES_SCHEMA
        if self.documents and not self.missing_texts():
            columns["negative_texts"] = [
                [self.documents[doc] for doc in ids] for ids in self.negatives.values()
            ]
            schema = schema.append(TEXTS_FIELD)
        table = pa.table(columns, schema=schema)
        return table.replace_schema_metadata(self.metadata())

    def write_parquet(self, uri: str) -> str:
        """Write ``negatives.parquet`` under ``uri`` (local or s3://); returns its URI."""
        target = storage.join(uri, TABLE_FILE)
        sink = pa.BufferOutputStream()
        pq.write_table(self.to_arrow(), sink)
        storage.write_bytes(target, sink.getvalue().to_pybytes())
        return target


def publish_table(table: NegativesTable, uri: str) -> str:
    """Write ``table`` as the output folder ``uri``, published whole (a staged folder
    renamed in, or on S3 a prefix named by the manifest); returns the table's URI."""
    from santa.data.outputs import published_root, staged_output

    with staged_output(uri, tool="mine_negatives") as staged:
        table.write_parquet(staged.staging)
        staged.publish({"queries": len(table.negatives), "step": table.step})
    return storage.join(published_root(uri), TABLE_FILE)


def published_table(uri: str) -> str | None:
    """The table of the output folder ``uri`` (published, or written by an older santa
    straight into the folder), or None when there is none."""
    from santa.data.outputs import published_root

    target = storage.join(published_root(uri), TABLE_FILE)
    return target if storage.exists(target) else None


def read_negatives_table(uri: str) -> NegativesTable:
    """Read a table :meth:`NegativesTable.write_parquet` wrote (the folder or the file)."""
    if uri.endswith(".parquet"):
        target = uri
    else:
        from santa.data.outputs import published_root

        target = storage.join(published_root(uri), TABLE_FILE)
    if not storage.exists(target):
        raise FileNotFoundError(f"no hard-negatives table at {target}")
    filesystem, path = storage.resolve(target)
    table = pq.read_table(path, filesystem=filesystem)
    missing = {"query_id", "negative_ids"} - set(table.column_names)
    if missing:
        raise ValueError(f"{target} is not a hard-negatives table: no column(s) {sorted(missing)}")
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    columns = table.to_pydict()
    documents: dict[str, str] = {}
    for ids, texts in zip(columns["negative_ids"], columns.get("negative_texts", []), strict=False):
        documents.update(zip(ids, texts, strict=True))
    return NegativesTable(
        negatives=dict(zip(columns["query_id"], columns["negative_ids"], strict=True)),
        step=int(meta.get("santa.step", 0)),
        version=int(meta.get("santa.version", 0)),
        built_at=float(meta.get("santa.built_at", 0.0)),
        build_s=float(meta.get("santa.build_s", 0.0)),
        documents=documents,
        encode_s=float(meta.get("santa.encode_s", 0.0)),
        filtered=json.loads(meta.get("santa.filtered", "{}")),
    )


def read_filtered_counts(uri: str) -> dict[str, int]:
    """What mining dropped for a table, by reason (its Parquet metadata only); ``{}`` for
    a table written before santa counted it."""
    target = uri if uri.endswith(".parquet") else storage.join(uri, "negatives.parquet")
    filesystem, path = storage.resolve(target)
    metadata = pq.read_schema(path, filesystem=filesystem).metadata or {}
    return json.loads(metadata.get(b"santa.filtered", b"{}").decode())


@dataclass
class MiningCorpus:
    """What mining needs from the preprocessed pairs.

    ``documents``: every document (doc id → text, judged-only ESCI products included);
    ``queries``: the training queries (query id → text); ``positives``: query id → ids of
    its positive documents; ``duplicate_of``: doc id → the first doc id with the same text
    after normalization (case, whitespace, Unicode form: near-duplicates).
    """

    documents: dict[str, str]
    queries: dict[str, str]
    positives: dict[str, set[str]]
    duplicate_of: dict[str, str]


CORPUS_COLUMNS = ["dataset", "query_id", "query", "doc_id", "title", "document", "label"]


def _corpus_rows(data_uri: str, doc_ids: set[str] | None = None):
    """Yield ``(kind, query_id, query, doc_id, embedded document, label)`` per pair row,
    only the rows of ``doc_ids`` when given (filtered while reading)."""
    wanted = None if doc_ids is None else pc.field("doc_id").isin(sorted(doc_ids))
    columns = [*CORPUS_COLUMNS, "mep_target"]
    for table in iter_pairs(data_uri, columns, optional=["kind"], filters=wanted):
        rows = table.to_pydict()
        kinds = rows.pop("kind", [None] * len(rows["query_id"]))
        targets = rows.pop("mep_target")
        for kind, target, dataset, query_id, query, doc_id, title, document, label in zip(
            kinds, targets, *rows.values(), strict=True
        ):
            kind = row_kind(kind, dataset, target)
            # Mined against what training embeds (title + text for ESCI judgments).
            yield kind, query_id, query, doc_id, embedded_document(kind, title, document), label


def load_documents(data_uri: str, doc_ids: set[str]) -> dict[str, str]:
    """The embedded texts of ``doc_ids`` only (for a table written without its texts)."""
    documents: dict[str, str] = {}
    if doc_ids:
        for _, _, _, doc_id, document, _ in _corpus_rows(data_uri, set(doc_ids)):
            documents.setdefault(doc_id, document)
    return documents


def load_mining_corpus(data_uri: str) -> MiningCorpus:
    """Read the pairs under ``data_uri/data`` (the preprocess job's output)."""
    documents: dict[str, str] = {}
    queries: dict[str, str] = {}
    positives: dict[str, set[str]] = {}
    first_with_text: dict[int, str] = {}  # normalized text's key → the first doc id
    duplicate_of: dict[str, str] = {}
    for kind, query_id, query, doc_id, document, label in _corpus_rows(data_uri):
        if doc_id not in documents:
            documents[doc_id] = document
            duplicate_of[doc_id] = first_with_text.setdefault(text_key(document), doc_id)
        if label is None or label >= POSITIVE_MIN_LABEL:
            positives.setdefault(query_id, set()).add(doc_id)
        if is_training_row(kind, label):
            queries.setdefault(query_id, query)
    return MiningCorpus(documents, queries, positives, duplicate_of)
