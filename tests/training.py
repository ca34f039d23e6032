"""Shared helpers of the training tests: a small tiny-T5 config and pair tables on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from santa.config import SantaConfig
from santa.data.records import PairOptions, build_code_pair
from santa.data.schema import PAIR_SCHEMA, rows_to_table
from santa.recipes import get_recipe
from tests.datagen import stdlib_python_records


def tiny_config(negatives: dict[str, Any] | None = None, **train: Any) -> SantaConfig:
    """The tiny recipe at test size (batch 8, short sequences), with ``train.*`` overrides
    and ``negatives.*`` ones (``negatives={"source": "async", "per_query": 1}``)."""
    overrides = [f"train.{key}={value}" for key, value in train.items()]
    overrides += [f"negatives.{key}={value}" for key, value in (negatives or {}).items()]
    return get_recipe("tiny").with_overrides(
        [
            "train.global_batch_size=8",
            "train.max_query_length=24",
            "train.max_document_length=96",
            "train.max_target_length=32",
            "model.tiny_vocab_size=2000",
            *overrides,
        ]
    )


def stdlib_pair_rows() -> list[dict[str, Any]]:
    """Pretraining pair rows built from real standard-library functions."""
    rows = [build_code_pair(r, "source", PairOptions()) for r in stdlib_python_records()]
    return [dict(row, drop_reason="", row_key="") for row in rows]


def write_pairs(root: Path, rows: list[dict[str, Any]]) -> str:
    """Write pair rows the way the preprocess job does (``root/data/*.parquet``)."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    table = rows_to_table(rows).select(PAIR_SCHEMA.names)
    pq.write_table(table, root / "data" / "part-0.parquet")
    return str(root)


def write_beir(root: Path, rows: list[dict[str, Any]], split: str = "test") -> str:
    """A BEIR folder (corpus, queries, qrels/{split}.tsv) of held-out query–document rows."""
    import json

    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w") as corpus, open(root / "queries.jsonl", "w") as queries:
        for i, row in enumerate(rows):
            corpus.write(json.dumps({"_id": f"d{i}", "title": "", "text": row["document"]}) + "\n")
            queries.write(json.dumps({"_id": f"q{i}", "text": row["query"]}) + "\n")
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in range(len(rows))]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return str(root)
