"""Ray Data readers for the raw inputs: JSON lines (CodeSearchNet, AdvTest) and source trees.

Ray's ``read_json`` fails a whole file on one malformed line and ``read_text`` on one
undecodable byte, so santa reads raw lines itself and lets the pair builders count bad
rows by reason.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator

import pyarrow as pa
from ray.data.datasource import FileBasedDatasource

from santa.data.schema import RAW_SCHEMA
from santa.entities import SUPPORTED_LANGUAGES as CODE_LANGUAGES

SPLIT_ALIASES = {"train": "train", "valid": "valid", "dev": "valid", "test": "test"}
_SPLIT_IN_NAME = re.compile(r"(?:^|[/_.-])(train|valid|dev|test)(?:[/_.-]|$)")


def split_from_path(path: str) -> str:
    """The split a file belongs to, from a directory or file name; "" when unknown."""
    # The innermost match wins: `.../train/test_utils.jsonl` is unusual, a file named
    # `test.jsonl` inside a `data/` dir is the common case.
    matches = _SPLIT_IN_NAME.findall(path.lower())
    return SPLIT_ALIASES[matches[-1]] if matches else ""


def language_from_path(path: str) -> str:
    """The language of a CodeSearchNet file from its ``{language}/final/...`` layout."""
    parts = path.replace("\\", "/").lower().split("/")
    for part in parts:
        if part in CODE_LANGUAGES:
            return part
    return ""


class JsonLinesDatasource(FileBasedDatasource):
    """Reads ``.jsonl``/``.jsonl.gz`` files as raw lines, in blocks of ``lines_per_block``.

    Yielding many small blocks from one file lets the downstream operators work on a
    large file in parallel instead of one block per file.
    """

    _FILE_EXTENSIONS = ["jsonl", "json", "gz"]

    def __init__(self, paths: list[str], *, root: str, lines_per_block: int = 1_000, **kwargs):
        super().__init__(paths, **kwargs)
        self.root = root
        self.lines_per_block = lines_per_block

    def _read_stream(self, f: pa.NativeFile, path: str) -> Iterator[pa.Table]:
        split = split_from_path(relative_path(path, self.root))
        rows: list[bytes] = []
        first_line = 1
        for line_number, line in enumerate(_iter_lines(f), start=1):
            rows.append(line)
            if len(rows) >= self.lines_per_block:
                yield _raw_block(path, first_line, rows, split)
                first_line = line_number + 1
                rows = []
        if rows:
            yield _raw_block(path, first_line, rows, split)


def _iter_lines(f: pa.NativeFile, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """Non-empty lines of a binary stream, without decoding them."""
    pending = b""
    while True:
        chunk = f.read(chunk_size)
        if not chunk:
            break
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _raw_block(path: str, first_line: int, lines: list[bytes], split: str) -> pa.Table:
    count = len(lines)
    return pa.Table.from_arrays(
        [
            pa.array([path] * count, pa.string()),
            pa.array(range(first_line, first_line + count), pa.int64()),
            pa.array(lines, pa.binary()),
            pa.array([split] * count, pa.string()),
            pa.array([""] * count, pa.string()),
        ],
        schema=RAW_SCHEMA,
    )


def relative_path(path: str, root: str) -> str:
    """``path`` relative to ``root`` with forward slashes (works for s3 keys and local)."""
    path = path.removeprefix("s3://")
    root = root.removeprefix("s3://")
    if os.sep != "/":
        path, root = path.replace(os.sep, "/"), root.replace(os.sep, "/")
    return posixpath.relpath(path, root)
