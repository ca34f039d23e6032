"""Turn a local source tree into CodeSearchNet-format records.

This lets users train/evaluate on their own code.  The default corpus is the
standard library of the running interpreter, which is always available offline.

Record format (one dict per documented function), the CodeSearchNet fields::

    repo, path, func_name, original_string, language, code, code_tokens,
    docstring, docstring_tokens, sha, url, partition

* ``code`` starts at the ``def``/``func``/``function`` keyword (or the first
  modifier/annotation for Java and PHP); the first line carries no indentation and
  the following lines keep their full indentation, exactly like CodeSearchNet.
  For Python it contains the docstring; ``original_string == code``.
* ``docstring`` is the full docstring (``ast.get_docstring``, i.e. dedented) or the
  doc comment with its comment markers stripped.
* ``code_tokens`` are ``\\w+|[^\\w\\s]`` tokens of the code *without* its docstring
  (CodeSearchNet also excludes it); ``docstring_tokens`` are the tokens of the first
  paragraph (:func:`santa.data.cleaning.clean_docstring`), as in CodeSearchNet.
* ``sha`` is the SHA-1 of the file text (there is no commit for a local tree).
* ``url`` is ``file://{repo}/{path}#L{start}-L{end}``, ``partition`` is
  :func:`santa.data.cleaning.split_for_key` of the relative path, so every function of
  a file lands in the same split.

Plain Python (no Ray); Ray jobs call these functions inside their map tasks.
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import hashlib
import inspect
import os
import re
import sysconfig
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from santa.data.cleaning import (
    clean_docstring,
    remove_docstring,
    split_for_key,
    strip_comment_markers,
)
from santa.data.schema import CODE_LANGUAGES
from santa.method.entities import parser_for

__all__ = [
    "EXTENSIONS",
    "SourceRecords",
    "SourceStats",
    "default_source_root",
    "extract_functions",
    "iter_source_files",
    "iter_source_records",
    "tokenize_text",
]

EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".java": "java",
    ".go": "go",
    ".js": "javascript",
    ".rb": "ruby",
    ".php": "php",
}

# Directories that hold third-party, generated or VCS content rather than the
# project's own code.
_SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules", "vendor"})
_TEST_DIRS = frozenset({"test", "tests"})

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
# ast counts '\r\n', '\r' and '\n' as line ends, but not '\f' or '\x1c' that
# str.splitlines() would also split on.
_LINE_SPLIT_RE = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


def tokenize_text(text: str) -> list[str]:
    """Split text into simple word / punctuation tokens (regex ``\\w+|[^\\w\\s]``)."""
    return _TOKEN_RE.findall(text)


def default_source_root() -> str:
    """Return the standard library directory of the running interpreter."""
    return sysconfig.get_paths()["stdlib"]


def _check_languages(languages: Iterable[str] | None) -> frozenset[str]:
    if languages is None:
        return frozenset(CODE_LANGUAGES)
    chosen = frozenset(languages)
    unknown = chosen - frozenset(CODE_LANGUAGES)
    if unknown:
        raise ValueError(
            f"unsupported languages {sorted(unknown)}; choose from {sorted(CODE_LANGUAGES)}"
        )
    return chosen


def iter_source_files(
    root: str, languages: Iterable[str] | None = None, *, skip_tests: bool = False
) -> Iterator[str]:
    """Yield paths of supported source files under ``root`` in a deterministic order."""
    wanted = _check_languages(languages)
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning + sorting in place controls both what os.walk descends into and its order.
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".")
            and d not in _SKIP_DIRS
            and not (skip_tests and d in _TEST_DIRS)
        )
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            language = EXTENSIONS.get(os.path.splitext(name)[1])
            if language in wanted:
                yield os.path.join(dirpath, name)


# ------------------------------------------------------------------------------- records


def _make_record(
    *,
    repo: str,
    path: str,
    func_name: str,
    language: str,
    code: str,
    docstring: str,
    start_line: int,
    end_line: int,
    sha: str,
    split_seed: int,
) -> dict[str, Any]:
    code_without_doc = code
    # A snippet tokenize cannot handle (it parsed as a whole file): keep the full code.
    with contextlib.suppress(ValueError):
        code_without_doc = remove_docstring(code, docstring, language)
    return {
        "repo": repo,
        "path": path,
        "func_name": func_name,
        "original_string": code,
        "language": language,
        "code": code,
        "code_tokens": tokenize_text(code_without_doc),
        "docstring": docstring,
        "docstring_tokens": tokenize_text(clean_docstring(docstring)),
        "sha": sha,
        "url": f"file://{repo}/{path}#L{start_line}-L{end_line}",
        "partition": split_for_key(path, seed=split_seed),
    }


# Fields holding statement lists (ExceptHandler / match_case nodes sit in
# "handlers" / "cases" and hold a "body" themselves).
_STMT_BLOCK_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")


def _parse_python(source: str, attempts: int = 3) -> ast.Module:
    """``ast.parse``, retried on CPython 3.11's spurious "AST constructor recursion depth
    mismatch" SystemError: the AST converter keeps its depth counter in module-wide state,
    so another thread converting an AST at the same moment (a driver's background thread,
    a threaded actor) can trip the check. Each call resets the counter, so a retry is
    sound; if it keeps failing the source counts as unparsable."""
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                # Invalid escape sequences etc. in old code are not our concern here.
                warnings.simplefilter("ignore")
                return ast.parse(source)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
            if attempt == attempts - 1:
                raise ValueError(f"cannot parse: {exc}") from exc
    raise AssertionError("unreachable")


def _extract_python(source: str) -> list[tuple[str, str, str, int, int]]:
    """(func_name, code, docstring, start_line, end_line) for documented Python functions."""
    try:
        tree = _parse_python(source)
    except (RecursionError, MemoryError) as exc:
        # Pathologically nested code; report it like other unparsable input.
        raise ValueError(f"cannot parse: {type(exc).__name__}") from exc
    lines = _LINE_SPLIT_RE.split(source)
    out = []
    # Explicit stack instead of ast.NodeVisitor recursion: deeply nested expressions
    # that ast.parse accepts could still exceed Python's recursion limit.
    stack: list[tuple[ast.AST, tuple[str, ...]]] = [(tree, ())]
    while stack:
        node, prefix = stack.pop()
        children_prefix = prefix
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            qualname = ".".join((*prefix, node.name))
            children_prefix = (*prefix, node.name)
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                # lineno is the 'def' line (decorators have their own nodes); col_offset
                # is in UTF-8 bytes but the prefix before 'def' is always ASCII indentation.
                first = lines[node.lineno - 1][node.col_offset :]
                if node.end_lineno == node.lineno:
                    end_line_bytes = lines[node.lineno - 1].encode()
                    code = end_line_bytes[node.col_offset : node.end_col_offset].decode()
                else:
                    last = lines[node.end_lineno - 1].encode()[: node.end_col_offset].decode()
                    code = first + "".join(lines[node.lineno : node.end_lineno - 1]) + last
                out.append((qualname, code, doc, node.lineno, node.end_lineno))
        elif isinstance(node, ast.ClassDef):
            children_prefix = (*prefix, node.name)
        # Functions and classes are statements, so only statement blocks need walking
        # (skipping expressions makes this ~5x faster).  Reversed so that popping
        # visits children in source order.
        children: list[ast.AST] = []
        for name in _STMT_BLOCK_FIELDS:
            block = getattr(node, name, None)
            if block:
                children.extend(block)
        stack.extend((child, children_prefix) for child in reversed(children))
    return out


# ---------------------------------------------------------------------------- tree-sitter

# node type -> kind, per language.  "function" nodes are emitted; "container" nodes
# contribute their name to the qualified func_name of what they contain.
_TS_FUNCTIONS = {
    "java": {"method_declaration", "constructor_declaration"},
    "go": {"function_declaration", "method_declaration"},
    "javascript": {
        "function_declaration",
        "generator_function_declaration",
        "method_definition",
        # function values bound to a name: const f = function/arrow, a.b = function, {k: function}
        "function_expression",
        "arrow_function",
        "generator_function",
    },
    "ruby": {"method", "singleton_method"},
    "php": {"function_definition", "method_declaration"},
}
_TS_CONTAINERS = {
    "java": {
        "class_declaration",
        "interface_declaration",
        "enum_declaration",
        "record_declaration",
        "annotation_type_declaration",
    },
    "go": set(),
    "javascript": {"class_declaration", "class"},
    "ruby": {"class", "module"},
    "php": {"class_declaration", "interface_declaration", "trait_declaration", "enum_declaration"},
}
_TS_COMMENTS = {"comment", "line_comment", "block_comment"}


def _text(node: Any) -> str:
    return node.text.decode("utf-8", errors="replace")


def _js_binding(node: Any) -> tuple[str, Any, Any] | None:
    """For a JS function value: (name, node whose text is the code, anchor for the comment)."""
    parent = node.parent
    if parent is None:
        return None
    if parent.type == "variable_declarator" and parent.child_by_field_name("value") == node:
        decl = parent.parent  # lexical_declaration / variable_declaration
        name = _text(parent.child_by_field_name("name"))
        if decl is None or decl.named_child_count != 1:
            # "const a = function(){}, b = 1": no single statement owns the comment.
            return name, parent, parent
        anchor = (
            decl.parent
            if decl.parent is not None and decl.parent.type == "export_statement"
            else decl
        )
        return name, decl, anchor
    if parent.type == "assignment_expression" and parent.child_by_field_name("right") == node:
        stmt = parent.parent
        name = _text(parent.child_by_field_name("left"))
        if stmt is not None and stmt.type == "expression_statement":
            return name, stmt, stmt
        return name, parent, parent
    if parent.type == "pair" and parent.child_by_field_name("value") == node:
        return _text(parent.child_by_field_name("key")), parent, parent
    return None


def _function_name(node: Any, language: str) -> str | None:
    name = node.child_by_field_name("name")
    if language == "go" and node.type == "method_declaration":
        # Qualify Go methods with their receiver type: (s *Server) Bar -> Server.Bar.
        receiver = node.child_by_field_name("receiver")
        rtype = None
        if receiver is not None:
            stack = [receiver]
            while stack:
                cur = stack.pop()
                if cur.type == "type_identifier":
                    rtype = _text(cur)
                    break
                stack.extend(reversed(cur.named_children))
        return f"{rtype}.{_text(name)}" if rtype else _text(name)
    return _text(name) if name is not None else None


def _doc_comment(
    comments: list[Any], comment_ends: list[int], anchor_start: int, source: bytes, language: str
) -> str | None:
    """The doc comment text directly above ``anchor_start`` (no blank line in between)."""
    idx = bisect.bisect_right(comment_ends, anchor_start) - 1
    if idx < 0:
        return None

    def adjacent(end: int, start: int) -> bool:
        gap = source[end:start]
        return not gap.strip() and gap.count(b"\n") <= 1

    def own_line(comment: Any) -> bool:
        # A trailing comment of the previous statement ("x = 1 // foo") is not a doc comment.
        line_start = source.rfind(b"\n", 0, comment.start_byte) + 1
        return not source[line_start : comment.start_byte].strip()

    last = comments[idx]
    if not adjacent(last.end_byte, anchor_start) or not own_line(last):
        return None
    text = _text(last)
    if language in ("java", "javascript", "php"):
        # Javadoc / JSDoc / phpdoc convention: only /** ... */ documents a declaration.
        return text if text.startswith("/**") else None
    marker = "//" if language == "go" else "#"
    if not text.startswith(marker):
        # Go /* */ and Ruby =begin/=end blocks document on their own.
        return text if text.startswith(("/*", "=begin")) else None
    parts = [text]
    # Extend upward over a run of adjacent line comments.
    while idx > 0:
        prev = comments[idx - 1]
        prev_text = _text(prev)
        if not (prev_text.startswith(marker) and adjacent(prev.end_byte, comments[idx].start_byte)):
            break
        if not own_line(prev):
            break
        parts.append(prev_text)
        idx -= 1
    return "\n".join(reversed(parts))


def _doc_from_comment(comment: str) -> str:
    """Doc comment -> docstring: markers stripped, common indentation removed."""
    return inspect.cleandoc(strip_comment_markers(comment))


def _extract_tree_sitter(source: str, language: str) -> list[tuple[str, str, str, int, int]]:
    data = source.encode("utf-8")
    # One parser per thread: tree-sitter parsers hold mutable parse state.
    tree = parser_for(language).parse(data)
    functions_types = _TS_FUNCTIONS[language]
    container_types = _TS_CONTAINERS[language]
    comments: list[Any] = []
    candidates: list[tuple[Any, tuple[str, ...]]] = []
    stack: list[tuple[Any, tuple[str, ...]]] = [(tree.root_node, ())]
    while stack:
        node, prefix = stack.pop()
        ntype = node.type
        child_prefix = prefix
        if ntype in _TS_COMMENTS:
            comments.append(node)
            continue
        if ntype in functions_types:
            candidates.append((node, prefix))
        elif ntype in container_types:
            name = node.child_by_field_name("name")
            if name is not None:
                child_prefix = (*prefix, _text(name))
        stack.extend((child, child_prefix) for child in reversed(node.children))
    comments.sort(key=lambda c: c.start_byte)
    comment_ends = [c.end_byte for c in comments]

    out = []
    for node, prefix in candidates:
        if node.has_error:
            # Code tree-sitter could not parse cleanly would make a poor training document.
            continue
        code_node = anchor = node
        if language == "javascript":
            if node.type in ("function_expression", "arrow_function", "generator_function"):
                binding = _js_binding(node)
                if binding is None:
                    continue  # anonymous callbacks etc.
                name, code_node, anchor = binding
            else:
                name = _function_name(node, language)
                if node.parent is not None and node.parent.type == "export_statement":
                    anchor = node.parent
        else:
            name = _function_name(node, language)
        if not name:
            continue
        comment = _doc_comment(comments, comment_ends, anchor.start_byte, data, language)
        if comment is None:
            continue
        docstring = _doc_from_comment(comment)
        if not docstring.strip():
            continue
        qualname = ".".join((*prefix, name))
        out.append(
            (
                qualname,
                _text(code_node),
                docstring,
                code_node.start_point[0] + 1,
                code_node.end_point[0] + 1,
            )
        )
    return out


def decode_source(raw: bytes) -> str:
    """Decode a source file's bytes as UTF-8 with universal newlines (raises on bad bytes)."""
    # utf-8-sig drops a BOM, which ast would otherwise reject.
    text = raw.decode("utf-8-sig")
    # Universal newlines, like open() in text mode: records hold '\n' only.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def extract_functions(
    source: str,
    relative_path: str,
    language: str,
    *,
    repo: str = "local",
    split_seed: int = 0,
) -> list[dict[str, Any]]:
    """Return CodeSearchNet-format records for every documented function in ``source``.

    Python is parsed with ``ast``: a file that does not parse raises ``SyntaxError``
    (or a subclass: ``IndentationError``, ``TabError``) or ``ValueError`` (null bytes,
    and ``RecursionError``/``MemoryError`` re-raised as ``ValueError``).  Callers should
    catch ``(SyntaxError, ValueError)``.  Other languages use tree-sitter, which never
    raises; functions whose subtree contains a parse error are skipped.
    """
    if language == "python":
        found = _extract_python(source)
    elif language in CODE_LANGUAGES:
        found = _extract_tree_sitter(source, language)
    else:
        raise ValueError(f"unsupported language {language!r}")
    path = relative_path.replace(os.sep, "/")
    sha = hashlib.sha1(source.encode("utf-8", errors="surrogatepass")).hexdigest()
    return [
        _make_record(
            repo=repo,
            path=path,
            func_name=func_name,
            language=language,
            code=code,
            docstring=docstring,
            start_line=start,
            end_line=end,
            sha=sha,
            split_seed=split_seed,
        )
        for func_name, code, docstring, start, end in found
    ]


# ------------------------------------------------------------------------------ the walk


@dataclass
class SourceStats:
    """Counters filled while a :class:`SourceRecords` is iterated."""

    files: int = 0  # files found by the walk
    files_with_records: int = 0
    records: int = 0
    records_by_language: Counter[str] = field(default_factory=Counter)
    # path -> reason, for files skipped entirely
    undecodable: dict[str, str] = field(default_factory=dict)  # not valid UTF-8
    unreadable: dict[str, str] = field(default_factory=dict)  # OSError
    parse_errors: dict[str, str] = field(default_factory=dict)  # SyntaxError / ValueError


class SourceRecords:
    """Iterable of records from a source tree; ``stats`` is updated during iteration.

    Each ``iter()`` walks the tree again and resets ``stats``.
    """

    def __init__(
        self,
        root: str,
        languages: Iterable[str] | None = None,
        *,
        skip_tests: bool = False,
        repo: str | None = None,
        split_seed: int = 0,
    ) -> None:
        self.root = os.path.abspath(root)
        self.languages = _check_languages(languages)
        self.skip_tests = skip_tests
        self.repo = repo if repo is not None else os.path.basename(self.root.rstrip(os.sep))
        self.split_seed = split_seed
        self.stats = SourceStats()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.stats = stats = SourceStats()
        for path in iter_source_files(self.root, self.languages, skip_tests=self.skip_tests):
            stats.files += 1
            rel = os.path.relpath(path, self.root).replace(os.sep, "/")
            try:
                with open(path, "rb") as fh:
                    raw = fh.read()
            except OSError as exc:
                stats.unreadable[rel] = f"{type(exc).__name__}: {exc}"
                continue
            try:
                text = decode_source(raw)
            except UnicodeDecodeError as exc:
                stats.undecodable[rel] = str(exc)
                continue
            language = EXTENSIONS[os.path.splitext(path)[1]]
            try:
                records = extract_functions(
                    text, rel, language, repo=self.repo, split_seed=self.split_seed
                )
            except (SyntaxError, ValueError) as exc:
                stats.parse_errors[rel] = f"{type(exc).__name__}: {exc}"
                continue
            if records:
                stats.files_with_records += 1
            stats.records += len(records)
            stats.records_by_language[language] += len(records)
            yield from records


def iter_source_records(
    root: str,
    languages: Iterable[str] | None = None,
    *,
    skip_tests: bool = False,
    repo: str | None = None,
    split_seed: int = 0,
) -> SourceRecords:
    """Walk ``root``, read files as UTF-8 and extract records; see :class:`SourceRecords`.

    ``skip_tests`` defaults to False because the standard library alone has fewer
    documented functions than the benchmarks need (~6,900 without its test dirs).
    ``repo`` defaults to the basename of ``root``.
    """
    return SourceRecords(root, languages, skip_tests=skip_tests, repo=repo, split_seed=split_seed)
