"""Fixtures the tests generate themselves, so a fresh clone passes without ../shared.

The code records are real: Python functions taken from this interpreter's standard
library, plus small hand-written functions in the other five languages. Those generators
live in ``bench/corpora.py`` (the benchmarks and the fault injection build the same data)
and are imported from there.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from bench.corpora import (  # noqa: F401 - the tests import them from here
    NOUNS,
    STDLIB_MODULES,
    other_language_records,
    stdlib_python_records,
    write_csn_layout,
    write_esci,
    write_esci_tables,
    write_jsonl_gz,
)
from santa.data.source import default_source_root, extract_functions


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


# ------------------------------------------------------------------ ../shared stand-ins

# Modules whose documented functions stand in for AdvTest's Python (after STDLIB_MODULES).
MORE_STDLIB_MODULES = ("difflib.py", "inspect.py", "tarfile.py", "configparser.py", "typing.py")
COSQA_VERBS = ("sort", "merge", "count", "filter", "reverse", "flatten", "group", "split")
COSQA_NOUNS = ("list", "dict", "string", "file", "tuple", "set", "array", "lines", "words")


def stdlib_records(count: int) -> list[dict[str, Any]]:
    """``count`` documented stdlib functions (CodeSearchNet format), distinct code."""
    root = default_source_root()
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    for module in (*STDLIB_MODULES, *MORE_STDLIB_MODULES):
        with open(os.path.join(root, module), encoding="utf-8") as handle:
            for record in extract_functions(handle.read(), module, "python", repo="stdlib"):
                if record["code"] not in seen and record["docstring_tokens"]:
                    seen.add(record["code"])
                    records.append(record)
        if len(records) >= count:
            return records[:count]
    raise ValueError(f"only {len(records)} documented stdlib functions found, {count} asked")


def write_advtest_sample(root: Path, count: int = 100) -> None:
    """AdvTest-shaped samples as ../shared has them: ``train_sample.jsonl`` (CodeSearchNet
    rows) and ``test_sample.jsonl`` (``function`` with names obfuscated, ``idx``)."""
    records = stdlib_records(2 * count)
    root.mkdir(parents=True, exist_ok=True)
    train = [
        dict(record, partition="train", idx=str(i)) for i, record in enumerate(records[:count])
    ]
    test = []
    for index, record in enumerate(records[count:]):
        name = record["func_name"].split(".")[-1]
        test.append(
            {
                "url": record["url"],
                "function": record["code"].replace(f"def {name}(", "def Func(", 1),
                "function_tokens": record["code_tokens"],
                "docstring": record["docstring"],
                "docstring_tokens": record["docstring_tokens"],
                "identifier": record["func_name"],
                "language": "python",
                "idx": str(10_000 + index),
            }
        )
    for name, rows in (("train_sample", train), ("test_sample", test)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def ruby_valid_records(count: int = 1400) -> list[dict[str, Any]]:
    """Documented Ruby functions of CodeSearchNet's shape (``partition`` valid)."""
    records = other_language_records("ruby", count)
    for index, record in enumerate(records):
        noun = NOUNS[index % len(NOUNS)]
        record["docstring"] = f"Returns the {noun} of entry {index}, doubled."
        record["docstring_tokens"] = ["Returns", "the", noun, "of", "entry", str(index), "doubled"]
        record["code"] = record["original_string"] = record["code"].replace(
            f"def get_{noun}{index}(", f"def get_{noun}_of_entry_{index}("
        )
        record["partition"] = "valid"
    return records


def write_cosqa_sample(
    path: Path, functions: int = 552, positives: int = 313, shared: int = 23
) -> Path:
    """A CoSQA-shaped JSON array: ``positives`` queries labelled 1 against their function
    (``shared`` of them against a function another positive query has), other queries
    labelled 0, ``functions`` distinct functions in all (../shared's sample has 604
    records, 313 positive, 552 functions)."""
    rng = random.Random(0)
    codes, docs = [], []
    for index in range(functions):
        verb = COSQA_VERBS[index % len(COSQA_VERBS)]
        noun = COSQA_NOUNS[(index // len(COSQA_VERBS)) % len(COSQA_NOUNS)]
        codes.append(
            f"def {verb}_{noun}_{index}(items, key=None):\n"
            f'    """{verb.capitalize()} the {noun} given, variant {index}."""\n'
            f"    result = {verb}(items) if key is None else {verb}(items, key)\n"
            f"    return result[:{index % 7 + 1}]\n"
        )
        docs.append(f"python {verb} {noun} {index}")
    records = []
    # As in the real sample, some functions answer several queries: the last ``shared``
    # positives reuse the first functions.
    distinct = positives - shared
    for index in range(positives):
        code_index = index if index < distinct else index - distinct
        query = docs[index] if index < distinct else f"{docs[code_index]} again"
        records.append({"idx": f"cosqa-dev-{index}", "doc": query, "code": codes[code_index]})
        records[-1]["label"] = 1
    negatives = list(range(distinct, functions))
    negatives += rng.sample(range(distinct), 604 - positives - len(negatives))
    for number, code_index in enumerate(negatives):
        query = docs[(code_index + 1) % functions]
        records.append(
            {"idx": f"cosqa-dev-{positives + number}", "doc": query, "code": codes[code_index]}
        )
        records[-1]["label"] = 0
    for record in records:
        record["code_tokens"] = record["code"].split()
        record["docstring_tokens"] = record["doc"].split()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return path


def write_shared_fixtures(root: Path) -> Path:
    """A stand-in for ../shared/fixtures, same layout and sizes, for a clone without it:
    ``csn/ruby/valid.jsonl.gz``, ``advtest/{train,test}_sample.jsonl``, ``esci/*.parquet``
    (one judged test query) and ``cosqa/cosqa-dev.json``."""
    write_jsonl_gz(root / "csn" / "ruby" / "valid.jsonl.gz", ruby_valid_records())
    write_advtest_sample(root / "advtest")
    write_esci(root / "esci")
    write_cosqa_sample(root / "cosqa" / "cosqa-dev.json")
    return root


def write_esci_splits(root: Path, train_queries: int = 24, test_queries: int = 4) -> dict:
    """ESCI parquet files with enough queries to carve a dev split from train.

    Each query judges four US products (one Exact at least, except the last train query,
    all Irrelevant). Even products have HTML descriptions, odd ones plain text. Product id
    ``BSHARED`` exists in the US and the ES locale with different titles; a US query judges
    the US one (query 1000) and an ES query the ES one.
    """
    root.mkdir(parents=True, exist_ok=True)
    products = []
    for index in range(40):
        noun = NOUNS[index % len(NOUNS)]
        description = f"The Acme {noun} meter {index} measures {noun} quickly"
        products.append(
            {
                "product_id": f"B{index:04d}",
                "product_title": f"Acme {noun.capitalize()} Meter {index}",
                "product_description": f"<p>{description}</p>" if index % 2 == 0 else description,
                "product_bullet_point": f"ACCURATE: reads {noun}\nLIGHT: fits a pocket",
                "product_brand": "Acme",
                "product_color": "black",
                "product_locale": "us",
            }
        )
    shared = {
        "product_id": "BSHARED",
        "product_description": "<p>Shared id, two products</p>",
        "product_bullet_point": "ONE: two",
        "product_brand": "Acme",
        "product_color": None,
    }
    products.append({**shared, "product_title": "US Shared Lamp", "product_locale": "us"})
    products.append({**shared, "product_title": "Lampara Compartida", "product_locale": "es"})
    examples = []
    labels = ("E", "S", "C", "I")
    for query in range(train_queries + test_queries):
        split = "train" if query < train_queries else "test"
        judged = [f"B{(query * 3 + k) % 40:04d}" for k in range(4)]
        if query == 0:
            judged[3] = "BSHARED"
        for k, product_id in enumerate(judged):
            label = "I" if query == train_queries - 1 else labels[k]
            examples.append(
                {
                    "example_id": len(examples),
                    "query": f"{NOUNS[query % len(NOUNS)]} meter query {query}",
                    "query_id": 1000 + query,
                    "product_id": product_id,
                    "product_locale": "us",
                    "esci_label": label,
                    "small_version": 1,
                    "large_version": 1,
                    "split": split,
                }
            )
    examples.append(
        {
            "example_id": len(examples),
            "query": "lampara",
            "query_id": 9999,
            "product_id": "BSHARED",
            "product_locale": "es",
            "esci_label": "E",
            "small_version": 1,
            "large_version": 1,
            "split": "train",
        }
    )
    return write_esci_tables(root, products, examples)
