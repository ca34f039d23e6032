"""Your own labelled pairs → santa's training pairs (``ray_jobs.preprocess --dataset pairs``).

Input: JSON lines ``{"query": str, "positive": str | [str, ...], "negatives"?: [str, ...],
"id"?: str}`` (the Tevatron / sentence-transformers shape), in one file or a folder of
``*.jsonl[.gz]`` files, local or ``s3://``.

Output (published whole, :mod:`santa.files.outputs`): the pair schema the finetune and ANCE
stages read (``data/*.parquet``, kind ``text_pair``), one row per (query, positive):

- a query with several positives (a list, or several rows) gives one pair per positive;
  all share the query's id (the hash of its text), so mining never takes one of its
  positives for a negative;
- several queries with the same positive are all kept (nothing is de-duplicated by
  document: the document id is the hash of its text, shared by those pairs);
- ``negatives`` are kept as a hard-negatives table, ``negatives/negatives.parquet``, with
  their texts (the table format the trainer reads: ``--set negatives.source=table:<it>
  --set negatives.per_query=1``); a negative equal to one of the query's
  positives is left out.

Bad rows are dropped and counted by reason: ``malformed_json``, ``undecodable_bytes``,
``missing_query``, ``missing_positive``, ``bad_negatives``, ``too_long``.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from santa.data.kinds import TEXT_PAIR
from santa.data.records import DropRow, Reason, parse_json_line, stable_hash
from santa.data.schema import PAIR_SCHEMA
from santa.files import storage
from santa.files.outputs import staged_output

__all__ = [
    "DATASET",
    "PAIR_REASONS",
    "format_pairs_report",
    "pair_rows_from_record",
    "preprocess",
    "run_pairs_preprocess",
]

DATASET = "pairs"
MISSING_QUERY = "missing_query"
MISSING_POSITIVE = "missing_positive"
BAD_NEGATIVES = "bad_negatives"
PAIR_REASONS = (
    Reason.MALFORMED_JSON,
    Reason.UNDECODABLE_BYTES,
    MISSING_QUERY,
    MISSING_POSITIVE,
    BAD_NEGATIVES,
    Reason.TOO_LONG,
)
# Internal columns, dropped before writing: the record's negatives and whether a row is its
# record's first pair (they travel on that one), and why a line was dropped.
WORK_SCHEMA = pa.schema(
    [
        *PAIR_SCHEMA,
        pa.field("negatives", pa.list_(pa.string())),
        pa.field("record_start", pa.bool_()),
        pa.field("drop_reason", pa.string()),
    ]
)


def _texts(value: Any) -> list[str] | None:
    """A string or a list of strings as a list of non-blank strings; None if neither."""
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [item for item in value if item.strip()]
    return None


def pair_rows_from_record(
    record: dict[str, Any], key: str, *, max_query_chars: int, max_document_chars: int
) -> list[dict[str, Any]]:
    """The pair rows of one input record (raises :class:`DropRow` for a bad one).

    ``key`` names the record's place in the input (``path:line``), for ids when it has none.
    """
    query = record.get("query")
    if not isinstance(query, str) or not query.strip():
        raise DropRow(MISSING_QUERY)
    positives = _texts(record.get("positive", record.get("positives")))
    if not positives:
        raise DropRow(MISSING_POSITIVE)
    negatives = record.get("negatives")
    negatives = [] if negatives is None else negatives
    negatives = _texts(negatives) if isinstance(negatives, list) else None
    if negatives is None:
        raise DropRow(BAD_NEGATIVES, "negatives must be a list of strings")
    if len(query) > max_query_chars or any(
        len(text) > max_document_chars for text in positives + negatives
    ):
        raise DropRow(Reason.TOO_LONG)
    given = record.get("id")
    base = str(given) if given not in (None, "") else stable_hash(DATASET, key)
    query_id = stable_hash("q", query)
    rows = []
    for number, positive in enumerate(positives):
        rows.append(
            {
                "id": base if len(positives) == 1 else f"{base}#{number}",
                "dataset": DATASET,
                "kind": TEXT_PAIR,
                "language": "",
                "query_id": query_id,
                "query": query,
                "doc_id": stable_hash("d", positive),
                "title": "",
                "document": positive,
                "label": 1,
                "entities": [],
                "masked_document": "",
                "mep_target": "",
                "num_tokens": 0,
                "num_masked_tokens": 0,
                "url": "",
                # Carried once per record (on its first pair) into the negatives table.
                "negatives": negatives if number == 0 else [],
                "record_start": number == 0,
                "drop_reason": "",
            }
        )
    return rows


def build_pair_rows(batch: pa.Table, *, max_query_chars: int, max_document_chars: int) -> pa.Table:
    """Ray Data function: raw JSON lines → pair rows, plus one row per dropped line."""
    out: list[dict[str, Any]] = []
    for path, line, raw, reason in zip(
        batch.column("path").to_pylist(),
        batch.column("line_number").to_pylist(),
        batch.column("raw").to_pylist(),
        batch.column("drop_reason").to_pylist(),
        strict=True,
    ):
        try:
            if reason:
                raise DropRow(reason)
            record = parse_json_line(raw)
            out.extend(
                pair_rows_from_record(
                    record,
                    f"{path}:{line}",
                    max_query_chars=max_query_chars,
                    max_document_chars=max_document_chars,
                )
            )
        except DropRow as error:
            out.append({"drop_reason": error.reason, "negatives": [], "record_start": True})
    return pa.Table.from_pylist(out, schema=WORK_SCHEMA)


def run_pairs_preprocess(
    input_uri: str,
    output: str,
    *,
    max_query_chars: int = 4_096,
    max_document_chars: int = 16_384,
    lines_per_block: int = 1_000,
) -> dict[str, Any]:
    """Convert the pairs at ``input_uri`` on the current Ray cluster; publish and return
    the report (rows read, written, dropped by reason; queries, positives, negatives)."""
    import ray.data

    from santa.data.readers import JsonLinesDatasource, in_input_order, reject_json_arrays
    from santa.negatives.table import write_id_table

    started = time.time()
    # Ray workers run in other folders: local paths must be absolute.
    input_uri, output = storage.absolute(input_uri), storage.absolute(output)
    files = storage.list_files(input_uri, suffixes=(".jsonl", ".jsonl.gz", ".json", ".json.gz"))
    if not files:
        raise FileNotFoundError(f"no .jsonl/.jsonl.gz files under {input_uri}")
    reject_json_arrays(files)
    source = JsonLinesDatasource(files, root=input_uri, lines_per_block=lines_per_block)
    with in_input_order():  # the rows written in the order of the input's lines
        work = (
            ray.data.read_datasource(source, override_num_blocks=source.num_read_tasks)
            .map_batches(
                build_pair_rows,
                fn_kwargs={
                    "max_query_chars": max_query_chars,
                    "max_document_chars": max_document_chars,
                },
                batch_format="pyarrow",
                batch_size=None,
            )
            .materialize()
        )
    dropped: Counter = Counter()
    rows_read = 0
    negatives: dict[str, list[str]] = {}
    positives: dict[str, set[str]] = {}
    documents: dict[str, str] = {}
    queries_of_document: Counter = Counter()
    written = 0
    for batch in work.iter_batches(batch_size=4096, batch_format="pyarrow"):
        reasons = batch.column("drop_reason").to_pylist()
        dropped.update(reason for reason in reasons if reason)
        kept = batch.filter(pa.array([not reason for reason in reasons]))
        columns = kept.select(["query_id", "doc_id", "negatives"]).to_pydict()
        rows_read += sum(batch.column("record_start").to_pylist())
        written += kept.num_rows
        for query_id, doc_id, texts in zip(
            columns["query_id"], columns["doc_id"], columns["negatives"], strict=True
        ):
            positives.setdefault(query_id, set()).add(doc_id)
            queries_of_document[doc_id] += 1
            for text in texts:
                negative_id = stable_hash("d", text)
                documents[negative_id] = text
                chosen = negatives.setdefault(query_id, [])
                if negative_id not in chosen:
                    chosen.append(negative_id)
    for query_id, chosen in negatives.items():
        negatives[query_id] = [doc for doc in chosen if doc not in positives[query_id]]
    negatives = {query_id: chosen for query_id, chosen in negatives.items() if chosen}

    with staged_output(output, tool="preprocess") as staged:
        data_uri = storage.join(staged.staging, "data")
        if written:
            from ray.data.expressions import col

            pairs = work.filter(expr=col("drop_reason") == "").select_columns(PAIR_SCHEMA.names)
            path, sink = storage.for_ray_write(data_uri)  # S3: santa's timeouts
            pairs.write_parquet(path, mode="overwrite", **sink)
        else:
            import pyarrow.parquet as pq

            fs, path = storage.resolve(storage.join(data_uri, "empty.parquet"))
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            pq.write_table(PAIR_SCHEMA.empty_table(), path, filesystem=fs)
        table_uri = None
        if negatives:
            write_id_table(negatives, documents, storage.join(staged.staging, "negatives"))
            table_uri = storage.join(output, staged.prefix, "negatives", "negatives.parquet")
        counts = np.array(list(queries_of_document.values()) or [0])
        report = {
            "dataset": DATASET,
            "rows_read": rows_read,
            "rows_written": written,
            "dropped": dict(sorted(dropped.items())),
            "filtered": {},
            "queries": len(positives),
            "documents": len(queries_of_document),
            "queries_with_several_positives": sum(
                1 for docs in positives.values() if len(docs) > 1
            ),
            "documents_of_several_queries": int((counts > 1).sum()),
            "negatives": {
                "queries": len(negatives),
                "total": sum(len(chosen) for chosen in negatives.values()),
                "table": table_uri,
            },
            "wall_time_s": round(time.time() - started, 2),
            "config": {"dataset": DATASET, "input": input_uri, "stage": "finetune"},
        }
        return staged.publish(report)


def preprocess(config) -> dict[str, Any]:
    """The registry's entry (:mod:`santa.data.datasets`): :func:`run_pairs_preprocess` of
    ``config.input`` into ``config.output`` with the config's length limits."""
    return run_pairs_preprocess(
        config.input,
        config.output,
        max_query_chars=config.max_query_chars,
        max_document_chars=config.max_document_chars,
        lines_per_block=config.lines_per_block,
    )


def format_pairs_report(report: dict[str, Any]) -> str:
    """What the job prints: the preprocess report's text, then the counts as JSON."""
    import json

    from santa.data.accounting import format_text

    counts = {key: report[key] for key in ("queries", "documents", "negatives")}
    return f"{format_text({**report, 'entity_ratio': {}})}\n{json.dumps(counts)}"
