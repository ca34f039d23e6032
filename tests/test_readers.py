"""Raw JSON-lines reading: a file that breaks off keeps what was read before the fault."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from santa.data.readers import read_lines_part
from santa.data.records import Reason


def _lines(count: int) -> bytes:
    return b"".join(json.dumps({"code": "x" * 200, "i": i}).encode() + b"\n" for i in range(count))


def _read(path: Path, parts: int = 1) -> list[dict]:
    rows = []
    for part in range(parts):
        for block in read_lines_part(str(path), "train", part, parts, 100):
            rows.extend(block.to_pylist())
    return rows


@pytest.mark.parametrize("parts", [1, 3])
def test_truncated_gzip_keeps_the_lines_before_the_fault(tmp_path: Path, parts: int) -> None:
    data = gzip.compress(_lines(2000))
    path = tmp_path / "train.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    rows = _read(path, parts)
    good = [row for row in rows if not row["drop_reason"]]
    corrupt = [row for row in rows if row["drop_reason"]]
    assert len(good) > 500  # about half of the file decompressed before the cut
    assert [row["line_number"] for row in sorted(good, key=lambda r: r["line_number"])] == list(
        range(1, len(good) + 1)
    )
    assert all(json.loads(row["raw"])["i"] == row["line_number"] - 1 for row in good)
    # One row, whatever the number of parts, naming the file and the line of the fault.
    assert len(corrupt) == 1 and corrupt[0]["drop_reason"] == Reason.CORRUPT_FILE
    assert corrupt[0]["line_number"] == len(good) + 1
    assert str(path) in corrupt[0]["raw"].decode() and "truncated" in corrupt[0]["raw"].decode()


def test_corrupt_gzip_bytes_count_as_a_corrupt_file(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(_lines(300)))
    data[len(data) // 2 : len(data) // 2 + 64] = b"\x00" * 64
    path = tmp_path / "valid.jsonl.gz"
    path.write_bytes(bytes(data))
    rows = _read(path)
    assert [row["drop_reason"] for row in rows].count(Reason.CORRUPT_FILE) == 1


def test_concatenated_gzip_members_are_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl.gz"
    path.write_bytes(gzip.compress(_lines(150)) + gzip.compress(_lines(50)))
    rows = _read(path, parts=2)
    assert len(rows) == 200 and not any(row["drop_reason"] for row in rows)


def test_plain_file_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(_lines(250) + b"\n\n")
    rows = _read(path)
    assert [row["line_number"] for row in rows] == list(range(1, 251))
