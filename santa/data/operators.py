"""Ray Data operators of the preprocessing pipeline: raw rows in, work rows out.

Plain classes and functions (``santa.data.records`` does the per-record work); the driver
(``santa.data.plan``) maps them over its datasets and does the accounting.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from santa.data.readers import SPLIT_ALIASES, language_from_path, relative_path
from santa.data.records import (
    DropRow,
    PairOptions,
    Reason,
    build_code_pair,
    build_product_judgment_row,
    build_product_pretrain_pair,
    normalize_advtest,
    normalize_codesearchnet,
    parse_json_line,
)
from santa.data.schema import PAIR_SCHEMA, RAW_SCHEMA, rows_to_table
from santa.data.source import EXTENSIONS, decode_source, extract_functions
from santa.method.entities import ensure_pos_tagger

# Marks rows of held-out splits read only for their keys; reported as filtered other_split.
HELDOUT_MARK = "__heldout__"


class ProgressCounter:
    """What the operators have done so far (source files parsed, JSON lines read), for the
    driver's progress lines: run as a Ray actor of no CPU, added to once per batch."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, count: int) -> None:
        """``count`` more units done."""
        self.count += int(count)

    def value(self) -> int:
        """The units done so far."""
        return self.count


def _count(counter: Any, count: int) -> None:
    """Tell the driver's counter (a Ray actor handle, or None) without waiting for it."""
    if counter is not None:
        counter.add.remote(count)


class CodePairBuilder:
    """Ray Data operator: raw JSON lines → pair rows (or dropped rows with a reason)."""

    def __init__(
        self,
        dataset: str,
        options: PairOptions,
        split: str | tuple[str, ...],
        heldout_splits: tuple[str, ...],
        languages: tuple[str, ...],
        root: str,
        counter: Any = None,
    ):
        self.counter = counter  # rows read, for the driver's progress lines
        self.root = root
        self.dataset = dataset
        self.options = options
        self.splits = {split} if isinstance(split, str) else set(split)
        self.heldout_splits = set(heldout_splits)
        self.heldout_options = PairOptions(
            stage="eval",
            max_query_chars=options.max_query_chars,
            max_document_chars=options.max_document_chars,
        )
        self.languages = set(languages)

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Process one batch of raw rows."""
        columns = batch.to_pydict()
        rows = []
        for path, line_number, raw, file_split, preset_reason in zip(
            columns["path"],
            columns["line_number"],
            columns["raw"],
            columns["split"],
            columns["drop_reason"],
            strict=True,
        ):
            language = language_from_path(relative_path(path, self.root))
            try:
                if preset_reason:
                    raise DropRow(preset_reason)
                record = parse_json_line(raw)
                if self.dataset == "advtest":
                    record = normalize_advtest(record)
                else:
                    record = normalize_codesearchnet(record)
                language = record["language"]
                split = file_split or SPLIT_ALIASES.get(record["partition"].lower(), "")
                if self.languages and language not in self.languages:
                    raise DropRow(Reason.OTHER_LANGUAGE)
                if split in self.heldout_splits:
                    # Only the keys of a held-out row are needed, to keep it out of training.
                    row = build_code_pair(record, self.dataset, self.heldout_options)
                    row["drop_reason"] = HELDOUT_MARK
                elif split in self.splits or not split:
                    # A file of unknown split belongs to the split asked for.
                    row = build_code_pair(record, self.dataset, self.options)
                    row["drop_reason"] = ""
                else:
                    raise DropRow(Reason.OTHER_SPLIT)
            except DropRow as drop:
                row = {"language": language, "drop_reason": drop.reason}
                if preset_reason:  # a reader's row for a whole file: its message says why
                    row["drop_detail"] = raw.decode("utf-8", "replace")
            row["row_key"] = f"{path}:{line_number:010d}"
            rows.append(row)
        _count(self.counter, batch.num_rows)
        return rows_to_table(rows)


def build_code_pairs(batch: pa.Table, **builder_args: Any) -> pa.Table:
    """Ray Data function: :class:`CodePairBuilder` (built from ``builder_args``) on one batch.

    The pipeline maps this as Ray tasks rather than an actor pool: the builder holds no
    state worth keeping (its parsers and the tagger are cached per process, and task
    workers are reused from task to task), and a pool costs every job one worker process
    per CPU to start, and every operator after it another, as the actors' processes exit
    with the pool (seconds a job on a small cluster; most of a small job). The class itself
    is the pool's operator where ``min_actors`` asks for more parsers than the cluster
    holds (``santa.data.plan._parsers``).
    """
    return CodePairBuilder(**builder_args)(batch)


def extract_source_records(batch: pa.Table, root: str, repo: str, counter: Any = None) -> pa.Table:
    """Ray Data function: source files → CodeSearchNet-format JSON lines (raw rows).

    A plain function, run as Ray tasks (fused with :func:`build_code_pairs`).
    """
    columns = batch.to_pydict()
    out: dict[str, list] = {name: [] for name in RAW_SCHEMA.names}

    def emit(path: str, line: int, raw: bytes, split: str, reason: str) -> None:
        for name, value in zip(RAW_SCHEMA.names, (path, line, raw, split, reason), strict=True):
            out[name].append(value)

    for path, data in zip(columns["path"], columns["bytes"], strict=True):
        relative = relative_path(path, root)
        language = EXTENSIONS.get("." + relative.rsplit(".", 1)[-1], "")
        try:
            records = extract_functions(decode_source(data), relative, language, repo=repo)
        except UnicodeDecodeError as error:
            emit(path, 0, f"{path}: {error}".encode(), "", Reason.UNDECODABLE_BYTES)
            continue
        except (SyntaxError, ValueError, RecursionError) as error:
            message = f"{path}: {type(error).__name__}: {error}"
            emit(path, 0, message.encode(), "", Reason.UNPARSABLE_CODE)
            continue
        for index, record in enumerate(records, start=1):
            raw = json.dumps(record, ensure_ascii=False).encode("utf-8")
            emit(path, index, raw, record.get("partition", ""), "")
    _count(counter, batch.num_rows)  # files parsed, for the driver's progress lines
    return pa.table(out, schema=RAW_SCHEMA)


class ProductPairBuilder:
    """Ray Data operator: ESCI products → bullet point ↔ description pretraining pairs."""

    def __init__(self, options: PairOptions, locale: str):
        ensure_pos_tagger()  # fail fast on a node without the tagger, not per row
        self.options = options
        self.locale = locale

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Process one batch of product rows."""
        rows = []
        for product in batch.to_pylist():
            locale = product.get("product_locale") or ""
            try:
                if locale != self.locale:
                    raise DropRow(Reason.OTHER_LOCALE)
                row = build_product_pretrain_pair(product, self.options)
                row["drop_reason"] = ""
            except DropRow as drop:
                row = {"language": locale, "drop_reason": drop.reason}
            row["row_key"] = str(product.get("product_id"))
            rows.append(row)
        return rows_to_table(rows)


def build_product_pairs(batch: pa.Table, **builder_args: Any) -> pa.Table:
    """Ray Data function: :class:`ProductPairBuilder` (built from ``builder_args``) on one
    batch; as Ray tasks, as :func:`build_code_pairs` (the tagger is loaded once a process)."""
    return ProductPairBuilder(**builder_args)(batch)


class ProductJudgmentBuilder:
    """Ray Data operator: ESCI products → one row per (query, product) judgment.

    The judgments (small) are broadcast to every actor; the products (large) stream past
    them, so this is a broadcast join without a shuffle.
    """

    def __init__(self, judgments: pa.Table, options: PairOptions):
        self.options = options
        self.by_product = judgments_by_product(judgments)

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Join a batch of products with their judgments."""
        rows = []
        for product in batch.to_pylist():
            key = (product["product_id"], product.get("product_locale"))
            for judgment in self.by_product.get(key, ()):
                example = {**product, **judgment}
                try:
                    row = build_product_judgment_row(example, self.options)
                    row["drop_reason"] = ""
                except DropRow as drop:
                    row = {"language": product.get("product_locale"), "drop_reason": drop.reason}
                row["row_key"] = f"{judgment['query_id']}:{product['product_id']}"
                rows.append(row)
        return rows_to_table(rows)


def judgments_by_product(judgments: pa.Table) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Judgments grouped by ESCI's product key, (``product_id``, ``product_locale``): one id
    can name different products in different locales."""
    by_product: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for judgment in judgments.to_pylist():
        by_product[(judgment["product_id"], judgment["product_locale"])].append(judgment)
    return by_product


class ProductPaperPairBuilder:
    """Ray Data operator: ESCI products → one pretraining pair per Exact judgment of theirs.

    SANTA's scripts' pretraining pairs (``esci_pretrain="paper"``, :mod:`santa.data.esci`):
    the judgments (query id and product key) are broadcast to every actor as in
    :class:`ProductJudgmentBuilder`.
    """

    def __init__(self, judgments: pa.Table, options: PairOptions):
        ensure_pos_tagger()  # fail fast on a node without the tagger, not per row
        self.options = options
        self.by_product = judgments_by_product(judgments)

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Pairs of a batch of products, one per Exact judgment of each."""
        rows = []
        for product in batch.to_pylist():
            key = (product["product_id"], product.get("product_locale"))
            for judgment in self.by_product.get(key, ()):
                query_id = str(judgment["query_id"])
                try:
                    row = build_product_pretrain_pair(product, self.options, judgment=query_id)
                    row["drop_reason"] = ""
                except DropRow as drop:
                    row = {"language": product.get("product_locale"), "drop_reason": drop.reason}
                row["row_key"] = f"{query_id}:{product['product_id']}"
                rows.append(row)
        return rows_to_table(rows)


def select_output_rows(batch: pa.Table, removed: pa.Array) -> pa.Table:
    """Ray Data function: the kept pair rows of a work block, in the output schema.

    Kept means built (no drop reason) and not removed by the driver's accounting (a
    duplicate, a held-out leak: ``removed`` row keys). One fused operator instead of a
    filter, a key filter and a projection: one task per block fewer, per operator.
    """
    if not batch.num_rows:  # a read task with no lines (e.g. a part past a file's end)
        return PAIR_SCHEMA.empty_table()
    keep = pc.equal(batch.column("drop_reason"), "")
    if len(removed):
        keep = pc.and_(keep, pc.invert(pc.is_in(batch.column("row_key"), value_set=removed)))
    return batch.filter(keep).select(PAIR_SCHEMA.names)
