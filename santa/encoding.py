"""Embed texts with a :class:`~santa.model.DualEncoder`, in-process or on a Ray Data pool.

Evaluation, the hard-negative miner and training's dev metrics all encode through here.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from santa.checkpoints import resolve_model

if TYPE_CHECKING:
    from santa.model import DualEncoder

__all__ = [
    "DEFAULT_MAX_DOCUMENT_LENGTH",
    "DEFAULT_MAX_QUERY_LENGTH",
    "encode_corpus_ray",
    "encode_texts",
]

# Token lengths used when neither the caller nor the model's santa_config.json sets them:
# SANTA's scripts' q_max_len / p_max_len (the paper states no lengths).
DEFAULT_MAX_QUERY_LENGTH = 50
DEFAULT_MAX_DOCUMENT_LENGTH = 240


def encode_texts(
    model: DualEncoder,
    texts: list[str],
    *,
    max_length: int,
    batch_size: int = 64,
    desc: str = "",
    progress: bool = True,
) -> np.ndarray:
    """Embed ``texts`` in-process: ``(len(texts), dim)`` float32, in input order.

    Texts are batched longest first (less padding); the model is put in eval mode and
    its previous mode restored afterwards.
    """
    import torch
    from tqdm.auto import tqdm

    if model.tokenizer is None:
        raise ValueError("the model has no tokenizer: load it from a folder that has one")
    if batch_size < 1 or max_length < 1:
        raise ValueError("batch_size and max_length must be positive")
    texts = list(texts)
    out = np.empty((len(texts), model.embedding_dim), dtype=np.float32)
    if not texts:
        return out
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with (
            torch.inference_mode(),
            tqdm(total=len(texts), desc=desc or None, disable=not progress, unit="text") as bar,
        ):
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                # The backbone's own lower-casing and length limit (sentence-transformers).
                encoded = model.tokenize([texts[i] for i in rows], max_length)
                embeddings = model.encode(
                    encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
                )  # (batch, dim)
                out[rows] = embeddings.float().cpu().numpy()
                bar.update(len(rows))
    finally:
        model.train(was_training)
    return out


class _EncodeActor:
    """Ray Data actor UDF: loads the model once, embeds batches of ``text`` rows."""

    def __init__(
        self, model: Any, max_length: int, batch_size: int, use_gpu: bool, threads: int
    ) -> None:
        import ray
        import torch

        from santa.model import DualEncoder

        if threads > 0:
            torch.set_num_threads(threads)
        if isinstance(model, ray.ObjectRef):
            model = ray.get(model)
        if isinstance(model, str):
            model = DualEncoder.from_pretrained(model)
        if use_gpu:
            model = model.to("cuda")
        self.model = model.eval()
        self.max_length = max_length
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        embeddings = encode_texts(
            self.model,
            [str(text) for text in batch["text"]],
            max_length=self.max_length,
            batch_size=self.batch_size,
            progress=False,
        )
        return {"row": batch["row"], "embedding": embeddings}


def encode_corpus_ray(
    model: str | DualEncoder,
    texts: Sequence[str],
    *,
    max_length: int,
    batch_size: int = 64,
    use_gpu: str | bool = "auto",
    num_actors: int = 0,
    num_cpus_per_actor: float = 1.0,
) -> np.ndarray:
    """Embed ``texts`` with a Ray Data actor pool; same result as :func:`encode_texts`.

    ``model`` is a URI every node can read (local folder on one machine, ``s3://`` on a
    cluster; a Ray checkpoint folder works too) or a model object, shipped once through
    the object store. Each actor loads the model once. With GPUs (``use_gpu="auto"``: the
    cluster has some) every actor takes one; otherwise CPU actors of
    ``num_cpus_per_actor``. ``num_actors=0``: one per GPU, or enough CPU actors to leave
    one cluster CPU free (at least one), so a 2-CPU machine never deadlocks.
    Needs Ray initialised (:func:`santa.ray_utils.init_ray`).
    """
    import pyarrow as pa
    import ray
    import ray.data

    from santa.ray_utils import capacity_of, cluster_capacity

    texts = [str(text) for text in texts]
    if not texts:
        raise ValueError("no texts to encode")
    # What the cluster can grow to: an autoscaling cluster's GPU workers count though none
    # is up yet (the pool's requests make the autoscaler start them).
    capacity = cluster_capacity()
    gpus = int(capacity_of("GPU", capacity))
    if use_gpu == "auto":
        use_gpu = gpus > 0
    if use_gpu and gpus < 1:
        raise ValueError("use_gpu=True but the Ray cluster has no GPU")
    cpus = max(1.0, capacity_of("CPU", capacity))
    if num_actors <= 0:
        # One per GPU, or CPU actors that leave one CPU free for the rest of Ray Data.
        cpu_actors = max(1, int((cpus - 1) // max(num_cpus_per_actor, 1e-3)))
        num_actors = gpus if use_gpu else cpu_actors
    if isinstance(model, str):
        payload: Any = resolve_model(model).model_uri
    else:
        if next(model.parameters()).device.type != "cpu":
            model = copy.deepcopy(model).to("cpu")
        payload = ray.put(model)
    # Blocks small enough to spread over the actors, big enough to batch well.
    rows_per_block = min(8192, max(batch_size, math.ceil(len(texts) / (4 * num_actors))))
    blocks = [
        pa.table(
            {
                "row": pa.array(range(start, min(start + rows_per_block, len(texts))), pa.int64()),
                "text": pa.array(texts[start : start + rows_per_block], pa.string()),
            }
        )
        for start in range(0, len(texts), rows_per_block)
    ]
    dataset = ray.data.from_arrow(blocks).map_batches(
        _EncodeActor,
        fn_constructor_kwargs={
            "model": payload,
            "max_length": max_length,
            "batch_size": batch_size,
            "use_gpu": bool(use_gpu),
            "threads": 0 if use_gpu else max(1, int(num_cpus_per_actor)),
        },
        batch_size=batch_size * 8,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=num_actors),
        num_gpus=1 if use_gpu else 0,
        num_cpus=0 if use_gpu else num_cpus_per_actor,
    )
    out: np.ndarray | None = None
    seen = 0
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        embeddings = np.asarray(batch["embedding"], dtype=np.float32)
        if out is None:
            out = np.empty((len(texts), embeddings.shape[1]), dtype=np.float32)
        out[batch["row"]] = embeddings
        seen += len(batch["row"])
    if out is None or seen != len(texts):
        raise RuntimeError(f"Ray encoding returned {seen} of {len(texts)} embeddings")
    return out
