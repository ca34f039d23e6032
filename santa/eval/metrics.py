"""Metrics of rankings against qrels, computed by ranx (never hand-written formulas).

At cut-off 100 over the top-100 retrieved:

- ``mrr@100``, ``recall@1``, ``recall@10``, ``recall@100`` and ``ndcg@100`` on binary
  relevance. For code (labels 1) every judged document is relevant. For graded ESCI
  qrels (E/S/C/I stored as 3/2/1/0) only Exact is relevant: ``ndcg@100`` is the paper's
  two-class NDCG (Exact = 1, else 0).
- ``ndcg@100_4class`` (graded qrels only): four-class NDCG, the labels mapped to gains at
  evaluation time by one of :data:`ESCI_GAINS` (``esci_gains``):

  - ``released`` (the default): Exact 1.0, Substitute 0.01, Complement 0.1, Irrelevant 0,
    what SANTA's released evaluation computes (``evaluate_product/evaluate_product.py``
    maps E/S/C/I to 4/2/3/1 and runs ``trec_eval -m ndcg.1=0,2=0.01,3=0.1,4=1``), which
    produced Table 2's numbers;
  - ``paper``: Exact 1.0, Substitute 0.1, Complement 0.01, Irrelevant 0, as Table 2's
    caption (and ESCI's own paper) words it.

  ranx keeps judgments as integers, so the gains are passed scaled by 100
  (100/1/10/0 or 100/10/1/0); ranx's ``ndcg`` is Järvelin & Kekäläinen's linear-gain NDCG
  (``rel / log2(rank + 1)``, not Burges' ``2^rel - 1``, which is ``ndcg_burges``), and a
  ratio of linear sums does not change when every gain is multiplied by the same number.
- A query with no relevant document under a scheme is left out of that scheme's means
  (its NDCG and recall are undefined); ``num_queries`` / ``num_queries_4class`` say how
  many were averaged.
- ``by_language``: the same metrics per query language (``language`` of queries.jsonl,
  else of the query's judged documents), e.g. per programming language for CodeSearchNet.

ranx is given rank-derived scores, so it evaluates exactly the ranking written to the
TREC run files.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from santa.data.schema import ESCI_LABEL_GRADES
from santa.eval.retrieval import RankedLists

__all__ = [
    "CUTOFF",
    "DEFAULT_BLOCK_SIZE",
    "ESCI_GAINS",
    "EXACT",
    "METRICS",
    "NDCG_4CLASS",
    "compute_metrics",
    "per_query_scores",
]

CUTOFF = 100
METRICS = ("mrr@100", "ndcg@100", "recall@1", "recall@10", "recall@100")
NDCG_4CLASS = "ndcg@100_4class"
# ESCI labels as the preprocessing stores them (E/S/C/I → 3/2/1/0) and their NDCG gains.
EXACT = 3
ESCI_GAINS: dict[str, dict[int, float]] = {
    # SANTA's released evaluation: E/S/C/I → 4/2/3/1, trec_eval ndcg.1=0,2=0.01,3=0.1,4=1.
    "released": {3: 1.0, 2: 0.01, 1: 0.1, 0: 0.0},
    # SANTA's Table 2 caption: Exact 1, Substitute 0.1, Complement 0.01, Irrelevant 0.
    "paper": {3: 1.0, 2: 0.1, 1: 0.01, 0: 0.0},
}
"""Four-class NDCG gains by label, per ``esci_gains`` (see the module doc)."""
# ranx stores judgments as int64: gains go in scaled by this (NDCG is scale-invariant).
GAIN_SCALE = 100
DEFAULT_BLOCK_SIZE = 2048
"""Queries scored (and written to a TREC run) at a time: memory stays bounded by a block."""


def compute_metrics(
    qrels: Mapping[str, Mapping[str, int]],
    ranking: Mapping[str, Sequence[tuple[str, float]] | Sequence[str]],
    *,
    graded: bool | None = None,
    query_languages: Mapping[str, str] | None = None,
    metrics: Sequence[str] = METRICS,
    esci_gains: str = "released",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, Any]:
    """ranx metrics of ``ranking`` (ranked lists, best first) against ``qrels``.

    ``metrics``: the binary-relevance metrics, ``name@cutoff`` with name ``mrr``, ``ndcg``
    or ``recall`` (default :data:`METRICS`; e.g. ``mrr@1000``, GraphCodeBERT's cut-off).

    ``ranking`` is a :class:`RankedLists` (read as arrays) or any mapping of query id to
    ``[(doc id, score), ...]`` or ``[doc id, ...]``. ``graded=None`` detects ESCI grading
    (a label above 1). Binary metrics take labels ``>= 1`` as relevant, or Exact (3) only
    when graded; graded qrels add ``ndcg@100_4class`` with the gains
    ``ESCI_GAINS[esci_gains]``. See the module doc. ranx scores ``block_size`` queries
    at a time (the same per-query values whatever the block size).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    gains = esci_gain_map(esci_gains)
    runs = _RunArrays(ranking)
    judgments = _Judgments(qrels, runs)
    labels = judgments.labels
    if graded is None:
        graded = bool(len(labels)) and int(labels.max()) > 1
    if graded:
        bad = set(np.unique(labels).tolist()) - set(gains)
        if bad:
            raise ValueError(f"graded qrels must use ESCI labels 0-3, got {sorted(bad)}")
    threshold = EXACT if graded else 1
    # suffix → (per-judgment relevance for ranx, metrics)
    tables = [("", (labels >= threshold).astype(np.int64), tuple(metrics))]
    if graded:
        gain_of = np.array([round(gains[label] * GAIN_SCALE) for label in range(4)])
        tables.append(("_4class", gain_of[labels], ("ndcg@100",)))

    # suffix → (rows of the judged queries in qrels order, {metric: per-query values})
    scored: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    for suffix, relevance, metrics in tables:
        scored[suffix] = judgments.score(relevance, metrics, block_size)

    result = _means(scored, None)
    if query_languages:
        language_of = np.array([query_languages.get(q) for q in judgments.qids], dtype=object)
        by_language: dict[str, Any] = {}
        for language in sorted(set(query_languages.values())):
            by_language[language] = _means(scored, language_of == language)
        result["by_language"] = by_language
    return result


def per_query_scores(
    qrels: Mapping[str, Mapping[str, int]],
    ranking: Mapping[str, Sequence[tuple[str, float]] | Sequence[str]],
    metric: str = "mrr@100",
) -> dict[str, float]:
    """ranx's ``metric`` of every query of ``qrels`` (labels ``>= 1`` relevant), in qrels
    order: 0.0 for a query the ranking does not rank or with no relevant document.

    The same kernels as :func:`compute_metrics` on arrays of a stable type: ranx's own
    ``Qrels``/``Run`` dictionaries would compile numba code again in every process (their
    types depend on the longest id)."""
    runs = _RunArrays(ranking)
    judgments = _Judgments(qrels, runs)
    relevance = (judgments.labels >= 1).astype(np.int64)
    rows, values = judgments.score(relevance, (metric,))
    scores = dict.fromkeys(judgments.qids, 0.0)
    judged = [judgments.qids[row] for row in rows.tolist()]
    scores.update(zip(judged, values[metric].tolist(), strict=True))
    return scores


def esci_gain_map(name: str) -> dict[int, float]:
    """``ESCI_GAINS[name]``, or a ValueError naming the choices."""
    if name not in ESCI_GAINS:
        raise ValueError(f"esci_gains must be one of {sorted(ESCI_GAINS)}, got {name!r}")
    return ESCI_GAINS[name]


def gains_text(name: str) -> str:
    """``E 1, S 0.01, C 0.1, I 0``: the four-class gains of ``ESCI_GAINS[name]``, in words."""
    gains = esci_gain_map(name)
    return ", ".join(f"{letter} {gains[grade]:g}" for letter, grade in ESCI_LABEL_GRADES.items())


def _means(
    scored: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]], keep: np.ndarray | None
) -> dict[str, Any]:
    """Metric means over the judged queries, or those whose qrels row ``keep`` marks."""
    out: dict[str, Any] = {}
    for suffix, (rows, per_metric) in scored.items():
        mask = None if keep is None else keep[rows]
        for metric, values in per_metric.items():
            chosen = values if mask is None else values[mask]
            out[metric + suffix] = float(chosen.mean()) if len(chosen) else 0.0
        out["num_queries" + suffix] = len(rows) if mask is None else int(mask.sum())
    return out


class _RunArrays:
    """A ranking as integer doc ids per query: what ranx's kernels read.

    A :class:`RankedLists` already is one (ids are corpus positions); any other mapping is
    numbered here once, whatever the number of qrels tables scored against it.
    """

    def __init__(self, ranking: Mapping[str, Sequence[tuple[str, float]] | Sequence[str]]):
        if isinstance(ranking, RankedLists):
            self.query_row = ranking.query_row
            self.rows = ranking.rows
            self.doc_number: Mapping[str, int] = ranking.doc_position
            return
        numbers: dict[str, int] = {}
        number = numbers.setdefault
        self.query_row = {}
        lists = []
        for qid, ranked in ranking.items():
            ids = [number(doc, len(numbers)) for doc in _doc_ids(ranked)]
            if len(set(ids)) != len(ids):
                raise ValueError(f"the ranking of query {qid!r} lists a document twice")
            self.query_row[qid] = len(lists)
            lists.append(ids)
        self.rows = np.full((len(lists), max((len(ids) for ids in lists), default=0)), -1)
        for row, ids in enumerate(lists):
            self.rows[row, : len(ids)] = ids
        self.doc_number = numbers

    def select(self, qids: Sequence[str]) -> np.ndarray:
        """Rows ``(len(qids), depth)`` of ``qids`` in order; an unranked query is all ``-1``."""
        at = np.fromiter(map(self.query_row.get, qids, itertools.repeat(-1)), np.int64, len(qids))
        depth = max(1, self.rows.shape[1])
        out = np.full((len(qids), depth), -1, dtype=np.int64)
        present = at >= 0
        out[present, : self.rows.shape[1]] = self.rows[at[present]]
        return out


class _Judgments:
    """Qrels flattened to arrays, documents numbered as the ranking numbers them.

    A judged document the ranking never names gets an id of its own, above every id the
    ranking uses, so it counts in recall and the ideal DCG but is never retrieved.
    """

    def __init__(self, qrels: Mapping[str, Mapping[str, int]], runs: _RunArrays) -> None:
        self.qids = list(qrels)
        self.runs = runs
        counts = [len(docs) for docs in qrels.values()]
        docs = [doc for judged in qrels.values() for doc in judged]
        self.query_of = np.repeat(np.arange(len(self.qids)), counts)
        self.labels = np.fromiter(
            (label for judged in qrels.values() for label in judged.values()), np.int64, len(docs)
        )
        self.doc_of = np.fromiter(
            map(runs.doc_number.get, docs, itertools.repeat(-1)), np.int64, len(docs)
        )
        unknown = np.flatnonzero(self.doc_of < 0)
        if len(unknown):
            base = max(len(runs.doc_number), int(runs.rows.max(initial=-1)) + 1)
            extra: dict[str, int] = {}
            for position in unknown.tolist():
                self.doc_of[position] = extra.setdefault(docs[position], base + len(extra))

    def score(
        self, relevance: np.ndarray, metrics: Sequence[str], block_size: int = DEFAULT_BLOCK_SIZE
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """ranx's per-query ``metrics`` for the queries with a judgment of ``relevance > 0``.

        Calls ranx's metric functions (``ranx.metrics``, what ``ranx.evaluate`` runs) on
        padded arrays: each query's ranked list is a row of integer doc ids in our order
        (ranx's kernels read the run as sorted; it gets strictly decreasing rank scores),
        qrels rows are sorted by relevance (what ranx's ideal DCG expects). Padding has id
        -1 and relevance 0, below ranx's relevance level 1, so it never counts. This
        skips building ranx's Qrels/Run dictionaries, whose conversion cost dominated the
        evaluation of small and medium corpora.

        The padded arrays are built ``block_size`` judged queries at a time (ranx scores
        each query on its own), so they never hold the whole run.
        """
        keep = relevance > 0
        query_of, doc_of, relevance = self.query_of[keep], self.doc_of[keep], relevance[keep]
        rows = np.unique(query_of)  # judged queries, in qrels order
        if not len(rows):
            return rows, {metric: np.zeros(0) for metric in metrics}
        from ranx import metrics as ranx_metrics

        query_of = np.searchsorted(rows, query_of)  # → row in the judged subset
        order = np.lexsort((-relevance, query_of))
        query_of, doc_of, relevance = query_of[order], doc_of[order], relevance[order]
        counts = np.bincount(query_of, minlength=len(rows))
        starts = np.cumsum(counts) - counts  # each judged query's first judgment
        column = np.arange(len(query_of)) - starts[query_of]
        width = int(counts.max())

        parts: dict[str, list[np.ndarray]] = {metric: [] for metric in metrics}
        for first in range(0, len(rows), block_size):
            last = min(first + block_size, len(rows))
            ranked = self.runs.select([self.qids[row] for row in rows[first:last].tolist()])
            run = np.empty((*ranked.shape, 2))
            run[:, :, 0] = ranked
            run[:, :, 1] = np.arange(ranked.shape[1], 0, -1, dtype=np.float64)
            span = slice(starts[first], starts[last - 1] + counts[last - 1])
            qrels = np.zeros((last - first, width, 2))
            qrels[:, :, 0] = -1.0
            block_of = query_of[span] - first
            qrels[block_of, column[span], 0] = doc_of[span]
            qrels[block_of, column[span], 1] = relevance[span]
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*unsafe cast.*")
                for metric in metrics:
                    name, _, cutoff = metric.partition("@")
                    function = getattr(ranx_metrics, _RANX_METRICS[name])
                    values = function(qrels, run, k=int(cutoff or 0), rel_lvl=1)
                    parts[metric].append(np.asarray(values))
        return rows, {metric: np.concatenate(values) for metric, values in parts.items()}


# Metric names → ranx's metric functions (the same ones ranx.evaluate dispatches to).
_RANX_METRICS = {"mrr": "reciprocal_rank", "ndcg": "ndcg", "recall": "recall"}


def _doc_ids(ranked: Sequence[tuple[str, float]] | Sequence[str]) -> list[str]:
    """The doc ids of a ranked list of ``(doc, score)`` pairs or of plain ids."""
    if ranked and isinstance(ranked[0], str):
        return list(ranked)
    return [item[0] for item in ranked]
