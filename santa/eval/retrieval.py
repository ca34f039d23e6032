"""Dense retrieval and re-ranking: rankings ordered by score, ties by corpus order.

Full retrieval goes through :class:`~santa.index.faiss_index.EmbeddingIndex` and keeps its result as
arrays (:class:`RankedLists`); re-ranking scores each query's judged candidates only
(ESCI's re-ranking task).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from santa.index.faiss_index import EmbeddingIndex

__all__ = [
    "DEFAULT_TOP_K",
    "RankedLists",
    "Ranking",
    "dense_rerank",
    "dense_retrieve",
    "prepare_embeddings",
    "top_k_indices",
]

DEFAULT_TOP_K = 100

# query id → [(doc id, score), ...], best first.
Ranking = dict[str, list[tuple[str, float]]]


class RankedLists(Mapping[str, list[tuple[str, float]]]):
    """Dense retrieval's rankings kept as arrays; reads as a :data:`Ranking` mapping.

    Row ``i`` of ``rows`` ``(nq, k)`` holds the hits of ``query_ids[i]`` as positions in
    ``doc_ids``, best first, ``-1`` for a missing hit (sorted last); ``scores`` ``(nq, k)``
    are their scores. :func:`~santa.eval.metrics.compute_metrics` reads the arrays
    directly, so evaluation never builds a Python object per hit; indexing by a query id
    gives the usual ``[(doc id, score), ...]`` list (TREC files, callers that want lists).
    ``doc_position`` (doc id → position in ``doc_ids``, e.g. the index's own) saves
    building that map when metrics are computed.
    """

    def __init__(
        self,
        query_ids: Sequence[str],
        doc_ids: Sequence[str],
        rows: np.ndarray,
        scores: np.ndarray,
        doc_position: Mapping[str, int] | None = None,
    ) -> None:
        self.query_ids = list(query_ids)
        self.doc_ids = doc_ids
        self.rows = rows
        self.scores = scores
        if rows.shape != scores.shape or rows.shape[0] != len(self.query_ids):
            raise ValueError(
                f"rows {rows.shape} and scores {scores.shape} for {len(self.query_ids)} queries"
            )
        self.query_row = {qid: i for i, qid in enumerate(self.query_ids)}
        if len(self.query_row) != len(self.query_ids):
            raise ValueError("query ids must be unique")
        self._doc_position = doc_position

    @property
    def doc_position(self) -> Mapping[str, int]:
        """doc id → its position in ``doc_ids`` (built once, on first use)."""
        if self._doc_position is None:
            self._doc_position = {doc: i for i, doc in enumerate(self.doc_ids)}
        return self._doc_position

    def __getitem__(self, qid: str) -> list[tuple[str, float]]:
        row = self.query_row[qid]
        hits = self.rows[row]
        found = int(np.count_nonzero(hits >= 0))
        doc_ids = self.doc_ids
        return [
            (doc_ids[j], score)
            for j, score in zip(
                hits[:found].tolist(), self.scores[row, :found].tolist(), strict=True
            )
        ]

    def __iter__(self):
        return iter(self.query_ids)

    def __len__(self) -> int:
        return len(self.query_ids)


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first, ties by lower index (exactly)."""
    n = scores.shape[0]
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        kth = np.partition(scores, n - k)[n - k]  # the k-th largest value
        above = np.flatnonzero(scores > kth)
        ties = np.flatnonzero(scores == kth)[: k - len(above)]
        index = np.concatenate([above, ties])
    else:
        index = np.arange(n)
    return index[np.lexsort((index, -scores[index]))]


def _prepare(embeddings: np.ndarray, similarity: str) -> np.ndarray:
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    if similarity == "cosine":
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        embeddings = embeddings / np.maximum(norms, 1e-12)
    return embeddings


def prepare_embeddings(embeddings: np.ndarray, similarity: str) -> np.ndarray:
    """Embeddings as the index holds them: float32, unit length for ``cosine``."""
    return _prepare(embeddings, similarity)


def dense_retrieve(
    query_embeddings: np.ndarray,
    query_ids: Sequence[str],
    doc_embeddings: np.ndarray,
    doc_ids: Sequence[str],
    *,
    top_k: int = DEFAULT_TOP_K,
    similarity: str = "dot",
    index_kind: str = "flat",
    **index_options: Any,
) -> RankedLists:
    """Top-``k`` documents per query through :class:`~santa.index.faiss_index.EmbeddingIndex`.

    The result stays in array form (:class:`RankedLists`): no Python object per hit.
    """
    if len(query_ids) != len(query_embeddings):
        raise ValueError(f"{len(query_embeddings)} query embeddings for {len(query_ids)} ids")
    index = EmbeddingIndex.build(
        _prepare(doc_embeddings, similarity), doc_ids, kind=index_kind, **index_options
    )
    rows, scores = index.search_rows(_prepare(query_embeddings, similarity), top_k)
    return RankedLists(query_ids, doc_ids, rows, scores, doc_position=index.positions)


def dense_rerank(
    query_embeddings: np.ndarray,
    query_ids: Sequence[str],
    doc_embeddings: np.ndarray,
    doc_ids: Sequence[str],
    candidates: Mapping[str, Sequence[str]],
    *,
    similarity: str = "dot",
) -> Ranking:
    """Each query's ``candidates`` ranked by the model's score (ties by corpus order)."""
    queries = _prepare(query_embeddings, similarity)
    docs = _prepare(doc_embeddings, similarity)
    position = {doc: i for i, doc in enumerate(doc_ids)}
    ranking: Ranking = {}
    for row, qid in enumerate(query_ids):
        rows = np.array(sorted(position[d] for d in candidates.get(qid, ()) if d in position))
        if not len(rows):
            ranking[qid] = []
            continue
        scores = docs[rows] @ queries[row]  # (candidates,)
        order = top_k_indices(scores, len(rows))
        ranking[qid] = [(doc_ids[rows[i]], float(scores[i])) for i in order]
    return ranking
