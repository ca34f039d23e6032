"""Find trained models in storage and fetch them: the resolver behind ``santa.load`` and
``python -m ray_jobs.export``.

What is found where:

- a **Hugging Face folder** (``config.json`` + weights, as ``DualEncoder.save_pretrained``
  writes it, with the tokenizer and ``santa_config.json``);
- a **santa checkpoint** (a Ray Train checkpoint folder): ``model/`` (such a folder) plus
  ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pt`` and ``trainer_state.json``
  (``{"step": ...}``), see :mod:`santa.train.loop`;
- a **Ray Train run**, ``<storage_path>/<name>/``: ``checkpoint_<timestamp>/`` folders and
  ``checkpoint_manager_snapshot.json``, Ray's own record of the checkpoints it committed;
- a **Tune sweep** root with ``best.json`` (``{"checkpoint": URI, ...}``).

A folder without weights (an upload cut short, a deleted model) is never taken for a
checkpoint. Locations are local paths or ``s3://bucket/key`` URIs. S3 credentials come from the
standard AWS chain only (environment, profile, instance role) and are never read, printed or
logged here; the endpoint from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``. S3 calls use
short connect timeouts and few retries, so an unreachable endpoint fails within seconds.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from santa.storage import StorageError

if TYPE_CHECKING:
    from santa.config import ModelConfig
    from santa.model import DualEncoder

__all__ = [
    "BEST_FILE",
    "RUN_SNAPSHOT_FILE",
    "CheckpointError",
    "ResolvedModel",
    "best_checkpoint",
    "download",
    "latest_checkpoint",
    "load",
    "resolve",
    "resolve_checkpoint",
]

# Names written by santa.train.loop (kept equal by tests/test_export.py).
MODEL_DIR = "model"
STATE_FILE = "trainer_state.json"
# ray.train.v2._internal.constants.CHECKPOINT_MANAGER_SNAPSHOT_FILENAME (Ray 2.60).
RUN_SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
CHECKPOINT_PREFIX = "checkpoint_"
BEST_FILE = "best.json"
HF_CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

S3_CONNECT_TIMEOUT_S = 3.0
S3_REQUEST_TIMEOUT_S = 30.0
S3_MAX_ATTEMPTS = 3  # a closed port fails in ~2 s; a dropped connection in ~3 x connect
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
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


class CheckpointError(StorageError):
    """A model or checkpoint could not be found or fetched; the message is one line."""


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True)
class Location:
    """A path on a filesystem, with the URI that names it to users."""

    fs: pafs.FileSystem = field(repr=False, compare=False)
    path: str
    uri: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def child(self, *parts: str) -> Location:
        return Location(
            self.fs, posixpath.join(self.path, *parts), posixpath.join(self.uri, *parts)
        )

    @property
    def parent(self) -> Location:
        return Location(
            self.fs, posixpath.dirname(self.path.rstrip("/")), posixpath.dirname(self.uri)
        )

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))


def s3_filesystem(bucket: str) -> pafs.S3FileSystem:
    """An S3 filesystem for ``bucket`` that fails fast; credentials from the AWS chain."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    options: dict[str, Any] = {
        "connect_timeout": S3_CONNECT_TIMEOUT_S,
        "request_timeout": S3_REQUEST_TIMEOUT_S,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS),
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
                raise CheckpointError(f"no such bucket: s3://{bucket}") from None
            if not region:
                raise _classify(error, f"s3://{bucket}", "find the region of") from None
            options["region"] = region
    return pafs.S3FileSystem(**options)


def _is_ray_checkpoint(source: Any) -> bool:
    """A ``ray.train.Checkpoint`` (duck-typed: Ray is not imported here)."""
    return hasattr(source, "path") and isinstance(
        getattr(source, "filesystem", None), pafs.FileSystem
    )


def open_location(source: Any) -> Location:
    """A :class:`Location` for a local path, ``s3://`` URI or ``ray.train.Checkpoint``.

    An S3 bucket is checked once here, so a missing bucket is named as such.
    """
    if _is_ray_checkpoint(source):
        filesystem = source.filesystem
        path = str(source.path)
        if isinstance(filesystem, pafs.S3FileSystem):
            return Location(filesystem, path.rstrip("/"), "s3://" + path.strip("/"))
        return Location(filesystem, path, path)
    uri = os.fspath(source)
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://") :].partition("/")
        if not bucket:
            raise CheckpointError(f"no bucket in {uri!r}")
        filesystem = s3_filesystem(bucket)
        bucket_info = _call(lambda: filesystem.get_file_info(bucket), uri, "open")
        if bucket_info.type == pafs.FileType.NotFound:
            raise CheckpointError(f"no such bucket: s3://{bucket}")
        key = key.strip("/")
        path = f"{bucket}/{key}" if key else bucket
        return Location(filesystem, path, f"s3://{path}")
    if "://" in uri:
        raise CheckpointError(f"unsupported URI {uri!r}: use a local path or s3://bucket/key")
    path = os.path.abspath(os.path.expanduser(uri))
    return Location(pafs.LocalFileSystem(), path, path)


def _endpoint_name() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return "AWS S3"
    parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    # Host and port only: never echo anything that could carry user info.
    return f"{parsed.scheme}://{parsed.hostname}" + (f":{parsed.port}" if parsed.port else "")


def _classify(error: OSError, uri: str, action: str) -> CheckpointError:
    """One clear line for an S3/filesystem error (no AWS request ids, never credentials)."""
    text = " ".join(str(error).split())
    if isinstance(error, FileNotFoundError):
        return CheckpointError(f"not found: {uri}")
    if "NETWORK_CONNECTION" in text or "curlCode" in text:
        return CheckpointError(f"cannot reach the S3 endpoint {_endpoint_name()} to {action} {uri}")
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return CheckpointError(f"no such bucket: {uri}")
    if any(marker in text for marker in _CREDENTIAL_ERRORS):
        return CheckpointError(
            f"access denied to {uri}: check the AWS credentials (environment variables, "
            "profile or instance role) and their permissions on the bucket"
        )
    text = re.sub(r"\s*\(Request ID:[^)]*\)", "", text)
    return CheckpointError(f"cannot {action} {uri}: {text}")


def _call(function, uri: str, action: str):
    try:
        return function()
    except OSError as error:
        raise _classify(error, uri, action) from None


def _info(location: Location) -> pafs.FileInfo:
    return _call(lambda: location.fs.get_file_info(location.path), location.uri, "read")


def _list(location: Location) -> list[pafs.FileInfo]:
    """Entries directly under a folder; empty when it does not exist or is a file."""
    selector = pafs.FileSelector(location.path, allow_not_found=True, recursive=False)
    try:
        return location.fs.get_file_info(selector)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        if location.is_local and os.path.isfile(location.path):
            return []
        raise _classify(error, location.uri, "list") from None


def _read_json(location: Location, invalid_ok: bool = False) -> Any | None:
    """The parsed JSON file; None when there is none (or, with ``invalid_ok``, if broken)."""

    def read() -> bytes | None:
        try:
            with location.fs.open_input_stream(location.path, compression=None) as stream:
                return stream.readall()
        except (FileNotFoundError, IsADirectoryError):
            return None

    data = _call(read, location.uri, "read")
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        if invalid_ok:
            return None
        raise CheckpointError(f"not valid JSON: {location.uri}") from None


# --------------------------------------------------------------------------- resolution


@dataclass(frozen=True)
class ResolvedModel:
    """A complete model folder found in storage."""

    model_uri: str
    """The Hugging Face folder (a checkpoint's ``model/``, or the folder given)."""
    checkpoint_uri: str | None = None
    """The santa/Ray checkpoint folder it belongs to, if any."""
    step: int | None = None
    """The training step of that checkpoint (``trainer_state.json``), if known."""
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    """Extra facts: ``best.json``'s metric and config, or Ray's metrics for the checkpoint."""
    location: Location | None = field(default=None, repr=False, compare=False)


def _is_complete_model(folder: Location) -> bool:
    """Whether ``folder`` holds an HF config and all of its weights (no empty files)."""
    entries = {posixpath.basename(entry.path): entry for entry in _list(folder)}

    def present(name: str) -> bool:
        entry = entries.get(name)
        return entry is not None and entry.type == pafs.FileType.File and (entry.size or 0) > 0

    if not present(HF_CONFIG_FILE):
        return False
    if any(present(name) for name in WEIGHT_FILES):
        return True
    for index_name in WEIGHT_INDEX_FILES:
        if present(index_name):
            index = _read_json(folder.child(index_name)) or {}
            shards = set((index.get("weight_map") or {}).values())
            if shards and all(present(shard) for shard in shards):
                return True
    return False


def _step_of(checkpoint: Location) -> int | None:
    """``trainer_state.json``'s step, or None when missing or unreadable."""
    state = _read_json(checkpoint.child(STATE_FILE), invalid_ok=True)
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _complete_checkpoint(checkpoint: Location) -> ResolvedModel | None:
    """The model of a santa checkpoint folder, or None when it has no complete model."""
    model = checkpoint.child(MODEL_DIR)
    if not _is_complete_model(model):
        return None
    return ResolvedModel(model.uri, checkpoint.uri, _step_of(checkpoint), location=model)


def resolve_checkpoint(source: Any) -> ResolvedModel:
    """A santa checkpoint folder (its ``model/``) or an HF folder, checked to be complete."""
    location = source if isinstance(source, Location) else open_location(source)
    found = _complete_checkpoint(location)
    if found is not None:
        return found
    if _is_complete_model(location):
        # A checkpoint's model/ given directly: report the checkpoint's step too.
        parent = location.parent
        is_checkpoint_model = location.name == MODEL_DIR and parent.path != location.path
        step = _step_of(parent) if is_checkpoint_model else None
        checkpoint_uri = parent.uri if step is not None else None
        return ResolvedModel(location.uri, checkpoint_uri, step, location=location)
    if _info(location).type == pafs.FileType.NotFound:
        raise CheckpointError(f"no checkpoint at {location.uri}")
    raise CheckpointError(
        f"no complete model at {location.uri}: expected {MODEL_DIR}/{HF_CONFIG_FILE} and "
        f"weights ({WEIGHT_FILES[0]}), or a Hugging Face folder"
    )


def _snapshot_candidates(snapshot: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """Checkpoint folder names in Ray's record, newest first; None if it is unreadable."""
    if not isinstance(snapshot, dict):
        return None
    try:
        results = snapshot.get("checkpoint_results") or []
        indices = snapshot.get("checkpoint_report_indices") or list(range(len(results)))
        ordered = sorted(zip(indices, results, strict=True), key=lambda pair: -pair[0])
        names = [
            (result["checkpoint_dir_name"], result.get("metrics") or {}) for _, result in ordered
        ]
        latest = snapshot.get("latest_checkpoint_result")
        if latest:
            names.insert(0, (latest["checkpoint_dir_name"], latest.get("metrics") or {}))
    except (KeyError, TypeError, ValueError):
        return None
    seen: set[str] = set()
    unique = []
    for name, metrics in names:
        if isinstance(name, str) and "/" not in name and name not in seen:
            seen.add(name)
            unique.append((name, metrics))
    return unique


def latest_checkpoint(run: Any) -> ResolvedModel:
    """The newest complete checkpoint of a Ray Train run folder (``storage_path/name``).

    Ray's record of committed checkpoints (``checkpoint_manager_snapshot.json``) decides
    when it is there: its latest checkpoint, else the newest listed one that is complete.
    Without it, the complete ``checkpoint_*`` folder with the highest ``trainer_state.json``
    step wins (ties: the newest folder name, which is a timestamp).
    """
    location = run if isinstance(run, Location) else open_location(run)
    snapshot = _read_json(location.child(RUN_SNAPSHOT_FILE))
    candidates = _snapshot_candidates(snapshot) if snapshot is not None else None
    if candidates is not None:
        for name, metrics in candidates:
            found = _complete_checkpoint(location.child(name))
            if found is not None:
                step = found.step if found.step is not None else metrics.get("step")
                return ResolvedModel(
                    found.model_uri,
                    found.checkpoint_uri,
                    step,
                    details={"metrics": metrics},
                    location=found.location,
                )
        raise CheckpointError(
            f"no complete checkpoint in {location.uri}: Ray's {RUN_SNAPSHOT_FILE} lists "
            f"{len(candidates)}, none with model weights"
        )
    entries = _list(location)
    if not entries and _info(location).type == pafs.FileType.NotFound:
        raise CheckpointError(f"no run at {location.uri}")
    stepped = []
    for entry in entries:
        name = posixpath.basename(entry.path)
        if entry.type == pafs.FileType.Directory and name.startswith(CHECKPOINT_PREFIX):
            step = _step_of(location.child(name))
            if step is not None:
                stepped.append((step, name))
    for _step, name in sorted(stepped, reverse=True):
        found = _complete_checkpoint(location.child(name))
        if found is not None:
            return found
    raise CheckpointError(f"no complete checkpoint in {location.uri}")


def _best_target(value: str, sweep: Location) -> Any:
    """Where ``best.json``'s checkpoint points, relative paths taken from the sweep root."""
    if "://" in value:
        return value
    if not sweep.is_local:
        bucket = sweep.path.split("/", 1)[0]
        if value.lstrip("/").startswith(bucket + "/"):  # Ray's scheme-less "bucket/key"
            return Location(sweep.fs, value.strip("/"), "s3://" + value.strip("/"))
        return sweep.child(value.strip("/"))
    return value if os.path.isabs(value) else os.path.join(sweep.path, value)


def best_checkpoint(sweep: Any) -> ResolvedModel:
    """The checkpoint a Tune sweep recorded as best (``best.json`` at the sweep root)."""
    location = sweep if isinstance(sweep, Location) else open_location(sweep)
    best_file = location if location.name == BEST_FILE else location.child(BEST_FILE)
    root = location.parent if location.name == BEST_FILE else location
    best = _read_json(best_file)
    if best is None:
        raise CheckpointError(f"no {BEST_FILE} in {root.uri}: has the sweep finished?")
    checkpoint = best.get("checkpoint") if isinstance(best, dict) else None
    if not checkpoint or not isinstance(checkpoint, str):
        raise CheckpointError(f"{best_file.uri} names no checkpoint")
    found = resolve_checkpoint(_best_target(checkpoint, root))
    details = {key: value for key, value in best.items() if key != "checkpoint"}
    return ResolvedModel(
        found.model_uri, found.checkpoint_uri, found.step, details=details, location=found.location
    )


def resolve(source: Any) -> ResolvedModel:
    """Whatever ``source`` names: a model/checkpoint folder, a run, or a sweep's best."""
    location = source if isinstance(source, Location) else open_location(source)
    if location.name == BEST_FILE:
        return best_checkpoint(location)
    found = _complete_checkpoint(location)
    if found is not None:
        return found
    if _is_complete_model(location):
        return resolve_checkpoint(location)
    names = {posixpath.basename(entry.path): entry for entry in _list(location)}
    if BEST_FILE in names:
        return best_checkpoint(location)
    if RUN_SNAPSHOT_FILE in names or any(
        name.startswith(CHECKPOINT_PREFIX) and entry.type == pafs.FileType.Directory
        for name, entry in names.items()
    ):
        return latest_checkpoint(location)
    return resolve_checkpoint(location)  # raises the right "no checkpoint" error


# --------------------------------------------------------------------------- fetching


def download(
    resolved: ResolvedModel, directory: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Write the model as a plain HF folder at ``directory``, atomically.

    Files land in a hidden temporary folder beside ``directory`` that is renamed into place
    once complete, so ``directory`` is never half-written. An existing non-empty
    ``directory`` is replaced only with ``overwrite``.
    """
    source = resolved.location or open_location(resolved.model_uri)
    target = Path(os.path.abspath(os.path.expanduser(os.fspath(directory))))
    if "://" in os.fspath(directory):
        raise CheckpointError(f"the destination must be a local folder, not {directory}")
    occupied = target.exists() and (not target.is_dir() or any(target.iterdir()))
    if occupied and not overwrite:
        raise CheckpointError(f"{target} already exists and is not empty (pass --overwrite)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        _call(
            lambda: pafs.copy_files(
                source.path,
                str(staging),
                source_filesystem=source.fs,
                destination_filesystem=pafs.LocalFileSystem(),
            ),
            source.uri,
            "download",
        )
        if not _is_complete_model(open_location(str(staging))):
            raise CheckpointError(f"incomplete download from {source.uri}")
        staging.chmod(0o755)
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _move_into_place(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; an existing ``target`` is moved aside first."""
    try:
        os.rename(staging, target)  # atomic; also replaces an empty directory
        return
    except OSError:
        if not target.exists():
            raise
    aside = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(target, aside)
    os.rename(staging, target)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def load(source: Any, model_config: ModelConfig | None = None) -> DualEncoder:
    """A :class:`~santa.model.DualEncoder` from a model folder, checkpoint, run, sweep or hub.

    ``source`` is a local path or ``s3://`` URI of an HF folder, a santa/Ray checkpoint
    folder, a Ray Train run folder (its newest complete checkpoint), a sweep root or its
    ``best.json`` (the best checkpoint), or a ``ray.train.Checkpoint``. A string that is
    none of these but looks like ``org/name`` is loaded as a Hugging Face hub model.
    """
    from santa.model import DualEncoder

    if isinstance(source, str | os.PathLike) and not _is_ray_checkpoint(source):
        text = os.fspath(source)
        # "org/name" is a hub model unless it (or its first part, "runs/" say) is local.
        is_hub_name = (
            _HUB_NAME.match(text) is not None
            and not os.path.exists(text)
            and not os.path.isdir(text.split("/", 1)[0])
        )
        if is_hub_name:
            try:
                return DualEncoder.from_pretrained(text, model_config)
            except (OSError, ValueError) as error:
                raise CheckpointError(
                    f"no such file or directory, and not a loadable hub model: {text}"
                ) from error
    resolved = resolve(source)
    location = resolved.location
    if location is not None and location.is_local:
        return DualEncoder.from_pretrained(location.path, model_config)
    with tempfile.TemporaryDirectory(prefix="santa-load-") as scratch:
        local = download(resolved, os.path.join(scratch, "model"))
        return DualEncoder.from_pretrained(str(local), model_config)
