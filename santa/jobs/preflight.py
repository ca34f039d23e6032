"""Checks a job makes before any Ray work: cheap, and each failure one line naming the URI.

An output is checked by writing and deleting a probe object where the job will write (a
missing bucket, bad credentials, a read-only folder or a silent S3 endpoint show up here,
not after the processing); inputs must exist; evaluation data must load.
"""

from __future__ import annotations

import errno
import os
import uuid

import pyarrow.fs as pafs

from santa.files import storage
from santa.files.storage import StorageError

__all__ = [
    "check_beir",
    "check_input",
    "check_model",
    "check_negatives_table",
    "check_pairs",
    "check_writable",
]

PROBE_PREFIX = ".santa-probe-"


def check_writable(uri: str, what: str = "output") -> None:
    """Write and delete a probe object at ``uri`` (a folder, made or not yet)."""
    name = PROBE_PREFIX + uuid.uuid4().hex
    if storage.is_s3(uri):
        try:
            location = storage.open_location(uri)
        except StorageError as error:
            if error.transient:
                raise  # it names the endpoint and the URI already
            raise StorageError(f"cannot write the {what} {uri}: {error}") from None
        probe = location.child(name)

        def write_and_delete() -> None:
            with probe.fs.open_output_stream(probe.path) as stream:
                stream.write(b"santa write check\n")
            probe.fs.delete_file(probe.path)

        storage.classified(write_and_delete, uri, f"write the {what}")
        return
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(f"unsupported {what} URI {uri!r}: use a local path or s3://bucket/key")
    path = os.path.abspath(os.path.expanduser(uri.removeprefix("file://")))
    folder = path
    while not os.path.exists(folder):  # the nearest folder that exists gets the probe
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise StorageError(f"cannot write the {what} {uri}: {folder} is a file, not a folder")
    try:
        probe = os.path.join(folder, name)
        with open(probe, "wb") as handle:
            handle.write(b"santa write check\n")
        os.remove(probe)
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            reason = f"{reason.lower()} in {folder}"
        raise StorageError(f"cannot write the {what} {uri}: {reason}") from None


def check_input(uri: str, what: str = "input") -> None:
    """The file or folder ``uri`` exists (S3: bucket and credentials are checked too)."""
    if storage.is_s3(uri):
        location = storage.open_location(uri)
        if storage.file_info(location).type == pafs.FileType.NotFound:
            raise StorageError(f"no {what} at {uri}")
        return
    if not os.path.exists(os.path.expanduser(uri)):
        raise StorageError(f"no {what} at {uri}")


def check_pairs(uri: str, what: str = "--data") -> None:
    """``uri`` is preprocessed pairs: Parquet files under its (published) ``data/``."""
    from santa.data.published import pair_files

    check_input(uri, what)
    pair_files(uri, what)  # one line: "--data URI holds no preprocessed pairs (...)"


def check_beir(uri: str, split: str, what: str = "--eval-data") -> None:
    """``uri`` is a BEIR folder whose ``split`` loads."""
    from santa.data.beir import load_beir

    check_input(uri, what)
    try:
        load_beir(uri, split)
    except (StorageError, ValueError) as error:
        raise StorageError(f"{what}: {error}") from None


def check_model(source: str, what: str = "--init-checkpoint") -> None:
    """``source`` resolves to a model folder whose config and weights load (a hub name is
    left to the workers); a corrupt file is named with its reason."""
    from santa.models.checkpoints import resolve_model
    from santa.models.weights import check_model_folder

    resolved = resolve_model(source)  # a mistyped folder is named here, not sent to the hub
    if not resolved.is_hub_name:
        check_model_folder(resolved.model_uri, what)


def check_negatives_table(uri: str, what: str = "--hard-negatives table:") -> None:
    """A hard-negatives table is there and has its columns (its schema is read, not its rows)."""
    import pyarrow.parquet as pq

    from santa.negatives.table import TABLE_FILE, published_table

    check_input(uri, what + uri)
    target = uri if uri.endswith(".parquet") else published_table(uri)
    if target is None:
        raise StorageError(
            f"{what}{uri} holds no hard-negatives table ({TABLE_FILE}, as "
            "ray_jobs.mine_negatives writes it)"
        )
    filesystem, path = storage.resolve(target)
    try:
        schema = pq.read_schema(path, filesystem=filesystem)
    except OSError as error:
        raise ValueError(f"cannot read the hard-negatives table {target}: {error}") from None
    missing = {"query_id", "negative_ids"} - set(schema.names)
    if missing:
        raise ValueError(f"{target} is not a hard-negatives table: no column(s) {sorted(missing)}")
