"""The Ray Data preprocessing pipeline: read → validate → entities → masking → Parquet.

It preprocesses the registry's raw datasets (codesearchnet, advtest, esci, source:
:mod:`santa.data.datasets`); ``run_preprocess``, re-exported here, dispatches any dataset.

The per-record work is plain Python (``santa.data.records``), wrapped in Ray Data operators
(``santa.data.operators``) that run on every node. This driver plans the datasets and
accounts for every input row: each one is written, dropped for a reason, or filtered out of
the requested selection.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
import ray.data

from santa.cluster.ray_utils import capacity_of, cluster_cpus, environment
from santa.config.preprocess import DATASETS, STAGES, PreprocessConfig  # noqa: F401 (re-exported)
from santa.data import esci
from santa.data.accounting import build_report, labels, summarize
from santa.data.beir import write_beir
from santa.data.datasets import run_preprocess  # noqa: F401 (re-exported: any dataset)
from santa.data.operators import (
    HELDOUT_MARK,
    CodePairBuilder,
    ProductJudgmentBuilder,
    ProductPairBuilder,
    ProductPaperPairBuilder,
    ProgressCounter,
    build_code_pairs,
    build_product_pairs,
    extract_source_records,
    select_output_rows,
)
from santa.data.readers import (
    JsonLinesDatasource,
    first_record_language,
    in_input_order,
    language_from_path,
    reject_json_arrays,
    relative_path,
    split_from_path,
)
from santa.data.records import Reason
from santa.data.schema import PAIR_SCHEMA
from santa.data.source import EXTENSIONS, iter_source_files
from santa.files import storage
from santa.files.outputs import staged_output
from santa.jobs.progress import ProgressLines, counted

logger = logging.getLogger(__name__)

# Files of a flat folder whose first record is read for its language (a second at most).
LANGUAGE_PEEK_FILES = 200
ESCI_PRODUCT_COLUMNS = [
    "product_id",
    "product_title",
    "product_description",
    "product_bullet_point",
    "product_brand",
    "product_color",
    "product_locale",
]
ESCI_EXAMPLE_COLUMNS = [
    "query",
    "query_id",
    "product_id",
    "product_locale",
    "esci_label",
    "small_version",
    "large_version",
    "split",
]


# ----------------------------------------------------------------------------- driver


# Reads of their own (source files, ESCI's Parquet) are I/O and decompression: they take no
# CPU slot, so that the parsers (one per CPU) can never starve them, a bounded number at once.
_READ_ARGS = {"num_cpus": 0, "concurrency": 2}
# How many actors Ray 2.60's Parquet reader starts to read the files' footers (default 32).
FOOTER_ACTORS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"


def _cluster_cpus() -> int:
    return max(1, int(cluster_cpus()))


def _actor_pool(config: PreprocessConfig) -> dict[str, Any]:
    """Map arguments for a pool of ESCI judgment-join actors (each holds the judgments it
    joins the products with, for the job's length), one per cluster CPU by default."""
    # The pool may grow to what the cluster can grow to (its autoscaler's declared max);
    # it starts with ``min_actors``, and Ray Data asks the autoscaler for the rest.
    per_actor = config.num_cpus_per_actor
    max_size = config.max_actors or max(1, int(capacity_of("CPU") / per_actor))
    return {
        "compute": ray.data.ActorPoolStrategy(
            min_size=min(config.min_actors, max_size), max_size=max_size
        ),
        "num_cpus": per_actor,
        "batch_size": config.batch_size,
        "batch_format": "pyarrow",
    }


def _parsers(
    config: PreprocessConfig,
    function: Any,
    builder: type,
    builder_args: dict[str, Any],
    batch_size: int | None = None,
) -> dict[str, Any]:
    """``map_batches`` arguments for the stateless pair builders (code pairs, ESCI's product
    pairs): ``function`` as Ray tasks of ``num_cpus_per_actor`` CPUs each (at most
    ``max_actors`` at once when set), ``batch_size`` rows a call (None: a whole block, which
    a read fuses with: ``ReadJsonLines->MapBatches(build_code_pairs)``).

    Tasks, not an actor pool: no worker process starts or exits with the job on a running
    cluster (an actor pool costs seconds a job on a small cluster). One exception: a
    ``min_actors`` above the parsers the cluster holds now, on a cluster that can grow
    (its autoscaler's declared max), asks for a pool of ``builder`` actors of that size,
    whose waiting actors the autoscaler adds nodes for (Ray Data's own requests for tasks
    come late, or not at all, for a short job).
    """
    per_parser = config.num_cpus_per_actor
    pool = _actor_pool(config)
    if pool["compute"].min_size > int(_cluster_cpus() / per_parser):
        pool["batch_size"] = batch_size
        return {"fn": builder, "fn_constructor_kwargs": builder_args, **pool}
    args: dict[str, Any] = {
        "fn": function,
        "fn_kwargs": builder_args,
        "num_cpus": per_parser,
        "batch_size": batch_size,
        "batch_format": "pyarrow",
    }
    if config.max_actors:
        args["concurrency"] = config.max_actors
    return args


def _code_files(config: PreprocessConfig) -> list[str]:
    found = storage.list_files(config.input, suffixes=(".jsonl", ".jsonl.gz", ".json", ".json.gz"))
    if not found:
        raise FileNotFoundError(f"no .jsonl/.jsonl.gz files under {config.input}")
    if not config.languages:
        reject_json_arrays(found)
        return found
    languages = {f: language_from_path(relative_path(f, config.input)) for f in found}
    # A flat folder names no language in its paths: its files' first records say which
    # (a bounded peek, so that `--languages python` on Ruby files fails here, not with 0
    # rows written).
    for f in [f for f, language in languages.items() if not language][:LANGUAGE_PEEK_FILES]:
        languages[f] = first_record_language(f)
    files = [f for f in found if languages[f] in ("", *config.languages)]
    if not files:
        raise _no_language_files(config, list(languages.values()))
    reject_json_arrays(files)
    return files


def _no_language_files(config: PreprocessConfig, found: list[str]) -> FileNotFoundError:
    """The error for inputs that hold files, none of the requested languages."""
    languages = sorted({language or "unknown" for language in found})
    return FileNotFoundError(
        f"no {'/'.join(config.languages)} files under {config.input} "
        f"(languages found: {', '.join(languages)})"
    )


def _source_files(config: PreprocessConfig) -> list[str]:
    if storage.is_s3(config.input):
        files = storage.list_files(config.input, suffixes=tuple(EXTENSIONS))
    else:
        files = list(iter_source_files(config.input, skip_tests=config.skip_tests))
    if not files:
        raise FileNotFoundError(f"no source files under {config.input}")
    if config.languages:
        found = files
        files = [f for f in found if EXTENSIONS["." + f.rsplit(".", 1)[-1]] in config.languages]
        if not files:
            languages = sorted({EXTENSIONS["." + f.rsplit(".", 1)[-1]] for f in found})
            raise FileNotFoundError(
                f"no {'/'.join(config.languages)} source files under {config.input} "
                f"(languages found: {', '.join(languages)})"
            )
    return files


def check_inputs(config: PreprocessConfig) -> None:
    """The input files are there, of the requested languages, and JSON lines (no Ray)."""
    if config.dataset == "source":
        _source_files(config)
    elif config.dataset == "esci":
        for name in ("examples", "products"):
            uri = storage.join(config.input, f"shopping_queries_dataset_{name}.parquet")
            if not storage.exists(uri):
                raise FileNotFoundError(f"no ESCI {name} file: {uri}")
            # The footer, not the rows: a file cut short is named here, before any Ray
            # task fails on it with Arrow's bare "magic bytes not found".
            filesystem, path = storage.resolve(uri)
            try:
                pq.read_schema(path, filesystem=filesystem)
            except (OSError, ValueError) as error:
                raise ValueError(f"cannot read the ESCI {name} file {uri}: {error}") from None
    else:
        _split_files(config, _code_files(config))


def _split_files(config: PreprocessConfig, files: list[str]) -> list[str]:
    """The code files to read: those of the wanted split, of a held-out split, or of none
    named (their records' ``partition`` field decides); an error when none can hold the
    wanted split's rows."""
    wanted = (*config.wanted_splits, *_heldout_splits(config), "")
    splits = {f: split_from_path(relative_path(f, config.input)) for f in files}
    if not any(split in (*config.wanted_splits, "") for split in splits.values()):
        named = sorted({split for split in splits.values() if split})
        raise FileNotFoundError(
            f"no {config.wanted_split} files under {config.input} "
            f"(splits found: {', '.join(named)}; choose one with --split)"
        )
    return [f for f in files if splits[f] in wanted]


@contextlib.contextmanager
def _read_block_size(nbytes: int):
    """Datasets created inside get ``target_max_block_size=nbytes`` (each copies the
    current DataContext when created); the process-wide context is left unchanged."""
    context = ray.data.DataContext.get_current()
    saved = context.target_max_block_size
    context.target_max_block_size = nbytes
    try:
        yield
    finally:
        context.target_max_block_size = saved


def _code_work_dataset(
    config: PreprocessConfig, counter: Any = None
) -> tuple[ray.data.Dataset, ProgressLines]:
    """Pair rows of the requested split, plus key-only rows of the held-out splits, and the
    progress lines its execution counts into through ``counter`` (source files parsed, or
    JSON lines read).

    Held-out splits are read in the same pass (not a second one) so that training output
    can be checked against them; evaluation output needs no such check.
    """
    heldout = _heldout_splits(config)
    builder_args = {
        "dataset": config.dataset,
        "options": config.pair_options(),
        "split": config.wanted_splits,
        "heldout_splits": heldout,
        "languages": config.languages,
        "root": config.input,
    }
    if config.dataset == "source":
        files = _source_files(config)
        with _read_block_size(config.block_bytes):
            raw = ray.data.read_binary_files(files, include_paths=True, **_READ_ARGS)
        raw = raw.map_batches(
            extract_source_records,
            fn_kwargs={"root": config.input, "repo": "local", "counter": counter},
            batch_size=16,
            batch_format="pyarrow",
        )
        progress = ProgressLines("preprocess", "source files parsed", len(files), unit="files")
        work = raw.map_batches(**_parsers(config, build_code_pairs, CodePairBuilder, builder_args))
        return work, progress
    else:
        # Files whose name says another split are not read; files of unknown split are
        # read and their rows selected by the records' own `partition` field.
        files = _split_files(config, _code_files(config))
        source = JsonLinesDatasource(
            files,
            root=config.input,
            lines_per_block=config.lines_per_block,
            part_bytes=config.read_part_bytes,
        )
        with _read_block_size(config.block_bytes):
            raw = ray.data.read_datasource(source, override_num_blocks=source.num_read_tasks)
    # The read fuses into the parser tasks (each parses the block it read): it has no
    # resources or concurrency of its own, and they take whole blocks.
    builder_args["counter"] = counter
    progress = ProgressLines("preprocess", "records read", unit="rows")
    work = raw.map_batches(**_parsers(config, build_code_pairs, CodePairBuilder, builder_args))
    return work, progress


def _materialize(work: ray.data.Dataset, progress: ProgressLines | None, counter: Any):
    """``work.materialize()``, with santa's progress lines every 15 s from ``counter`` (the
    operators' count): the source corpus job was 3 minutes without a line. The closing
    line counts what was done: every file (of a known total) or one work row per line."""
    if progress is None or counter is None:
        return work.materialize()
    done: list[ray.data.Dataset] = []

    def final() -> int:
        return progress.total or done[0].count()

    with counted(progress, lambda: ray.get(counter.value.remote(), timeout=10), final=final):
        done.append(work.materialize())
    return done[0]


def _read_examples(config: PreprocessConfig) -> pa.Table:
    uri = storage.join(config.input, "shopping_queries_dataset_examples.parquet")
    fs, path = storage.resolve(uri)
    return pq.read_table(path, filesystem=fs, columns=ESCI_EXAMPLE_COLUMNS)


def _products_dataset(config: PreprocessConfig) -> ray.data.Dataset:
    uri = storage.join(config.input, "shopping_queries_dataset_products.parquet")
    path, filesystem = storage.for_ray(uri)
    # Ray 2.60's Parquet reader lists files through a pool of actors that read their footers,
    # 32 of them by default (each a new Python process, ~16 s of a 1-CPU node's start-up
    # concurrency): one file takes one. Its row groups are still read in parallel.
    # (Ray 2.60 deprecates ``columns=``: it reads, then selects, as this does.)
    with environment({FOOTER_ACTORS_ENV: "1"}):
        products = ray.data.read_parquet(path, filesystem=filesystem, **_READ_ARGS)
    return products.select_columns(ESCI_PRODUCT_COLUMNS)


def _select_examples(
    config: PreprocessConfig, examples: pa.Table
) -> tuple[pa.Table, Counter, dict[str, Any]]:
    """The judgments of the requested version, locale and split (``valid`` carved from
    train as SANTA's scripts carve it), what was filtered, and the split's counts."""
    frame, filtered, counts = esci.select_judgments(
        examples.to_pandas(),
        version=config.esci_version,
        locale=config.locale,
        split=config.wanted_split,
        dev_fraction=config.esci_dev_fraction,
        dev_seed=config.esci_dev_seed,
    )
    keep = frame[["query", "query_id", "product_id", "product_locale", "esci_label"]].copy()
    keep["query_id"] = keep["query_id"].astype(str)
    return pa.Table.from_pandas(keep, preserve_index=False), filtered, counts


def _paper_pretrain_judgments(
    config: PreprocessConfig, examples: pa.Table
) -> tuple[pa.Table, Counter, dict[str, Any]]:
    """The Exact judgments SANTA's scripts make pretraining pairs of (``esci.paper_...``)."""
    frame, filtered, counts = esci.paper_pretrain_examples(
        examples.to_pandas(), version=config.esci_version, locale=config.locale
    )
    keep = frame[["query_id", "product_id", "product_locale"]].copy()
    keep["query_id"] = keep["query_id"].astype(str)
    return pa.Table.from_pandas(keep, preserve_index=False), filtered, counts


def _heldout_splits(config: PreprocessConfig) -> tuple[str, ...]:
    """The splits a training run must never see (none for evaluation)."""
    if config.stage == "eval":
        return ()
    return tuple(s for s in ("train", "valid", "test") if s not in config.wanted_splits)


def _esci_heldout_products(config: PreprocessConfig) -> set[str]:
    """Products of the locale judged by a test query: santa's product pretraining must not
    see them (products of the carved dev queries stay, as before there was a dev split).
    The ``paper`` rule keeps them all, as SANTA's scripts do."""
    if config.stage != "pretrain" or config.esci_pretrain == "paper":
        return set()  # ESCI splits by query: judgments cannot leak across splits
    examples = _read_examples(config).to_pandas()
    in_locale = examples["product_locale"] == config.locale
    return set(examples.loc[in_locale & (examples["split"] == "test"), "product_id"].astype(str))


def run_plan(config: PreprocessConfig) -> dict[str, Any]:
    """Run the pipeline (codesearchnet, advtest, esci, source) on the current Ray cluster;
    return (and publish) its report. :func:`run_preprocess` takes any dataset.

    The output is staged and published whole (:mod:`santa.files.outputs`): an interrupted
    or failed run leaves the previous output as it was.
    """
    with staged_output(config.output, tool="preprocess") as staged, in_input_order():
        report = _run_into(config, staged.staging)
        return staged.publish(report)


def _run_into(config: PreprocessConfig, output: str) -> dict[str, Any]:
    """Process ``config`` and write its files (not the report) into the folder ``output``."""
    started = time.time()
    options = config.pair_options()
    filtered: Counter = Counter()
    expected_rows = None
    esci_counts: dict[str, Any] | None = None
    counter = progress = None  # the code datasets' progress lines
    if config.dataset == "esci":
        products = _products_dataset(config)
        if config.stage == "pretrain" and config.esci_pretrain == "product":
            esci_counts = {
                "rule": "santa: one pair per product of the locale, products judged by test "
                "queries left out",
                "test_judgments": 0,
                "paper_table5_pairs": esci.TABLE5_PRODUCT_PAIRS,
                "comparable_to_table5": False,
            }
            builder_args = {"options": options, "locale": config.locale}
            work = products.map_batches(
                **_parsers(
                    config,
                    build_product_pairs,
                    ProductPairBuilder,
                    builder_args,
                    batch_size=config.batch_size,
                )
            )
        else:
            paper_pairs = config.stage == "pretrain"
            select = _paper_pretrain_judgments if paper_pairs else _select_examples
            judgments, filtered, esci_counts = select(config, _read_examples(config))
            expected_rows = judgments.num_rows
            work = products.map_batches(
                ProductPaperPairBuilder if paper_pairs else ProductJudgmentBuilder,
                fn_constructor_kwargs={"judgments": judgments, "options": options},
                **_actor_pool(config),
            )
    else:
        counter = ray.remote(num_cpus=0)(ProgressCounter).remote()
        work, progress = _code_work_dataset(config, counter)
    work = _materialize(work, progress, counter)
    phases = {"process_s": time.time() - started}

    summary = summarize(work)
    phases["summary_s"] = time.time() - started - sum(phases.values())
    report_rows, kept, removed = _settle_rows(config, summary)
    final = work.map_batches(
        select_output_rows,
        fn_kwargs={"removed": pc.unique(removed).sort()},
        batch_format="pyarrow",
        batch_size=None,  # whole blocks: the rows only need filtering
    )
    written = None
    if config.stage == "eval":
        written = write_beir(final, output, config.wanted_split)
    else:
        data_uri = storage.join(output, "data")
        if kept.any():
            path, sink = storage.for_ray_write(data_uri)  # S3: santa's timeouts in the writers
            final.write_parquet(
                path,
                mode="overwrite",
                min_rows_per_file=_rows_per_file(config, int(kept.sum())),
                **sink,
            )
        else:
            # Ray writes no file for an empty dataset; readers still need the schema.
            fs, path = storage.resolve(storage.join(data_uri, "empty.parquet"))
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            pq.write_table(PAIR_SCHEMA.empty_table(), path, filesystem=fs)

    asst = None
    if config.asst and config.stage != "eval":
        from santa.data.asst_pairs import write_asst_pairs

        asst = write_asst_pairs(storage.join(output, "data"), seed=config.seed)
    phases["write_s"] = time.time() - started - sum(phases.values())
    report = build_report(config, report_rows, filtered, expected_rows, time.time() - started)
    report["phases"] = {name: round(seconds, 2) for name, seconds in phases.items()}
    if written is not None:
        report["beir"] = written
    if esci_counts is not None:
        report["esci"] = esci_counts
        if config.stage == "pretrain":
            esci_counts["pairs_written"] = report["rows_written"]
    if asst is not None:
        report["asst"] = asst  # derived pairs: not in rows_read / rows_written
        report["by_kind"]["asst"] = asst["written"]
    return report


def _settle_rows(config: PreprocessConfig, summary: pa.Table):
    """Each row's final drop reason (held-out leaks, duplicates), which rows are kept, and
    the row keys to remove from the written output; in Arrow, column by column."""
    first_reason = labels(summary["drop_reason"])
    heldout_rows = pc.equal(first_reason, HELDOUT_MARK)
    heldout_ids = _set_of(summary["doc_id"].filter(heldout_rows))
    heldout_dedup = _set_of(summary["dedup_key"].filter(heldout_rows))
    if config.dataset == "esci":
        heldout_ids = pa.array(sorted(_esci_heldout_products(config)), pa.string())
    reason = pc.if_else(heldout_rows, Reason.OTHER_SPLIT, first_reason)
    kept = pc.equal(reason, "")
    if len(heldout_ids) or len(heldout_dedup):
        leak = pc.and_(
            kept,
            pc.or_(
                pc.is_in(summary["doc_id"], value_set=heldout_ids),
                pc.is_in(summary["dedup_key"], value_set=heldout_dedup),
            ),
        ).fill_null(False)
        reason = pc.if_else(leak, Reason.HELDOUT_LEAK, reason)
        kept = pc.and_(kept, pc.invert(leak))
    if config.stage != "eval":
        # Among the kept rows, a pair whose dedup key came at an earlier input position
        # (row key): every row ordered by (dedup key, row key) as indices, the kept ones
        # taken, and only their dedup keys copied (row keys are long: paths).
        order = pc.sort_indices(
            summary.select(["dedup_key", "row_key"]),
            sort_keys=[("dedup_key", "ascending"), ("row_key", "ascending")],
        ).to_numpy()
        order = order[_numpy(kept)[order]]
        keys = summary["dedup_key"].take(order)
        repeated = pc.equal(keys.slice(1), keys.slice(0, max(len(keys) - 1, 0)))
        del keys
        later = order[1:][_numpy(repeated)]
        # By key, as the writers drop them: rows sharing a row key share its fate.
        duplicate_keys = pc.unique(summary["row_key"].take(later).combine_chunks())
        duplicate = pc.is_in(summary["row_key"], value_set=duplicate_keys).fill_null(False)
        reason = pc.if_else(duplicate, Reason.DUPLICATE, reason)
        kept = pc.equal(reason, "")
    report_rows = summary.set_column(
        summary.column_names.index("drop_reason"), "drop_reason", reason
    )
    removed = summary["row_key"].filter(pc.and_(pc.invert(kept), pc.equal(first_reason, "")))
    return report_rows, _numpy(kept), removed.combine_chunks()


def _numpy(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow column as a numpy array (nulls: False)."""
    mask = mask.fill_null(False)
    return (pa.chunked_array([mask]) if isinstance(mask, pa.Array) else mask).to_numpy()


def _set_of(column: pa.ChunkedArray) -> pa.Array:
    """The distinct non-empty values of a string column."""
    distinct = pc.unique(column.combine_chunks()) if len(column) else pa.array([], pa.string())
    return distinct.filter(pc.not_equal(distinct, ""))


def _rows_per_file(config: PreprocessConfig, rows: int) -> int:
    """``config.rows_per_file``, or fewer so that every CPU of the cluster writes a share
    of a small output in parallel (one file per write task)."""
    return max(1, min(config.rows_per_file, math.ceil(rows / _cluster_cpus())))
