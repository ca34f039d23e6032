"""URIs everywhere: a local path or ``s3://bucket/prefix``, resolved through pyarrow.

S3 endpoints and credentials come from the standard AWS chain (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, instance profiles, ...); nothing here reads, prints or logs them.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterable
from typing import Any

import pyarrow.fs as pafs


class StorageError(RuntimeError):
    """A storage URI could not be read or written; the message says which and why."""


def is_s3(uri: str) -> bool:
    """Whether ``uri`` names an S3 location."""
    return uri.startswith("s3://")


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a local path or URI."""
    if is_s3(uri):
        return posixpath.join(uri, *parts)
    return os.path.join(uri, *parts)


def absolute(uri: str) -> str:
    """A local path made absolute (Ray workers and Ray Train's storage need that: they run
    in other folders, and Train V2 rejects a relative ``storage_path``); URIs as they are."""
    if not uri or "://" in uri:
        return uri
    return os.path.abspath(os.path.expanduser(uri))


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, path)`` for a local path or ``s3://`` URI."""
    if is_s3(uri):
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
        except Exception as error:  # pyarrow raises OSError/ArrowInvalid with AWS details
            raise StorageError(f"cannot open {uri}: {error}") from error
        return fs, path
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))


def exists(uri: str) -> bool:
    """Whether a file or directory exists at ``uri``."""
    fs, path = resolve(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def list_files(uri: str, suffixes: Iterable[str] = ()) -> list[str]:
    """All files under ``uri`` (recursively, sorted) ending in one of ``suffixes``.

    Names starting with ``.`` or ``_`` are skipped, as Ray Data does. Returned entries keep
    the URI's form (``s3://...`` stays ``s3://...``).
    """
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"no such file or directory: {uri}")
    suffixes = tuple(suffixes)
    if info.type == pafs.FileType.File:
        found = [path]
    else:
        found = [
            entry.path
            for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True))
            if entry.type == pafs.FileType.File
            and not any(part.startswith((".", "_")) for part in _relative_parts(entry.path, path))
        ]
    found = sorted(p for p in found if not suffixes or p.endswith(suffixes))
    return [("s3://" + p) if is_s3(uri) else p for p in found]


def file_sizes(uris: list[str]) -> list[int]:
    """The size in bytes of each file (one listing call, not one per file)."""
    if not uris:
        return []
    fs, _ = resolve(uris[0])  # one filesystem: resolving every s3 URI would connect anew
    paths = [uri.removeprefix("s3://") if is_s3(uri) else resolve(uri)[1] for uri in uris]
    infos = fs.get_file_info(paths)
    missing = [
        uri for uri, info in zip(uris, infos, strict=True) if info.type != pafs.FileType.File
    ]
    if missing:
        raise StorageError(f"no such file: {missing[0]}")
    return [int(info.size) for info in infos]


def _relative_parts(path: str, root: str) -> list[str]:
    # Pure string work: posixpath.relpath would call os.getcwd(), which fails in a process
    # whose working directory was removed (e.g. a finished job's unpacked working_dir).
    prefix = root.rstrip("/") + "/"
    relative = path[len(prefix) :] if path.startswith(prefix) else posixpath.basename(path)
    return relative.split("/")


def write_bytes(uri: str, data: bytes) -> None:
    """Write ``data`` to ``uri`` as is, creating parent directories.

    pyarrow would gzip a ``*.gz`` path on its own (``compression="detect"``); bytes are
    written and read verbatim here.
    """
    fs, path = resolve(uri)
    try:
        fs.create_dir(posixpath.dirname(path), recursive=True)
        with fs.open_output_stream(path, compression=None) as stream:
            stream.write(data)
    except OSError as error:
        raise StorageError(f"cannot write {uri}: {error}") from error


def read_bytes(uri: str) -> bytes:
    """Read the whole file at ``uri``."""
    fs, path = resolve(uri)
    try:
        with fs.open_input_stream(path, compression=None) as stream:
            return stream.readall()
    except FileNotFoundError as error:
        raise StorageError(f"no such file: {uri}") from error
    except OSError as error:
        raise StorageError(f"cannot read {uri}: {error}") from error


def write_json(uri: str, payload: Any) -> None:
    """Write ``payload`` as indented JSON."""
    write_bytes(uri, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


def read_json(uri: str) -> Any:
    """Read a JSON file."""
    return json.loads(read_bytes(uri))


def delete_dir(uri: str) -> None:
    """Delete a directory and everything under it, if it exists."""
    fs, path = resolve(uri)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)
