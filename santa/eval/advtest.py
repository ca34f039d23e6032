"""AdvTest scored as CodeXGLUE scores it (SANTA's Table 2 and Table 6, the Adv column).

CodeXGLUE's NL-code-search-Adv evaluator pairs the ``i``-th query of the test file with the
``i``-th function (its answer) and ranks every query against every function of the file.
The rank of the answer counts every *other* function scoring at least as high
(``1 + #{j != i: s_ij >= s_ii}``: ties go against the answer) and MRR is the mean of
``1 / rank`` over the whole ranking, without a cut-off (``mrr``). The numbers the papers
print are cut at 100: CodeXGLUE's ``run.py`` writes each query's top 100 for its official
``evaluator.py``, and SANTA's released ``evaluate_code/evaluate_code.py`` (``calculate_mrr``)
looks for the answer in the top 100; an answer below them scores 0 (``mrr@100``, reported
beside ``mrr``). santa builds that ranking (the answer after the functions it ties with)
in chunks of queries and lets ranx compute the reciprocal ranks and recalls from it, so
the numbers are CodeXGLUE's exactly.

A query is the space-joined docstring tokens. A function's text is ``EvalConfig.code_text``
(:func:`santa.eval.codesearch.candidate_text`): by default its space-joined
``function_tokens`` (the name-obfuscated tokens), as CodeXGLUE's fine-tuning script and
SANTA's ``build_test_code.py`` embed it.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from santa.eval.bm25 import _BM25
from santa.eval.codesearch import SUFFIXES, _rows, candidate_text, query_text, skipped_line
from santa.eval.evaluation import EvalConfig
from santa.eval.protocol_parts import Encoder, ProtocolResult, markdown_table
from santa.eval.retrieval import RankedLists, _prepare
from santa.files import storage

__all__ = ["ADVTEST_METRICS", "AdvTestSet", "codexglue_scores", "read_advtest", "run_advtest"]

ADVTEST_METRICS = ("mrr", "mrr@100", "recall@1", "recall@10", "recall@100")
LANGUAGE = "python"
QUERY_CHUNK = 128


@dataclass
class AdvTestSet:
    """AdvTest queries and functions, row ``i`` of one the answer of row ``i`` of the other."""

    uri: str
    ids: list[str]
    """The ``idx`` of each row, else ``line-<n>``; a query and its answer share it."""
    queries: list[str]
    functions: list[str]
    skipped: dict[str, int]


def advtest_file(data: str, split: str) -> str:
    """``data`` itself when it is a file, else ``{data}/{split}.jsonl[.gz]``."""
    if data.endswith(SUFFIXES) and storage.exists(data):
        return data
    for suffix in SUFFIXES:
        uri = storage.join(data, split + suffix)
        if storage.exists(uri):
            return uri
    raise FileNotFoundError(f"no AdvTest {split}.jsonl under {data} (give the folder or the file)")


def read_advtest(data: str, split: str = "test", code_text: str = "released") -> AdvTestSet:
    """Read an AdvTest file (``function``, ``docstring_tokens``; CodeSearchNet rows too),
    each function's text as ``code_text`` asks."""
    uri = advtest_file(data, split)
    skipped: Counter = Counter()
    ids: list = []
    queries, functions = [], []
    for line_no, row in _rows(uri, skipped):
        query, function = query_text(row), candidate_text(row, LANGUAGE, code_text)
        if not query or not function.strip():
            skipped["missing_field"] += 1
            continue
        # A row's url is not unique in AdvTest's test split (it names the commit), so
        # rows are told apart by their idx (by their line where idx is missing or repeats).
        ids.append((str(row.get("idx", "")).strip(), f"line-{line_no}"))
        queries.append(query)
        functions.append(function)
    given = [idx for idx, _ in ids]
    unique = all(given) and len(set(given)) == len(given)
    ids = [idx if unique else line for idx, line in ids]
    if not ids:
        raise ValueError(f"{uri}: no AdvTest rows with a function and docstring tokens")
    return AdvTestSet(uri, ids, queries, functions, dict(sorted(skipped.items())))


def codexglue_scores(
    score_rows: Callable[[int, int], np.ndarray], count: int, top_k: int
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """CodeXGLUE's MRR (and recalls) of ``count`` queries, whose answer is their own row.

    ``score_rows(start, end)`` gives the scores ``(end - start, count)`` of queries
    ``start..end`` against every function. Returns the metric means and each query's top
    ``top_k`` (rows ``(count, top_k)`` and their scores, for the TREC run).
    """
    from ranx import metrics as ranx_metrics

    per_query = {name: np.zeros(count) for name in ADVTEST_METRICS}
    top_k = min(top_k, count)
    rows = np.empty((count, top_k), dtype=np.int64)
    kept_scores = np.empty((count, top_k), dtype=np.float32)
    for start in range(0, count, QUERY_CHUNK):
        end = min(count, start + QUERY_CHUNK)
        scores = score_rows(start, end)  # (chunk, count)
        chunk = np.arange(end - start)
        is_answer = np.zeros(scores.shape, dtype=bool)
        is_answer[chunk, start + chunk] = True
        # Score descending; among equal scores the answer last (CodeXGLUE's >=), the rest
        # by position (lexsort is stable).
        order = np.lexsort((is_answer, -scores), axis=-1)  # (chunk, count)
        run = np.empty((*order.shape, 2))
        run[:, :, 0] = order
        run[:, :, 1] = np.arange(count, 0, -1, dtype=np.float64)
        qrels = np.empty((len(chunk), 1, 2))
        qrels[:, 0, 0] = start + chunk
        qrels[:, 0, 1] = 1
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*unsafe cast.*")
            for name in ADVTEST_METRICS:
                metric, _, cutoff = name.partition("@")
                score = ranx_metrics.reciprocal_rank if metric == "mrr" else ranx_metrics.recall
                per_query[name][start:end] = score(qrels, run, k=int(cutoff or 0))
        rows[start:end] = order[:, :top_k]
        kept_scores[start:end] = np.take_along_axis(scores, order[:, :top_k], axis=1)
    means = {name: float(values.mean()) for name, values in per_query.items()}
    return means, rows, kept_scores


def run_advtest(encoder: Encoder, data: str, config: EvalConfig) -> ProtocolResult:
    """Every query against every function of the file; CodeXGLUE's MRR (ties against)."""
    adv = read_advtest(data, config.split, config.code_text)
    count = len(adv.ids)
    function_embeddings = _prepare(encoder.documents(adv.functions), encoder.similarity)
    query_embeddings = _prepare(encoder.queries(adv.queries), encoder.similarity)

    def model_scores(start: int, end: int) -> np.ndarray:
        return query_embeddings[start:end] @ function_embeddings.T  # (chunk, count)

    scorers: dict[str, Callable[[int, int], np.ndarray]] = {"model": model_scores}
    if config.with_bm25:
        bm25 = _BM25(adv.functions)
        scorers["bm25"] = lambda start, end: np.stack(
            [bm25.scores(query) for query in adv.queries[start:end]]
        )
    results, rankings, timings = {}, {}, {}
    for system, scorer in scorers.items():
        started = time.perf_counter()
        metrics, rows, scores = codexglue_scores(scorer, count, config.top_k)
        timings[f"rank_{system}_s"] = round(time.perf_counter() - started, 3)
        results[system] = {
            **metrics,
            "num_queries": count,
            "num_candidates": count,
            "ties": "counted against the answer (CodeXGLUE)",
        }
        rankings[system] = RankedLists(adv.ids, adv.ids, rows, scores)
    markdown = (
        "AdvTest: each query against every function of the file, MRR without cut-off and "
        "at 100 (CodeXGLUE's evaluator and SANTA's script score the top 100)\n\n"
        + markdown_table(
            ["system", *ADVTEST_METRICS, "queries"],
            [[s, *(results[s][m] for m in ADVTEST_METRICS), count] for s in results],
        )
        + (f"\n{line}" if (line := skipped_line(adv.uri, adv.skipped)) else "")
    )
    info = {
        "file": adv.uri,
        "num_queries": count,
        "skipped": adv.skipped,
        "code_text": config.code_text,
        "timings_s": timings,
    }
    return ProtocolResult(results, rankings, markdown, info)
