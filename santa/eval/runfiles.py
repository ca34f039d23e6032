"""Evaluation outputs: TREC run files and markdown tables of metrics."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from santa.eval.metrics import DEFAULT_BLOCK_SIZE, METRICS, NDCG_4CLASS
from santa.eval.retrieval import Ranking
from santa.files import storage

__all__ = ["check_trec_ids", "format_markdown", "read_trec", "trec_blocks", "write_trec"]


def write_trec(
    uri: str,
    ranking: Mapping[str, Sequence[tuple[str, float]]],
    tag: str,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> None:
    """Write a TREC run file: ``qid Q0 docid rank score tag`` (ranks from 1), written
    ``block_size`` queries at a time (:func:`trec_blocks`), never held whole: a run of
    100,000 queries' top 100 is ~1.8 GB of text with CodeSearchNet's URL doc ids. Whole or
    not at all (:func:`santa.files.storage.write_chunks`)."""
    storage.write_chunks(uri, trec_blocks(ranking, tag, block_size=block_size))


def trec_blocks(
    ranking: Mapping[str, Sequence[tuple[str, float]]],
    tag: str,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Iterator[bytes]:
    """A TREC run's lines, UTF-8, one chunk per ``block_size`` queries (in ranking order)."""
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    queries = iter(ranking)
    while block := list(itertools.islice(queries, block_size)):
        lines = [
            f"{qid} Q0 {doc} {rank} {score:.6f} {tag}\n"
            for qid in block
            for rank, (doc, score) in enumerate(ranking[qid], start=1)
        ]
        if lines:
            yield "".join(lines).encode("utf-8")


def read_trec(uri: str) -> Ranking:
    """Read a TREC run file back (ranked by the rank column)."""
    rows: dict[str, list[tuple[int, str, float]]] = defaultdict(list)
    for line in storage.read_bytes(uri).decode("utf-8").splitlines():
        if line.strip():
            qid, _, doc, rank, score, _tag = line.split()
            rows[qid].append((int(rank), doc, float(score)))
    return {qid: [(doc, score) for _, doc, score in sorted(hits)] for qid, hits in rows.items()}


def check_trec_ids(ids: Iterable[str], what: str) -> None:
    """Raise ValueError for an id a TREC run file cannot hold (empty, or with whitespace)."""
    for value in ids:
        if not value or any(ch.isspace() for ch in value):
            raise ValueError(
                f"{what} id {value!r} is empty or has whitespace: a TREC run cannot hold it"
            )


def format_markdown(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown tables: systems × metrics, then per language when there is more than one."""
    columns = _metric_columns(results.values())
    lines = [_table_header(["system", *columns, "queries"])]
    for system, metrics in results.items():
        lines.append(_table_row([system], metrics, columns))
    languages = sorted({lang for m in results.values() for lang in m.get("by_language", {})})
    if len(languages) > 1:
        lines += [
            "",
            "Per language:",
            "",
            _table_header(["system", "language", *columns, "queries"]),
        ]
        for system, metrics in results.items():
            for language, values in metrics.get("by_language", {}).items():
                lines.append(_table_row([system, language], values, columns))
    return "\n".join(lines) + "\n"


def _metric_columns(all_metrics: Iterable[Mapping[str, Any]]) -> list[str]:
    present = {key for metrics in all_metrics for key in metrics}
    return [m for m in (*METRICS, NDCG_4CLASS) if m in present]


def _table_header(names: list[str]) -> str:
    return "| " + " | ".join(names) + " |\n|" + "|".join("---" for _ in names) + "|"


def _table_row(labels: list[str], metrics: Mapping[str, Any], columns: list[str]) -> str:
    cells = [f"{metrics[c]:.4f}" if c in metrics else "" for c in columns]
    return "| " + " | ".join([*labels, *cells, str(metrics.get("num_queries", ""))]) + " |"
