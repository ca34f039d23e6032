"""The preprocess report: every input row accounted for, by reason and language."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from santa.data.records import Reason

if TYPE_CHECKING:
    import ray.data

    from santa.config.preprocess import PreprocessConfig

MISSING_PRODUCT = "missing_product"


_SUMMARY_COLUMNS = [
    "language",
    "kind",
    "drop_reason",
    "row_key",
    "dedup_key",
    "doc_id",
    "num_tokens",
    "num_masked_tokens",
    "drop_detail",
]
# Reasons a reader gives a whole input file (a row standing for it, at line 0 or after its
# last good line).
FILE_REASONS = frozenset({Reason.CORRUPT_FILE, Reason.UNREADABLE_FILE})


def summarize(work: ray.data.Dataset) -> pa.Table:
    """The accounting columns of a materialized dataset, one block at a time from the
    object store, without another Ray Data execution.

    The result stays in Arrow: the repeated labels (language, kind, reason, detail)
    dictionary-encoded and the keys copied out of the blocks, so no block stays pinned and
    the driver holds about the keys' bytes per row (~280 B with CodeSearchNet's paths)
    instead of pandas' Python objects. At 1 M pairs the preprocess driver's private memory
    peaked at 621 MB instead of 1,238 MB (bench/scale, issue 56).
    """
    tables = []
    for ref in work.to_arrow_refs():
        block = ray.get(ref)
        # Empty blocks (read tasks that found no lines) may come without columns.
        if block.num_rows:
            tables.append(_compact(block.select(_SUMMARY_COLUMNS)))
        del block
    if not tables:
        return pa.table({name: pa.array([], pa.string()) for name in _SUMMARY_COLUMNS})
    return pa.concat_tables(tables, promote_options="permissive")


_LABELS = ("language", "kind", "drop_reason", "drop_detail")


def _compact(block: pa.Table) -> pa.Table:
    """One block's accounting columns as new buffers (labels dictionary-encoded)."""
    columns = {}
    for name in block.column_names:
        column = block[name].combine_chunks()
        if name in _LABELS:
            column = pc.dictionary_encode(column.cast(pa.string()))
        else:
            column = pa.concat_arrays([column, column[:0]])  # a copy, not a view
        columns[name] = column
    return pa.table(columns)


def labels(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A label column as plain strings (for comparisons and grouping across blocks, whose
    dictionaries differ)."""
    if pa.types.is_dictionary(column.type):
        return column.cast(pa.string())
    return column


def _count(table: pa.Table, keys: list[str]) -> list[dict[str, Any]]:
    """Rows per group of ``keys`` (label columns compared as strings)."""
    if not table.num_rows:
        return []
    plain = pa.table({key: labels(table[key]) for key in keys})
    plain = plain.append_column("_one", pa.repeat(1, table.num_rows))
    return plain.group_by(keys).aggregate([("_one", "count")]).to_pylist()


def failed_files(rows: pa.Table) -> list[dict[str, Any]]:
    """Each input file that failed or was cut short: path, reason, the reader's message,
    the lines read from it before the fault and how many of them were written.

    A truncated or corrupt ``.jsonl.gz`` (``corrupt_file``), an unreadable file, and a source
    file that cannot be decoded or parsed as a whole (a row at line 0).
    """
    if not rows.num_rows:
        return []
    reason = labels(rows["drop_reason"])
    row_key = rows["row_key"]
    file_reason = pc.is_in(reason, value_set=pa.array(sorted(FILE_REASONS), pa.string()))
    whole_file = pc.or_(
        file_reason,
        pc.and_(pc.ends_with(row_key, ":" + "0" * 10), pc.not_equal(reason, "")),
    )
    failed = rows.filter(whole_file).to_pylist()  # a few rows: one per failed file
    if not failed:
        return []
    others = rows.filter(pc.invert(whole_file))
    other_keys, other_written = others["row_key"], pc.equal(labels(others["drop_reason"]), "")
    out = []
    for row in sorted(failed, key=lambda row: row["row_key"]):
        path, _, at = row["row_key"].rpartition(":")
        same_file = pc.starts_with(other_keys, path + ":")
        out.append(
            {
                "path": path,
                "reason": row["drop_reason"],
                "detail": row.get("drop_detail") or "",
                "at_line": int(at),
                "rows_read": int(pc.sum(same_file).as_py() or 0),
                "rows_kept": int(pc.sum(pc.and_(same_file, other_written)).as_py() or 0),
            }
        )
    return out


def build_report(
    config: PreprocessConfig,
    rows: pa.Table,
    filtered: Counter,
    expected_rows: int | None,
    wall_time_s: float,
) -> dict[str, Any]:
    """Counts by reason and language, entity ratio per language, and wall time."""
    dropped: Counter = Counter()
    filtered = Counter(filtered)  # selected away by the driver before any row was built
    by_language: dict[str, Counter] = defaultdict(Counter)
    filtered_rows = 0
    for group in _count(rows, ["language", "drop_reason"]):
        language, reason, count = group["language"], group["drop_reason"], group["_one_count"]
        by_language[language or "unknown"][reason or "written"] += count
        if reason in Reason.FILTERS:
            filtered[reason] += count
            filtered_rows += count
        elif reason:
            dropped[reason] += count
    rows_read = rows.num_rows + sum(filtered.values()) - filtered_rows
    if expected_rows is not None and expected_rows > rows.num_rows:
        # Judgments whose product is absent from the products file never reach a builder.
        dropped[MISSING_PRODUCT] += expected_rows - rows.num_rows
        rows_read += expected_rows - rows.num_rows
    kept = rows.select(["language", "kind", "num_tokens", "num_masked_tokens"])
    if rows.num_rows:  # (not the keys: a copy of them would double the driver's memory)
        kept = kept.filter(pc.equal(labels(rows["drop_reason"]), ""))
    entity_ratio, without_entities = {}, {}
    if config.stage == "pretrain" and kept.num_rows:
        sums = (
            pa.table(
                {
                    "language": labels(kept["language"]),
                    "num_tokens": kept["num_tokens"],
                    "num_masked_tokens": kept["num_masked_tokens"],
                }
            )
            .group_by("language")
            .aggregate([("num_tokens", "sum"), ("num_masked_tokens", "sum")])
        )
        for row in sorted(sums.to_pylist(), key=lambda row: row["language"] or ""):
            tokens = int(row["num_tokens_sum"] or 0)
            masked = int(row["num_masked_tokens_sum"] or 0)
            entity_ratio[row["language"]] = round(masked / tokens, 4) if tokens else 0.0
        # Pretraining pairs with nothing to mask train SDA only: counted, never dropped.
        nothing_masked = kept.filter(pc.equal(kept["num_masked_tokens"], 0))
        without_entities = {
            str(group["kind"]): group["_one_count"]
            for group in sorted(_count(nothing_masked, ["kind"]), key=lambda g: g["kind"] or "")
        }
    by_kind = {
        str(group["kind"]): group["_one_count"]
        for group in sorted(_count(kept, ["kind"]), key=lambda g: g["kind"] or "")
    }
    return {
        "config": config.to_dict(),
        "failed_files": failed_files(rows),
        "rows_read": int(rows_read),
        "rows_written": int(kept.num_rows),
        "by_kind": by_kind,
        "without_entities": without_entities,
        "dropped": dict(sorted(dropped.items())),
        "filtered": dict(sorted(filtered.items())),
        "by_language": {k: dict(sorted(v.items())) for k, v in sorted(by_language.items())},
        "entity_ratio": entity_ratio,
        "mask": config.mask,
        "wall_time_s": round(wall_time_s, 2),
    }


def format_text(report: dict[str, Any]) -> str:
    """The report as a small plain-text table (what ``ray_jobs.preprocess`` prints)."""
    lines = [
        f"rows read     {report['rows_read']:>10,}",
        f"rows written  {report['rows_written']:>10,}",
    ]
    for reason, count in report["dropped"].items():
        lines.append(f"dropped  {reason:<22}{count:>10,}")
    for reason, count in report["filtered"].items():
        lines.append(f"filtered {reason:<22}{count:>10,}")
    for language, ratio in report["entity_ratio"].items():
        lines.append(f"entity ratio {language:<18}{ratio:>10.3f}")
    if "asst" in report:
        lines.append(f"asst pairs    {report['asst']['written']:>10,}")
        for reason, count in report["asst"]["skipped"].items():
            lines.append(f"asst skipped {reason:<18}{count:>10,}")
    lines += _esci_lines(report.get("esci"), report["config"])
    lines += _failed_file_lines(report.get("failed_files", []))
    lines.append(f"wall time     {report['wall_time_s']:>10.1f} s")
    if "beir" in report:
        lines.append("BEIR " + json.dumps(report["beir"]))
    return "\n".join(lines)


# Source files that do not decode or parse as a whole: every standard library has some
# (lib2to3's and test's deliberately broken files), so they are counted, not listed.
SOURCE_FILE_REASONS = ("unparsable_code", "undecodable_bytes")


def _failed_file_lines(failed_files: list[dict[str, Any]]) -> list[str]:
    """A line per input file that failed or was cut short (its rows may be lost), and one
    line counting by reason the source files that did not parse (report.json names each)."""
    lines, unparsed = [], Counter()
    for failed in failed_files:
        if failed["reason"] in SOURCE_FILE_REASONS and failed.get("rows_read", 0) == 0:
            unparsed[failed["reason"]] += 1
            continue
        lines.append(
            f"failed file   {failed['path']}: {failed['reason']} ({failed['detail']}); "
            f"{failed['rows_kept']:,} rows kept"
        )
    if unparsed:
        counts = ", ".join(f"{reason} {count:,}" for reason, count in sorted(unparsed.items()))
        total = sum(unparsed.values())
        lines.append(
            f"failed files  {total:>10,} source file{'s' * (total != 1)} not parsed "
            f"({counts}; report.json's failed_files names each)"
        )
    return lines


def _esci_lines(counts: dict | None, config: dict) -> list[str]:
    """ESCI's split and pair counts beside the paper's (Table 1, Table 5)."""
    if not counts:
        return []
    if "queries" in counts:  # a judgments split
        lines = [f"ESCI {config['esci_version']} {config['locale']}: {counts['rule']}"]
        for split in ("train", "valid", "test"):
            paper = counts["paper_table1"][split]
            lines.append(
                f"  {split:<6} {counts['queries'][split]:>8,} queries "
                f"{counts['judgments'][split]:>9,} judgments   (SANTA Table 1, small us: "
                f"{paper['queries']:,} / {paper['judgments']:,})"
            )
        return lines
    comparable = "" if counts["comparable_to_table5"] else "; other version/locale"
    return [
        f"ESCI pretraining pairs {counts['pairs_written']:,}   (SANTA Table 5, large us: "
        f"{counts['paper_table5_pairs']:,}{comparable})",
        f"  {counts['rule']}",
        f"  of which from test queries' judgments: {counts['test_judgments']:,} (before drops)",
    ]
