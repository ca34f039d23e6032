"""The preprocess accounting: final drop reasons and the report, computed in Arrow on a
compact summary (no Ray here: the functions the driver runs after the blocks are built)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from santa.config.preprocess import PreprocessConfig
from santa.data.accounting import _SUMMARY_COLUMNS, _compact, build_report
from santa.data.operators import HELDOUT_MARK
from santa.data.plan import _settle_rows


def row(key: str, dedup: str, reason: str = "", doc_id: str = "", **extra) -> dict:
    return {
        "language": extra.get("language", "python"),
        "kind": extra.get("kind", "code"),
        "drop_reason": reason,
        "row_key": key,
        "dedup_key": dedup,
        "doc_id": doc_id,
        "num_tokens": extra.get("tokens", 10),
        "num_masked_tokens": extra.get("masked", 2),
        "drop_detail": extra.get("detail", ""),
    }


def summary(*blocks: list[dict]) -> pa.Table:
    """Blocks compacted one by one, as `summarize` does: each with its own dictionaries."""
    return pa.concat_tables(
        [_compact(pa.Table.from_pylist(block).select(_SUMMARY_COLUMNS)) for block in blocks]
    )


def config(stage: str) -> PreprocessConfig:
    return PreprocessConfig(stage=stage, dataset="codesearchnet", input="/in", output="/out")


ROWS = [
    # block 1: a later copy of b.py:1's pair comes first in the block order
    [row("b.py:0000000009", "h1"), row("a.py:0000000002", "h2", doc_id="d2")],
    # block 2: the earlier copy, a held-out pair and a leak of its document, a filter
    [
        row("b.py:0000000001", "h1", language="ruby"),
        row("t.py:0000000001", "h9", HELDOUT_MARK, doc_id="d2"),
        row("c.py:0000000004", "h3", "other_language", language="go"),
        row("c.py:0000000005", "h4", masked=0, kind="text"),
    ],
    # block 3: a file that broke after two lines (one of them written)
    [
        row("z.jsonl.gz:0000000001", "h5"),
        row("z.jsonl.gz:0000000002", "h6", "too_long"),
        row("z.jsonl.gz:0000000003", "", "corrupt_file", detail="truncated gzip"),
    ],
]


def test_duplicates_keep_the_earliest_input_position_and_leaks_are_dropped() -> None:
    rows, kept, removed = _settle_rows(config("pretrain"), summary(*ROWS))
    final = dict(zip(rows["row_key"].to_pylist(), rows["drop_reason"].to_pylist(), strict=True))
    assert final == {
        "b.py:0000000009": "duplicate",  # b.py:1 came first in the input, not in the blocks
        "a.py:0000000002": "heldout_leak",  # its document is a held-out pair's
        "b.py:0000000001": "",
        "t.py:0000000001": "other_split",
        "c.py:0000000004": "other_language",
        "c.py:0000000005": "",
        "z.jsonl.gz:0000000001": "",
        "z.jsonl.gz:0000000002": "too_long",
        "z.jsonl.gz:0000000003": "corrupt_file",
    }
    assert kept.tolist() == [reason == "" for reason in final.values()]
    # Only rows the builders wrote and the driver dropped are removed from the output.
    assert sorted(removed.to_pylist()) == ["a.py:0000000002", "b.py:0000000009"]


def test_eval_keeps_duplicates() -> None:
    rows, _, removed = _settle_rows(config("eval"), summary(*ROWS))
    assert "duplicate" not in rows["drop_reason"].to_pylist()
    assert removed.to_pylist() == ["a.py:0000000002"]


def test_report_counts_every_row_by_reason_language_and_file() -> None:
    rows, _, _ = _settle_rows(config("pretrain"), summary(*ROWS))
    report = build_report(config("pretrain"), rows, Counter({"other_language": 5}), None, 1.234)
    assert report["rows_read"] == 9 + 5
    assert report["rows_written"] == 3
    assert report["dropped"] == {
        "corrupt_file": 1,
        "duplicate": 1,
        "heldout_leak": 1,
        "too_long": 1,
    }
    assert report["filtered"] == {"other_language": 6, "other_split": 1}
    assert report["by_language"]["python"] == {
        "corrupt_file": 1,
        "duplicate": 1,
        "heldout_leak": 1,
        "other_split": 1,
        "too_long": 1,
        "written": 2,
    }
    assert report["by_language"]["ruby"] == {"written": 1}
    assert report["by_kind"] == {"code": 2, "text": 1}
    assert report["without_entities"] == {"text": 1}
    assert report["entity_ratio"] == {"python": pytest.approx(2 / 20), "ruby": 0.2}
    assert report["failed_files"] == [
        {
            "path": "z.jsonl.gz",
            "reason": "corrupt_file",
            "detail": "truncated gzip",
            "at_line": 3,
            "rows_read": 2,
            "rows_kept": 1,
        }
    ]
    assert report["wall_time_s"] == 1.23


def test_the_summary_is_compact() -> None:
    """The driver holds the whole set's accounting: labels as dictionaries and keys in
    Arrow buffers, not pandas' Python objects (1.1 KB per row more at 1 M pairs)."""
    block = [
        row(f"/data/python/train/file_{i // 1000}.jsonl.gz:{i:010d}", f"{i:016x}", doc_id=str(i))
        for i in range(5000)
    ]
    table = summary(block[:2500], block[2500:])
    for name in ("language", "kind", "drop_reason", "drop_detail"):
        assert pa.types.is_dictionary(table.schema.field(name).type), name
    assert table.nbytes / table.num_rows < 120
    report = build_report(
        config("finetune"), *_settle_rows(config("finetune"), table)[:1], {}, None, 0
    )
    assert report["rows_written"] == 5000 and report["by_kind"] == {"code": 5000}


def test_rows_sharing_a_row_key_share_its_fate() -> None:
    """The written output is filtered by row key: two rows of one key (a product listed
    twice) are both counted as dropped when one of them is a duplicate, as both are not
    written."""
    twice = [row("p1", "h1", kind="product"), row("p1", "h1", kind="product")]
    rows, kept, removed = _settle_rows(config("pretrain"), summary(twice, [row("p2", "h2")]))
    assert rows["drop_reason"].to_pylist() == ["duplicate", "duplicate", ""]
    assert kept.tolist() == [False, False, True]
    assert pc.unique(removed).to_pylist() == ["p1"]


def test_no_rows_and_no_row_kept() -> None:
    """An input with no rows (`summarize` of an empty dataset) and one whose every row is
    dropped: nothing kept, nothing to remove, a report of zeros."""
    empty = pa.table({name: pa.array([], pa.string()) for name in _SUMMARY_COLUMNS})
    rows, kept, removed = _settle_rows(config("pretrain"), empty)
    assert kept.tolist() == [] and removed.to_pylist() == []
    report = build_report(config("pretrain"), rows, Counter(), 3, 0.0)
    assert report["rows_written"] == 0 and report["dropped"] == {"missing_product": 3}
    dropped = summary([row("a:1", "h", "too_long"), row("a:2", "h", "too_long")])
    rows, kept, removed = _settle_rows(config("pretrain"), dropped)
    assert kept.tolist() == [False, False] and removed.to_pylist() == []
    assert build_report(config("pretrain"), rows, Counter(), None, 0.0)["dropped"] == {
        "too_long": 2
    }
