"""torch.compile's work, kept in the run's storage and counted.

Compiling T5-base for a training step takes tens of seconds on a GPU node, and every stage
of a run (and every resumed or repeated run of the same shape) compiled it again on fresh
worker processes, often fresh nodes. Inductor caches what it compiles (its FX graph and
AOTAutograd caches), and ``torch.compiler.save_cache_artifacts`` packs what this process
compiled into one blob that ``load_cache_artifacts`` puts back into a fresh process's
caches. Rank 0 saves the blob under the storage's cache folder
(:meth:`santa.files.layout.CacheLayout.compile`, local or S3) once it has compiled;
every worker loads it before compiling. A model's folder (torch version, device, backend, the
model section, precision, workers: :func:`cache_key`) holds one blob per stage shape
(:func:`shape_key`) and a worker loads them all: a rerun or another run of the same shape
finds its own graphs, a later stage the subgraphs it shares with earlier ones. A blob that
does not match is only a cache miss, since Inductor checks every entry by its own hash.

:func:`compile_stats` counts the graphs Dynamo compiled (``unique_graphs``): the training
loop reports it, and a recompile mid-run (a new shape, a new input) shows as a step up.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from santa.files import storage

logger = logging.getLogger(__name__)

__all__ = ["cache_key", "compile_stats", "load_compile_cache", "save_compile_cache", "shape_key"]


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def cache_key(config, *, device: str) -> str:
    """The folder key of a model's compiled graphs: torch, device, backend, the model
    section, the precision switches and the DDP world (stages of a run share it)."""
    import torch

    train = config.train
    family = {
        "torch": torch.__version__,
        "device": device,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "model": config.model.to_dict(),
        "backend": train.compile_backend,
        "scope": train.compile_scope,
        "precision": [
            train.bf16,
            train.bf16_weights,
            train.fused_rms_norm,
            train.bf16_position_bias,
        ],
        "workers": train.num_workers,  # DDP splits graphs at its buckets
    }
    return f"{device}-torch{torch.__version__.split('+')[0]}-{_digest(family)}"


def shape_key(config, *, objective: str) -> str:
    """The file of one stage's shapes in the model's folder (batch, lengths, MEP, hard
    negatives, objective): every stage keeps its own, and every stage loads them all."""
    train = config.train
    shape = {
        "objective": objective,
        "batch": train.per_worker_batch_size(),
        "lengths": [train.max_query_length, train.max_document_length, train.max_target_length],
        "mep": train.uses_mep,
        "negatives": config.negatives.per_query if config.negatives.source != "none" else 0,
    }
    return f"{objective}-{_digest(shape)}.bin"


def load_compile_cache(folder: str) -> int:
    """Put every saved blob under ``folder`` into this process's compile caches (before
    compiling); how many loaded (a blob that does not load is skipped with a warning)."""
    import torch

    if not folder or not storage.exists(folder):
        return 0
    loaded = 0
    for uri in storage.list_files(folder, suffixes=(".bin",)):
        try:
            if torch.compiler.load_cache_artifacts(storage.read_bytes(uri)) is not None:
                loaded += 1
        except Exception as error:  # noqa: BLE001 - a bad blob only costs a compile
            logger.warning("compile cache %s not loaded (%s)", uri, error)
    return loaded


def save_compile_cache(uri: str) -> bool:
    """Save what this process compiled (``torch.compiler.save_cache_artifacts``) to ``uri``;
    False when there is nothing to save (an eager or ``aot_eager`` run)."""
    import torch

    try:
        artifacts = torch.compiler.save_cache_artifacts()
        if not artifacts or not artifacts[0]:
            return False
        storage.write_bytes(uri, artifacts[0])
    except Exception as error:  # noqa: BLE001 - the run goes on without a saved cache
        logger.warning("compile cache not saved to %s: %s", uri, error)
        return False
    return True


def compile_stats() -> dict[str, Any]:
    """Graphs Dynamo compiled in this process so far, and the seconds it spent."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    seconds = sum(compilation_time_metrics.get("_compile.compile_inner", ()))
    # The backward graph compiles lazily, in the first backward, outside Dynamo's frame.
    seconds += sum(compilation_time_metrics.get("compile_fx.<locals>.bw_compiler", ()))
    return {
        "compile_graphs": float(counters["stats"]["unique_graphs"]),
        "compile_s": float(seconds),
    }
