"""The one reader of preprocessed pairs: a published preprocess output's ``data/*.parquet``.

Every module that reads the pairs (the training input, the tiny recipe's tokenizer sample,
the local session, mining, SCodeR's examples, the index job's corpus, preflight) reads them
here, so that where they are (the manifest's prefix on S3, :func:`published_root`), which
files they are (sorted, ``.``/``_`` names skipped) and what a bad output says are decided
once:

- :func:`pair_files`: the part files, in the order every reader reads them;
- :func:`iter_pairs` / :func:`read_pairs`: in-process, as pyarrow Tables (per file, or
  whole), with required and optional columns and a row filter;
- :func:`pairs_dataset`: the same files as a Ray Data dataset, read with the project's
  settings (:data:`DATA_TASK_CPUS`, Ray Data's V1 Parquet reader; S3 through santa's
  filesystem, so its timeouts reach the read tasks).

A missing folder, a folder without Parquet files and a missing column each fail with one
line naming the URI. Other folders of Parquet rows that santa writes (SCodeR's listwise
examples) are read through the same functions (:func:`parquet_files`,
:func:`read_parquet`, :func:`parquet_dataset`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from santa.files import storage
from santa.files.outputs import published_root
from santa.files.storage import StorageError

__all__ = [
    "DATA_FOLDER",
    "DATA_TASK_CPUS",
    "MissingPairs",
    "iter_pairs",
    "iter_parquet",
    "pair_columns",
    "pair_files",
    "parquet_file",
    "pairs_dataset",
    "pairs_folder",
    "parquet_dataset",
    "parquet_files",
    "read_pairs",
    "read_parquet",
]

DATA_FOLDER = "data"
"""Where a preprocess output keeps its pairs (beside ``report.json``, BEIR files)."""

# CPUs a training-input task asks for. Parquet reads of Ray Data's V2 datasource list files
# in a task that asks a whole CPU, with no setting to lower it: beside two 0.5-CPU trainers
# on two 1-CPU nodes (free CPUs split 0.5 + 0.5) it never runs and training waits forever.
DATA_TASK_CPUS = 0.5

PAIRS_HINT = "expected data/*.parquet, as ray_jobs.preprocess writes them"


class MissingPairs(StorageError, FileNotFoundError):
    """No Parquet rows where a reader looked (a missing folder, or no ``.parquet`` file in
    it): bad input, one line naming the URI."""


# ----------------------------------------------------------------------- any Parquet folder


def parquet_files(folder: str, what: str = "Parquet files") -> list[str]:
    """The ``.parquet`` files under ``folder`` (recursively, sorted; ``.``/``_`` names
    skipped, as Ray Data does); :class:`MissingPairs` when there is none."""
    try:
        files = storage.list_files(folder, suffixes=(".parquet",))
    except StorageError as error:
        if error.transient or storage.exists(folder):
            raise
        raise MissingPairs(f"no {what} under {folder} (no such folder)") from None
    if not files:
        raise MissingPairs(f"no {what} under {folder} (no .parquet file)")
    return files


def _read_file(
    uri: str, columns: Sequence[str] | None, optional: Sequence[str], filters: Any
) -> pa.Table:
    """One file's table; a missing column or an unreadable file is one line naming it."""
    filesystem, path = storage.resolve(uri)
    wanted = None if columns is None else list(columns)
    if optional:
        names = storage.classified(
            lambda: pq.read_schema(path, filesystem=filesystem).names, uri, "read"
        )
        wanted = [*(wanted or []), *(name for name in optional if name in names)]
    try:
        return storage.classified(
            lambda: pq.read_table(path, filesystem=filesystem, columns=wanted, filters=filters),
            uri,
            "read",
        )
    except (pa.ArrowInvalid, KeyError) as error:
        try:
            names = pq.read_schema(path, filesystem=filesystem).names
        except (pa.ArrowInvalid, OSError):
            names = []  # not a Parquet file at all: the read's own error says so
        missing = [name for name in wanted or () if name not in names]
        if names and missing:
            raise ValueError(
                f"{uri} has no column(s) {missing} (its columns: {', '.join(names)})"
            ) from None
        raise ValueError(f"cannot read {uri}: {' '.join(str(error).split())}") from None


def parquet_file(uri: str) -> pq.ParquetFile:
    """One Parquet file opened for reading in batches (``iter_batches``: the row files of
    :mod:`santa.train.rows` stream from it); an unreachable storage is one line naming it."""
    filesystem, path = storage.resolve(uri)
    return storage.classified(lambda: pq.ParquetFile(filesystem.open_input_file(path)), uri, "read")


def iter_parquet(
    files: Sequence[str],
    columns: Sequence[str] | None = None,
    *,
    optional: Sequence[str] = (),
    filters: Any = None,
) -> Iterator[pa.Table]:
    """One Table per file of ``files``, in order: ``columns`` (all when None; each must be
    there), then those of ``optional`` the file has; ``filters`` as pyarrow's (a row
    expression, applied while reading)."""
    for uri in files:
        yield _read_file(uri, columns, optional, filters)


def read_parquet(
    folder: str,
    what: str = "Parquet files",
    columns: Sequence[str] | None = None,
    *,
    optional: Sequence[str] = (),
    filters: Any = None,
) -> pa.Table:
    """Every row under ``folder`` in one Table (its files in order)."""
    tables = list(
        iter_parquet(parquet_files(folder, what), columns, optional=optional, filters=filters)
    )
    return pa.concat_tables(tables)


def parquet_dataset(paths: str | Sequence[str], what: str = "Parquet files", *, check: bool = True):
    """The Parquet rows of ``paths`` (a folder or a list of files) as a Ray Dataset, read
    with :data:`DATA_TASK_CPUS` per task by Ray Data's V1 Parquet reader (see the note on
    :data:`DATA_TASK_CPUS`); on S3 through santa's filesystem (its timeouts)."""
    import ray.data

    if isinstance(paths, str):
        if check:
            parquet_files(paths, what)
        path, filesystem = storage.for_ray(paths)
    else:
        if not paths:
            raise MissingPairs(f"no {what} to read")
        path = [storage.for_ray(uri)[0] for uri in paths]
        filesystem = storage.for_ray(paths[0])[1]
    context = ray.data.DataContext.get_current()
    use_v2, context.use_datasource_v2 = context.use_datasource_v2, False
    try:  # the dataset keeps a copy of the context it was created with
        return ray.data.read_parquet(path, filesystem=filesystem, num_cpus=DATA_TASK_CPUS)
    finally:
        context.use_datasource_v2 = use_v2


# ------------------------------------------------------------------- preprocessed pairs


def pairs_folder(uri: str) -> str:
    """The folder of the pairs of the preprocess output ``uri`` (its published ``data/``)."""
    return storage.join(published_root(uri), DATA_FOLDER)


def pair_files(uri: str, what: str = "") -> list[str]:
    """The pairs' Parquet files of the preprocess output ``uri``, in reading order.

    ``what`` names the option in the error (``--data``): ``--data URI holds no
    preprocessed pairs (...)``, or ``--data URI: no such file or folder``.
    """
    subject = f"{what} {uri}" if what else uri
    try:
        return parquet_files(pairs_folder(uri), "preprocessed pairs")
    except MissingPairs:
        if not storage.exists(uri):
            raise MissingPairs(f"{subject}: no such file or folder") from None
        raise MissingPairs(f"{subject} holds no preprocessed pairs ({PAIRS_HINT})") from None


def pair_columns(uri: str) -> list[str]:
    """The column names of the pairs of ``uri`` (its first file's schema)."""
    first = pair_files(uri)[0]
    filesystem, path = storage.resolve(first)
    return storage.classified(
        lambda: pq.read_schema(path, filesystem=filesystem).names, first, "read"
    )


def iter_pairs(
    uri: str,
    columns: Sequence[str] | None = None,
    *,
    optional: Sequence[str] = (),
    filters: Any = None,
) -> Iterator[pa.Table]:
    """The pairs of the preprocess output ``uri``, one Table per file, in order (see
    :func:`iter_parquet` for ``columns``, ``optional`` and ``filters``)."""
    return iter_parquet(pair_files(uri), columns, optional=optional, filters=filters)


def read_pairs(
    uri: str,
    columns: Sequence[str] | None = None,
    *,
    optional: Sequence[str] = (),
    filters: Any = None,
) -> pa.Table:
    """Every pair of the preprocess output ``uri`` in one Table (its files in order)."""
    return pa.concat_tables(list(iter_pairs(uri, columns, optional=optional, filters=filters)))


def pairs_dataset(uri: str):
    """The pairs of the preprocess output ``uri`` as a Ray Dataset (all columns; select
    with ``select_columns``), read as :func:`parquet_dataset` reads."""
    pair_files(uri)  # one line naming the URI before Ray Data plans a read of nothing
    return parquet_dataset(pairs_folder(uri), check=False)
