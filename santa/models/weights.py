"""Is a model folder loadable? Checked in a second, without torch or transformers.

A training job's ``--init-checkpoint`` (and any model folder a job is given) is checked
before Ray starts: ``config.json`` parses and names a model type, and each safetensors file
has a whole header whose tensors fit the file — what a copy cut short or a corrupt upload
breaks. The same check names the file and the reason when loading fails inside a worker
(``cannot load checkpoint .../model.safetensors: ...``), instead of the library's bare
``HeaderTooLarge``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pyarrow.fs as pafs

from santa.files import storage

__all__ = ["WEIGHT_FILES", "check_model_folder", "model_folder_problem"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEX = "model.safetensors.index.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
SHARDED_METADATA = "sharded/.metadata"
CONFIG_FILE = "config.json"
# safetensors refuses headers above 100 MB (its own limit).
MAX_HEADER_BYTES = 100 * 1024 * 1024


def _read(fs: pafs.FileSystem, path: str) -> tuple[int, Any]:
    handle = fs.open_input_file(path)
    return handle.size(), handle


def safetensors_problem(fs: pafs.FileSystem, path: str) -> str | None:
    """Why the safetensors file at ``path`` cannot load, or None when its header is whole."""
    try:
        size, handle = _read(fs, path)
        with handle:
            if size < 8:
                return f"{size} bytes: too short for a safetensors header"
            (length,) = struct.unpack("<Q", handle.read_at(8, 0))
            if length > MAX_HEADER_BYTES or 8 + length > size:
                return (
                    f"invalid header length {length} for a file of {size} bytes (the file is "
                    "cut short or not safetensors)"
                )
            header = json.loads(handle.read_at(length, 8))
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return f"unreadable header ({type(error).__name__}: {error})"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    end = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = tensor["data_offsets"]
        except (KeyError, TypeError, ValueError):
            return f"tensor {name!r} has no data offsets"
        end = max(end, int(stop))
    if 8 + length + end != size:
        return (
            f"the tensors need {8 + length + end} bytes, the file has {size} (cut short or padded)"
        )
    return None


def model_folder_problem(uri: str) -> tuple[str, str] | None:
    """``(file URI, reason)`` when the model folder at ``uri`` cannot load, else None."""
    location = storage.open_location(uri)
    config_uri = storage.join(uri, CONFIG_FILE)
    config_path = location.child(CONFIG_FILE)
    if storage.file_info(config_path).type != pafs.FileType.File:
        return config_uri, "no config.json (not a model folder)"
    try:
        config = json.loads(storage.read_bytes(config_uri))
    except ValueError as error:
        return config_uri, f"not valid JSON ({error})"
    if not isinstance(config, dict) or not config.get("model_type"):
        return config_uri, "no model_type: not a Hugging Face model config"
    names = {
        entry.path.rstrip("/").rsplit("/", 1)[-1]: entry
        for entry in storage.list_dir(location)
        if entry.type == pafs.FileType.File
    }
    shards: list[str] = []
    if SHARD_INDEX in names:
        try:
            index = json.loads(storage.read_bytes(storage.join(uri, SHARD_INDEX)))
            shards = sorted(set(index["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as error:
            return storage.join(uri, SHARD_INDEX), f"unreadable shard index ({error})"
    elif "model.safetensors" in names:
        shards = ["model.safetensors"]
    elif ADAPTER_WEIGHTS_FILE in names:  # a LoRA folder (santa.models.lora)
        shards = [ADAPTER_WEIGHTS_FILE]
    elif storage.file_info(location.child(*SHARDED_METADATA.split("/"))).type == pafs.FileType.File:
        return None  # FSDP's sharded weights (santa.models.sharded): DCP checks them on load
    elif not any(name in names for name in WEIGHT_FILES):
        return uri, "no weights (model.safetensors or pytorch_model.bin)"
    for shard in shards:
        if shard not in names:
            return storage.join(uri, shard), "missing (named by the shard index)"
        problem = safetensors_problem(location.fs, location.child(shard).path)
        if problem:
            return storage.join(uri, shard), problem
    return None


def check_model_folder(uri: str, what: str = "checkpoint") -> None:
    """Raise ``ValueError`` naming the file and the reason when ``uri`` cannot load."""
    problem = model_folder_problem(uri)
    if problem is not None:
        file_uri, reason = problem
        raise ValueError(f"cannot load {what} {file_uri}: {reason}")
