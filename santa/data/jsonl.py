"""JSON-lines files read in one place: plain or gzip-compressed, local or ``s3://``.

A bad line never ends the read silently or anonymously: it is skipped and counted by
reason (where the caller keeps a count), else it ends the read with an error naming the
file and the line. A compressed file cut short ends the read with an error naming the file
and how many rows came before the cut.
"""

from __future__ import annotations

import io
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any, BinaryIO

from santa.files import storage

__all__ = ["MALFORMED", "TRUNCATED", "chunks", "gunzipped_chunks", "json_lines"]

MALFORMED = "malformed_json"
"""The reason a line that is not a JSON object is skipped for."""
TRUNCATED = "compressed file ended before the end-of-stream marker"

_CHUNK_BYTES = 1 << 20


def chunks(f: BinaryIO) -> Iterator[bytes]:
    """The bytes of an open file, a MiB at a time."""
    while chunk := f.read(_CHUNK_BYTES):
        yield chunk


def gunzipped_chunks(f: BinaryIO) -> Iterator[bytes]:
    """Decompressed bytes of a gzip stream (several members allowed), as they come.

    Unlike a decompressing stream that fails a whole read at a fault, everything before
    a truncation or corruption is handed out first; then ``EOFError``/``zlib.error``.
    """
    decompressor = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
    fed = False
    for chunk in chunks(f):
        while chunk:
            fed = True
            if out := decompressor.decompress(chunk):
                yield out
            if not decompressor.eof:
                break
            chunk = decompressor.unused_data  # the next gzip member, if any
            decompressor, fed = zlib.decompressobj(wbits=47), False
    if fed and not decompressor.eof:
        raise EOFError("compressed stream ends before its end-of-stream marker (truncated)")


def json_lines(
    uri: str, skipped: Counter | None = None, prefix: str = ""
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of every JSON object line of ``uri`` (``.gz``: gzip).

    A line that is not a JSON object is counted in ``skipped`` as ``{prefix}malformed_json``
    (``skipped`` given) or ends the read: ``ValueError("{uri} line {n}: not a JSON
    object ...")``. A compressed file cut short or corrupt ends it with
    ``ValueError("{uri}: compressed file ended before the end-of-stream marker (after N
    rows)")``: the rows before the cut have been handed out by then.
    """
    data = storage.read_bytes(uri)
    stream = gunzipped_chunks(io.BytesIO(data)) if uri.endswith(".gz") else iter([data])
    rows = 0
    line_no = 0
    pending = b""
    try:
        for chunk in stream:
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop()
            for line in lines:
                line_no += 1
                row = _row(uri, line_no, line, skipped, prefix)
                if row is not None:
                    rows += 1
                    yield line_no, row
    except (EOFError, zlib.error) as error:
        what = TRUNCATED if isinstance(error, EOFError) else f"corrupt compressed data ({error})"
        raise ValueError(f"{uri}: {what} (after {rows:,} rows)") from None
    if pending.strip():
        row = _row(uri, line_no + 1, pending, skipped, prefix)
        if row is not None:
            yield line_no + 1, row


def _row(
    uri: str, line_no: int, line: bytes, skipped: Counter | None, prefix: str
) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        row, problem = None, f"invalid JSON ({error})"
    else:
        problem = "" if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"
    if problem:
        if skipped is None:
            raise ValueError(f"{uri} line {line_no}: {problem}")
        skipped[prefix + MALFORMED] += 1
        return None
    return row
