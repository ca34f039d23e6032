"""Arrow schemas of what the preprocessing pipeline writes (see README, "Data schemas")."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

CODE_LANGUAGES = ("python", "java", "go", "javascript", "ruby", "php")
"""The programming languages santa reads, finds entities in and evaluates by."""
ESCI_LABEL_GRADES = {"E": 3, "S": 2, "C": 1, "I": 0}
"""ESCI judgments (Exact, Substitute, Complement, Irrelevant) as graded ``label`` values."""
ESCI_EXACT = ESCI_LABEL_GRADES["E"]
"""The grade of an Exact judgment, the only relevant one in binary metrics."""

# One row per training pair. Text only: tokenization happens in the training input pipeline,
# so one preprocessed corpus serves any backbone.
PAIR_SCHEMA = pa.schema(
    [
        ("id", pa.string()),  # stable id of the pair
        ("dataset", pa.string()),  # codesearchnet | advtest | esci | source
        (
            "kind",
            pa.string(),
        ),  # code_pair | asst | product_pretrain | product_judgment (data.kinds)
        ("language", pa.string()),  # programming language, or the ESCI locale
        ("query_id", pa.string()),
        ("query", pa.string()),  # docstring / bullet point / search query
        ("doc_id", pa.string()),  # CodeSearchNet url / ESCI product_id
        ("title", pa.string()),  # function name / product title
        ("document", pa.string()),  # code without its docstring / product description
        ("label", pa.int8()),  # 1 for code pairs; ESCI E/S/C/I as 3/2/1/0
        ("entities", pa.list_(pa.string())),  # entity k is masked by <extra_id_k>
        ("masked_document", pa.string()),  # pretraining only
        ("mep_target", pa.string()),  # "<extra_id_0> ent_0 <extra_id_1> ent_1 ..."
        ("num_tokens", pa.int32()),  # word/punctuation tokens of the document
        ("num_masked_tokens", pa.int32()),  # of which masked
        ("url", pa.string()),
    ]
)

# Columns the pipeline carries between its stages and drops before writing.
INTERNAL_FIELDS = [
    ("dedup_key", pa.string()),  # rows with equal keys are duplicates
    ("row_key", pa.string()),  # input position ("path:line"), orders duplicates
    ("drop_reason", pa.string()),  # "" for kept rows
    ("drop_detail", pa.string()),  # what failed, for rows that stand for a whole file
]
WORK_SCHEMA = pa.schema(list(PAIR_SCHEMA) + [pa.field(n, t) for n, t in INTERNAL_FIELDS])

# What a raw reader hands to the pair builders: one input record per row.
RAW_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("line_number", pa.int64()),
        ("raw", pa.binary()),  # one JSON line, undecoded
        ("split", pa.string()),  # split known from the path ("" when unknown)
        ("drop_reason", pa.string()),  # set by a reader that already rejected the row
    ]
)


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema = WORK_SCHEMA) -> pa.Table:
    """Build a table with exactly ``schema`` from row dicts (missing keys become null)."""
    return pa.Table.from_pylist(rows, schema=schema)
