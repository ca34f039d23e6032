"""Fixtures the tests generate themselves, so a fresh clone passes without ../shared.

The code records are real: Python functions taken from this interpreter's standard
library, plus small hand-written functions in the other five languages. Those generators
live in ``bench/corpora.py`` (the benchmarks and the fault injection build the same data)
and are imported from there.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.corpora import (  # noqa: F401 - the tests import them from here
    other_language_records,
    stdlib_python_records,
    write_csn_layout,
    write_jsonl_gz,
)


def write_bad_input(path: Path, good: list[dict[str, Any]]) -> dict[str, int]:
    """A JSONL file mixing good records with one bad row per reason; returns the counts."""
    huge = dict(good[0], url="https://example.com/huge", code="def f():\n" + "    x = 1\n" * 5000)
    missing_code = {k: v for k, v in good[1].items() if k != "code"}
    empty_doc = dict(
        good[2], url="https://example.com/empty-doc", docstring="", docstring_tokens=[]
    )
    lines: list[bytes] = [json.dumps(record).encode() for record in good]
    lines.insert(1, json.dumps(good[3])[:40].encode())  # truncated JSON line
    lines.insert(3, json.dumps(missing_code).encode())
    lines.insert(5, b'{"code": "def f(): pass", "docstring": "caf\xe9"}')  # invalid UTF-8
    lines.insert(7, json.dumps(empty_doc).encode())
    lines.insert(9, json.dumps(huge).encode())
    lines.insert(11, json.dumps(good[4]).encode())  # exact duplicate of a good row
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return {
        "malformed_json": 1,
        "missing_field": 1,
        "undecodable_bytes": 1,
        "empty_docstring": 1,
        "too_long": 1,
        "duplicate": 1,
    }


def write_advtest(root: Path) -> None:
    """AdvTest-shaped files: CSN-format train, name-obfuscated ``function`` test records."""
    records = stdlib_python_records(limit=60)
    write_jsonl_gz(root / "train.jsonl.gz", records[:40])
    rows = []
    for index, record in enumerate(records[40:]):
        rows.append(
            {
                "url": record["url"],
                "function": record["code"].replace(record["func_name"].split(".")[-1], "Func", 1),
                "function_tokens": record["code_tokens"],
                "docstring": record["docstring"],
                "docstring_tokens": record["docstring_tokens"],
                "identifier": record["func_name"],
                "language": "python",
                "idx": index,
            }
        )
    (root / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_esci(root: Path, seed: int = 0) -> dict[str, Any]:
    """ESCI parquet files in the exact schema: products and judged examples."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    kinds = [
        ("Wireless Mouse", "mouse"),
        ("Coffee Grinder", "grinder"),
        ("Yoga Mat", "mat"),
        ("Desk Lamp", "lamp"),
        ("Water Bottle", "bottle"),
        ("Phone Case", "case"),
    ]
    products = []
    for index in range(24):
        name, noun = kinds[index % len(kinds)]
        locale = "us" if index < 20 else "es"
        products.append(
            {
                "product_id": f"B{index:09d}",
                "product_title": f"Acme {name} {index} with Travel Pouch",
                "product_description": (
                    f"<p>The <b>Acme</b> {noun} is built for daily use.<br>"
                    f"Each {noun} ships with a travel pouch &amp; a warranty card.</p>"
                ),
                "product_bullet_point": (
                    f"DURABLE {noun.upper()}: made from recycled materials\n"
                    f"PORTABLE: the pouch keeps the {noun} clean\nWARRANTY: two years"
                )
                if index % 7
                else "",
                "product_brand": "Acme",
                "product_color": rng.choice(["black", "red", None]),
                "product_locale": locale,
            }
        )
    examples = []
    queries = [
        ("wireless mouse for laptop", "mouse"),
        ("burr coffee grinder", "grinder"),
        ("thick yoga mat", "mat"),
        ("led desk lamp", "lamp"),
    ]
    example_id = 0
    for query_id, (query, noun) in enumerate(queries):
        split = "test" if query_id == 3 else "train"
        # The test query judges its own products, so pretraining keeps the others.
        judged = products[12:20] if split == "test" else products[:20]
        for product in judged:
            example_id += 1
            label = "E" if noun in product["product_title"].lower() else rng.choice("SCI")
            examples.append(
                {
                    "example_id": example_id,
                    "query": query,
                    "query_id": query_id,
                    "product_id": product["product_id"],
                    "product_locale": "us",
                    "esci_label": label,
                    "small_version": 1 if product["product_id"] < "B000000016" else 0,
                    "large_version": 1,
                    "split": split,
                }
            )
    products_schema = pa.schema([(name, pa.string()) for name in products[0]])
    examples_schema = pa.schema(
        [
            ("example_id", pa.int64()),
            ("query", pa.string()),
            ("query_id", pa.int64()),
            ("product_id", pa.string()),
            ("product_locale", pa.string()),
            ("esci_label", pa.string()),
            ("small_version", pa.int64()),
            ("large_version", pa.int64()),
            ("split", pa.string()),
        ]
    )
    pq.write_table(
        pa.Table.from_pylist(products, products_schema),
        root / "shopping_queries_dataset_products.parquet",
    )
    pq.write_table(
        pa.Table.from_pylist(examples, examples_schema),
        root / "shopping_queries_dataset_examples.parquet",
    )
    return {"products": products, "examples": examples}
