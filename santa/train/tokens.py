"""The node's token cache: each training row's collated token ids, kept on the node's disk
beside its row file (:mod:`santa.train.rows`) and read by row number, so that a row is
tokenized once per data version, tokenizer and lengths, not once per epoch, run or restart.

Nothing is tokenized ahead: a batch's rows that the cache lacks are read from the row file,
collated as ever and written into the cache (:meth:`TokenCache.collate`), and rows it holds
are read from it. The first epoch on a node tokenizes what it trains on, as it would
without the cache; later epochs, stages with the same tokenization, later runs and restarted
or resized worker groups read ids. A run never waits for the cache and never depends on it:
a cache that cannot be written (a full disk) is left as it is and the run collates.

One file per key, in the row files' folder (``SANTA_ROW_CACHE``, else ``<tmp>/santa-rows``):
a header (the key and the record layout), a byte per row (1: the row's record is written;
set after the record, so a writer killed mid-row leaves that row to be collated again), and
one fixed-size record per row (each array column of the collated batch, ids as ``int32``,
attention masks as ``uint8``; 1.6 KB a pair at the T5-base table recipe's lengths). The
file is sparse: its disk grows with the rows written. Records are written with ``pwrite``
(a full disk is an ``OSError``, never a fault of a mapped page) and read from a read-only
mapping whose pages are given back after each batch, so a worker's memory does not grow
with the set. The workers of a node share one file; rows are written by whoever collates
them first. The folder keeps the newest :data:`KEEP_TOKEN_FILES` token files.

The key (:func:`cache_key`) names the data version (the row file's own key), the collator's
key (for SANTA's pairs: the tokenizer as loaded, the lengths and prefixes, and the source of
the code that collates), and this file's format: any change there is another file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import threading
from typing import Any

import numpy as np

from santa.train.rows import RowFile, evict_cache_files, locked

__all__ = ["KEEP_TOKEN_FILES", "TokenCache", "cache_key", "open_token_cache"]

logger = logging.getLogger(__name__)

KEEP_TOKEN_FILES = 8
"""Token files a cache folder keeps (the newest used); older ones go when one is made."""
_FORMAT = 1  # bump when the file's layout changes: old files are not reused
_MAGIC = b"santa-tokens\n"
_HEADER = 4096  # bytes of the header, before the row flags
_PAGE = 4096


def cache_key(row_file: RowFile, collate_key: str) -> str:
    """The token file's name for ``row_file``'s rows collated as ``collate_key`` says."""
    payload = {
        "format": _FORMAT,
        "rows": os.path.basename(row_file.path),
        "num_rows": row_file.num_rows,
        "collate": collate_key,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return f"tokens-{digest[:24]}"


def _stored_type(name: str) -> np.dtype:
    """How a collated column is stored: masks in a byte, other integers in 32 bits."""
    if name.endswith("attention_mask"):
        return np.dtype(np.uint8)
    return np.dtype(np.int32)


class TokenCache:
    """One node's token file of a row file and a collator (thread- and process-safe)."""

    def __init__(self, path: str, num_rows: int, passthrough: tuple[str, ...] = ()) -> None:
        self.path = path
        self.num_rows = num_rows
        self.passthrough = passthrough
        """Columns of the rows handed on as they are (ids: strings), not cached."""
        self.rows_collated = 0
        """Rows this process has collated (not found in the cache)."""
        self.rows_cached = 0
        """Rows this process has read from the cache."""
        self.writable = True
        self._closed = False
        self._lock = threading.Lock()  # the file's state, and its reads and writes
        self._layout: list[tuple[str, str, str, int]] | None = None  # name, dtype, stored, width
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._flags: np.ndarray | None = None
        self._records: np.ndarray | None = None
        self._record_dtype: np.dtype | None = None
        self._records_at = 0

    # -------------------------------------------------------------- the file

    def _open(self, layout: list[tuple[str, str, str, int]]) -> None:
        """Map the token file of ``layout`` (made, sparse, when there is none or when the
        one there holds another layout)."""
        header = json.dumps(
            {"format": _FORMAT, "num_rows": self.num_rows, "layout": layout}, sort_keys=True
        ).encode()
        if len(_MAGIC) + len(header) + 1 > _HEADER:
            raise ValueError(f"token cache header of {len(header)} bytes is too long")
        flags_bytes = -(-self.num_rows // _PAGE) * _PAGE
        record_dtype = np.dtype([(name, stored, (width,)) for name, _, stored, width in layout])
        size = _HEADER + flags_bytes + self.num_rows * record_dtype.itemsize
        folder = os.path.dirname(self.path)
        key = os.path.basename(self.path).removesuffix(".tokens")
        with locked(os.path.join(folder, f"{key}.lock"), fcntl.LOCK_EX):
            if not _has_header(self.path, header, size):
                temporary = f"{self.path}.tmp-{os.getpid()}"
                try:
                    with open(temporary, "wb") as handle:
                        handle.write(_MAGIC + header + b"\n")
                        handle.truncate(size)  # sparse: blocks come as rows are written
                    os.replace(temporary, self.path)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(temporary)
                made = True
            else:
                os.utime(self.path)  # newest used: kept by the eviction
                made = False
            self._fd = os.open(self.path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ)
        self._map.madvise(mmap.MADV_RANDOM)
        self._flags = np.frombuffer(self._map, np.uint8, count=self.num_rows, offset=_HEADER)
        self._records_at = _HEADER + flags_bytes
        self._records = np.frombuffer(
            self._map, record_dtype, count=self.num_rows, offset=self._records_at
        )
        self._record_dtype = record_dtype
        self._layout = layout
        if made:
            evict_cache_files(folder, ".tokens", keep=KEEP_TOKEN_FILES)
            logger.info(
                "token cache %s: %d rows of %d bytes",
                self.path,
                self.num_rows,
                record_dtype.itemsize,
            )

    def _open_existing(self) -> bool:
        """Map the file there is for this key, in its own layout (the key names what was
        collated, so its layout is this collator's); False when there is none whole."""
        try:
            with open(self.path, "rb") as handle:
                head = handle.read(_HEADER)
        except FileNotFoundError:
            return False
        if not head.startswith(_MAGIC) or b"\n" not in head[len(_MAGIC) :]:
            return False
        try:
            header = json.loads(head[len(_MAGIC) :].split(b"\n", 1)[0])
        except ValueError:
            return False
        if header.get("format") != _FORMAT or header.get("num_rows") != self.num_rows:
            return False
        layout = [tuple(part) for part in header["layout"]]
        self._open(layout)  # checks the size too, and makes the file anew when it is not whole
        return True

    def filled(self) -> int:
        """Rows whose records the file holds (0 before the first batch)."""
        return 0 if self._flags is None else int(np.count_nonzero(self._flags))

    # -------------------------------------------------------------- a batch

    def collate(self, row_file: RowFile, rows: np.ndarray, collate) -> dict[str, Any]:
        """The collated batch of rows ``rows`` (in that order): the cached rows' records
        read, the others read from ``row_file``, collated by ``collate`` (a Table → a dict
        of arrays, one entry per row) and written for next time."""
        rows = np.asarray(rows, dtype=np.int64)
        with self._lock:
            self._check_open()
            if self._layout is None and not self._open_existing():
                # A new file: the first batch fixes the layout.
                batch = self._collate_rows(row_file, rows, collate)
                self._open(_layout_of(batch, len(rows), self.passthrough))
                self._write(rows, batch)
                return batch
            cached = self._flags[rows].astype(bool)
            present = np.flatnonzero(cached)
            missing = np.flatnonzero(~cached)
            if len(present):
                records = self._records[rows[present]]  # a copy
                # The pages read go back (they stay in the page cache).
                self._map.madvise(mmap.MADV_DONTNEED)
        if not len(present):
            batch = self._collate_rows(row_file, rows, collate)
            with self._lock:
                self._check_open()
                self._write(rows, batch)
            return batch
        self.rows_cached += len(present)
        out: dict[str, Any] = {}
        for name, dtype, _, width in self._layout:
            column = np.empty((len(rows), width), dtype=dtype)  # (batch, width)
            column[present] = records[name]
            out[name] = column
        if self.passthrough:
            ids = row_file.take(rows, columns=list(self.passthrough))
            for name in self.passthrough:
                out[name] = np.asarray(ids.column(name).to_pylist(), dtype=object)  # (batch,)
        if len(missing):
            fresh = self._collate_rows(row_file, rows[missing], collate)
            for name, *_ in self._layout:
                out[name][missing] = fresh[name]
            with self._lock:
                self._check_open()
                self._write(rows[missing], fresh)
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the token cache {self.path} is closed")

    def _collate_rows(self, row_file: RowFile, rows: np.ndarray, collate) -> dict[str, Any]:
        batch = collate(row_file.take(rows))
        if not isinstance(batch, dict):
            raise TypeError(f"a cached collator must return a dict, not {type(batch).__name__}")
        self.rows_collated += len(rows)
        return batch

    def _write(self, rows: np.ndarray, batch: dict[str, Any]) -> None:
        """Write the records of ``rows``, then their flags (a full disk: writing stops)."""
        if not self.writable:
            return
        records = np.empty(len(rows), dtype=self._record_dtype)
        for name, _, stored, _ in self._layout:
            values = np.asarray(batch[name])
            if values.shape != records[name].shape:
                raise ValueError(
                    f"collated column {name!r} has shape {values.shape}, the token cache "
                    f"{self.path} holds {records[name].shape}"
                )
            info = np.iinfo(stored)
            if values.size and (values.min() < info.min or values.max() > info.max):
                raise ValueError(f"collated column {name!r} does not fit the cache's {stored}")
            records[name] = values
        size = self._record_dtype.itemsize
        try:
            for row, record in zip(rows.tolist(), records, strict=True):
                data = record.tobytes()
                if os.pwrite(self._fd, data, self._records_at + row * size) != len(data):
                    raise OSError(f"short write to {self.path}")
            for row in rows.tolist():
                os.pwrite(self._fd, b"\x01", _HEADER + row)
        except OSError as error:
            self.writable = False
            logger.warning(
                "token cache %s: %s; batches are collated from here on", self.path, error
            )

    def close(self) -> None:
        """Unmap and close the file (a batch being collated meanwhile is refused)."""
        with self._lock:
            self._closed = True
            self._flags = self._records = None
            if self._map is not None:
                with contextlib.suppress(BufferError):
                    self._map.close()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _layout_of(
    batch: dict[str, Any], rows: int, passthrough: tuple[str, ...]
) -> list[tuple[str, str, str, int]]:
    """The records' layout from a collated batch: each integer array of one row per row."""
    layout = []
    for name in sorted(batch):
        if name in passthrough:
            continue
        values = batch[name]
        if (
            not isinstance(values, np.ndarray)
            or values.dtype.kind not in "iu"
            or values.ndim != 2
            or values.shape[0] != rows
        ):
            raise ValueError(
                f"collated column {name!r} is not a (rows, width) integer array: the token "
                "cache holds only those (name the others as passed through)"
            )
        layout.append((name, values.dtype.str, _stored_type(name).str, values.shape[1]))
    return layout


def _has_header(path: str, header: bytes, size: int) -> bool:
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_MAGIC) + len(header) + 1)
            handle.seek(0, os.SEEK_END)
            return head == _MAGIC + header + b"\n" and handle.tell() == size
    except FileNotFoundError:
        return False


def open_token_cache(row_file: RowFile, collate, cache_dir: str) -> TokenCache | None:
    """The node's token cache of ``row_file`` for ``collate``, or None when the collator
    names no key (``cache_key()``: None, e.g. a tokenizer santa cannot fingerprint)."""
    key_of = getattr(collate, "cache_key", None)
    collate_key = key_of() if key_of is not None else None
    if collate_key is None:
        return None
    folder = cache_dir or os.path.dirname(row_file.path)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{cache_key(row_file, collate_key)}.tokens")
    return TokenCache(path, row_file.num_rows, tuple(getattr(collate, "passthrough", ())))
