"""An index folder's files: the documents (one row group a shard), the embedding shards
(``embeddings/part-NNNNN.parquet``, each written whole) and the faiss index; reading them
back, and telling which shards a cut job already wrote."""

from __future__ import annotations

import os
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from santa.files import storage

__all__ = [
    "DOCUMENTS_FILE",
    "EMBEDDINGS_DIR",
    "INDEX_FILE",
    "read_documents",
    "read_embeddings",
    "shard_name",
    "write_shard",
]

DOCUMENTS_FILE = "documents.parquet"
EMBEDDINGS_DIR = "embeddings"
INDEX_FILE = "index.faiss"


def shard_name(shard: int) -> str:
    """The file name of shard ``shard``."""
    return f"part-{shard:05d}.parquet"


def read_documents(root: str, shard: int | None = None, columns: list[str] | None = None):
    """``documents.parquet`` under ``root``: all of it, or the row group of one shard."""
    filesystem, path = storage.resolve(storage.join(root, DOCUMENTS_FILE))
    with filesystem.open_input_file(path) as handle:
        reader = pq.ParquetFile(handle)
        if shard is None:
            return reader.read(columns=columns)
        return reader.read_row_group(shard, columns=columns)


def write_shard(root: str, shard: int, ids: pa.Array, embeddings: np.ndarray) -> None:
    """Write one shard's ``(id, embedding)`` rows whole."""
    dim = embeddings.shape[1]
    values = pa.array(np.ascontiguousarray(embeddings, dtype=np.float32).ravel(), pa.float32())
    table = pa.table({"id": ids, "embedding": pa.FixedSizeListArray.from_arrays(values, dim)})
    write_parquet_whole(table, storage.join(root, EMBEDDINGS_DIR, shard_name(shard)))


def write_parquet_whole(table: pa.Table, uri: str, **options: Any) -> None:
    """Write a Parquet file that is never seen half-written (S3 objects appear whole)."""
    if storage.is_s3(uri):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **options)
        storage.write_bytes(uri, sink.getvalue().to_pybytes())
        return
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    partial = os.path.join(os.path.dirname(uri), f".{os.path.basename(uri)}.{uuid.uuid4().hex}")
    pq.write_table(table, partial, **options)
    os.replace(partial, uri)


def read_embeddings(root: str, shards: int) -> tuple[list[str], np.ndarray]:
    """Every shard's ids and embeddings ``(n, dim)``, in shard order."""
    ids: list[str] = []
    parts: list[np.ndarray] = []
    for shard in range(shards):
        table = read_shard(root, shard)
        ids.extend(table.column("id").to_pylist())
        parts.append(embedding_matrix(table))
    return ids, np.concatenate(parts)


def read_shard(root: str, shard: int) -> pa.Table:
    filesystem, path = storage.resolve(storage.join(root, EMBEDDINGS_DIR, shard_name(shard)))
    return pq.read_table(path, filesystem=filesystem)


def embedding_matrix(table: pa.Table) -> np.ndarray:
    column = table.column("embedding").combine_chunks()
    dim = column.type.list_size
    return column.values.to_numpy(zero_copy_only=False).reshape(-1, dim)  # (rows, dim)


def finished_shards(work: str, expected: list[int]) -> set[int]:
    """Shards whose file is there with the expected number of rows."""
    folder = storage.join(work, EMBEDDINGS_DIR)
    if not storage.exists(folder):
        return set()
    present = {
        os.path.basename(uri.removeprefix("s3://")): uri
        for uri in storage.list_files(folder, suffixes=(".parquet",))
    }
    done = set()
    for shard, rows in enumerate(expected):
        uri = present.get(shard_name(shard))
        if uri is None:
            continue
        filesystem, path = storage.resolve(uri)
        try:
            with filesystem.open_input_file(path) as handle:
                if pq.ParquetFile(handle).metadata.num_rows == rows:
                    done.add(shard)
        except (OSError, pa.ArrowInvalid):
            continue  # unreadable: encode it again
    return done
