"""Ray Data readers for the raw inputs: JSON lines (CodeSearchNet, AdvTest) and source trees.

Ray's ``read_json`` fails a whole file on one malformed line and ``read_text`` on one
undecodable byte, so santa reads raw lines itself and lets the pair builders count bad
rows by reason.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import posixpath
import re
import zlib
from collections.abc import Iterator

import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from santa.data.jsonl import chunks, gunzipped_chunks
from santa.data.records import Reason
from santa.data.schema import CODE_LANGUAGES, RAW_SCHEMA
from santa.files import storage

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


# A JSON lines file is read in one task per this many bytes of it (``part_bytes``).
PART_BYTES = 4 << 20


class JsonLinesDatasource(Datasource):
    """Reads ``.jsonl``/``.jsonl.gz`` files as raw lines, in blocks of ``lines_per_block``.

    One read task per ``part_bytes`` of a file (on disk; at least one, at most
    ``MAX_PARTS_PER_FILE``): a function of the input alone, so that with
    :func:`in_input_order` the rows come out in the same order on any cluster. Part ``k``
    of ``n`` keeps the blocks ``k, k + n,
    k + 2n, ...`` of its file: line numbers stay those of the whole file, and a gzip
    stream needs no seeking (each part decompresses the file; parts are capped at
    ``MAX_PARTS_PER_FILE`` so that this stays a small fraction of the parsing work).

    Read without resources or concurrency of its own, it fuses into the parser tasks
    downstream, which take whole blocks (``ReadJsonLines->MapBatches(...)``): each task
    parses what it read, and no lines are copied into the object store between a reader
    and a parser.
    """

    MAX_PARTS_PER_FILE = 8

    def __init__(
        self,
        paths: list[str],
        *,
        root: str,
        lines_per_block: int = 1_000,
        part_bytes: int = PART_BYTES,
    ):
        super().__init__()
        self.paths = list(paths)
        self.root = root
        self.lines_per_block = lines_per_block
        self.sizes = storage.file_sizes(self.paths)
        self.parts = plan_parts(self.sizes, part_bytes, self.MAX_PARTS_PER_FILE)

    @property
    def num_read_tasks(self) -> int:
        """Pass this as ``override_num_blocks``: fewer would make Ray Data split the read
        output (``SplitBlocks``), and a split read no longer fuses with the parsers."""
        return sum(self.parts)

    def estimate_inmemory_data_size(self) -> int:
        # Code compresses about 4x with gzip.
        return sum(size * (4 if path.endswith(".gz") else 1) for path, size in self._files())

    def _files(self):
        return zip(self.paths, self.sizes, strict=True)

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None):
        tasks = []
        for (path, size), parts in zip(self._files(), self.parts, strict=True):
            split = split_from_path(relative_path(path, self.root))
            for part in range(parts):
                read = functools.partial(
                    read_lines_part, path, split, part, parts, self.lines_per_block
                )
                metadata = BlockMetadata(
                    num_rows=None, size_bytes=size // parts, input_files=(path,), exec_stats=None
                )
                tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


def plan_parts(sizes: list[int], part_bytes: int, max_parts: int) -> list[int]:
    """Read tasks per file: one per ``part_bytes`` of it, at least one and at most
    ``max_parts``."""
    return [min(max_parts, max(1, math.ceil(size / part_bytes))) for size in sizes]


@contextlib.contextmanager
def in_input_order():
    """Datasets created inside keep their blocks in input order through every operator
    (Ray Data's ``preserve_order``): rows are written in the order of the read tasks (the
    input files, sorted, and their parts) whatever block finishes first. Without it the
    written order followed the actors' timing, and a training run, which orders its
    epochs over row positions, computed another model from the same input. The
    process-wide context is left as it was."""
    options = ray.data.DataContext.get_current().execution_options
    saved = options.preserve_order
    options.preserve_order = True
    try:
        yield
    finally:
        options.preserve_order = saved


def read_lines_part(
    path: str, split: str, part: int, parts: int, lines_per_block: int
) -> Iterator[pa.Table]:
    """Blocks ``part, part + parts, ...`` of ``lines_per_block`` non-empty lines of a file
    (gzip-compressed when its name ends in ``.gz``), with their line numbers."""
    fs, local = storage.resolve(path)
    rows: list[bytes] = []
    first_line = 0
    index = -1
    try:
        with fs.open_input_stream(local, compression=None) as f:
            stream = gunzipped_chunks(f) if path.endswith(".gz") else chunks(f)
            for index, line in enumerate(_iter_lines(stream)):
                block, offset = divmod(index, lines_per_block)
                if block % parts != part:
                    continue
                if offset == 0 and rows:
                    yield _raw_block(path, first_line, rows, split)
                    rows = []
                if not rows:
                    first_line = index + 1
                rows.append(line)
    except (OSError, EOFError, zlib.error) as error:
        if storage.unreachable(error) is not None:  # S3 silent past santa's timeouts
            raise storage.classify_error(error, path, "read") from None  # a fault, not data
        # A truncated or corrupt file: keep what was read, count the rest once (part 0).
        if rows:
            yield _raw_block(path, first_line, rows, split)
            rows = []
        if part == 0:
            message = f"{path}: {type(error).__name__}: {error}".encode()
            yield _raw_block(path, index + 2, [message], split, drop_reason=Reason.CORRUPT_FILE)
    if rows:
        yield _raw_block(path, first_line, rows, split)


def _iter_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Non-empty lines of a stream of byte chunks, without decoding them."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _raw_block(
    path: str, first_line: int, lines: list[bytes], split: str, drop_reason: str = ""
) -> pa.Table:
    count = len(lines)
    return pa.Table.from_arrays(
        [
            pa.array([path] * count, pa.string()),
            pa.array(range(first_line, first_line + count), pa.int64()),
            pa.array(lines, pa.binary()),
            pa.array([split] * count, pa.string()),
            pa.array([drop_reason] * count, pa.string()),
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


_PEEK_BYTES = 4096


def first_text_byte(uri: str) -> bytes:
    """The first byte of a file's (decompressed) content past whitespace and a BOM."""
    fs, path = storage.resolve(uri)
    with fs.open_input_stream(path, compression=None) as stream:
        head = stream.read(_PEEK_BYTES * 4)
    if uri.endswith(".gz"):
        try:
            head = zlib.decompressobj(wbits=47).decompress(head, _PEEK_BYTES)
        except zlib.error:
            return b""  # a corrupt file: the reader counts it (corrupt_file)
    head = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return head[:1]


def first_record_language(uri: str) -> str:
    """The ``language`` field of a JSON-lines file's first record ("" when unknown): what
    a flat folder, whose paths name no language, holds."""
    fs, path = storage.resolve(uri)
    with fs.open_input_stream(path, compression=None) as stream:
        head = stream.read(_PEEK_BYTES * 16)
    if uri.endswith(".gz"):
        try:
            head = zlib.decompressobj(wbits=47).decompress(head, _PEEK_BYTES * 16)
        except zlib.error:
            return ""
    line = head.removeprefix(b"\xef\xbb\xbf").lstrip().split(b"\n", 1)[0]
    try:
        record = json.loads(line)
    except ValueError:
        return ""  # an array, a record longer than the peek, bad JSON: the reader decides
    language = record.get("language") if isinstance(record, dict) else None
    return language.lower() if isinstance(language, str) else ""


def reject_json_arrays(files: list[str]) -> None:
    """Fail fast on a file holding one JSON array instead of JSON lines.

    Each of its lines would be dropped as invalid JSON and the job would end with nothing
    written; converting is one command, so the message says which.
    """
    for uri in files:
        if first_text_byte(uri) == b"[":
            raise ValueError(
                f"{uri} is a JSON array, not JSON lines (one object per line): convert it, "
                "e.g. jq -c '.[]' FILE > FILE.jsonl"
            )
