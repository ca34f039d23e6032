"""Evaluation: dense retrieval and BM25 on BEIR splits, scored with ranx.

:mod:`~santa.eval.evaluation` runs it (:func:`evaluate`, :class:`EvalConfig`);
:mod:`~santa.eval.retrieval`, :mod:`~santa.eval.bm25`, :mod:`~santa.eval.metrics` and
:mod:`~santa.eval.runfiles` are its parts. Reading BEIR folders is :mod:`santa.data.beir`,
encoding is :mod:`santa.models.encoding`.
"""

from santa.eval.bm25 import bm25_rerank, bm25_retrieve, bm25_tokenize
from santa.eval.evaluation import (
    DEFAULT_RAY_THRESHOLD,
    PROTOCOLS,
    EvalConfig,
    evaluate,
    evaluate_model,
    system_name,
)
from santa.eval.metrics import ESCI_GAINS, METRICS, NDCG_4CLASS, compute_metrics
from santa.eval.retrieval import DEFAULT_TOP_K, RankedLists, Ranking, dense_rerank, dense_retrieve
from santa.eval.runfiles import format_markdown, read_trec, write_trec

__all__ = [
    "DEFAULT_RAY_THRESHOLD",
    "DEFAULT_TOP_K",
    "ESCI_GAINS",
    "METRICS",
    "NDCG_4CLASS",
    "PROTOCOLS",
    "EvalConfig",
    "RankedLists",
    "Ranking",
    "bm25_rerank",
    "bm25_retrieve",
    "bm25_tokenize",
    "compute_metrics",
    "dense_rerank",
    "dense_retrieve",
    "evaluate",
    "evaluate_model",
    "format_markdown",
    "read_trec",
    "system_name",
    "write_trec",
]
