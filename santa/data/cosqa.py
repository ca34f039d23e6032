"""CoSQA (web queries labelled against Python functions) as a BEIR retrieval set.

CoSQA (Huang et al., 2021; the CodeXGLUE copy) is a JSON array of
``{"idx", "doc", "code", "code_tokens", "docstring_tokens", "label"}``: ``doc`` is a real
web search query, ``code`` a Python function, ``label`` 1 when the code answers the query.
As a retrieval set: every query with a positive label is a query, every distinct function
(by its text) is a document, and the qrels pair each query with its function. Functions are
kept whole, as the dataset gives them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from santa.data.beir import write_beir_files
from santa.data.kinds import CODE_PAIR
from santa.files import storage

__all__ = [
    "CosqaBeir",
    "cosqa_beir",
    "preprocess",
    "publish_cosqa_beir",
    "read_cosqa",
    "write_cosqa_beir",
]

LANGUAGE = "python"


class CosqaBeir:
    """A CoSQA file turned into BEIR rows (corpus, queries, qrels) plus what was skipped."""

    def __init__(
        self,
        corpus: list[dict[str, Any]],
        queries: list[dict[str, Any]],
        qrels: dict[tuple[str, str], int],
        skipped: dict[str, int],
    ) -> None:
        self.corpus = corpus
        self.queries = queries
        self.qrels = qrels
        self.skipped = skipped


def read_cosqa(uri: str) -> list[dict[str, Any]]:
    """The records of a CoSQA JSON file (local or ``s3://``), as a list of dicts."""
    try:
        records = json.loads(storage.read_bytes(uri))
    except json.JSONDecodeError as error:
        raise ValueError(f"{uri}: not a CoSQA JSON array ({error})") from None
    if not isinstance(records, list):
        raise ValueError(f"{uri}: not a CoSQA JSON array (found {type(records).__name__})")
    return records


def cosqa_beir(records: Sequence[Any]) -> CosqaBeir:
    """BEIR rows from CoSQA records; malformed records are skipped and counted by reason."""
    corpus: dict[str, dict[str, Any]] = {}
    doc_by_code: dict[str, str] = {}
    queries: list[dict[str, Any]] = []
    qrels: dict[tuple[str, str], int] = {}
    skipped = {"missing_field": 0, "empty_query": 0, "empty_code": 0, "duplicate_query_id": 0}
    query_ids: set[str] = set()
    for record in records:
        if not isinstance(record, dict) or not {"idx", "doc", "code", "label"} <= record.keys():
            skipped["missing_field"] += 1
            continue
        code, query = str(record["code"]), str(record["doc"]).strip()
        if not code.strip():
            skipped["empty_code"] += 1
            continue
        doc_id = doc_by_code.get(code)
        if doc_id is None:
            doc_id = doc_by_code[code] = f"cosqa-code-{len(doc_by_code)}"
            corpus[doc_id] = {
                "_id": doc_id,
                "title": "",
                "text": code,
                "language": LANGUAGE,
                "kind": CODE_PAIR,
            }
        if int(record["label"]) != 1:
            continue  # the function stays in the corpus as a distractor
        if not query:
            skipped["empty_query"] += 1
            continue
        query_id = str(record["idx"])
        if query_id in query_ids:
            skipped["duplicate_query_id"] += 1
            continue
        query_ids.add(query_id)
        queries.append({"_id": query_id, "text": query, "language": LANGUAGE})
        qrels[(query_id, doc_id)] = 1
    return CosqaBeir(list(corpus.values()), queries, qrels, skipped)


def write_cosqa_beir(input_uri: str, output: str, split: str = "test") -> dict[str, Any]:
    """CoSQA file → BEIR folder; returns the counts and what was skipped, by reason."""
    records = read_cosqa(input_uri)
    beir = cosqa_beir(records)
    if not beir.queries:
        raise ValueError(f"{input_uri}: no CoSQA record with label 1 (nothing to evaluate)")
    counts = write_beir_files(output, beir.corpus, beir.queries, beir.qrels, split)
    return {"rows_read": len(records), "beir": counts, "skipped": beir.skipped}


def publish_cosqa_beir(input_uri: str, output: str, split: str = "test") -> dict[str, Any]:
    """:func:`write_cosqa_beir` into ``output`` published whole (staged, then renamed in or
    named by a manifest on S3); returns the report."""
    from santa.files.outputs import staged_output

    with staged_output(output, tool="preprocess") as staged:
        report = write_cosqa_beir(input_uri, staged.staging, split=split)
        staged.publish(
            {**report, "config": {"dataset": "cosqa", "input": input_uri, "split": split}}
        )
    return report


def preprocess(config) -> dict[str, Any]:
    """The registry's entry (:mod:`santa.data.datasets`): ``config.input`` → the BEIR
    folder ``config.output`` (split ``config.split``, default test), published whole."""
    return publish_cosqa_beir(config.input, config.output, config.split or "test")
