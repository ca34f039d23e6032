"""Hard-negative mining's rules (ANCE): a query's top-K hits of the current model, minus
its positives, copies of their text and hits scoring too close to the positive (the
false-negative filter); the reasons counted. Plain functions: no Ray, no files."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FILTER_REASONS",
    "FalseNegativeFilter",
    "POSITIVE_MIN_LABEL",
    "mine_hard_negatives",
    "positive_scores",
]


# Labels that make a judged document a positive of its query (code pairs: 1; ESCI E/S/C
# are 3/2/1: Substitutes and Complements are too close to the query to be safe negatives).
POSITIVE_MIN_LABEL = 1


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
