"""ASST code–code pairs (SCodeR Algorithm 1) written beside the preprocessed pairs.

From every written docstring ↔ code pair, one sub-tree is cut out of the code: the pair
is (the sub-tree's code, the function without it), of kind ``asst``. Built from the pairs
already written, so duplicates and held-out leaks removed there never come back here, and
stored in the same ``data/`` folder (one more set of Parquet files) so that every reader of
the pairs (training, mining, SCodeR) sees both kinds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from santa.data.kinds import ASST, CODE_PAIR
from santa.data.records import empty_pair_row, stable_hash
from santa.data.schema import CODE_LANGUAGES, PAIR_SCHEMA
from santa.files import storage
from santa.method.asst import DEFAULT_MIN_TOKENS, extract_subtree
from santa.method.entities import UnparsableCodeError

__all__ = ["ASST_FILE_PREFIX", "asst_row", "build_asst_rows", "write_asst_pairs"]

# File names of the ASST shards in ``data/`` (a rerun replaces exactly these).
ASST_FILE_PREFIX = "asst-"
# Why a code pair gave no ASST pair (counted in the preprocess report).
NO_SUBTREE = "no_subtree"
UNPARSABLE = "unparsable_code"
OTHER_KIND = "not_code"


def asst_row(pair: dict[str, Any], seed: int, min_tokens: int = DEFAULT_MIN_TOKENS):
    """The ASST pair of one code pair row, or the reason there is none (a string)."""
    if pair.get("kind") not in (CODE_PAIR, None, "") or pair["language"] not in CODE_LANGUAGES:
        return OTHER_KIND
    try:
        # Seeded per function: the same corpus and seed always give the same pairs.
        split = extract_subtree(
            pair["document"],
            pair["language"],
            stable_hash(seed, pair["doc_id"]),
            min_tokens=min_tokens,
        )
    except UnparsableCodeError:
        return UNPARSABLE
    if split is None:
        return NO_SUBTREE
    row = empty_pair_row()
    doc_id = f"{pair['doc_id']}#asst"
    row.update(
        kind=ASST,
        id=stable_hash(pair["dataset"], doc_id, split.span),
        dataset=pair["dataset"],
        language=pair["language"],
        query_id=stable_hash("asst", doc_id),
        query=split.span,
        doc_id=doc_id,
        title=pair["title"],
        document=split.context,
        masked_document=split.context,  # nothing masked: a MEP stage trains SDA only on it
        url=pair["url"],
    )
    row.pop("dedup_key")
    return row


def build_asst_rows(batch: pa.Table, seed: int, min_tokens: int) -> pa.Table:
    """Ray Data function: pair rows → their ASST rows plus a ``reason`` column
    (empty for a built row, else why the pair gave none)."""
    rows, reasons = [], []
    for pair in batch.to_pylist():
        built = asst_row(pair, seed, min_tokens)
        if isinstance(built, str):
            reasons.append(built)
            rows.append({"language": pair.get("language") or ""})
        else:
            reasons.append("")
            rows.append(built)
    table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
    return table.append_column("reason", pa.array(reasons, pa.string()))


def write_asst_pairs(
    data_uri: str, *, seed: int = 0, min_tokens: int = DEFAULT_MIN_TOKENS
) -> dict[str, Any]:
    """Add ASST pairs of the code pairs under ``data_uri`` (``OUTPUT/data``) beside them.

    Returns ``{"written": n, "skipped": {reason: count}}``. A rerun replaces the ASST files
    of the previous run instead of adding more.
    """
    from santa.data.published import parquet_dataset

    files = storage.list_files(data_uri, suffixes=(".parquet",))
    for uri in files:
        if uri.rsplit("/", 1)[-1].startswith(ASST_FILE_PREFIX):
            filesystem, path = storage.resolve(uri)
            filesystem.delete_file(path)
    files = [f for f in files if not f.rsplit("/", 1)[-1].startswith(ASST_FILE_PREFIX)]
    if not files:
        return {"written": 0, "skipped": {}}
    dataset = (
        parquet_dataset(files)  # the pairs just written (staged, not published yet)
        .select_columns(PAIR_SCHEMA.names)
        .map_batches(
            build_asst_rows,
            fn_kwargs={"seed": seed, "min_tokens": min_tokens},
            batch_format="pyarrow",
            batch_size=256,
        )
        .materialize()
    )
    reasons = Counter()
    for batch in dataset.select_columns(["reason"]).iter_batches(batch_format="pyarrow"):
        reasons.update(batch.column("reason").to_pylist())
    written = reasons.pop("", 0)
    if written:
        from ray.data.expressions import col

        built = dataset.filter(expr=col("reason") == "").select_columns(PAIR_SCHEMA.names)
        path, sink = storage.for_ray_write(data_uri)  # S3: santa's timeouts in the writers
        built.write_parquet(path, mode="append", filename_provider=_asst_file_names(), **sink)
    return {"written": written, "skipped": dict(sorted(reasons.items()))}


def _asst_file_names():
    """Ray Data file names with the ASST prefix (so a rerun finds and replaces them)."""
    from ray.data.datasource import FilenameProvider

    class AsstFileNames(FilenameProvider):
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"{ASST_FILE_PREFIX}{write_uuid}_{task_index:06}.parquet"

    return AsstFileNames()
