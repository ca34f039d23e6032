"""The index job's encoders: :class:`ShardEncoder` (one shard of documents → its embeddings
file) run by a Ray Data actor pool, or by the driver itself for a small corpus on CPU, and
how many actors a job gets (:func:`encoder_actors`). See :mod:`santa.search.indexing`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from santa.search.shards import read_documents, write_shard

if TYPE_CHECKING:
    from santa.search.indexing import IndexConfig

__all__ = ["LOCAL_MAX_DOCUMENTS", "ShardEncoder", "encode_missing", "encoder_actors"]

LOCAL_MAX_DOCUMENTS = 1_000
"""Documents to encode up to which an index on CPU is encoded in the driver (``num_actors``
0): the smallest default shard, which a pool would give one actor of one CPU anyway."""


class ShardEncoder:
    """Ray Data actor UDF: encodes whole shards and writes each as its own Parquet file.

    A plain class (Ray Data wraps it in an actor pool; the driver runs one itself, with its
    own model, for a small corpus): it loads the model once, reads a shard's texts from
    ``documents.parquet`` (row group = shard), embeds them with
    :func:`santa.models.encoding.encode_texts` (the evaluator's encoder) and writes
    ``embeddings/part-NNNNN.parquet`` whole (a local file is renamed into place).
    """

    def __init__(
        self,
        *,
        model_uri: str,
        work: str,
        max_length: int,
        batch_size: int,
        use_gpu: bool,
        bf16: bool,
        threads: int,
        counter: Any = None,
        dim: int | None = None,
        model: Any = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        import torch

        from santa.models.checkpoints import load

        # Documents encoded, for the driver's progress lines: into a counter actor, or
        # ``on_batch`` where the driver encodes itself.
        self.on_batch = on_batch or (None if counter is None else counter.add.remote)
        if threads > 0:
            torch.set_num_threads(threads)
            # The fast tokenizer's thread pool would use every core of the node: an actor
            # keeps to the CPUs it asked for, so that N actors scale as N.
            os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        # ``model``: the driver's own copy, when it encodes a small corpus itself.
        model = load(model_uri) if model is None else model
        self.device = "cuda" if use_gpu else "cpu"
        self.model = model.to(self.device).eval()
        self.work = work
        self.max_length = max_length
        self.batch_size = batch_size
        self.bf16 = bf16
        self.dim = dim

    def encode_shard(self, shard: int) -> tuple[int, float]:
        """Encode and write one shard; returns its rows and seconds."""
        import contextlib

        import torch

        from santa.eval.evaluation import truncate_embeddings
        from santa.models.encoding import encode_texts

        started = time.perf_counter()
        documents = read_documents(self.work, shard, columns=["id", "text"])
        autocast = (
            torch.autocast(self.device, dtype=torch.bfloat16)
            if self.bf16
            else contextlib.nullcontext()
        )
        with autocast:
            embeddings = encode_texts(
                self.model,
                documents.column("text").to_pylist(),
                max_length=self.max_length,
                batch_size=self.batch_size,
                role="document",
                progress=False,
                on_batch=self.on_batch,
            )  # (shard rows, full dim)
        embeddings = truncate_embeddings(embeddings, self.dim)  # (shard rows, dim)
        write_shard(self.work, shard, documents.column("id"), embeddings)
        return documents.num_rows, time.perf_counter() - started

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, seconds = [], []
        for shard in batch["shard"].tolist():
            count, elapsed = self.encode_shard(int(shard))
            rows.append(count)
            seconds.append(elapsed)
        return {"shard": batch["shard"], "rows": np.array(rows), "seconds": np.array(seconds)}


def encoder_actors(
    config: IndexConfig, *, use_gpu: bool, gpus: int, cpus: float, shards: int, documents: int
) -> int:
    """How many encoder actors encode ``documents`` in ``shards`` missing shards: 0 means
    in the driver (CPU, up to :data:`LOCAL_MAX_DOCUMENTS` documents, no actors asked for)."""
    if not config.num_actors and not use_gpu and documents <= LOCAL_MAX_DOCUMENTS:
        return 0
    actors = config.num_actors or (
        gpus if use_gpu else max(1, int((cpus - 1) // config.cpus_per_actor))
    )
    return max(1, min(actors, shards))


def encode_missing(
    config: IndexConfig,
    model: Any,
    model_uri: str,
    work: str,
    missing: list[int],
    plan: dict[str, Any],
    max_length: int,
    report: dict[str, Any],
) -> None:
    """Encode the ``missing`` shards on a Ray Data actor pool (in this process with
    ``model`` for a small corpus on CPU), showing progress."""
    import ray
    import ray.data

    from santa.cluster.ray_utils import capacity_of, cluster_capacity

    capacity = cluster_capacity()
    gpus = int(capacity_of("GPU", capacity))
    use_gpu = gpus > 0 if config.use_gpu == "auto" else bool(config.use_gpu)
    if use_gpu and gpus < 1:
        raise ValueError("use_gpu=True but the Ray cluster has no GPU")
    total = sum(plan["shard_rows"][shard] for shard in missing)
    actors = encoder_actors(
        config,
        use_gpu=use_gpu,
        gpus=gpus,
        cpus=max(1.0, capacity_of("CPU", capacity)),
        shards=len(missing),
        documents=total,
    )
    bf16 = config.precision == "bf16" or (config.precision == "auto" and use_gpu)
    report.update(
        actors=actors, device="gpu" if use_gpu else "cpu", precision="bf16" if bf16 else "fp32"
    )
    if not missing:
        return
    encoders = (
        f"with {actors} {'GPU' if use_gpu else 'CPU'} actor(s)" if actors else "in this process"
    )
    print(
        f"[index] encoding {total:,} documents in {len(missing)} shard(s) {encoders}, "
        f"{report['precision']}",
        flush=True,
    )
    from santa.data.operators import ProgressCounter
    from santa.jobs.progress import ProgressLines, counted

    started = time.perf_counter()
    done_rows = 0
    actor_seconds = 0.0
    progress = ProgressLines("index", "documents encoded", total, unit="documents")
    if not actors:
        encoder = ShardEncoder(
            model_uri=model_uri,
            work=work,
            max_length=max_length,
            batch_size=config.batch_size,
            use_gpu=False,
            bf16=bf16,
            threads=0,  # the driver's torch threads, left as they are
            dim=config.dim,
            model=model,
            on_batch=progress.advance if config.progress else None,
        )
        for shard in missing:
            rows, seconds = encoder.encode_shard(shard)
            done_rows += rows
            actor_seconds += seconds
        if config.progress:
            progress.finish()
    else:
        # Shards finish a minute apart on a CPU: the actors count each batch into this, and
        # the driver says how far they got every 15 s.
        counter = ray.remote(num_cpus=0)(ProgressCounter).remote() if config.progress else None
        dataset = ray.data.from_items(
            [{"shard": shard} for shard in missing], override_num_blocks=len(missing)
        ).map_batches(
            ShardEncoder,
            fn_constructor_kwargs={
                "model_uri": model_uri,
                "work": work,
                "max_length": max_length,
                "batch_size": config.batch_size,
                "use_gpu": use_gpu,
                "bf16": bf16,
                "threads": 0 if use_gpu else max(1, int(config.cpus_per_actor)),
                "counter": counter,
                "dim": config.dim,
            },
            batch_size=1,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(min_size=actors, max_size=actors),
            num_gpus=1 if use_gpu else 0,
            num_cpus=0 if use_gpu else config.cpus_per_actor,
        )
        read = (lambda: ray.get(counter.value.remote(), timeout=10)) if counter else (lambda: 0)
        with counted(progress, read) if counter is not None else nullcontext():
            for row in dataset.iter_rows():
                done_rows += int(row["rows"])
                actor_seconds += float(row["seconds"])
    report["encode_s"] = time.perf_counter() - started
    report["encode_actor_s"] = actor_seconds
    report["encoded_documents"] = done_rows
