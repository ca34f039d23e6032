"""URIs everywhere: a local path or ``s3://bucket/prefix``, resolved through pyarrow.

All file access of santa goes through here: whole files (bytes, JSON), listings, folder
copies to and from S3, and :class:`Location` (a filesystem with a path) for code that walks
storage, such as :mod:`santa.models.checkpoints`.

S3 endpoints and credentials come from the standard AWS chain (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, instance profiles, ...); nothing here reads, prints or logs them.
:func:`resolve` and :func:`open_location` share one S3 filesystem per bucket with
connect and read timeouts and a bounded number of attempts, so an unreachable endpoint, or
one that accepts connections and never answers, fails within seconds (the settings:
``SANTA_S3_CONNECT_TIMEOUT``, ``SANTA_S3_READ_TIMEOUT`` in seconds, ``SANTA_S3_MAX_ATTEMPTS``);
:func:`classify_error` turns S3 errors into one line naming the URI.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import posixpath
import re
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse

import pyarrow.fs as pafs

S3_CONNECT_TIMEOUT_S = 5.0
S3_REQUEST_TIMEOUT_S = 10.0  # no byte for this long: the request failed (not a size limit)
UPLOAD_CHUNK_BYTES = 8 * 1024 * 1024  # each write handed to pyarrow's stream
S3_MAX_ATTEMPTS = 2  # a silent endpoint fails in ~2 x read timeout, a closed port at once
_CREDENTIAL_ERRORS = (
    "ACCESS_DENIED",
    "AccessDenied",
    "INVALID_ACCESS_KEY_ID",
    "InvalidAccessKeyId",
    "SIGNATURE_DOES_NOT_MATCH",
    "SignatureDoesNotMatch",
    "EXPIRED_TOKEN",
    "ExpiredToken",
    "InvalidToken",
    "MISSING_AUTHENTICATION_TOKEN",
    "Unable to locate credentials",
)
T = TypeVar("T")


class StorageError(RuntimeError):
    """A storage URI could not be read or written; the message says which and why.

    ``transient``: the storage could not be reached (a fault at run time, exit 1), rather
    than something wrong with the URI, bucket or credentials (bad input, exit 2).
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def _setting(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value else default
    except ValueError:
        raise StorageError(f"{name} must be a number of seconds, not {value!r}") from None


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
        bucket, _, key = uri[len("s3://") :].partition("/")
        if not bucket:
            raise StorageError(f"no bucket in {uri!r}")
        key = key.strip("/")
        return s3_filesystem(bucket), f"{bucket}/{key}" if key else bucket
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))


def exists(uri: str) -> bool:
    """Whether a file or directory exists at ``uri``."""
    fs, path = resolve(uri)
    info = classified(lambda: fs.get_file_info(path), uri, "read")
    return info.type != pafs.FileType.NotFound


def list_files(uri: str, suffixes: Iterable[str] = ()) -> list[str]:
    """All files under ``uri`` (recursively, sorted) ending in one of ``suffixes``.

    Names starting with ``.`` or ``_`` are skipped, as Ray Data does. Returned entries keep
    the URI's form (``s3://...`` stays ``s3://...``).
    """
    fs, path = resolve(uri)
    info = classified(lambda: fs.get_file_info(path), uri, "list")
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"no such file or directory: {uri}")
    suffixes = tuple(suffixes)
    if info.type == pafs.FileType.File:
        found = [path]
    else:
        entries = classified(
            lambda: fs.get_file_info(pafs.FileSelector(path, recursive=True)), uri, "list"
        )
        found = [
            entry.path
            for entry in entries
            if entry.type == pafs.FileType.File
            and not any(part.startswith((".", "_")) for part in _relative_parts(entry.path, path))
        ]
    found = sorted(p for p in found if not suffixes or p.endswith(suffixes))
    return [("s3://" + p) if is_s3(uri) else p for p in found]


def file_sizes(uris: list[str]) -> list[int]:
    """The size in bytes of each file (one listing call, not one per file)."""
    return [size for size, _ in file_infos(uris)]


def file_infos(uris: list[str]) -> list[tuple[int, int | None]]:
    """Each file's size in bytes and modification time (ns; None where the storage keeps
    none), in one listing call."""
    if not uris:
        return []
    fs, _ = resolve(uris[0])
    paths = [uri.removeprefix("s3://") if is_s3(uri) else resolve(uri)[1] for uri in uris]
    infos = classified(lambda: fs.get_file_info(paths), uris[0], "read")
    missing = [
        uri for uri, info in zip(uris, infos, strict=True) if info.type != pafs.FileType.File
    ]
    if missing:
        raise StorageError(f"no such file: {missing[0]}")
    return [(int(info.size), info.mtime_ns) for info in infos]


def _relative_parts(path: str, root: str) -> list[str]:
    # Pure string work: posixpath.relpath would call os.getcwd(), which fails in a process
    # whose working directory was removed (e.g. a finished job's unpacked working_dir).
    prefix = root.rstrip("/") + "/"
    relative = path[len(prefix) :] if path.startswith(prefix) else posixpath.basename(path)
    return relative.split("/")


def write_bytes(uri: str, data: bytes) -> None:
    """Write ``data`` to ``uri`` as is (:func:`write_chunks` with one chunk)."""
    write_chunks(uri, [data])


def write_chunks(uri: str, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``uri`` in order, as is, without holding them together.

    A local file is written beside ``uri`` (hidden) and renamed onto it when complete,
    its parent directories created. On S3 the object appears when its upload closes
    (and is deleted if writing fails); no directories: pyarrow's ``create_dir`` there
    costs requests for each level of the path and leaves an empty ``folder/`` object at
    each. pyarrow would gzip a ``*.gz`` path on its own (``compression="detect"``);
    bytes are written and read verbatim here.
    """
    fs, path = resolve(uri)
    local = not is_s3(uri)
    folder, name = posixpath.split(path)
    target = posixpath.join(folder, f".{name}.{uuid.uuid4().hex}") if local else path
    try:
        if local:
            fs.create_dir(folder, recursive=True)
        with fs.open_output_stream(target, compression=None) as stream:
            for chunk in chunks:
                stream.write(chunk)
        if local:
            fs.move(target, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            fs.delete_file(target)
        if isinstance(error, OSError):
            raise classify_error(error, uri, "write") from None
        raise


def read_bytes(uri: str) -> bytes:
    """Read the whole file at ``uri``."""
    fs, path = resolve(uri)
    try:
        with fs.open_input_stream(path, compression=None) as stream:
            return stream.readall()
    except FileNotFoundError as error:
        raise StorageError(f"no such file: {uri}") from error
    except OSError as error:
        raise classify_error(error, uri, "read") from None


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


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True)
class Location:
    """A path on a filesystem, with the URI that names it to users."""

    fs: pafs.FileSystem = field(repr=False, compare=False)
    path: str
    uri: str

    @property
    def is_local(self) -> bool:
        """Whether the path is on the local filesystem."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def child(self, *parts: str) -> Location:
        """The location of ``parts`` under this one."""
        return Location(
            self.fs, posixpath.join(self.path, *parts), posixpath.join(self.uri, *parts)
        )

    @property
    def parent(self) -> Location:
        """The folder holding this location."""
        return Location(
            self.fs, posixpath.dirname(self.path.rstrip("/")), posixpath.dirname(self.uri)
        )

    @property
    def name(self) -> str:
        """The last path component."""
        return posixpath.basename(self.path.rstrip("/"))


def s3_filesystem(bucket: str) -> pafs.S3FileSystem:
    """An S3 filesystem for ``bucket`` that fails fast; credentials from the AWS chain.

    One per bucket and settings (finding a bucket's region is a request of its own).
    """
    names = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")
    names += ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "SANTA_S3_CONNECT_TIMEOUT")
    names += ("SANTA_S3_READ_TIMEOUT", "SANTA_S3_MAX_ATTEMPTS")
    return _s3_filesystem(bucket, tuple(os.environ.get(name, "") for name in names))


@functools.lru_cache(maxsize=64)
def _s3_filesystem(bucket: str, _settings: tuple[str, ...]) -> pafs.S3FileSystem:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    options: dict[str, Any] = {
        "connect_timeout": _setting("SANTA_S3_CONNECT_TIMEOUT", S3_CONNECT_TIMEOUT_S),
        "request_timeout": _setting("SANTA_S3_READ_TIMEOUT", S3_REQUEST_TIMEOUT_S),
        "max_attempts": int(_setting("SANTA_S3_MAX_ATTEMPTS", S3_MAX_ATTEMPTS)),
    }
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options["endpoint_override"] = parsed.hostname + (f":{parsed.port}" if parsed.port else "")
        options["scheme"] = parsed.scheme
        options["region"] = region or "us-east-1"
    else:
        try:
            options["region"] = pafs.resolve_s3_region(bucket)
        except OSError as error:
            if "not found" in str(error).lower():
                raise StorageError(f"no such bucket: s3://{bucket}") from None
            if not region:
                raise classify_error(error, f"s3://{bucket}", "find the region of") from None
            options["region"] = region
    return BoundedS3FileSystem(**options)


class BoundedS3FileSystem(pafs.S3FileSystem):
    """pyarrow's S3 filesystem with a bounded number of attempts that survives pickling.

    pyarrow pickles an ``S3FileSystem`` without its ``retry_strategy``: the copy that Ray
    hands to its processes (Ray Data's tasks, Ray Train's checkpoint uploads) made 3
    attempts where santa's driver makes ``SANTA_S3_MAX_ATTEMPTS``, and a silent endpoint
    took half as long again there.
    """

    def __init__(self, *, max_attempts: int, **options: Any) -> None:
        retry = pafs.AwsStandardS3RetryStrategy(max_attempts=max_attempts)
        super().__init__(retry_strategy=retry, **options)
        self.santa_options = {**options, "max_attempts": max_attempts}

    def __reduce__(self):
        return _bounded_s3, (self.santa_options,)


def _bounded_s3(options: dict[str, Any]) -> BoundedS3FileSystem:
    return BoundedS3FileSystem(**options)


def for_ray(uri: str) -> tuple[str, pafs.FileSystem | None]:
    """What to hand Ray for ``uri``: Ray Data's ``(paths, filesystem=)``, Ray Train's
    ``RunConfig(storage_path, storage_filesystem=)``.

    On S3, ``bucket/key`` and santa's :func:`s3_filesystem`, so that Ray's own reads,
    writes and checkpoint uploads get santa's connect/request timeouts (a silent endpoint
    ends a job in seconds, not after Ray's and the AWS SDK's defaults); locally the path
    and None (Ray's default). Ray's returned paths then lack the ``s3://`` scheme
    (:func:`santa.files.layout.checkpoint_uri` puts it back).
    """
    if not is_s3(uri):
        return uri, None
    bucket, _, key = uri[len("s3://") :].partition("/")
    path = f"{bucket}/{key.strip('/')}" if key.strip("/") else bucket
    limit_ray_data_retries()
    return path, s3_filesystem(bucket)


def for_ray_write(uri: str) -> tuple[str, dict[str, Any]]:
    """Ray Data's ``write_parquet(path, **options)`` for ``uri``: :func:`for_ray`'s path and
    filesystem, and on S3 no directory creation (S3 has none: pyarrow's ``create_dir`` tests
    the bucket twice, in the driver and in every write task, and against a silent endpoint
    that doubled the time a write took to fail)."""
    path, filesystem = for_ray(uri)
    return path, {"filesystem": filesystem, "try_create_dir": not is_s3(uri)}


# Ray Data retries a read or write that fails with these AWS errors up to 10 times, with a
# backoff growing to 32 s, on top of pyarrow's own attempts (and again per batch): a silent
# endpoint kept a read waiting more than 15 minutes. pyarrow's attempts, with santa's
# timeouts, are the only retries of these; throttling and 503s stay Ray Data's to retry.
NOT_RETRIED_BY_RAY_DATA = ("AWS Error NETWORK_CONNECTION",)


def limit_ray_data_retries() -> None:
    """Drop :data:`NOT_RETRIED_BY_RAY_DATA` from Ray Data's retried errors (the current
    DataContext: datasets created from now on, and their tasks, keep it)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.retried_io_errors = [
        error for error in context.retried_io_errors if error not in NOT_RETRIED_BY_RAY_DATA
    ]


_S3_OBJECT = re.compile(r"key '([^']*)' in bucket '([^']*)'")
_S3_BUCKET = re.compile(r"bucket '([^']*)'")


def s3_error(error: BaseException) -> StorageError | None:
    """The one-line :class:`StorageError` of an AWS error pyarrow raised inside Ray (a Ray
    Data task, a checkpoint upload): the URI it names and why; None for other errors."""
    text = " ".join(str(error).split())
    if not isinstance(error, OSError) or "AWS Error" not in text:
        return None
    found = _S3_OBJECT.search(text)
    if found:
        uri = f"s3://{found.group(2)}/{found.group(1)}".rstrip("/")
    else:
        bucket = _S3_BUCKET.search(text)
        uri = f"s3://{bucket.group(1)}" if bucket else "S3"
    lowered = text.lower()
    writing = any(word in lowered for word in ("upload", "writing", "creating", "deleting"))
    return classify_error(error, uri, "write" if writing else "read")


def unreachable(error: BaseException) -> StorageError | None:
    """The :class:`StorageError` of ``error`` (or of pyarrow's AWS error inside it) when it
    says the S3 endpoint did not answer past santa's timeouts and attempts; None otherwise.

    Such a fault is not worth another try at once: a retry (Ray Train's new worker group, a
    cleanup upload) would wait the same timeouts on the same endpoint before failing again.
    """
    if not isinstance(error, StorageError):
        error = s3_error(error) or error
    return error if isinstance(error, StorageError) and error.transient else None


def is_ray_checkpoint(source: Any) -> bool:
    """Whether ``source`` is a ``ray.train.Checkpoint`` (duck-typed: Ray is not imported)."""
    return hasattr(source, "path") and isinstance(
        getattr(source, "filesystem", None), pafs.FileSystem
    )


def open_location(source: Any) -> Location:
    """A :class:`Location` for a local path, ``s3://`` URI or ``ray.train.Checkpoint``.

    An S3 bucket is checked once here, so a missing bucket is named as such.
    """
    if is_ray_checkpoint(source):
        filesystem = source.filesystem
        path = str(source.path)
        if isinstance(filesystem, pafs.S3FileSystem):
            return Location(filesystem, path.rstrip("/"), "s3://" + path.strip("/"))
        return Location(filesystem, path, path)
    uri = os.fspath(source)
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if is_s3(uri):
        bucket, _, key = uri[len("s3://") :].partition("/")
        if not bucket:
            raise StorageError(f"no bucket in {uri!r}")
        filesystem = s3_filesystem(bucket)
        bucket_info = classified(lambda: filesystem.get_file_info(bucket), uri, "open")
        if bucket_info.type == pafs.FileType.NotFound:
            raise StorageError(f"no such bucket: s3://{bucket}")
        key = key.strip("/")
        path = f"{bucket}/{key}" if key else bucket
        return Location(filesystem, path, f"s3://{path}")
    if "://" in uri:
        raise StorageError(f"unsupported URI {uri!r}: use a local path or s3://bucket/key")
    path = os.path.abspath(os.path.expanduser(uri))
    return Location(pafs.LocalFileSystem(), path, path)


def _endpoint_name() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return "AWS S3"
    parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    # Host and port only: never echo anything that could carry user info.
    return f"{parsed.scheme}://{parsed.hostname}" + (f":{parsed.port}" if parsed.port else "")


def classify_error(error: OSError, uri: str, action: str) -> StorageError:
    """One clear line for an S3/filesystem error (no AWS request ids, never credentials)."""
    text = " ".join(str(error).split())
    if isinstance(error, FileNotFoundError):
        return StorageError(f"not found: {uri}")
    if "NETWORK_CONNECTION" in text or "curlCode" in text:
        why = "no answer in time" if "Timeout" in text or "curlCode: 28" in text else ""
        return StorageError(
            f"cannot reach the S3 endpoint {_endpoint_name()} to {action} {uri}"
            + (f" ({why})" if why else ""),
            transient=True,
        )
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return StorageError(f"no such bucket: {uri}")
    if any(marker in text for marker in _CREDENTIAL_ERRORS):
        return StorageError(
            f"access denied to {uri}: check the AWS credentials (environment variables, "
            "profile or instance role) and their permissions on the bucket"
        )
    text = re.sub(r"\s*\(Request ID:[^)]*\)", "", text)
    return StorageError(f"cannot {action} {uri}: {text}")


def classified(function: Callable[[], T], uri: str, action: str) -> T:
    """``function()``, its ``OSError`` turned into a one-line :class:`StorageError`."""
    try:
        return function()
    except OSError as error:
        raise classify_error(error, uri, action) from None


def file_info(location: Location) -> pafs.FileInfo:
    """The file info of ``location`` (type ``NotFound`` when there is nothing)."""
    return classified(lambda: location.fs.get_file_info(location.path), location.uri, "read")


def list_dir(location: Location) -> list[pafs.FileInfo]:
    """Entries directly under a folder; empty when it does not exist or is a file."""
    selector = pafs.FileSelector(location.path, allow_not_found=True, recursive=False)
    try:
        return location.fs.get_file_info(selector)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        if location.is_local and os.path.isfile(location.path):
            return []
        raise classify_error(error, location.uri, "list") from None


def read_json_or_none(location: Location, invalid_ok: bool = False) -> Any | None:
    """The parsed JSON file; None when there is none (or, with ``invalid_ok``, if broken)."""

    def read() -> bytes | None:
        try:
            with location.fs.open_input_stream(location.path, compression=None) as stream:
                return stream.readall()
        except (FileNotFoundError, IsADirectoryError):
            return None

    data = classified(read, location.uri, "read")
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        if invalid_ok:
            return None
        raise StorageError(f"not valid JSON: {location.uri}") from None


def download_dir(source: str | Location, local_dir: str, what: str = "folder") -> None:
    """Copy every file under a folder (a URI or :class:`Location`) into ``local_dir``.

    A missing folder raises ``StorageError("no {what} at {uri}")``.
    """
    if isinstance(source, str):
        filesystem, path = resolve(source)
        source = Location(filesystem, path, source)
    if file_info(source).type == pafs.FileType.NotFound:
        raise StorageError(f"no {what} at {source.uri}")
    # Arrow creates the folders it lists; a flat S3 folder lists none, so make the root.
    os.makedirs(local_dir, exist_ok=True)
    classified(
        lambda: pafs.copy_files(
            source.path,
            local_dir,
            source_filesystem=source.fs,
            destination_filesystem=pafs.LocalFileSystem(),
        ),
        source.uri,
        "download",
    )


def upload_dir(local_dir: str, uri: str) -> None:
    """Copy every file of ``local_dir`` under ``uri`` (local or ``s3://``), keeping paths.

    One file after another, each one stream (no directory objects on S3): on an endpoint gone
    silent, the first request to fail ends the copy within santa's attempts. With
    ``pyarrow.fs.copy_files`` (directories first, files on its threads) a one-file TensorBoard
    folder took 41 s to fail there, file by file 35 s (2026-11-28).
    """
    filesystem, path = resolve(uri)
    on_s3 = is_s3(uri)

    def copy() -> None:
        for root, _, names in os.walk(local_dir):
            for name in sorted(names):
                source = os.path.join(root, name)
                target = posixpath.join(
                    path, os.path.relpath(source, local_dir).replace(os.sep, "/")
                )
                if not on_s3:
                    filesystem.create_dir(posixpath.dirname(target), recursive=True)
                with (
                    open(source, "rb") as data,
                    filesystem.open_output_stream(target, compression=None) as stream,
                ):
                    shutil.copyfileobj(data, stream, UPLOAD_CHUNK_BYTES)

    classified(copy, uri, "upload to")
