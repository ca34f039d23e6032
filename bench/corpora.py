"""The data the benchmarks build: real code from this interpreter's standard library.

- ``stdlib_python_records`` / ``stdlib_pair_rows``: the documented functions of eight
  standard-library modules (105 docstring → code pairs), the training set of
  ``versus_st.py``, ``versus_st_quality.py``, ``cosqa_transfer.py`` and
  ``minilm_similarity.py`` (and of the tests, which import it from here);
- ``write_stdlib_pairs``: up to ``limit`` pairs from the whole standard library;
- ``write_pairs`` / ``write_beir``: pair rows and BEIR folders on disk, as the
  preprocessing job writes them;
- ``other_language_records`` / ``write_csn_layout``: small well-formed functions in the
  tree-sitter languages and a CodeSearchNet folder tree of them (the fault injection's
  inputs).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from santa.data.records import PairOptions, build_code_pair
from santa.data.schema import PAIR_SCHEMA, rows_to_table
from santa.data.source import SourceRecords, default_source_root, extract_functions

STDLIB_MODULES = (
    "json/decoder.py",
    "json/encoder.py",
    "textwrap.py",
    "shlex.py",
    "csv.py",
    "fractions.py",
    "string.py",
    "calendar.py",
)

# CodeSearchNet's `code` for these languages excludes the doc comment, as here.
OTHER_LANGUAGE_TEMPLATES = {
    "java": (
        "public int get{Noun}(int {thing}Count, String label) {{\n"
        "    int total = {thing}Count * 2;\n    return total + label.length();\n}}"
    ),
    "go": (
        "func Get{Noun}({thing}Count int, label string) int {{\n"
        "\ttotal := {thing}Count * 2\n\treturn total + len(label)\n}}"
    ),
    "javascript": (
        "function get{Noun}({thing}Count, label) {{\n"
        "  const total = {thing}Count * 2;\n  return total + label.length;\n}}"
    ),
    "ruby": "def get_{noun}({thing}_count, label)\n  total = {thing}_count * 2\n  total + label.length\nend",
    "php": (
        "function get{Noun}(${thing}Count, $label) {{\n"
        "    $total = ${thing}Count * 2;\n    return $total + strlen($label);\n}}"
    ),
}
NOUNS = ("size", "width", "weight", "price", "score", "depth", "count", "height", "speed")
THINGS = ("box", "item", "order", "cart", "page", "node", "file", "user")


def stdlib_python_records(limit: int | None = None) -> list[dict[str, Any]]:
    """CodeSearchNet-format records of documented functions from a few stdlib modules."""
    root = default_source_root()
    records: list[dict[str, Any]] = []
    for module in STDLIB_MODULES:
        path = os.path.join(root, module)
        with open(path, encoding="utf-8") as handle:
            records.extend(extract_functions(handle.read(), module, "python", repo="stdlib"))
    return records[:limit] if limit else records


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


def write_stdlib_pairs(workdir: Path, limit: int = 8000) -> str:
    """Up to ``limit`` pretraining pairs from the whole standard library in
    ``workdir/pairs`` (kept: a second call with the same folder reuses them)."""
    data = workdir / "pairs"
    if (data / "data" / "part-0.parquet").exists():
        return str(data)
    rows = []
    for record in SourceRecords(default_source_root(), languages=["python"]):
        try:
            rows.append(
                dict(build_code_pair(record, "source", PairOptions()), drop_reason="", row_key="")
            )
        except Exception:  # noqa: BLE001 - a row the job would drop is no loss to a benchmark
            continue
        if len(rows) >= limit:
            break
    return write_pairs(data, rows)


def write_beir(root: Path, rows: list[dict[str, Any]], split: str = "test") -> str:
    """A BEIR folder (corpus, queries, qrels/{split}.tsv) of held-out query–document rows."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w") as corpus, open(root / "queries.jsonl", "w") as queries:
        for i, row in enumerate(rows):
            corpus.write(json.dumps({"_id": f"d{i}", "title": "", "text": row["document"]}) + "\n")
            queries.write(json.dumps({"_id": f"q{i}", "text": row["query"]}) + "\n")
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in range(len(rows))]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return str(root)


def other_language_records(language: str, count: int = 20) -> list[dict[str, Any]]:
    """Hand-written but well-formed functions in one of the tree-sitter languages."""
    records = []
    for index in range(count):
        noun = NOUNS[index % len(NOUNS)]
        thing = THINGS[(index // len(NOUNS)) % len(THINGS)]
        code = OTHER_LANGUAGE_TEMPLATES[language].format(
            noun=f"{noun}{index}", Noun=f"{noun.capitalize()}{index}", thing=thing
        )
        docstring = f"Returns the {noun} of the {thing}."
        records.append(
            {
                "repo": "generated/repo",
                "path": f"src/{language}/file{index}.{language[:2]}",
                "func_name": f"get{noun.capitalize()}{index}",
                "original_string": code,
                "language": language,
                "code": code,
                "code_tokens": code.split(),
                "docstring": docstring,
                "docstring_tokens": docstring.rstrip(".").split(),
                "url": f"https://example.com/{language}/{index}",
                "partition": "",
            }
        )
    return records


def write_jsonl_gz(path: Path, records: list[dict[str, Any]]) -> Path:
    """Write records as a gzipped JSON-lines file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


def write_csn_layout(
    root: Path, languages=("python", "java", "go", "javascript", "ruby", "php")
) -> dict:
    """A CodeSearchNet tree ``{lang}/final/jsonl/{split}/*.jsonl.gz``; returns url sets."""
    urls: dict[str, set[str]] = {"train": set(), "valid": set(), "test": set()}
    for language in languages:
        if language == "python":
            records = stdlib_python_records(limit=120)
        else:
            records = other_language_records(language, count=30)
        cut_valid, cut_test = int(len(records) * 0.7), int(len(records) * 0.85)
        parts = {
            "train": records[:cut_valid],
            "valid": records[cut_valid:cut_test],
            "test": records[cut_test:],
        }
        for split, part in parts.items():
            for record in part:
                record["partition"] = split
                urls[split].add(record["url"])
            write_jsonl_gz(
                root / language / "final" / "jsonl" / split / f"{language}_{split}_0.jsonl.gz", part
            )
    return urls


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
    return write_esci_tables(root, products, examples)


def write_esci_tables(
    root: Path, products: list[dict[str, Any]], examples: list[dict[str, Any]]
) -> dict[str, Any]:
    """``products`` and ``examples`` as the ESCI release's two Parquet files (its schema)."""
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
