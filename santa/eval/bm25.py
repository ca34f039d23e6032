"""The BM25 baseline (bm25s, Lucene's BM25) over identifier-aware tokens."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from santa.eval.retrieval import DEFAULT_TOP_K, Ranking, top_k_indices

__all__ = ["bm25_rerank", "bm25_retrieve", "bm25_tokenize"]

_CAMEL_BOUNDARIES = (
    re.compile(r"([a-z0-9])([A-Z])"),  # getValue → get Value
    re.compile(r"([A-Z]+)([A-Z][a-z])"),  # HTTPServer → HTTP Server
)
_WORD = re.compile(r"[a-z0-9]+")


def bm25_tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric runs, splitting camelCase and snake_case identifiers."""
    for boundary in _CAMEL_BOUNDARIES:
        text = boundary.sub(r"\1 \2", text)
    return _WORD.findall(text.lower())


class _BM25:
    """bm25s (Lucene's BM25, k1=1.5, b=0.75) over the corpus; dense scores per query."""

    def __init__(self, doc_texts: Sequence[str]) -> None:
        import bm25s

        self.num_docs = len(doc_texts)
        self.retriever = bm25s.BM25()
        tokens = [bm25_tokenize(text) for text in doc_texts]
        self.retriever.index(tokens, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        token_ids = self.retriever.get_tokens_ids(bm25_tokenize(query))
        if not token_ids:
            return np.zeros(self.num_docs, dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(token_ids), dtype=np.float32)


def bm25_retrieve(
    doc_texts: Sequence[str],
    doc_ids: Sequence[str],
    query_texts: Sequence[str],
    query_ids: Sequence[str],
    *,
    top_k: int = DEFAULT_TOP_K,
) -> Ranking:
    """BM25 top-``k`` per query over the whole corpus (ties by corpus order)."""
    bm25 = _BM25(doc_texts)
    ranking: Ranking = {}
    for qid, query in zip(query_ids, query_texts, strict=True):
        scores = bm25.scores(query)
        ranking[qid] = [(doc_ids[i], float(scores[i])) for i in top_k_indices(scores, top_k)]
    return ranking


def bm25_rerank(
    doc_texts: Sequence[str],
    doc_ids: Sequence[str],
    query_texts: Sequence[str],
    query_ids: Sequence[str],
    candidates: Mapping[str, Sequence[str]],
) -> Ranking:
    """Each query's ``candidates`` ranked by BM25 (statistics of the whole corpus)."""
    bm25 = _BM25(doc_texts)
    position = {doc: i for i, doc in enumerate(doc_ids)}
    ranking: Ranking = {}
    for qid, query in zip(query_ids, query_texts, strict=True):
        rows = np.array(sorted(position[d] for d in candidates.get(qid, ()) if d in position))
        if not len(rows):
            ranking[qid] = []
            continue
        scores = bm25.scores(query)[rows]
        ranking[qid] = [
            (doc_ids[rows[i]], float(scores[i])) for i in top_k_indices(scores, len(rows))
        ]
    return ranking
