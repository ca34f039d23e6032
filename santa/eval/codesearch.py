"""CodeSearch as GraphCodeBERT, CodeRetriever and SANTA's Table 6 evaluate it.

The data is GraphCodeBERT's layout, one folder per language (or one language's folder)::

    {lang}/codebase.jsonl   the candidates: "url" and the function ("code", else
                            "original_string", "function" or the joined "code_tokens")
    {lang}/test.jsonl       the queries: "docstring_tokens" (else "docstring") and the
    {lang}/valid.jsonl      "url" of the answer in the codebase

(``.jsonl.gz`` works too; the folder may be local or ``s3://``). Each language's queries are
ranked against that language's codebase only, never a pool of languages, and scored as
GraphCodeBERT's ``run.py`` scores them: the reciprocal rank of the answer within the top
1000, else 0 (``mrr@1000``, by ranx). The table row is the MRR per language and their
unweighted mean (``Overall``).

A query is the space-joined docstring tokens. A candidate's text is
``EvalConfig.code_text`` (:func:`candidate_text`), each named after the code it follows:

- ``released`` (the default): the space-joined ``code_tokens`` (else ``function_tokens``),
  as SANTA's released ``evaluate_code/build_test_code.py`` embeds the codebase (CodeSearchNet's
  tokens hold no docstring and no comments);
- ``graphcodebert``: the source with its comments and docstrings removed, as GraphCodeBERT's
  ``run.py`` (``remove_comments_and_docstrings``) reads it (Python by its tokenizer, the other
  languages' comment nodes by their tree-sitter grammars);
- ``training``: the source without its docstring, comments kept, as santa's preprocessing
  gives training documents.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from santa.data.cleaning import remove_docstring
from santa.data.jsonl import json_lines
from santa.data.schema import CODE_LANGUAGES
from santa.eval.bm25 import bm25_retrieve
from santa.eval.evaluation import CODE_TEXTS, EvalConfig
from santa.eval.metrics import compute_metrics
from santa.eval.protocol_parts import Encoder, ProtocolResult, markdown_table
from santa.eval.retrieval import dense_retrieve
from santa.files import storage

__all__ = [
    "CODESEARCH_METRICS",
    "CODE_TEXTS",
    "MRR_CUTOFF",
    "CodeSearchLanguage",
    "find_languages",
    "read_language",
    "run_codesearch",
    "write_codesearch_layout",
]

logger = logging.getLogger(__name__)

# GraphCodeBERT's evaluator looks for the answer among the top 1000 candidates.
MRR_CUTOFF = 1000
CODESEARCH_METRICS = (f"mrr@{MRR_CUTOFF}", "mrr@100", "recall@1", "recall@10", "recall@100")
CODEBASE = "codebase"
SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass
class CodeSearchLanguage:
    """One language of a CodeSearch set: its codebase and its queries."""

    language: str
    doc_ids: list[str]
    """Codebase urls (the first copy of a repeated url is kept)."""
    documents: list[str]
    query_ids: list[str]
    """``{language}-{line}`` (line of the split file)."""
    queries: list[str]
    answers: dict[str, str]
    """query id → the url of its answer."""
    skipped: dict[str, int]
    """Rows left out, by reason (``codebase_*`` or ``query_*``)."""

    @property
    def missing_answers(self) -> int:
        """Queries whose answer url is not in the codebase (they score 0)."""
        known = set(self.doc_ids)
        return sum(url not in known for url in self.answers.values())


def _file(folder: str, name: str) -> str | None:
    for suffix in SUFFIXES:
        uri = storage.join(folder, name + suffix)
        if storage.exists(uri):
            return uri
    return None


def find_languages(root: str, split: str, languages: Sequence[str] = ()) -> dict[str, str]:
    """``{language: folder}`` of a CodeSearch set; raises naming what is there or missing.

    ``root`` is one language's folder (its ``codebase.jsonl`` inside) or a folder of
    language folders; ``languages`` keeps only those (all by default).
    """
    found: dict[str, str] = {}
    if _file(root, CODEBASE):
        name = os.path.basename(root.rstrip("/"))
        found[name if name in CODE_LANGUAGES else _language_of(root, name)] = root
    else:
        for language in CODE_LANGUAGES:
            folder = storage.join(root, language)
            if _file(folder, CODEBASE):
                found[language] = folder
    if not found:
        raise FileNotFoundError(
            f"not a CodeSearch folder: {root} has no codebase.jsonl, nor "
            f"{{{','.join(CODE_LANGUAGES)}}}/codebase.jsonl (GraphCodeBERT's layout)"
        )
    if languages:
        missing = sorted(set(languages) - set(found))
        if missing:
            raise FileNotFoundError(
                f"no CodeSearch {'/'.join(missing)} under {root} "
                f"(languages found: {', '.join(sorted(found))})"
            )
        found = {language: found[language] for language in languages}
    for language, folder in found.items():
        if _file(folder, split) is None:
            raise FileNotFoundError(f"{folder} has no {split}.jsonl (the {language} queries)")
    return found


def _language_of(folder: str, fallback: str) -> str:
    """A lone language folder with another name: the ``language`` of its first row."""
    for _, row in _rows(_file(folder, CODEBASE) or "", Counter()):
        return str(row.get("language") or fallback).lower()
    return fallback


def _rows(uri: str, skipped: Counter, prefix: str = "") -> Iterable[tuple[int, dict[str, Any]]]:
    """``(line, row)`` of a JSON-lines file; bad lines are counted in ``skipped``."""
    return json_lines(uri, skipped, prefix)


def skipped_line(uri: str, skipped: dict[str, int]) -> str:
    """``skipped 2 rows of URI: malformed_json 2``, or nothing when none was skipped."""
    total = sum(skipped.values())
    if not total:
        return ""
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(skipped.items()))
    return f"skipped {total:,} row{'s' if total != 1 else ''} of {uri}: {reasons}"


def candidate_text(row: dict[str, Any], language: str, code_text: str = "training") -> str:
    """A codebase row's text as ``code_text`` asks (the module doc; :data:`CODE_TEXTS`).

    ``released`` joins the row's ``code_tokens`` (else ``function_tokens``); a row without
    tokens falls back to ``graphcodebert``'s text. A source that cannot be parsed keeps its
    comments (``graphcodebert``) or its docstring (``training``): a candidate stays
    rankable rather than being dropped.
    """
    if code_text not in CODE_TEXTS:
        raise ValueError(f"code_text must be one of {CODE_TEXTS}, got {code_text!r}")
    if code_text == "released":
        tokens = row.get("code_tokens") or row.get("function_tokens")
        if isinstance(tokens, list) and tokens:
            return " ".join(str(token) for token in tokens)
        code_text = "graphcodebert"
    code = row.get("code") or row.get("original_string") or row.get("function")
    if not code and row.get("code_tokens"):
        code = " ".join(str(token) for token in row["code_tokens"])
    code = str(code or "")
    if code_text == "graphcodebert":
        return strip_comments_and_docstrings(code, language)
    docstring = row.get("docstring")
    if docstring and code:
        try:
            return remove_docstring(code, str(docstring), language) or code
        except (ValueError, SyntaxError):
            return code
    return code


def strip_comments_and_docstrings(code: str, language: str) -> str:
    """``code`` without comments (and, for Python, docstrings), blank lines dropped.

    Python goes through its tokenizer as GraphCodeBERT's ``remove_comments_and_docstrings``
    does (a string token that is a statement of its own is a docstring); the other
    languages drop their grammar's comment nodes. Unparsable code comes back as it is.
    """
    if language == "python":
        kept = _python_without_comments(code)
    else:
        kept = _without_comment_nodes(code, language)
    if kept is None:
        return code
    return "\n".join(line for line in kept.split("\n") if line.strip())


def _python_without_comments(code: str) -> str | None:
    import io
    import tokenize

    pieces: list[str] = []
    previous = tokenize.INDENT
    last_line, last_col = -1, 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            kind, text, (start_line, start_col), (end_line, end_col), _ = token
            if start_line > last_line:
                last_col = 0
            if start_col > last_col:
                pieces.append(" " * (start_col - last_col))
            docstring = kind == tokenize.STRING and previous in (
                tokenize.INDENT,
                tokenize.NEWLINE,
                tokenize.DEDENT,
            )
            if kind != tokenize.COMMENT and not docstring:
                pieces.append(text)
            previous = kind if kind != tokenize.NL else previous
            last_line, last_col = end_line, end_col
    except (tokenize.TokenError, SyntaxError):
        return None
    return "".join(pieces)


def _without_comment_nodes(code: str, language: str) -> str | None:
    from santa.method.entities import (
        UnparsableCodeError,
        _grammar,
        parse_snippet,
        parser_for,
    )

    try:
        grammar = _grammar(language)
    except ValueError:
        return None  # no grammar for the language
    snippet = code.encode("utf-8", "surrogatepass")
    try:
        root, offset, end = parse_snippet(grammar, parser_for(language), snippet, language)
    except UnparsableCodeError:
        return None
    spans: list[tuple[int, int]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.end_byte <= offset or node.start_byte >= end:
            continue
        if "comment" in node.type:
            spans.append((max(node.start_byte, offset) - offset, min(node.end_byte, end) - offset))
        else:
            stack.extend(node.children)
    kept, position = bytearray(), 0
    for start, stop in sorted(spans):
        kept += snippet[position:start]
        position = max(position, stop)
    kept += snippet[position:]
    return kept.decode("utf-8", "surrogatepass")


def query_text(row: dict[str, Any]) -> str:
    """A query row's text: its docstring tokens joined by spaces (else its docstring)."""
    tokens = row.get("docstring_tokens")
    if isinstance(tokens, list) and tokens:
        return " ".join(str(token) for token in tokens)
    return str(row.get("docstring") or "").strip()


def read_language(
    folder: str, language: str, split: str, code_text: str = "released"
) -> CodeSearchLanguage:
    """Read one language's codebase (each candidate's text as ``code_text`` asks) and its
    ``split`` queries."""
    skipped: Counter = Counter()
    doc_ids: list[str] = []
    documents: list[str] = []
    seen: set[str] = set()
    for _, row in _rows(_file(folder, CODEBASE) or "", skipped, "codebase_"):
        url = str(row.get("url") or "")
        text = candidate_text(row, language, code_text)
        if not url or not text.strip():
            skipped["codebase_missing_field"] += 1
        elif url in seen:
            skipped["codebase_duplicate_url"] += 1
        else:
            seen.add(url)
            doc_ids.append(url)
            documents.append(text)
    query_ids, queries, answers = [], [], {}
    for line_no, row in _rows(_file(folder, split) or "", skipped, "query_"):
        url, text = str(row.get("url") or ""), query_text(row)
        if not url or not text:
            skipped["query_missing_field"] += 1
            continue
        query_id = f"{language}-{line_no}"
        query_ids.append(query_id)
        queries.append(text)
        answers[query_id] = url
    if not doc_ids or not query_ids:
        raise ValueError(
            f"{folder}: no usable {'codebase rows' if not doc_ids else split + ' queries'}"
        )
    return CodeSearchLanguage(
        language, doc_ids, documents, query_ids, queries, answers, dict(sorted(skipped.items()))
    )


def run_codesearch(
    encoder: Encoder, data: str, config: EvalConfig, *, languages: Sequence[str] = ()
) -> ProtocolResult:
    """Each language's queries against its own codebase; MRR per language and the mean."""
    folders = find_languages(data, config.split, languages)
    systems = ["model", *(["bm25"] if config.with_bm25 else [])]
    per_language: dict[str, dict[str, dict[str, Any]]] = {system: {} for system in systems}
    rankings: dict[str, dict[str, Any]] = {system: {} for system in systems}
    counts: dict[str, dict[str, Any]] = {}
    timings: Counter = Counter()
    for language, folder in folders.items():
        subset = read_language(folder, language, config.split, config.code_text)
        depth = min(max(config.top_k, MRR_CUTOFF), len(subset.doc_ids))
        doc_embeddings = encoder.documents(subset.documents, desc=f"{language} codebase")
        query_embeddings = encoder.queries(subset.queries, desc=f"{language} queries")
        qrels = {qid: {url: 1} for qid, url in subset.answers.items()}
        started = time.perf_counter()
        ranked = {
            "model": dense_retrieve(
                query_embeddings,
                subset.query_ids,
                doc_embeddings,
                subset.doc_ids,
                top_k=depth,
                similarity=encoder.similarity,
                index_kind=config.index_kind,
            )
        }
        timings["retrieve_model_s"] += time.perf_counter() - started
        if config.with_bm25:
            started = time.perf_counter()
            ranked["bm25"] = bm25_retrieve(
                subset.documents, subset.doc_ids, subset.queries, subset.query_ids, top_k=depth
            )
            timings["retrieve_bm25_s"] += time.perf_counter() - started
        for system, ranking in ranked.items():
            metrics = compute_metrics(qrels, ranking, graded=False, metrics=CODESEARCH_METRICS)
            metrics["mrr"] = metrics[f"mrr@{MRR_CUTOFF}"]
            metrics["num_candidates"] = len(subset.doc_ids)
            per_language[system][language] = metrics
            rankings[system].update(ranking.items())
        counts[language] = {
            "codebase": len(subset.doc_ids),
            "queries": len(subset.query_ids),
            "answers_not_in_codebase": subset.missing_answers,
            "skipped": subset.skipped,
        }
        logger.info("codesearch %s: %s", language, counts[language])
    results = {system: macro_summary(per_language[system]) for system in systems}
    order = list(folders)
    rows = [
        [system, *(results[system]["by_language"][lang]["mrr"] for lang in order)]
        + [results[system]["mrr"], results[system]["num_queries"]]
        for system in systems
    ]
    markdown = (
        f"CodeSearch ({config.split}): MRR (top {MRR_CUTOFF}) per language, each language's "
        "queries against its own codebase\n\n"
        + markdown_table(["system", *order, "Overall", "queries"], rows)
        + "".join(
            f"\n{line}"
            for line in (skipped_line(folders[lang], counts[lang]["skipped"]) for lang in order)
            if line
        )
    )
    info = {
        "languages": counts,
        "mrr_cutoff": MRR_CUTOFF,
        "code_text": config.code_text,
        "timings_s": {name: round(value, 3) for name, value in timings.items()},
    }
    return ProtocolResult(results, rankings, markdown, info)


def macro_summary(by_language: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Macro averages over languages (the table's Overall), with the per-language rows."""
    metrics = ["mrr", *CODESEARCH_METRICS]
    summary: dict[str, Any] = {
        name: sum(row[name] for row in by_language.values()) / len(by_language) for name in metrics
    }
    summary["num_queries"] = sum(row["num_queries"] for row in by_language.values())
    summary["averaging"] = "macro over languages"
    summary["by_language"] = by_language
    return summary


def write_codesearch_layout(
    records: Sequence[dict[str, Any]], root: str | Path, language: str, split: str = "test"
) -> str:
    """Write CodeSearchNet-format ``records`` as one language of GraphCodeBERT's layout.

    ``{root}/{language}/codebase.jsonl`` holds every record's function and
    ``{split}.jsonl`` one query per record (its docstring tokens, answered by its url): the
    records' own functions are the candidates, e.g. to run a CodeSearchNet split (such as
    ../shared's Ruby valid sample) under this protocol. Returns the language folder.
    """
    folder = Path(root) / language
    folder.mkdir(parents=True, exist_ok=True)
    codebase, queries = [], []
    for record in records:
        codebase.append(
            {
                "url": record["url"],
                "code": record.get("code") or record.get("original_string", ""),
                "docstring": record.get("docstring", ""),
                "code_tokens": list(record.get("code_tokens") or []),
                "func_name": record.get("func_name", ""),
                "language": language,
            }
        )
        queries.append(
            {
                "url": record["url"],
                "docstring_tokens": list(record.get("docstring_tokens") or []),
                "docstring": record.get("docstring", ""),
                "language": language,
            }
        )
    for name, rows in ((CODEBASE, codebase), (split, queries)):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (folder / f"{name}.jsonl").write_text(text, encoding="utf-8")
    return str(folder)
