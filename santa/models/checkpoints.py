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
checkpoint. Locations are local paths or ``s3://bucket/key`` URIs, read through
:mod:`santa.files.storage` (credentials from the standard AWS chain only, fast-failing S3 calls);
its errors surface here as :class:`CheckpointError`.

:func:`resolve_model` is the one way santa turns a user's model argument (folder,
checkpoint, run, sweep or hub name) into a model folder and its saved config.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import posixpath
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import pyarrow.fs as pafs

from santa.files import storage
from santa.files.layout import (
    BEST_FILE,
    CHECKPOINT_PREFIX,
    MODEL_DIR,
    RUN_SNAPSHOT_FILE,
    SANTA_CONFIG_FILE,
    STATE_FILE,
)
from santa.files.storage import Location, StorageError

if TYPE_CHECKING:
    from santa.config import ModelConfig
    from santa.models.dual_encoder import DualEncoder

__all__ = [
    "BEST_FILE",
    "MODEL_DIR",
    "RUN_SNAPSHOT_FILE",
    "SANTA_CONFIG_FILE",
    "STATE_FILE",
    "CheckpointError",
    "ResolvedModel",
    "best_checkpoint",
    "download",
    "latest_checkpoint",
    "load",
    "load_model",
    "resolve",
    "resolve_checkpoint",
    "resolve_model",
]

# A santa checkpoint (written by santa.train.loop): the HF model folder, santa's config
# beside it, and the loop state; a run's and a sweep's files (santa.files.layout).
HF_CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# A LoRA folder's weights (santa.models.lora), and a sharded checkpoint's index
# (santa.models.sharded): named here to keep this module free of torch.
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
SHARDED_METADATA = "sharded/.metadata"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
P = ParamSpec("P")
R = TypeVar("R")


class CheckpointError(StorageError):
    """A model or checkpoint could not be found or fetched; the message is one line."""


def _checkpoint_errors(function: Callable[P, R]) -> Callable[P, R]:
    """Storage errors of ``function`` surface as :class:`CheckpointError` (same message)."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except CheckpointError:
            raise
        except StorageError as error:
            raise CheckpointError(str(error), transient=error.transient) from None

    return wrapper


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
    """Where the model folder is; None for a Hugging Face hub name."""
    santa_config: dict[str, Any] = field(default_factory=dict, compare=False)
    """The folder's ``santa_config.json`` (:func:`resolve_model` reads it); may be empty."""

    @property
    def is_hub_name(self) -> bool:
        """Whether ``model_uri`` is a Hugging Face hub name rather than a folder."""
        return self.location is None

    @property
    def train(self) -> dict[str, Any]:
        """The saved ``train`` section (lengths the model was trained with); may be empty."""
        return dict(self.santa_config.get("train") or {})


def _is_complete_model(folder: Location) -> bool:
    """Whether ``folder`` holds an HF config and all of its weights (no empty files)."""
    entries = {posixpath.basename(entry.path): entry for entry in storage.list_dir(folder)}

    def present(name: str) -> bool:
        entry = entries.get(name)
        return entry is not None and entry.type == pafs.FileType.File and (entry.size or 0) > 0

    if not present(HF_CONFIG_FILE):
        return False
    if any(present(name) for name in (*WEIGHT_FILES, ADAPTER_WEIGHTS_FILE)):
        return True
    # FSDP training's sharded weights (santa.models.sharded): DCP's index, written last.
    if storage.file_info(folder.child(*SHARDED_METADATA.split("/"))).type == pafs.FileType.File:
        return True
    for index_name in WEIGHT_INDEX_FILES:
        if present(index_name):
            index = storage.read_json_or_none(folder.child(index_name)) or {}
            shards = set((index.get("weight_map") or {}).values())
            if shards and all(present(shard) for shard in shards):
                return True
    return False


def _step_of(checkpoint: Location) -> int | None:
    """``trainer_state.json``'s step, or None when missing or unreadable."""
    state = storage.read_json_or_none(checkpoint.child(STATE_FILE), invalid_ok=True)
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _complete_checkpoint(checkpoint: Location) -> ResolvedModel | None:
    """The model of a santa checkpoint folder, or None when it has no complete model."""
    model = checkpoint.child(MODEL_DIR)
    if not _is_complete_model(model):
        return None
    return ResolvedModel(model.uri, checkpoint.uri, _step_of(checkpoint), location=model)


@_checkpoint_errors
def resolve_checkpoint(source: Any) -> ResolvedModel:
    """A santa checkpoint folder (its ``model/``) or an HF folder, checked to be complete."""
    location = source if isinstance(source, Location) else storage.open_location(source)
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
    if storage.file_info(location).type == pafs.FileType.NotFound:
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


@_checkpoint_errors
def latest_checkpoint(run: Any) -> ResolvedModel:
    """The newest complete checkpoint of a Ray Train run folder (``storage_path/name``).

    Ray's record of committed checkpoints (``checkpoint_manager_snapshot.json``) decides
    when it is there: its latest checkpoint, else the newest listed one that is complete.
    Without it, the complete ``checkpoint_*`` folder with the highest ``trainer_state.json``
    step wins (ties: the newest folder name, which is a timestamp).
    """
    location = run if isinstance(run, Location) else storage.open_location(run)
    snapshot = storage.read_json_or_none(location.child(RUN_SNAPSHOT_FILE))
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
    entries = storage.list_dir(location)
    if not entries and storage.file_info(location).type == pafs.FileType.NotFound:
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


@_checkpoint_errors
def best_checkpoint(sweep: Any) -> ResolvedModel:
    """The checkpoint a Tune sweep recorded as best (``best.json`` at the sweep root)."""
    location = sweep if isinstance(sweep, Location) else storage.open_location(sweep)
    best_file = location if location.name == BEST_FILE else location.child(BEST_FILE)
    root = location.parent if location.name == BEST_FILE else location
    best = storage.read_json_or_none(best_file)
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


@_checkpoint_errors
def resolve(source: Any) -> ResolvedModel:
    """Whatever ``source`` names: a model/checkpoint folder, a run, or a sweep's best."""
    location = source if isinstance(source, Location) else storage.open_location(source)
    if location.name == BEST_FILE:
        return best_checkpoint(location)
    found = _complete_checkpoint(location)
    if found is not None:
        return found
    if _is_complete_model(location):
        return resolve_checkpoint(location)
    names = {posixpath.basename(entry.path): entry for entry in storage.list_dir(location)}
    if BEST_FILE in names:
        return best_checkpoint(location)
    if RUN_SNAPSHOT_FILE in names or any(
        name.startswith(CHECKPOINT_PREFIX) and entry.type == pafs.FileType.Directory
        for name, entry in names.items()
    ):
        return latest_checkpoint(location)
    return resolve_checkpoint(location)  # raises the right "no checkpoint" error


# --------------------------------------------------------------------------- fetching


@_checkpoint_errors
def download(
    resolved: ResolvedModel, directory: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Write the model as a plain HF folder at ``directory``, atomically.

    Files land in a hidden temporary folder beside ``directory`` that is renamed into place
    once complete, so ``directory`` is never half-written. An existing non-empty
    ``directory`` is replaced only with ``overwrite``.
    """
    source = resolved.location or storage.open_location(resolved.model_uri)
    target = Path(os.path.abspath(os.path.expanduser(os.fspath(directory))))
    if "://" in os.fspath(directory):
        raise CheckpointError(f"the destination must be a local folder, not {directory}")
    occupied = target.exists() and (not target.is_dir() or any(target.iterdir()))
    if occupied and not overwrite:
        raise CheckpointError(f"{target} already exists and is not empty (pass --overwrite)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        storage.download_dir(source, str(staging))
        if not _is_complete_model(storage.open_location(str(staging))):
            raise CheckpointError(f"incomplete download from {source.uri}")
        staging.chmod(0o755)
        move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def move_into_place(staging: Path, target: Path) -> None:
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


def _looks_local(text: str) -> bool:
    """Whether a path that does not exist was meant as a local path, not a hub name.

    Absolute paths, ``.``/``~`` paths, more than one ``/``, or ``first/...`` where ``first``
    is a local folder (``runs/ckpt``) are local; ``name`` and ``org/name`` are hub names.
    """
    if text.startswith((".", "~")) or os.path.isabs(text) or _HUB_NAME.match(text) is None:
        return True
    return "/" in text and os.path.isdir(text.split("/", 1)[0])


@_checkpoint_errors
def resolve_model(source: Any) -> ResolvedModel:
    """The model ``source`` names, with its saved ``santa_config.json``: the one resolver.

    ``source`` is anything :func:`resolve` takes (a model or checkpoint folder, a Ray Train
    run, a sweep root or ``best.json``, local or ``s3://``; a ``ray.train.Checkpoint``), or
    a Hugging Face hub name (``name``, ``org/name``), returned as is. A local-looking path
    that does not exist raises :class:`CheckpointError` instead of going to the hub.
    """
    if isinstance(source, ResolvedModel):
        return source
    if isinstance(source, str | os.PathLike) and not storage.is_ray_checkpoint(source):
        text = os.fspath(source)
        if "://" not in text and not os.path.exists(os.path.expanduser(text)):
            if _looks_local(text):
                raise CheckpointError(f"no such file or directory: {text}")
            return ResolvedModel(text)
    resolved = resolve(source)
    location = resolved.location or storage.open_location(resolved.model_uri)
    saved = storage.read_json_or_none(location.child(SANTA_CONFIG_FILE))
    return dataclasses.replace(resolved, santa_config=saved if isinstance(saved, dict) else {})


@_checkpoint_errors
def load(source: Any, model_config: ModelConfig | None = None) -> DualEncoder:
    """A :class:`~santa.models.dual_encoder.DualEncoder` from a model folder, checkpoint, run, sweep or hub.

    ``source`` is anything :func:`resolve_model` takes: a local path or ``s3://`` URI of an
    HF folder, a santa/Ray checkpoint folder, a Ray Train run folder (its newest complete
    checkpoint), a sweep root or its ``best.json`` (the best checkpoint), a
    ``ray.train.Checkpoint`` or a :class:`ResolvedModel`. A string that is none of these but
    looks like ``name`` or ``org/name`` is loaded as a Hugging Face hub model.
    """
    # Lazy: santa.models.dual_encoder imports torch and transformers, too slow for the export CLI.
    from santa.models.dual_encoder import DualEncoder

    resolved = resolve_model(source)
    if resolved.is_hub_name:
        try:
            return DualEncoder.from_pretrained(resolved.model_uri, model_config)
        except (OSError, ValueError) as error:
            raise CheckpointError(
                f"no such file or directory, and not a loadable hub model: {resolved.model_uri}"
            ) from error
    location = resolved.location
    if location.is_local:
        return DualEncoder.from_pretrained(location.path, model_config)
    with tempfile.TemporaryDirectory(prefix="santa-load-") as scratch:
        local = download(resolved, os.path.join(scratch, "model"))
        return DualEncoder.from_pretrained(str(local), model_config)


def load_model(source: Any) -> tuple[DualEncoder, dict[str, Any]]:
    """:func:`load` plus the ``train`` section of the model's ``santa_config.json``.

    The train section (empty when the folder has none) holds the lengths it was trained with.
    """
    resolved = resolve_model(source)
    return load(resolved), resolved.train
