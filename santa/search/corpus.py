"""Corpora to index: every document as ``(id, title, text)``, ``text`` being what is embedded.

Formats (``format="auto"`` tells them apart):

- ``pairs``: santa's preprocessed pairs (``ray_jobs.preprocess`` output, ``data/*.parquet``);
  each distinct ``doc_id`` once, embedded as training embeds it (:mod:`santa.data.kinds`).
- ``beir``: a BEIR folder (``corpus.jsonl``, as the eval stage writes it), or
  ``beir-corpus``: one BEIR ``corpus.jsonl`` file; embedded as the evaluator embeds it.
- ``codesearchnet``: a folder (or file) of CodeSearchNet ``*.jsonl[.gz]`` records: id is the
  ``url``, the text the code without its docstring (what preprocessing makes of it).
- ``jsonl``: a file or folder of ``{"id", "text"}`` lines (``title`` optional, shown only).

Rows that cannot be indexed are skipped and counted by reason (``malformed_json``,
``missing_field``, ``empty_text``, ``duplicate_id``, ...); one bad row never stops a job.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from santa.data.kinds import ASST, document_text, embedded_document, row_kind
from santa.data.published import iter_pairs
from santa.files import storage
from santa.files.outputs import published_root, read_manifest

__all__ = ["CORPUS_FORMATS", "Corpus", "detect_format", "read_corpora", "read_corpus"]

CORPUS_FORMATS = ("auto", "pairs", "beir", "beir-corpus", "codesearchnet", "jsonl")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
CORPUS_SCHEMA = pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string())])


@dataclass
class Corpus:
    """The documents of one corpus, in a fixed order, and what was skipped."""

    uri: str
    format: str
    table: pa.Table
    """``id``, ``title``, ``text`` (the embedded text), one row per document."""
    skipped: Counter = field(default_factory=Counter)
    """Rows not indexed, by reason."""
    parts: dict[str, int] = field(default_factory=dict)
    """Documents taken from each corpus read into this one (:func:`read_corpora`)."""

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def ids(self) -> list[str]:
        """Document ids in corpus order."""
        return self.table.column("id").to_pylist()


class _Collector:
    """Documents in arrival order, the first of each id kept, skips counted by reason."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.texts: list[str] = []
        self.seen: set[str] = set()
        self.earlier: set[str] = set()
        """Ids of the corpora read before the current one (:func:`read_corpora`)."""
        self.skipped: Counter = Counter()

    def add(self, doc_id: Any, title: Any, text: Any) -> None:
        if doc_id is None or doc_id == "" or not isinstance(text, str):
            self.skipped["missing_field"] += 1
            return
        doc_id = str(doc_id)
        if doc_id in self.earlier:
            return  # an earlier corpus of the same index has it
        if not text.strip():
            self.skipped["empty_text"] += 1
        elif doc_id in self.seen:
            self.skipped["duplicate_id"] += 1
        else:
            self.seen.add(doc_id)
            self.ids.append(doc_id)
            self.titles.append("" if title is None else str(title))
            self.texts.append(text)

    def corpus(self, uri: str, format: str) -> Corpus:
        table = pa.table([self.ids, self.titles, self.texts], schema=CORPUS_SCHEMA)
        return Corpus(uri, format, table, +self.skipped)


def read_corpus(uri: str, format: str = "auto") -> Corpus:
    """Read the corpus at ``uri`` (local or ``s3://``) in ``format`` (see the module doc)."""
    return read_corpora([uri], format)


def read_corpora(uris: list[str], format: str = "auto") -> Corpus:
    """Read several corpora into one index's documents: each in its own format (``auto``
    detects each), a document whose id an earlier corpus held left out (not a skip: the
    pipeline's held-out, dev and training sets hold the same function once each); the uri
    is the first's, with ``+ N more``, and ``parts`` counts the documents each gave."""
    if not uris:
        raise ValueError("no corpus to read")
    collector = _Collector()
    formats, parts = [], {}
    for uri in uris:
        before = len(collector.ids)
        formats.append(_read_into(uri, format, collector))
        parts[uri] = len(collector.ids) - before
    name = uris[0] + (f" + {len(uris) - 1} more" if len(uris) > 1 else "")
    kinds = formats[0] if len(set(formats)) == 1 else "+".join(formats)
    corpus = collector.corpus(name, kinds)
    corpus.parts = parts
    if not len(corpus):
        reasons = ", ".join(f"{r}: {n}" for r, n in corpus.skipped.items()) or "no rows"
        raise ValueError(f"no document to index in {name} ({kinds}; {reasons})")
    return corpus


def _read_into(uri: str, format: str, collector: _Collector) -> str:
    """Add the documents of the corpus at ``uri`` to ``collector``; returns its format."""
    if format not in CORPUS_FORMATS:
        raise ValueError(f"corpus format must be one of {CORPUS_FORMATS}, got {format!r}")
    if not storage.exists(uri):
        raise storage.StorageError(f"no corpus at {uri}")
    if format == "auto":
        format = detect_format(uri)
    if collector.ids:  # ids of the corpora read before: the same documents, not duplicates
        collector.earlier = set(collector.seen)
    if format == "pairs":
        _read_pairs(uri, collector)
    elif format in ("beir", "beir-corpus"):
        file_uri = storage.join(published_root(uri), "corpus.jsonl") if format == "beir" else uri
        for row in _json_rows([file_uri], collector):
            collector.add(row.get("_id"), row.get("title"), _beir_text(row))
    elif format == "codesearchnet":
        _read_codesearchnet(uri, collector)
    else:
        for row in _json_rows(_jsonl_files(uri), collector):
            collector.add(row.get("id"), row.get("title"), row.get("text"))
    return format


def detect_format(uri: str) -> str:
    """The corpus format of ``uri``, from its layout and its first JSON line."""
    if _is_folder(uri):
        if read_manifest(uri) is not None or storage.exists(storage.join(uri, "data")):
            root = published_root(uri)
            if storage.exists(storage.join(root, "corpus.jsonl")):
                return "beir"
            if storage.exists(storage.join(root, "data")):
                return "pairs"
        if storage.exists(storage.join(uri, "corpus.jsonl")):
            return "beir"
        files = _jsonl_files(uri)
        return _format_of_row(_first_row(files[0]), files[0])
    return _format_of_row(_first_row(uri), uri)


def _format_of_row(row: dict[str, Any], uri: str) -> str:
    if "_id" in row:
        return "beir-corpus"
    if "code" in row and ("docstring" in row or "func_name" in row):
        return "codesearchnet"
    if "id" in row and "text" in row:
        return "jsonl"
    raise ValueError(
        f"{uri}: cannot tell the corpus format from its first row (keys {sorted(row)[:8]}); "
        "expected {'id', 'text'} lines, a BEIR corpus.jsonl or CodeSearchNet records "
        "(or pass --corpus-format)"
    )


def _is_folder(uri: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = storage.resolve(uri)
    info = storage.classified(lambda: fs.get_file_info(path), uri, "read")
    return info.type == pafs.FileType.Directory


def _jsonl_files(uri: str) -> list[str]:
    files = storage.list_files(uri, suffixes=JSONL_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no .jsonl/.jsonl.gz files under {uri}")
    return files


def _lines(file_uri: str) -> Iterator[bytes]:
    data = storage.read_bytes(file_uri)
    if file_uri.endswith(".gz"):
        data = gzip.decompress(data)
    yield from data.splitlines()


def _first_row(file_uri: str) -> dict[str, Any]:
    for line in _lines(file_uri):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                return row
    raise ValueError(f"{file_uri}: no JSON object lines")


def _json_rows(files: list[str], collector: _Collector) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``files``; bad lines counted on ``collector``."""
    for file_uri in files:
        for line in _lines(file_uri):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except UnicodeDecodeError:
                collector.skipped["undecodable_bytes"] += 1
                continue
            except ValueError:
                collector.skipped["malformed_json"] += 1
                continue
            if not isinstance(row, dict):
                collector.skipped["malformed_json"] += 1
                continue
            yield row


def _beir_text(row: dict[str, Any]) -> str | None:
    if not isinstance(row.get("text", ""), str):
        return None
    return document_text(row)


def _read_pairs(uri: str, collector: _Collector) -> None:
    # What a pair's kind is made of (older corpora lack some: santa.data.kinds infers it).
    kind_columns = ("kind", "dataset", "mep_target")
    for table in iter_pairs(uri, ["doc_id", "title", "document"], optional=kind_columns):
        rows = table.to_pydict()
        count = table.num_rows
        for i in range(count):
            kind = row_kind(
                rows.get("kind", [None] * count)[i],
                rows.get("dataset", [None] * count)[i],
                rows.get("mep_target", [None] * count)[i],
            )
            if kind == ASST:
                continue  # code–code training pairs: their documents are partial functions
            title, document = rows["title"][i] or "", rows["document"][i]
            text = embedded_document(kind, title, document) if document is not None else None
            doc_id = rows["doc_id"][i]
            if doc_id in collector.seen:
                continue  # one document, many pairs: not a duplicate to report
            collector.add(doc_id, title, text)


def _read_codesearchnet(uri: str, collector: _Collector) -> None:
    from santa.data.cleaning import remove_docstring
    from santa.data.records import DropRow, normalize_codesearchnet

    for row in _json_rows(_jsonl_files(uri), collector):
        try:
            record = normalize_codesearchnet(row)
            text = remove_docstring(record["code"], record["docstring"], record["language"])
        except DropRow as error:
            collector.skipped[error.reason] += 1
            continue
        except (ValueError, SyntaxError):
            collector.skipped["unparsable_code"] += 1
            continue
        collector.add(record["url"], record["func_name"], text)
