"""The preprocess report: every input row accounted for, by reason and language."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
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


def summarize(work: ray.data.Dataset) -> pd.DataFrame:
    """The accounting columns of a materialized dataset, block by block from the object
    store (zero-copy), without another Ray Data execution."""
    tables = [ray.get(ref) for ref in work.to_arrow_refs()]
    # Empty blocks (read tasks that found no lines) may come without columns.
    tables = [table.select(_SUMMARY_COLUMNS) for table in tables if table.num_rows]
    if not tables:
        return pd.DataFrame(columns=_SUMMARY_COLUMNS)
    return pa.concat_tables(tables, promote_options="permissive").to_pandas()


def failed_files(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Each input file that failed or was cut short: path, reason, the reader's message,
    the lines read from it before the fault and how many of them were written.

    A truncated or corrupt ``.jsonl.gz`` (``corrupt_file``), an unreadable file, and a source
    file that cannot be decoded or parsed as a whole (a row at line 0).
    """
    if rows.empty:
        return []
    line = rows["row_key"].str.rsplit(":", n=1).str[-1]
    whole_file = rows["drop_reason"].isin(FILE_REASONS) | (
        (line == "0" * 10) & (rows["drop_reason"] != "")
    )
    out = []
    for _, failed in rows[whole_file].sort_values("row_key").iterrows():
        path, _, at = failed["row_key"].rpartition(":")
        same_file = rows["row_key"].str.startswith(path + ":") & ~whole_file
        out.append(
            {
                "path": path,
                "reason": failed["drop_reason"],
                "detail": failed.get("drop_detail") or "",
                "at_line": int(at),
                "rows_read": int(same_file.sum()),
                "rows_kept": int((same_file & (rows["drop_reason"] == "")).sum()),
            }
        )
    return out


def build_report(
    config: PreprocessConfig,
    rows: pd.DataFrame,
    filtered: Counter,
    expected_rows: int | None,
    wall_time_s: float,
) -> dict[str, Any]:
    """Counts by reason and language, entity ratio per language, and wall time."""
    dropped: Counter = Counter()
    filtered = Counter(filtered)  # selected away by the driver before any row was built
    by_language: dict[str, Counter] = defaultdict(Counter)
    for (language, reason), count in rows.groupby(["language", "drop_reason"]).size().items():
        by_language[language or "unknown"][reason or "written"] += int(count)
        if reason in Reason.FILTERS:
            filtered[reason] += int(count)
        elif reason:
            dropped[reason] += int(count)
    rows_read = (
        len(rows) + sum(filtered.values()) - int(rows["drop_reason"].isin(Reason.FILTERS).sum())
    )
    if expected_rows is not None and expected_rows > len(rows):
        # Judgments whose product is absent from the products file never reach a builder.
        dropped[MISSING_PRODUCT] += expected_rows - len(rows)
        rows_read += expected_rows - len(rows)
    kept = rows[rows["drop_reason"] == ""]
    entity_ratio = {}
    if config.stage == "pretrain":
        sums = kept.groupby("language")[["num_tokens", "num_masked_tokens"]].sum()
        for language, row in sums.iterrows():
            tokens = int(row["num_tokens"])
            entity_ratio[language] = (
                round(int(row["num_masked_tokens"]) / tokens, 4) if tokens else 0.0
            )
    # Pretraining pairs with nothing to mask train SDA only: counted, never dropped.
    without_entities = (
        kept[kept["num_masked_tokens"] == 0].groupby("kind").size()
        if config.stage == "pretrain"
        else pd.Series(dtype=int)
    )
    return {
        "config": config.to_dict(),
        "failed_files": failed_files(rows),
        "rows_read": int(rows_read),
        "rows_written": int(len(kept)),
        "by_kind": {str(k): int(v) for k, v in kept.groupby("kind").size().items()},
        "without_entities": {str(k): int(v) for k, v in without_entities.items()},
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
