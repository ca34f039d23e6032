"""The training rows on a node: the columns a run trains on, in a local memory-mapped
Arrow file, read by row number.

The preprocessed rows are Parquet (``data/*.parquet``, local or S3), which cannot be read
row by row at random. The first worker of a node that needs them copies the columns it
trains on, and only the training rows, into one uncompressed Arrow IPC file on the node's
disk (:func:`open_rows`): one streaming pass (a few record batches in memory at a time),
no tokenization, whole or not at all (written beside, renamed into place), once per data
version (the files, their sizes and times, the columns and the row filter name it) and
node, under a lock so that the node's other workers wait for it and then share it. Later
runs, stages, restarted workers and resized groups find it there.

Workers then read rows by number (:meth:`RowFile.take`) from the memory-mapped file: the
pages a batch touches are mapped for it and given back after it (``MADV_DONTNEED``; the
file stays in the page cache), so a worker's memory does not grow with the training set.
This is how tevatron and sentence-transformers read their training text (Hugging Face
``datasets``' memory-mapped Arrow tables), row by row as each batch is collated.

The folder (``SANTA_ROW_CACHE``, else ``<tmp>/santa-rows``) keeps the newest
:data:`KEEP_ROW_FILES` files; older ones are deleted when a new one is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from santa.data.published import parquet_file
from santa.files import storage

__all__ = [
    "KEEP_ROW_FILES",
    "ROWS_PER_BATCH",
    "RowFile",
    "RowSource",
    "count_rows",
    "evict_cache_files",
    "locked",
    "open_rows",
    "row_cache_dir",
]

logger = logging.getLogger(__name__)

ROWS_PER_BATCH = 8192
"""Rows per record batch of a row file (every batch but the last): row ``i`` is row
``i % ROWS_PER_BATCH`` of batch ``i // ROWS_PER_BATCH``."""
KEEP_ROW_FILES = 8
"""Row files a cache folder keeps (the newest used); older ones go when one is written."""
ROW_CACHE_ENV = "SANTA_ROW_CACHE"
_FORMAT = 1  # bump when the file's layout changes: old files are not reused
_READ_ROWS = 8192  # rows per Parquet read while building

RowFilter = Callable[[pa.RecordBatch], np.ndarray]
"""``batch -> bool mask``: which rows of a read batch are training rows."""


@dataclass(frozen=True)
class RowSource:
    """What a run trains on: Parquet ``files`` (in order), the ``columns`` to keep (each
    file must have them), ``optional`` ones (null where a file lacks them), and a row
    filter named ``filter_name`` (part of the cache key) with its function ``keep``, which
    may also read ``filter_columns`` (read for it, not kept)."""

    files: tuple[str, ...]
    columns: tuple[str, ...]
    optional: tuple[str, ...] = ()
    filter_name: str = ""
    keep: RowFilter | None = field(default=None, compare=False)
    filter_columns: tuple[str, ...] = ()
    groups: Callable[[RowFile], tuple[np.ndarray, np.ndarray]] | None = field(
        default=None, compare=False
    )
    """Optional: the units an epoch is made of (``(offsets, members)``, see
    :class:`santa.train.order.EpochPlan`), computed once from the built file and kept
    beside it; part of the key through ``filter_name``."""

    def key(self) -> str:
        """The data version this source reads: a file name for its row file."""
        infos = storage.file_infos(list(self.files))
        payload = {
            "format": _FORMAT,
            "files": [
                [storage.absolute(uri), size, mtime]
                for uri, (size, mtime) in zip(self.files, infos, strict=True)
            ],
            "columns": list(self.columns),
            "optional": list(self.optional),
            "filter": [self.filter_name, list(self.filter_columns)],
        }
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        return f"rows-{digest[:24]}"


def row_cache_dir(setting: str = "") -> str:
    """Where this node keeps row files: ``setting``, else ``SANTA_ROW_CACHE``, else
    ``<tmp>/santa-rows``."""
    return (
        setting
        or os.environ.get(ROW_CACHE_ENV)
        or os.path.join(tempfile.gettempdir(), "santa-rows")
    )


class RowFile:
    """A row file, memory-mapped: :meth:`take` reads rows by number. Thread-safe."""

    def __init__(self, path: str, build_s: float = 0.0, built: bool = False) -> None:
        self.path = path
        self.build_s, self.built = build_s, built
        self._file = open(path, "rb")  # noqa: SIM115 - held for the mapping's life
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        # Rows are read at random: no read-ahead from disk around each.
        self._map.madvise(mmap.MADV_RANDOM)
        reader = ipc.open_file(pa.BufferReader(pa.py_buffer(self._map)))
        self.schema = reader.schema
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self.num_rows = sum(batch.num_rows for batch in self._batches)
        self.groups: tuple[np.ndarray, np.ndarray] | None = None
        if os.path.exists(f"{path}.groups.npz"):
            with np.load(f"{path}.groups.npz") as saved:
                self.groups = saved["offsets"], saved["members"]

    def columns(self, names: list[str]) -> pa.Table:
        """Columns ``names`` of every row, as a Table over the mapped file (no copy)."""
        return pa.Table.from_batches([batch.select(names) for batch in self._batches])

    def take(self, rows: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        """The rows numbered ``rows`` (any order, repeats allowed), in that order; only
        ``columns`` of them when given."""
        rows = np.asarray(rows, dtype=np.int64)
        schema = (
            self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
        )
        if rows.size == 0:
            return schema.empty_table()
        if rows.min() < 0 or rows.max() >= self.num_rows:
            raise IndexError(
                f"rows must be in [0, {self.num_rows}), got {rows.min()}..{rows.max()}"
            )
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        chunks = ordered // ROWS_PER_BATCH
        parts = []
        bounds = np.flatnonzero(np.diff(chunks)) + 1
        for start, end in zip([0, *bounds], [*bounds, len(ordered)], strict=True):
            chunk = int(chunks[start])
            local = ordered[start:end] - chunk * ROWS_PER_BATCH
            batch = self._batches[chunk]
            batch = batch if columns is None else batch.select(columns)
            parts.append(batch.take(pa.array(local)))
        table = pa.Table.from_batches(parts, schema=schema)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        taken = table.take(pa.array(inverse)).combine_chunks()
        # The pages read for these rows go back (they stay in the page cache): what the
        # process holds of the file is one batch's, however many batches it has read.
        self._map.madvise(mmap.MADV_DONTNEED)
        return taken

    def close(self) -> None:
        """Unmap the file (no Arrow buffer of it may be used afterwards)."""
        self._batches = []
        with contextlib.suppress(BufferError):
            self._map.close()
        self._file.close()


def count_rows(source: RowSource) -> int:
    """The training rows of ``source``, without building its row file: the files'
    Parquet footers, or, with a row filter, the filter over the filter's columns."""
    total = 0
    for uri in source.files:
        parquet = parquet_file(uri)
        if source.keep is None:
            total += parquet.metadata.num_rows
            continue
        for batch in _read_batches(parquet, uri, source):
            total += batch.num_rows
    return total


def open_rows(source: RowSource, cache_dir: str = "") -> RowFile:
    """This node's row file of ``source``: built on first use (one builder per node; the
    others wait for it), then memory-mapped."""
    folder = row_cache_dir(cache_dir)
    os.makedirs(folder, exist_ok=True)
    key = source.key()
    path = os.path.join(folder, f"{key}.arrow")
    with locked(os.path.join(folder, f"{key}.lock"), fcntl.LOCK_EX):
        if os.path.exists(path):
            os.utime(path)  # newest used: kept by the eviction
            return RowFile(path)
        for stale in os.listdir(folder):  # a builder killed outright left these
            if stale.startswith(f"{key}.arrow.tmp-"):
                os.remove(os.path.join(folder, stale))
        started = time.perf_counter()
        read, kept = _build(source, path)
        seconds = time.perf_counter() - started
        logger.info("row file %s: %d of %d rows in %.1f s", path, kept, read, seconds)
    evict_cache_files(folder, ".arrow", keep=KEEP_ROW_FILES)
    return RowFile(path, build_s=seconds, built=True)


@contextlib.contextmanager
def locked(path: str, how: int) -> Iterator[None]:
    """Hold ``flock`` ``how`` on the lock file ``path`` (made if missing) for the block."""
    with open(path, "a") as handle:
        fcntl.flock(handle, how)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_batches(parquet: pq.ParquetFile, uri: str, source: RowSource) -> Iterator[pa.RecordBatch]:
    """The source's columns of one Parquet file, in batches, its row filter applied;
    optional columns it lacks as nulls, and a missing required one as one line naming the
    file."""
    names = parquet.schema_arrow.names
    required = [*source.columns, *source.filter_columns]
    missing = [name for name in dict.fromkeys(required) if name not in names]
    if missing:
        raise ValueError(f"{uri} has no column(s) {missing} (its columns: {', '.join(names)})")
    wanted = list(dict.fromkeys([*required, *(name for name in source.optional if name in names)]))
    kept = [*source.columns, *source.optional]
    for batch in parquet.iter_batches(batch_size=_READ_ROWS, columns=wanted):
        for name in source.optional:
            if name not in names:
                batch = batch.append_column(name, pa.nulls(batch.num_rows, pa.string()))
        if source.keep is not None:
            batch = batch.filter(pa.array(source.keep(batch)))
        yield batch.select(kept)


def _build(source: RowSource, path: str) -> tuple[int, int]:
    """Write the row file: every file of the source in order, its training rows only, in
    record batches of :data:`ROWS_PER_BATCH` rows. Returns (rows read, rows kept)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    read = kept = 0
    writer = None
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    try:
        for uri in source.files:
            parquet = parquet_file(uri)
            read += parquet.metadata.num_rows
            for batch in _read_batches(parquet, uri, source):
                if not batch.num_rows:
                    continue
                batch = _uniform(batch)
                if writer is None:
                    writer = ipc.new_file(temporary, batch.schema)
                pending.append(batch)
                pending_rows += batch.num_rows
                while pending_rows >= ROWS_PER_BATCH:
                    table = pa.Table.from_batches(pending).combine_chunks()
                    writer.write_batch(table.slice(0, ROWS_PER_BATCH).to_batches()[0])
                    kept += ROWS_PER_BATCH
                    rest = table.slice(ROWS_PER_BATCH)
                    pending = rest.to_batches() if rest.num_rows else []
                    pending_rows = rest.num_rows
        if writer is None:
            raise ValueError(
                f"no training rows in {len(source.files)} file(s) from {source.files[0]}"
            )
        if pending_rows:
            writer.write_batch(pa.Table.from_batches(pending).combine_chunks().to_batches()[0])
            kept += pending_rows
        writer.close()
        writer = None
        if source.groups is not None:
            _write_groups(temporary, source)
        os.replace(temporary, path)
        if source.groups is not None:
            os.replace(f"{temporary}.groups.npz", f"{path}.groups.npz")
    finally:
        if writer is not None:
            writer.close()
        for leftover in (temporary, f"{temporary}.groups.npz"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)
    return read, kept


def _uniform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Strings as ``string`` and lists of strings as ``list<string>`` (Parquet files of one
    output may disagree on large or view types), so that every batch has one schema."""
    columns, fields = [], []
    for column, batch_field in zip(batch.columns, batch.schema, strict=True):
        kind = batch_field.type
        if (
            pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)
            or pa.types.is_null(kind)
        ):
            column, kind = column.cast(pa.string()), pa.string()
        elif pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
            kind = pa.list_(pa.string())
            column = column.cast(kind)
        columns.append(column)
        fields.append(pa.field(batch_field.name, kind))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def _write_groups(temporary: str, source: RowSource) -> None:
    """The source's units of the built file, beside it (``.groups.npz``, found by name)."""
    file = RowFile(temporary)
    try:
        offsets, members = source.groups(file)
    finally:
        file.close()
    with open(f"{temporary}.groups.npz", "wb") as handle:
        np.savez(handle, offsets=offsets, members=members)


def evict_cache_files(folder: str, suffix: str, keep: int) -> None:
    """Delete all but the ``keep`` newest files of ``folder`` named ``*suffix`` (row files,
    token files) with what stands beside them (a file a worker has mapped stays readable to
    it: its pages live until it is unmapped)."""
    files = sorted(
        (entry for entry in os.scandir(folder) if entry.name.endswith(suffix)),
        key=lambda entry: entry.stat().st_mtime,
        reverse=True,
    )
    for entry in files[keep:]:
        key = entry.name.removesuffix(suffix)
        lock = os.path.join(folder, f"{key}.lock")
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built or opened right now
            for name in (entry.name, f"{entry.name}.groups.npz"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(folder, name))
            fcntl.flock(handle, fcntl.LOCK_UN)
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)
