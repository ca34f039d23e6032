"""The index job's library side: a corpus → embedding shards + a faiss index + a manifest.

Layout of an index folder (local or ``s3://``; published whole, see
:mod:`santa.files.outputs`; its manifest ``report.json`` is written last):

- ``documents.parquet``: ``id``, ``title``, ``text`` of every document, one row group per shard;
- ``embeddings/part-NNNNN.parquet``: ``id``, ``embedding`` (``float32[dim]``), the model's raw
  output for shard ``NNNNN``, exactly what the evaluator computes for those documents;
- ``index.faiss``: the faiss index over them (unit vectors when the similarity is cosine),
  rows in document order;
- ``report.json``: model, pooling, similarity, dimension, count, lengths, source checkpoint,
  index kind, what was skipped, throughput.

Encoding is Ray Data batch inference: one task per missing shard, run by a pool of encoder
actors (``map_batches`` with ``ActorPoolStrategy``; one GPU each and bf16 when the cluster
has GPUs, CPU actors otherwise). A small corpus on CPU (up to ``LOCAL_MAX_DOCUMENTS``
documents to encode, no ``num_actors`` asked for) is encoded in this process instead, by the
model already loaded: a pool's actors each take seconds to start and load the model, longer
than such a corpus takes to encode. Each encoder writes its shards itself, so a run that is
interrupted keeps every finished shard in its work folder (``OUT.partial-<key>`` beside a
local output, ``OUT/runs/work-<key>/`` on S3), and a re-run with the same model, corpus and
settings encodes only the missing ones. One writer at a time (:class:`santa.files.runlock.RunLock`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from santa.files import storage
from santa.files.outputs import StagedOutput, read_manifest
from santa.index.faiss_index import (
    INDEX_KINDS,
    IVF_TRAIN_POINTS_PER_CELL,
    EmbeddingIndex,
    ivf_cells,
)
from santa.search.corpus import CORPUS_FORMATS, Corpus, read_corpora
from santa.search.encoders import ShardEncoder, encode_missing
from santa.search.shards import (
    DOCUMENTS_FILE,
    INDEX_FILE,
    embedding_matrix,
    finished_shards,
    read_shard,
    write_parquet_whole,
)

__all__ = ["IndexConfig", "ShardEncoder", "build_index", "index_fingerprint"]

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
WORK_SUFFIX = ".partial-"
PRECISIONS = ("auto", "fp32", "bf16")
# Vectors added to a faiss index per call when building it from the shards.
ADD_CHUNK_ROWS = 200_000


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """What :func:`build_index` encodes, with what, and where it writes."""

    checkpoint: str
    """The model: anything :func:`santa.models.checkpoints.resolve_model` takes (local or s3://)."""
    corpus: str
    """The corpus URI (see :mod:`santa.search.corpus`)."""
    more_corpora: tuple[str, ...] = ()
    """Corpora indexed with the first, in order (a document whose id an earlier one holds
    is left out): the pipeline indexes its held-out, dev and training sets together."""
    output: str
    """The index folder to publish (local or s3://)."""
    corpus_format: str = "auto"
    index_kind: str = "auto"
    """``flat``, ``ivf``, ``hnsw``, or ``auto`` (flat below 500,000 documents, IVF above)."""
    nlist: int = 0
    """IVF cells; 0: 4·√n."""
    nprobe: int = 32
    hnsw_m: int = 32
    shard_size: int = 0
    """Documents per shard; 0: n/64 within [1,000, 50,000]."""
    batch_size: int = 64
    """Texts per forward pass."""
    num_actors: int = 0
    """Encoder actors; 0: one per GPU, or one per CPU leaving one CPU free (at least one),
    and none on CPU for up to ``encoders.LOCAL_MAX_DOCUMENTS`` documents (in the driver)."""
    cpus_per_actor: float = 1.0
    use_gpu: str | bool = "auto"
    """``auto``: GPU actors when the cluster has GPUs."""
    precision: str = "auto"
    """``auto`` (bf16 on GPU, fp32 on CPU), ``fp32`` or ``bf16``."""
    max_query_length: int | None = None
    """Query tokens (recorded for search); None: as the evaluator chooses."""
    max_document_length: int | None = None
    """Document tokens; None: as the evaluator chooses."""
    dim: int | None = None
    """Keep the first ``dim`` dimensions of every embedding (a Matryoshka model's truncated
    vectors: shards and index shrink by ``dim / full``); None: whole vectors."""
    force: bool = False
    """Take over a stale S3 lease of the output."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.corpus_format not in CORPUS_FORMATS:
            raise ValueError(f"corpus format must be one of {CORPUS_FORMATS}")
        if self.index_kind not in (*INDEX_KINDS, "auto"):
            raise ValueError(f"index kind must be auto or one of {INDEX_KINDS}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        if self.use_gpu not in ("auto", True, False):
            raise ValueError("use_gpu must be 'auto', True or False")
        for name in ("nlist", "shard_size", "num_actors"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("nprobe", "hnsw_m", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.cpus_per_actor <= 0:
            raise ValueError("cpus_per_actor must be positive")
        for name in ("max_query_length", "max_document_length", "dim"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive")


def _shard_size(config: IndexConfig, count: int) -> int:
    if config.shard_size:
        return config.shard_size
    return min(max(math.ceil(count / 64), 1_000), 50_000)


def _model_identity(resolved) -> dict[str, Any]:
    """What tells this model's weights apart from others at the same path."""
    identity: dict[str, Any] = {"model": resolved.model_uri, "step": resolved.step}
    if resolved.location is not None:
        for entry in storage.list_dir(resolved.location):
            name = entry.path.rstrip("/").rsplit("/", 1)[-1]
            if name.endswith((".safetensors", ".bin", "santa_config.json", "config.json")):
                mtime = entry.mtime.timestamp() if entry.mtime is not None else None
                identity[name] = [entry.size, mtime]
    return identity


def index_fingerprint(identity: dict[str, Any], corpus: Corpus, settings: dict[str, Any]) -> str:
    """A key for one (model, corpus, settings) triple: equal keys, interchangeable shards."""
    digest = hashlib.blake2b(digest_size=10)
    digest.update(repr(sorted(identity.items())).encode())
    digest.update(repr(sorted(settings.items())).encode())
    digest.update(f"{corpus.uri}\x1f{corpus.format}\x1f{len(corpus)}".encode())
    for column in ("id", "text"):
        for chunk in corpus.table.column(column).chunks:
            for buffer in chunk.buffers():
                if buffer is not None:
                    digest.update(memoryview(buffer))
    return digest.hexdigest()


# --------------------------------------------------------------------------- the driver


def _work_place(output: str, key: str) -> StagedOutput:
    """Where a run with fingerprint ``key`` stages: the same place on every re-run."""
    if storage.is_s3(output):
        run_id = f"work-{key}"
        staging = storage.join(output.rstrip("/"), "runs", run_id)
        return StagedOutput(output, run_id, staging, tool="index")
    final = storage.absolute(output).rstrip(os.sep)
    run_id = f"{key}-{uuid.uuid4().hex[:8]}"
    return StagedOutput(final, run_id, f"{final}{WORK_SUFFIX}{key}", tool="index")


def _prepare_work(staged: StagedOutput, plan: dict[str, Any], corpus: Corpus) -> bool:
    """Make the work folder hold this plan's documents; True when it was there already."""
    plan_uri = storage.join(staged.staging, PLAN_FILE)
    if storage.exists(plan_uri):
        try:
            if storage.read_json(plan_uri) == plan:
                return True
        except ValueError:
            pass
    storage.delete_dir(staged.staging)
    write_parquet_whole(
        corpus.table,
        storage.join(staged.staging, DOCUMENTS_FILE),
        row_group_size=plan["shard_size"],
    )
    storage.write_json(plan_uri, plan)  # last: a folder without it is started over
    return False


def _build_faiss(
    work: str,
    shards: int,
    similarity: str,
    kind: str,
    config: IndexConfig,
    count: int,
) -> tuple[EmbeddingIndex, int]:
    """The faiss index over every shard, added in chunks; returns it and its dimension."""
    from santa.eval.retrieval import prepare_embeddings

    nlist = config.nlist or ivf_cells(count)
    # IVF learns its cells from the first vectors added: give it a large first chunk.
    first_chunk = (
        max(ADD_CHUNK_ROWS, IVF_TRAIN_POINTS_PER_CELL * nlist) if kind == "ivf" else ADD_CHUNK_ROWS
    )
    index: EmbeddingIndex | None = None
    pending_ids: list[str] = []
    pending: list[np.ndarray] = []
    pending_rows = 0
    dim = 0

    def flush() -> None:
        nonlocal index, pending_ids, pending, pending_rows
        if not pending:
            return
        vectors = prepare_embeddings(np.concatenate(pending), similarity)
        if index is None:
            index = EmbeddingIndex(
                vectors.shape[1], kind, nlist=nlist, nprobe=config.nprobe, hnsw_m=config.hnsw_m
            )
        index.add(vectors, pending_ids)
        pending_ids, pending, pending_rows = [], [], 0

    for shard in range(shards):
        table = read_shard(work, shard)
        matrix = embedding_matrix(table)
        dim = matrix.shape[1]
        pending_ids.extend(table.column("id").to_pylist())
        pending.append(matrix)
        pending_rows += matrix.shape[0]
        if pending_rows >= (first_chunk if index is None else ADD_CHUNK_ROWS):
            flush()
    flush()
    assert index is not None
    return index, dim


def build_index(config: IndexConfig) -> dict[str, Any]:
    """Encode ``config.corpus`` with the model and publish the index; returns the manifest.

    Needs Ray initialised (:func:`santa.cluster.ray_utils.init_ray`) when shards must be encoded.
    An output already published from the same model, corpus and settings is left as it is
    (the manifest returned has ``up_to_date: true``). The caller holds the output (the index
    job's lock, :class:`santa.jobs.lifecycle.Job`, or the pipeline's run lock).
    """
    from santa.eval.evaluation import EvalConfig, evaluation_lengths
    from santa.index.faiss_index import index_kind
    from santa.models.checkpoints import load_model, resolve_model

    started = time.perf_counter()
    resolved = resolve_model(config.checkpoint)
    model, train_config = load_model(resolved)
    if model.tokenizer is None:
        raise ValueError(f"{config.checkpoint}: the model folder has no tokenizer")
    query_length, document_length, _ = evaluation_lengths(
        model,
        train_config,
        EvalConfig(
            max_query_length=config.max_query_length,
            max_document_length=config.max_document_length,
        ),
    )
    model_config = model.model_config
    model_dimension = model.embedding_dim
    if config.dim is not None and config.dim > model_dimension:
        raise ValueError(
            f"--dim {config.dim} is wider than the model's {model_dimension} dimensions"
        )
    dimension = config.dim or model_dimension
    corpus = read_corpora([config.corpus, *config.more_corpora], config.corpus_format)
    count = len(corpus)
    shard_size = _shard_size(config, count)
    shards = math.ceil(count / shard_size)
    kind = index_kind(config.index_kind, count)
    settings = {
        "max_document_length": document_length,
        "shard_size": shard_size,
        "precision": config.precision,
        "batch_size": config.batch_size,
        **({"dim": config.dim} if config.dim else {}),  # older indexes' keys stay valid
    }
    key = index_fingerprint(_model_identity(resolved), corpus, settings)
    options = {
        "fingerprint": key,
        "index_kind": kind,
        "nlist": config.nlist,
        "nprobe": config.nprobe,
        "hnsw_m": config.hnsw_m,
        "max_query_length": query_length,
        **({"dim": config.dim} if config.dim else {}),
    }
    print(
        f"[index] {count:,} documents from {corpus.uri} ({corpus.format}"
        + (f"; skipped {dict(corpus.skipped)}" if corpus.skipped else "")
        + f"), {shards} shard(s) of {shard_size:,}, model {resolved.model_uri}",
        flush=True,
    )
    published = read_manifest(config.output)
    if published is not None and published.get("config") == options:
        print(f"[index] {config.output} is up to date (same model, corpus and settings)")
        return {**published, "up_to_date": True}

    staged = _work_place(config.output, key)
    shard_rows = [min(shard_size, count - s * shard_size) for s in range(shards)]
    plan = {"fingerprint": key, "shard_size": shard_size, "shard_rows": shard_rows}
    resumed = _prepare_work(staged, plan, corpus)
    finished = finished_shards(staged.staging, shard_rows) if resumed else set()
    missing = [shard for shard in range(shards) if shard not in finished]
    if finished:
        print(
            f"[index] resuming: {len(finished)} of {shards} shard(s) already encoded in "
            f"{staged.staging}",
            flush=True,
        )
    report: dict[str, Any] = {"encode_s": 0.0, "encoded_documents": 0}
    encode_missing(
        config, model, resolved.model_uri, staged.staging, missing, plan, document_length, report
    )
    del model  # an actor pool loaded its own copies
    still_missing = set(missing) - finished_shards(staged.staging, shard_rows)
    if still_missing:
        raise RuntimeError(f"shards {sorted(still_missing)[:5]} were not written")
    indexed_at = time.perf_counter()
    index, dim = _build_faiss(staged.staging, shards, model_config.similarity, kind, config, count)
    if dim != dimension:
        raise RuntimeError(f"shards hold {dim}-dimensional vectors, the model gives {dimension}")
    storage.write_bytes(storage.join(staged.staging, INDEX_FILE), index.to_bytes())
    index_s = time.perf_counter() - indexed_at
    total_s = time.perf_counter() - started
    encoded = report.pop("encoded_documents")
    manifest = {
        "model": resolved.model_uri,
        "checkpoint": resolved.checkpoint_uri or config.checkpoint,
        "step": resolved.step,
        "pooling": "decoder-0" if model_config.kind == "t5" else model_config.pooling,
        "similarity": model_config.similarity,
        "dimension": dimension,
        # The model's own width: the index keeps the first `dimension` of each vector
        # (Matryoshka), and search cuts its queries the same way.
        "model_dimension": model_dimension,
        "count": count,
        "max_query_length": query_length,
        "max_document_length": document_length,
        "corpus": {
            "uri": corpus.uri,
            "format": corpus.format,
            "skipped": dict(corpus.skipped),
            # In indexing order (a JSON object's keys are written sorted).
            "parts": [[uri, count] for uri, count in corpus.parts.items()],
        },
        "index": {
            "kind": kind,
            "nlist": index.nlist if kind == "ivf" else None,
            "nprobe": index.nprobe if kind == "ivf" else None,
            "hnsw_m": index.hnsw_m if kind == "hnsw" else None,
            "gpu_built": index.on_gpu,
        },
        "shards": {
            "count": shards,
            "size": shard_size,
            "encoded": len(missing),
            "reused": len(finished),
        },
        "throughput": {
            "documents_encoded": encoded,
            "encode_s": round(report["encode_s"], 3),
            # Wall time of the pool, actor start-up included.
            "documents_per_s": round(encoded / report["encode_s"], 1) if encoded else None,
            # What one actor encodes per second once loaded.
            "documents_per_actor_s": round(encoded / report["encode_actor_s"], 1)
            if encoded
            else None,
            "index_s": round(index_s, 3),
            "total_s": round(total_s, 3),
        },
        **{k: v for k, v in report.items() if k in ("actors", "device", "precision")},
        "config": options,
    }
    published = staged.publish(manifest)
    _remove_other_work(config.output)
    print(
        f"[index] published {config.output}: {count:,} documents, {kind} index, dimension "
        f"{dimension}, {manifest['throughput']['total_s']:.1f} s",
        flush=True,
    )
    return published


def _remove_other_work(output: str) -> None:
    """Delete work folders of earlier, unfinished runs beside a local output (we hold the
    lock, so nobody writes them)."""
    if storage.is_s3(output):
        return  # publishing deleted every other runs/ entry
    final = storage.absolute(output).rstrip(os.sep)
    parent, name = os.path.split(final)
    for sibling in os.listdir(parent or "."):
        if sibling.startswith(f"{name}{WORK_SUFFIX}"):
            shutil.rmtree(os.path.join(parent, sibling), ignore_errors=True)


def config_dict(config: IndexConfig) -> dict[str, Any]:
    """The config as plain values (for reports)."""
    return asdict(config)
