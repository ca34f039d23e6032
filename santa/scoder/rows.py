"""SCodeR's listwise examples as the training loop reads them (light to import: the worker
starts reading them before it imports the objectives)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from santa.data.published import parquet_files
from santa.files import storage
from santa.train.rows import RowSource

__all__ = ["LISTWISE", "LISTWISE_SCHEMA", "listwise_data", "listwise_source"]

LISTWISE_SCHEMA = pa.schema(
    [
        ("query_id", pa.string()),
        ("kind", pa.string()),  # text_code (D_φ) | code_code (D_ψ)
        ("query", pa.string()),
        ("candidates", pa.list_(pa.string())),  # the positive first
        ("heldout", pa.bool_()),  # never trained on by the discriminators
    ]
)
LISTWISE = "listwise examples"  # what the readers' errors call them


SCORES = "scores"
"""The discriminators' scores of each candidate (offline soft labels), where written."""


def listwise_source(uri: str) -> RowSource:
    """The listwise rows under ``uri/data`` (every row trains: the writer left out the
    held-out ones), with their soft labels (``scores``) where the folder has them."""
    return RowSource(
        files=tuple(parquet_files(storage.join(uri, "data"), LISTWISE)),
        columns=tuple(LISTWISE_SCHEMA.names),
        optional=(SCORES,),
    )


def _as_table(rows: pa.Table) -> pa.Table:
    return rows


def listwise_data(loop) -> Any:
    """The ``discriminators`` and ``dual_encoder`` objectives' data: listwise rows, handed
    to the objective as a Table (it tokenizes them itself)."""
    from santa.train.loop_config import TrainingData

    return TrainingData(source=listwise_source(loop.data_uri), collate=_as_table)
