"""BEIR folders: read them for evaluation, write them from the preprocessing pipeline.

A BEIR folder (local or ``s3://``) holds ``corpus.jsonl``, ``queries.jsonl`` and
``qrels/{split}.tsv``, as ``ray_jobs.preprocess --stage eval`` writes it. Only queries
judged in the split are loaded.

The document text is ``title + " " + text`` for products; code documents (whose language
is a code language) use the code alone: their BEIR title is the function name, and for
AdvTest that is the *de-obfuscated* name, which would leak the answer.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from santa.data.kinds import document_text, row_kind
from santa.files import storage
from santa.files.outputs import published_root

if TYPE_CHECKING:
    import ray.data

__all__ = ["BeirData", "document_text", "load_beir", "write_beir", "write_beir_files"]

logger = logging.getLogger(__name__)


@dataclass
class BeirData:
    """One BEIR split: the corpus, the judged queries and their qrels."""

    corpus: dict[str, dict[str, str]]
    """doc id → ``{"title", "text"}`` (and ``"language"`` when known)."""
    queries: dict[str, str]
    """query id → text, only queries judged in the split."""
    qrels: dict[str, dict[str, int]]
    """query id → {doc id: label}; labels 1 for code, 3/2/1/0 (E/S/C/I) for ESCI."""
    query_languages: dict[str, str] = field(default_factory=dict)
    """query id → language (programming language, product locale); may be empty."""
    uri: str = ""
    split: str = "test"

    @property
    def graded(self) -> bool:
        """Whether the qrels are ESCI-graded (any label above 1)."""
        return any(label > 1 for docs in self.qrels.values() for label in docs.values())

    @property
    def doc_ids(self) -> list[str]:
        """Corpus ids in file order."""
        return list(self.corpus)

    def document_texts(self) -> list[str]:
        """What the encoders see for each document, in :attr:`doc_ids` order."""
        return [document_text(doc) for doc in self.corpus.values()]

    def candidates(self) -> dict[str, list[str]]:
        """Each query's judged documents that are in the corpus (the rerank protocol)."""
        return {
            qid: [doc for doc in docs if doc in self.corpus] for qid, docs in self.qrels.items()
        }


def load_beir(uri: str, split: str = "test") -> BeirData:
    """Read a BEIR folder (local path or ``s3://``); keep the queries judged in ``split``.

    A preprocess output is read where its manifest says (:func:`published_root`).
    """
    uri = published_root(uri)
    corpus: dict[str, dict[str, str]] = {}
    for line_no, row in _read_jsonl(uri, "corpus.jsonl"):
        doc_id = _row_id(row, "corpus.jsonl", line_no)
        if doc_id in corpus:
            continue  # BEIR files are de-duplicated by writers; keep the first copy
        doc = {"title": str(row.get("title") or ""), "text": str(row.get("text") or "")}
        if row.get("language"):
            doc["language"] = str(row["language"])
        corpus[doc_id] = doc
    all_queries: dict[str, str] = {}
    languages: dict[str, str] = {}
    for line_no, row in _read_jsonl(uri, "queries.jsonl"):
        query_id = _row_id(row, "queries.jsonl", line_no)
        all_queries[query_id] = str(row.get("text") or "")
        if row.get("language"):
            languages[query_id] = str(row["language"])
    qrels = _read_qrels(uri, split)
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        raise ValueError(
            f"{uri}: qrels/{split}.tsv judges {len(missing)} queries that queries.jsonl lacks "
            f"(e.g. {missing[0]!r})"
        )
    unknown_docs = sum(doc not in corpus for docs in qrels.values() for doc in docs)
    if unknown_docs:
        logger.warning(
            "%s: %d judged documents are not in corpus.jsonl (they count as unretrievable)",
            uri,
            unknown_docs,
        )
    queries = {qid: all_queries[qid] for qid in qrels}
    query_languages = {}
    for qid, docs in qrels.items():
        language = languages.get(qid)
        if language is None:
            # The language of the query's best-judged document that has one.
            judged = sorted(docs.items(), key=lambda item: -item[1])
            language = next(
                (corpus[d]["language"] for d, _ in judged if "language" in corpus.get(d, {})),
                None,
            )
        if language:
            query_languages[qid] = language
    return BeirData(corpus, queries, qrels, query_languages, uri=uri, split=split)


def _read_jsonl(uri: str, name: str) -> Iterable[tuple[int, dict[str, Any]]]:
    file_uri = storage.join(uri, name)
    if not storage.exists(file_uri):
        raise storage.StorageError(f"not a BEIR folder: {uri} has no {name}")
    text = storage.read_bytes(file_uri).decode("utf-8")
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file_uri} line {line_no}: invalid JSON ({error})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{file_uri} line {line_no}: expected a JSON object")
        yield line_no, row


def _row_id(row: dict[str, Any], name: str, line_no: int) -> str:
    value = row.get("_id")
    if value is None or value == "":
        raise ValueError(f"{name} line {line_no}: missing '_id'")
    return str(value)


def _read_qrels(uri: str, split: str) -> dict[str, dict[str, int]]:
    qrels_uri = storage.join(uri, "qrels", f"{split}.tsv")
    if not storage.exists(qrels_uri):
        folder = storage.join(uri, "qrels")
        found = []
        if storage.exists(folder):
            found = [os.path.basename(p)[:-4] for p in storage.list_files(folder, (".tsv",))]
        raise storage.StorageError(
            f"{uri} has no qrels/{split}.tsv (splits present: {found or 'none'})"
        )
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    lines = storage.read_bytes(qrels_uri).decode("utf-8").splitlines()
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if line_no == 1 and parts[0].strip().lower() in ("query-id", "query_id", "qid"):
            continue  # header
        if len(parts) != 3:
            raise ValueError(f"{qrels_uri} line {line_no}: expected query-id, corpus-id, score")
        try:
            label = int(float(parts[2]))
        except ValueError:
            raise ValueError(f"{qrels_uri} line {line_no}: score {parts[2]!r}") from None
        qrels[parts[0].strip()][parts[1].strip()] = label
    if not qrels:
        raise ValueError(f"{qrels_uri} has no judgments")
    return dict(qrels)


def write_beir(dataset: ray.data.Dataset, output: str, split: str) -> dict[str, int]:
    """Write ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/{split}.tsv`` (BEIR format)."""
    corpus: dict[str, dict[str, Any]] = {}
    queries: dict[str, dict[str, Any]] = {}
    qrels: dict[tuple[str, str], int] = {}
    for batch in dataset.iter_batches(batch_size=4096, batch_format="pyarrow"):
        for row in batch.to_pylist():
            corpus.setdefault(
                row["doc_id"],
                {
                    "_id": row["doc_id"],
                    "title": row["title"],
                    "text": row["document"],
                    "language": row["language"],
                    "kind": row_kind(row.get("kind"), row["dataset"], row["mep_target"]),
                },
            )
            queries.setdefault(
                row["query_id"],
                {"_id": row["query_id"], "text": row["query"], "language": row["language"]},
            )
            qrels[(row["query_id"], row["doc_id"])] = int(row["label"])
    return write_beir_files(output, list(corpus.values()), list(queries.values()), qrels, split)


def write_beir_files(
    output: str,
    corpus: list[dict[str, Any]],
    queries: list[dict[str, Any]],
    qrels: Mapping[tuple[str, str], int],
    split: str,
) -> dict[str, int]:
    """Write BEIR rows as ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/{split}.tsv``."""
    storage.write_bytes(storage.join(output, "corpus.jsonl"), _jsonl(corpus))
    storage.write_bytes(storage.join(output, "queries.jsonl"), _jsonl(queries))
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for (q, d), s in qrels.items()]
    storage.write_bytes(
        storage.join(output, "qrels", f"{split}.tsv"), ("\n".join(lines) + "\n").encode()
    )
    return {"corpus": len(corpus), "queries": len(queries), "qrels": len(qrels)}


def _jsonl(items) -> bytes:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode("utf-8")
