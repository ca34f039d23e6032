"""santa's one encoder: embed texts with a :class:`~santa.models.dual_encoder.DualEncoder`.

:class:`TextEncoder` holds a model on one device and embeds texts in planned batches
(longest first). Evaluation and training's dev metrics (:func:`encode_texts`), the Ray Data
pool of the evaluator and the index job (:func:`encode_corpus_ray`) and the hard-negative
miner's actors (:mod:`santa.negatives.encoders`) all encode through it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from santa.models.checkpoints import resolve_model

if TYPE_CHECKING:
    from santa.models.dual_encoder import DualEncoder

__all__ = [
    "DEFAULT_MAX_DOCUMENT_LENGTH",
    "DEFAULT_MAX_QUERY_LENGTH",
    "TextEncoder",
    "autocast_dtype",
    "encode_corpus_ray",
    "encode_texts",
    "plan_batches",
    "select_device",
]

logger = logging.getLogger(__name__)

# Token lengths used when neither the caller nor the model's santa_config.json sets them:
# SANTA's scripts' q_max_len / p_max_len (the paper states no lengths).
DEFAULT_MAX_QUERY_LENGTH = 50
DEFAULT_MAX_DOCUMENT_LENGTH = 240


def select_device(num_gpus: float, *, cuda_available: bool | None = None) -> str:
    """``"cuda"`` when the actor was given GPUs and CUDA is visible, else ``"cpu"``."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if num_gpus > 0 and not cuda_available:
        logger.warning("encoder asked for %g GPU(s) but CUDA is not available: using CPU", num_gpus)
    return "cuda" if num_gpus > 0 and cuda_available else "cpu"


def autocast_dtype(device: str, *, bf16_supported: bool | None = None):
    """The autocast dtype for encoding on ``device``: bf16 (fp16 without it) on CUDA, else None."""
    import torch

    if device != "cuda":
        return None
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16_supported else torch.float16


def plan_batches(texts: Sequence[str], batch_size: int) -> list[np.ndarray]:
    """Row indices of ``texts`` cut into batches, longest text first (less padding)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    order = np.array(sorted(range(len(texts)), key=lambda i: -len(texts[i])), dtype=np.int64)
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class TextEncoder:
    """One model on one device that embeds texts; plain PyTorch, no Ray. santa's one encoder:
    evaluation, the hard-negative miner's actors and the index job all embed through it.

    ``model`` is a loaded :class:`~santa.models.dual_encoder.DualEncoder` or a folder/URI to
    load (with ``model_config``, a :class:`~santa.config.ModelConfig` dict). ``num_gpus`` > 0
    puts it on CUDA (when visible), 0 on CPU, ``None`` leaves a model object on its device.
    ``half``: on CUDA, encode under bf16 (fp16 without it) autocast, as the miner does for
    speed; False keeps float32 (evaluation's exact scores). ``threads`` > 0 sets torch's CPU
    threads.
    """

    def __init__(
        self,
        model: Any,
        model_config: dict | None = None,
        *,
        num_gpus: float | None = 0.0,
        threads: int = 1,
        half: bool = True,
    ) -> None:
        import torch

        from santa.config import ModelConfig
        from santa.models.dual_encoder import DualEncoder

        if threads > 0:
            torch.set_num_threads(threads)
        if isinstance(model, str):
            config = ModelConfig.from_dict(model_config) if model_config else None
            model = DualEncoder.from_pretrained(model, config)
            num_gpus = num_gpus or 0.0
        if num_gpus is None:  # a model object stays where the caller put it
            self.device = next(model.parameters()).device.type
        else:
            self.device = select_device(num_gpus)
            model = model.to(self.device)
        self.dtype = autocast_dtype(self.device) if half else None
        self.model = model
        self.weights_step: int | None = None

    @property
    def embedding_dim(self) -> int:
        """Size of the vectors it returns."""
        return self.model.embedding_dim

    def load_weights(self, state: dict, step: int | None = None) -> None:
        """Load a weights snapshot (a state dict of CPU tensors) taken at training ``step``."""
        self.model.load_state_dict(state)
        self.weights_step = step

    def encode_batches(
        self, batches: Sequence[Sequence[str]], max_length: int, role: str | None = None
    ) -> np.ndarray:
        """Embed each batch as given: ``(total texts, dim)`` float32, batches concatenated.
        ``role``: ``query`` or ``document`` (the model's prefix for it; ``None``: texts as
        given)."""
        import torch

        out = np.empty((sum(len(b) for b in batches), self.embedding_dim), dtype=np.float32)
        autocast = (
            torch.autocast(self.device, dtype=self.dtype)
            if self.dtype is not None
            else contextlib.nullcontext()
        )
        row = 0
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), autocast:
                for batch in batches:
                    encoded = self.model.tokenize(list(batch), max_length, role=role)
                    embeddings = self.model.encode(
                        encoded["input_ids"].to(self.device),
                        encoded["attention_mask"].to(self.device),
                    )  # (batch, dim)
                    out[row : row + len(batch)] = embeddings.float().cpu().numpy()
                    row += len(batch)
        finally:
            self.model.train(was_training)
        return out

    def encode(
        self,
        texts: Sequence[str],
        max_length: int,
        batch_size: int = 64,
        *,
        role: str | None = None,
        progress: bool = False,
        desc: str = "",
        tag: str = "encode",
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` in input order: ``(len(texts), dim)`` float32. Batched longest
        text first (less padding); the same embeddings whatever the batch size or order.

        ``role``: ``query`` or ``document`` (the model's prefix; ``None``: texts as given).
        ``progress``: santa's progress lines (``[tag] desc: 2,048/5,427 texts ...``, see
        :mod:`santa.jobs.progress`) while it works, not a redrawn bar: a bar's text
        became empty lines on the pipeline's terminal. ``on_batch(count)`` is called after
        each batch (an index actor tells the driver's count)."""
        out = np.empty((len(texts), self.embedding_dim), dtype=np.float32)
        batches = plan_batches(texts, batch_size)
        if not batches:
            return out
        if not progress and on_batch is None:
            rows = np.concatenate(batches)
            out[rows] = self.encode_batches(
                [[texts[i] for i in b] for b in batches], max_length, role
            )
            return out
        from santa.jobs.progress import ProgressLines

        lines = ProgressLines(tag, desc or "encoding", total=len(texts)) if progress else None
        for rows in batches:
            out[rows] = self.encode_batches([[texts[i] for i in rows]], max_length, role)
            if lines is not None:
                lines.advance(len(rows))
            if on_batch is not None:
                on_batch(len(rows))
        if lines is not None:
            lines.finish()
        return out


def encode_texts(
    model: DualEncoder,
    texts: list[str],
    *,
    max_length: int,
    batch_size: int = 64,
    role: str | None = None,
    desc: str = "",
    progress: bool = True,
    tag: str = "encode",
    on_batch: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Embed ``texts`` in-process, in float32 on the model's device: ``(len(texts), dim)``,
    in input order (a :class:`TextEncoder` around ``model``). ``role``: ``query`` or
    ``document``, whose prefix the model puts first (``None``: texts as given);
    ``progress``: a ``[tag]`` line every 15 s of a long encoding; ``on_batch(count)`` after
    each batch.

    Texts are batched longest first (less padding); the model is put in eval mode and
    its previous mode restored afterwards.
    """
    if model.tokenizer is None:
        raise ValueError("the model has no tokenizer: load it from a folder that has one")
    if batch_size < 1 or max_length < 1:
        raise ValueError("batch_size and max_length must be positive")
    encoder = TextEncoder(model, num_gpus=None, threads=0, half=False)
    return encoder.encode(
        list(texts),
        max_length,
        batch_size,
        role=role,
        progress=progress,
        desc=desc,
        tag=tag,
        on_batch=on_batch,
    )


class _EncodeActor:
    """Ray Data actor UDF: a :class:`TextEncoder` loaded once, embedding ``text`` rows."""

    def __init__(
        self,
        model: Any,
        max_length: int,
        batch_size: int,
        use_gpu: bool,
        threads: int,
        role: str | None = None,
    ) -> None:
        import ray

        if isinstance(model, ray.ObjectRef):
            model = ray.get(model)
        self.encoder = TextEncoder(model, num_gpus=1 if use_gpu else 0, threads=threads, half=False)
        self.max_length = max_length
        self.batch_size = batch_size
        self.role = role

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(text) for text in batch["text"]]
        embeddings = self.encoder.encode(texts, self.max_length, self.batch_size, role=self.role)
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
    progress: bool = False,
    desc: str = "",
    tag: str = "encode",
    role: str | None = None,
) -> np.ndarray:
    """Embed ``texts`` with a Ray Data actor pool; same result as :func:`encode_texts`
    (``role`` as there; ``progress``: the same ``[tag]`` lines, counted as the pool's
    batches arrive).

    ``model`` is a URI every node can read (local folder on one machine, ``s3://`` on a
    cluster; a Ray checkpoint folder works too) or a model object, shipped once through
    the object store. Each actor loads the model once. With GPUs (``use_gpu="auto"``: the
    cluster has some) every actor takes one; otherwise CPU actors of
    ``num_cpus_per_actor``. ``num_actors=0``: one per GPU, or enough CPU actors to leave
    one cluster CPU free (at least one), so a 2-CPU machine never deadlocks.
    Needs Ray initialised (:func:`santa.cluster.ray_utils.init_ray`).
    """
    import pyarrow as pa
    import ray
    import ray.data

    from santa.cluster.ray_utils import capacity_of, cluster_capacity

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
            "role": role,
        },
        batch_size=batch_size * 8,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=num_actors),
        num_gpus=1 if use_gpu else 0,
        num_cpus=0 if use_gpu else num_cpus_per_actor,
    )
    out: np.ndarray | None = None
    seen = 0
    from santa.jobs.progress import ProgressLines

    lines = ProgressLines(tag, desc or "encoding", total=len(texts), every_s=None)
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        embeddings = np.asarray(batch["embedding"], dtype=np.float32)
        if out is None:
            out = np.empty((len(texts), embeddings.shape[1]), dtype=np.float32)
        out[batch["row"]] = embeddings
        seen += len(batch["row"])
        if progress:
            lines.advance(len(batch["row"]))
    if progress:
        lines.finish()
    if out is None or seen != len(texts):
        raise RuntimeError(f"Ray encoding returned {seen} of {len(texts)} embeddings")
    return out
