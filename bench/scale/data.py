"""Data of the papers' sizes for the scale bench, generated here (no download).

- :func:`write_codesearchnet`: ``n`` CodeSearchNet-format records in its layout
  (``ruby/final/jsonl/{train,test}/*.jsonl.gz``, shards of 30,000 records as the release's),
  made from real functions (the Ruby fixture of ``../shared``, else this Python's standard
  library) copied with renamed identifiers: copy ``k`` of a function renames every word of
  its name and of its docstring's first identifier-like word with a ``_k`` suffix, so no two
  rows are duplicates and the code keeps its shape, lengths and entity ratio.
- :func:`write_esci`: the ESCI release's two Parquet files in its exact schema at its real
  size (1.8 M products, 2.6 M judgments over about 130 k queries by default), with the
  release's label shares (E 65 %, S 22 %, C 3 %, I 10 %), HTML in the descriptions,
  bullet points, ``small_version`` on about a third of the queries and a train/test split.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
RUBY_FIXTURE = ROOT.parent / "shared" / "fixtures" / "csn" / "ruby" / "valid.jsonl.gz"
SHARD_RECORDS = 30_000
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def base_functions() -> tuple[str, list[dict[str, Any]]]:
    """Real documented functions: the Ruby fixture's, else the standard library's."""
    if RUBY_FIXTURE.exists():
        with gzip.open(RUBY_FIXTURE, "rt", encoding="utf-8") as handle:
            return "ruby", [json.loads(line) for line in handle if line.strip()]
    from bench.corpora import stdlib_python_records

    return "python", stdlib_python_records()


def _renamed(record: dict[str, Any], copy: int, partition: str) -> dict[str, Any]:
    """Copy ``copy`` of ``record``: its name's words suffixed ``_copy`` everywhere."""
    if copy == 0:
        return dict(record, partition=partition)
    name = record["func_name"].split(".")[-1]
    words = {w for w in _WORD.findall(name) if len(w) > 1}
    if not words:
        words = {"x"}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(words))) + r")\b")

    def rename(text: str) -> str:
        return pattern.sub(lambda m: f"{m.group(1)}_{copy}", text)

    code = rename(record["code"])
    docstring = record["docstring"] + f" (variant {copy})"
    return dict(
        record,
        func_name=rename(record["func_name"]),
        code=code,
        original_string=rename(record["original_string"]),
        code_tokens=[rename(t) for t in record["code_tokens"]],
        docstring=docstring,
        docstring_tokens=[*record["docstring_tokens"], "variant", str(copy)],
        url=f"{record['url']}#copy{copy}",
        partition=partition,
    )


def write_codesearchnet(root: Path, n: int, test: int = 0, seed: int = 0) -> dict[str, Any]:
    """``n`` training and ``test`` test records under ``root``; returns what was written.
    Kept: a folder with a ``done`` marker for the same sizes is reused."""
    marker = root / "done.json"
    wanted = {"n": n, "test": test, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return wanted
    language, functions = base_functions()
    rng = random.Random(seed)
    rng.shuffle(functions)

    def records(count: int, first_copy: int, partition: str):
        for index in range(count):
            function = functions[index % len(functions)]
            yield _renamed(function, first_copy + index // len(functions), partition)

    copies_for_train = -(-n // len(functions))
    for split, count, first in (("train", n, 0), ("test", test, copies_for_train)):
        folder = root / language / "final" / "jsonl" / split
        folder.mkdir(parents=True, exist_ok=True)
        shard, handle, written = 0, None, 0
        for record in records(count, first, split):
            if handle is None or written == SHARD_RECORDS:
                if handle is not None:
                    handle.close()
                path = folder / f"{language}_{split}_{shard}.jsonl.gz"
                handle = gzip.open(path, "wt", encoding="utf-8", compresslevel=1)  # noqa: SIM115
                shard, written = shard + 1, 0
            handle.write(json.dumps(record) + "\n")
            written += 1
        if handle is not None:
            handle.close()
    marker.write_text(json.dumps(wanted))
    return {**wanted, "language": language}


NOUNS = [
    "mouse",
    "keyboard",
    "lamp",
    "bottle",
    "case",
    "charger",
    "cable",
    "speaker",
    "headphones",
    "blender",
    "grinder",
    "kettle",
    "mat",
    "pillow",
    "blanket",
    "towel",
    "jacket",
    "shoe",
    "backpack",
    "wallet",
    "watch",
    "camera",
    "tripod",
    "router",
    "drill",
    "hammer",
    "wrench",
    "saw",
    "glove",
    "helmet",
    "tent",
    "stove",
    "lantern",
    "knife",
    "pan",
    "pot",
    "mug",
    "plate",
    "bowl",
    "cup",
]
ADJECTIVES = [
    "wireless",
    "portable",
    "durable",
    "compact",
    "premium",
    "waterproof",
    "rechargeable",
    "stainless",
    "ergonomic",
    "lightweight",
    "heavy-duty",
    "adjustable",
    "foldable",
    "organic",
    "vintage",
    "classic",
    "modern",
    "smart",
]
BRANDS = [f"Brand{i}" for i in range(500)]
LABELS = ("E", "S", "C", "I")
LABEL_SHARES = (0.65, 0.22, 0.03, 0.10)


def _product(index: int, rng: random.Random) -> dict[str, Any]:
    noun = NOUNS[index % len(NOUNS)]
    adjectives = rng.sample(ADJECTIVES, 3)
    brand = BRANDS[index % len(BRANDS)]
    title = f"{brand} {adjectives[0].title()} {noun.title()} {index} for Home and Travel"
    description = (
        f"<p>The <b>{brand}</b> {adjectives[1]} {noun} is made for everyday use.<br>"
        f"This {noun} comes with a {adjectives[2]} {NOUNS[(index * 7) % len(NOUNS)]} and a "
        f"two year warranty &amp; free returns. Model {index}.</p>"
    )
    bullets = "\n".join(
        f"{word.upper()} {noun.upper()}: {rng.choice(ADJECTIVES)} design for {rng.choice(NOUNS)}"
        for word in adjectives
    )
    return {
        "product_id": f"B{index:09d}",
        "product_title": title,
        "product_description": description if index % 5 else None,
        "product_bullet_point": bullets if index % 9 else None,
        "product_brand": brand,
        "product_color": rng.choice(["black", "white", "red", None]),
        "product_locale": "us",
    }


def write_esci(
    root: Path, products: int = 1_800_000, judgments: int = 2_600_000, seed: int = 0
) -> dict[str, Any]:
    """The ESCI release's two files at ``products`` / ``judgments`` (kept when done)."""
    from santa.data.plan import ESCI_EXAMPLE_COLUMNS  # the columns the reader reads

    marker = root / "done.json"
    wanted = {"products": products, "judgments": judgments, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return wanted
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    product_rows = [_product(index, rng) for index in range(products)]
    products_schema = pa.schema([(name, pa.string()) for name in product_rows[0]])
    pq.write_table(
        pa.Table.from_pylist(product_rows, products_schema),
        root / "shopping_queries_dataset_products.parquet",
    )
    del product_rows
    queries = max(1, judgments // 20)
    columns: dict[str, list[Any]] = {name: [] for name in ("example_id", *ESCI_EXAMPLE_COLUMNS)}
    for example in range(judgments):
        query_id = example % queries
        noun = NOUNS[query_id % len(NOUNS)]
        product = rng.randrange(products)
        columns["example_id"].append(example)
        columns["query"].append(f"{ADJECTIVES[query_id % len(ADJECTIVES)]} {noun} {query_id}")
        columns["query_id"].append(query_id)
        columns["product_id"].append(f"B{product:09d}")
        columns["product_locale"].append("us")
        columns["esci_label"].append(rng.choices(LABELS, LABEL_SHARES)[0])
        columns["small_version"].append(1 if query_id % 3 == 0 else 0)
        columns["large_version"].append(1)
        columns["split"].append("test" if query_id % 10 == 0 else "train")
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
        pa.table(columns, schema=examples_schema),
        root / "shopping_queries_dataset_examples.parquet",
    )
    marker.write_text(json.dumps(wanted))
    return wanted
