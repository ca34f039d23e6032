"""Config as code: frozen dataclasses, validated on construction (recipes: santa.recipes).

Configs travel through Ray as plain dicts (:meth:`SantaConfig.to_dict` /
:meth:`SantaConfig.from_dict`); the command line picks a recipe and changes a few fields
with dotted overrides (:meth:`SantaConfig.with_overrides`)::

    config = get_recipe("tiny").with_overrides(["train.learning_rate=1e-4"])
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelConfig", "NegativesConfig", "SantaConfig", "ScoderConfig", "TrainConfig"]

TINY_BACKBONE = "tiny"
MODEL_KINDS = ("t5", "encoder")
T5_POOLINGS = ("decoder0",)
ENCODER_POOLINGS = ("cls", "mean")
SIMILARITIES = ("dot", "cosine")
# Activations a projection after pooling may use (sentence-transformers' Dense: tanh).
PROJECTION_ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid")
STAGES = ("pretrain", "finetune")
COMPILE_MODES = ("gpu", "always", "never")
COMPILE_SCOPES = ("blocks", "model")
SHUFFLES = ("global", "local")
DISTRIBUTED_BACKENDS = ("auto", "nccl", "gloo")
SOFT_LABEL_MODES = ("offline", "online")
SECTIONS = ("model", "train", "negatives", "scoder")
NEGATIVE_INDEXES = ("flat", "ivf", "hnsw", "auto")
OPTIMIZERS = ("adamw", "adam")
# How the MEP cross-entropy is reduced over a batch (see santa.losses.mep_loss).
MEP_REDUCTIONS = ("token_mean", "sum")


def _fail(message: str) -> None:
    raise ValueError(message)


def _check_positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if value is not None and value <= 0:
            _fail(f"{type(owner).__name__}.{name} must be positive, got {value}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which backbone to load and how it turns a sequence into one vector."""

    backbone: str = TINY_BACKBONE
    """Hub name, local HF directory, ``s3://`` URI, santa checkpoint, or ``"tiny"`` (a
    random-init T5 sized by the ``tiny_*`` fields, with a locally trained tokenizer)."""

    kind: str = "t5"
    """``"t5"`` (T5/CodeT5 encoder-decoder; SDA + MEP) or ``"encoder"`` (BERT/RoBERTa/
    MiniLM baselines; SDA/DR loss only)."""

    pooling: str | None = None
    """``"decoder0"`` for T5 (last decoder layer at position 0); ``"cls"`` or ``"mean"``
    for encoder-only. ``None`` picks ``"decoder0"`` for T5 and ``"mean"`` otherwise."""

    similarity: str = "dot"
    """``"dot"`` (the paper) or ``"cosine"`` (unit vectors, divided by ``temperature``)."""

    temperature: float = 1.0
    """Scores are divided by this before the softmax; meant for cosine (1.0 = off)."""

    max_seq_length: int | None = None
    """The backbone's own input limit (a sentence-transformers folder's ``max_seq_length``):
    texts are cut to at most this many tokens whatever length training or evaluation asks
    for. ``None``: no limit of its own."""

    lowercase: bool = False
    """Lower-case texts before tokenizing (a sentence-transformers folder's
    ``do_lower_case``)."""

    projection_dim: int | None = None
    """Encoder-only: output size of a linear layer after pooling (a sentence-transformers
    ``Dense`` module); ``None``: no projection."""

    projection_bias: bool = True
    """Whether the projection has a bias."""

    projection_activation: str = "identity"
    """Activation after the projection, one of ``PROJECTION_ACTIVATIONS``."""

    embed_unmasked_document: bool = False
    """False: the document embedding comes from the same pass over the *masked* document
    that gives the MEP loss (the paper's reference). True: embed the unmasked document in
    a second pass."""

    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""

    tokenizer: str | None = None
    """Where the tokenizer lives when not beside the backbone's weights (``None``: the
    backbone's folder; for ``"tiny"``, one trained on the training texts)."""

    tiny_d_model: int = 128
    """``tiny`` only: hidden size."""

    tiny_num_layers: int = 2
    """``tiny`` only: layers in the encoder and, separately, in the decoder."""

    tiny_num_heads: int = 4
    """``tiny`` only: attention heads per layer (must divide ``tiny_d_model``)."""

    tiny_d_ff: int = 256
    """``tiny`` only: feed-forward inner size."""

    tiny_vocab_size: int = 8000
    """``tiny`` only: vocabulary size the local tokenizer is trained to."""

    tiny_dropout: float = 0.0
    """``tiny`` only: T5 dropout rate. 0: a random-init model trained for a few hundred
    steps does not overfit, and dropout slows it enough that held-out retrieval gets worse."""

    def __post_init__(self) -> None:
        if not self.backbone:
            _fail("ModelConfig.backbone must name a model (hub name, path, s3:// or 'tiny')")
        if self.kind not in MODEL_KINDS:
            _fail(f"ModelConfig.kind must be one of {MODEL_KINDS}, got {self.kind!r}")
        if self.pooling is None:
            # Frozen dataclass: set the resolved default the one sanctioned way.
            object.__setattr__(self, "pooling", "decoder0" if self.kind == "t5" else "mean")
        allowed = T5_POOLINGS if self.kind == "t5" else ENCODER_POOLINGS
        if self.pooling not in allowed:
            _fail(
                f"ModelConfig.pooling={self.pooling!r} does not fit kind={self.kind!r}; "
                f"use one of {allowed}"
            )
        if self.similarity not in SIMILARITIES:
            _fail(f"ModelConfig.similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        if self.projection_activation not in PROJECTION_ACTIVATIONS:
            _fail(
                f"ModelConfig.projection_activation must be one of {PROJECTION_ACTIVATIONS}, "
                f"got {self.projection_activation!r}"
            )
        if self.projection_dim is not None and self.kind == "t5":
            _fail("ModelConfig.projection_dim is for encoder-only backbones (kind='encoder')")
        _check_positive(
            self,
            "temperature",
            "max_seq_length",
            "projection_dim",
            "tiny_d_model",
            "tiny_num_layers",
            "tiny_num_heads",
            "tiny_d_ff",
            "tiny_vocab_size",
        )
        if not 0.0 <= self.tiny_dropout < 1.0:
            _fail(f"ModelConfig.tiny_dropout must be in [0, 1), got {self.tiny_dropout}")
        if self.tiny_d_model % self.tiny_num_heads:
            _fail(
                f"ModelConfig.tiny_num_heads={self.tiny_num_heads} must divide "
                f"tiny_d_model={self.tiny_d_model}"
            )
        if self.backbone == TINY_BACKBONE and self.kind != "t5":
            _fail("the 'tiny' backbone is a T5; set kind='t5'")

    @property
    def is_tiny(self) -> bool:
        """Whether the backbone is a random-init T5 built from the ``tiny_*`` fields."""
        return self.backbone == TINY_BACKBONE

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return _from_dict(cls, values)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train: stage, optimisation, batch shape, lengths and loss weights."""

    stage: str = "pretrain"
    """``"pretrain"`` (SDA + λ·MEP on structured/unstructured pairs) or ``"finetune"``
    (DR loss, paper Eq. 3, with in-batch and hard negatives)."""

    learning_rate: float = 1e-4
    """Peak learning rate (after warm-up)."""

    optimizer: str = "adamw"
    """``"adamw"`` (santa's default, decoupled weight decay) or ``"adam"`` (the SANTA
    paper's optimizer; the paper recipes use it with ``weight_decay=0``). Built by
    :func:`santa.train.optim.build_optimizer`."""

    weight_decay: float = 0.01
    """Weight decay: decoupled with AdamW, a coupled L2 penalty with Adam."""

    warmup_ratio: float = 0.1
    """Share of the total steps spent warming the learning rate up linearly from 0."""

    global_batch_size: int = 128
    """Query-document pairs per optimiser step over all workers; the same meaning on 1 or
    64 workers (every worker's documents are negatives for every query)."""

    num_workers: int = 1
    """Training workers (Ray Train workers, one DDP rank each); with ``min_workers`` the
    most of them."""

    min_workers: int = 0
    """Elastic training (``--num-workers MIN-MAX``): go on with as few as this many workers
    when nodes are lost, and grow back to ``num_workers`` when they return, at the same
    global batch (each worker takes ``global_batch_size / workers present``); 0: a fixed
    ``num_workers``."""

    max_steps: int | None = None
    """Stop after this many optimiser steps; ``None`` runs ``epochs`` epochs."""

    epochs: int = 1
    """Passes over the training data when ``max_steps`` is ``None``."""

    max_query_length: int = 50
    """Tokens kept of a query (docstring / bullet point / search query), ``</s>`` included."""

    max_document_length: int = 240
    """Tokens kept of a document (code / product description), ``</s>`` included."""

    max_target_length: int = 60
    """Tokens kept of the MEP target ``<extra_id_0> ent_0 ...``, ``</s>`` included."""

    mep_weight: float = 1.0
    """λ in ``L = L_SDA + λ·L_MEP``; MEP runs in the pretrain stage only and needs a T5."""

    mep_reduction: str = "token_mean"
    """How L_MEP is reduced over a batch: ``"token_mean"`` (the mean over every target
    token of the batch: santa's default, and what SANTA's released code computes through
    Hugging Face's T5 loss) or ``"sum"`` (the paper's Eq. 7: each document's loss is the
    sum over its target tokens, averaged over the documents that have entities)."""

    sda_weight: float = 1.0
    """Weight of L_SDA (the DR loss in fine-tuning). 0 trains MEP alone: the paper's
    "w/ MEP" ablation (Table 3), pretraining only."""

    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this; ``None`` turns clipping off."""

    seed: int = 42
    """Seed for model init, data order and masking."""

    log_every: int = 10
    """Report metrics every this many steps."""

    checkpoint_every: int | None = None
    """Checkpoint every this many steps; ``None``: at the end of every epoch only."""

    shuffle: str = "global"
    """How each epoch's batches are drawn. ``global``: each worker holds its share of the
    tokenized training set in memory and draws a new seeded permutation of all of it every
    epoch; with several workers the shares are equal parts of the set in corpus order, so a
    global batch is a uniform sample of each part. ``local``: batches stream in corpus order
    (all functions of a file together) through a seeded buffer of ``shuffle_buffer`` rows,
    for a set larger than the workers' memory; SANTA's released code streams its files the
    same way through a 10,000-row buffer (OpenMatch's ``StreamTrainDatasetMixin``), its
    code pretraining file shuffled once when built. Objectives whose rows are tokenized in
    the worker (SCodeR's listwise rows) always stream (``local``)."""

    shuffle_buffer: int = 2048
    """``shuffle="local"``: rows each worker shuffles in a buffer (seeded) before batching;
    0 keeps corpus order."""

    eval_every: int | None = None
    """With a dev set (``RunSpec.eval_data``): report dev MRR/NDCG every this many steps;
    ``None``: at every checkpoint and at the end."""

    use_gpu: bool = False
    """One GPU per worker (NCCL) instead of CPU (gloo)."""

    bf16: bool = True
    """bfloat16 autocast when training on GPU; CPU runs stay in float32."""

    compile: str = "gpu"
    """``torch.compile`` the model: ``gpu`` (only when training on GPU; T5-base on an H100
    trains about 3x faster than eager, see bench/RESULTS.md), ``always`` or ``never``. The
    first steps are slower while it compiles."""

    compile_backend: str = "inductor"
    """The ``torch.compile`` backend (``inductor``; ``aot_eager`` needs no C++ compiler)."""

    compile_scope: str = "model"
    """What ``compile`` compiles: ``model``, the whole step's forward as one graph, or
    ``blocks``, each repeated transformer block (regional compilation: a few small graphs
    shared by every layer; what runs between blocks stays eager). Measured at T5-base on an
    H100 (bench/RESULTS.md): ``blocks`` compiles in 60 s instead of 193 s but steps at 536
    pairs/s instead of 1,012 (each compiled block call costs the host time), so ``model``
    wins past about 1,200 steps: ``blocks`` suits short runs and debugging."""

    grad_cache_chunk_size: int = 0
    """GradCache (Gao et al., 2021): embed each worker's batch in chunks of this many pairs
    without activations, compute the loss of the whole global batch and its gradient with
    respect to the embeddings, then re-run each chunk with activations and back-propagate
    that gradient. The gradients are those of the whole batch (exact, dropout included), at
    the activation memory of one chunk and about one more forward pass. 0: off (one forward
    over the worker's batch). A size that divides the per-worker batch keeps every chunk
    the same shape (one graph under ``torch.compile``). Objectives that train the dual
    encoder use it; SCodeR's discriminators (a per-example loss) do not."""

    mask_duplicates: bool = True
    """A document that appears twice in the global batch (the same doc id, or the same
    tokens) is not a negative of the query whose positive it is: its score is masked before
    the softmax. Hard negatives are checked the same way."""

    compile_cache: bool = True
    """Keep torch.compile's work (Inductor's caches, ``torch.compiler.save_cache_artifacts``)
    in the storage's cache folder and load it before compiling: the later stages of a run,
    a resumed run and other runs of the same shape skip most of the compile."""

    distributed_backend: str = "auto"
    """``torch.distributed`` backend: ``auto`` (NCCL when the workers have GPUs, else gloo),
    ``nccl`` or ``gloo`` (e.g. a GPU-shaped request on workers without CUDA)."""

    bf16_weights: bool = False
    """On GPU: train bf16 weights and keep an fp32 master copy for the optimizer, instead of
    autocast's per-op casts (checkpoints and the optimizer stay fp32)."""

    fused_rms_norm: bool = False
    """Run T5's RMS layer norms through ``torch.nn.functional.rms_norm`` (a fused kernel on
    GPU) instead of transformers' five-op version."""

    bf16_position_bias: bool = False
    """Under bf16 autocast: compute T5's relative position bias in bf16 once, instead of an
    fp32 bias every attention layer casts."""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            _fail(f"TrainConfig.stage must be one of {STAGES}, got {self.stage!r}")
        if self.compile not in COMPILE_MODES:
            _fail(f"TrainConfig.compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.shuffle not in SHUFFLES:
            _fail(f"TrainConfig.shuffle must be one of {SHUFFLES}, got {self.shuffle!r}")
        if self.compile_scope not in COMPILE_SCOPES:
            _fail(
                f"TrainConfig.compile_scope must be one of {COMPILE_SCOPES}, "
                f"got {self.compile_scope!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            _fail(f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.mep_reduction not in MEP_REDUCTIONS:
            _fail(
                f"TrainConfig.mep_reduction must be one of {MEP_REDUCTIONS}, "
                f"got {self.mep_reduction!r}"
            )
        if self.distributed_backend not in DISTRIBUTED_BACKENDS:
            _fail(
                f"TrainConfig.distributed_backend must be one of {DISTRIBUTED_BACKENDS}, "
                f"got {self.distributed_backend!r}"
            )
        _check_positive(
            self,
            "learning_rate",
            "global_batch_size",
            "num_workers",
            "max_steps",
            "epochs",
            "max_query_length",
            "max_document_length",
            "max_target_length",
            "grad_clip",
            "log_every",
            "checkpoint_every",
            "eval_every",
        )
        if self.grad_cache_chunk_size < 0:
            _fail(
                "TrainConfig.grad_cache_chunk_size must be >= 0 (0: off), got "
                f"{self.grad_cache_chunk_size}"
            )
        if self.weight_decay < 0:
            _fail(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_ratio < 1:
            _fail(f"TrainConfig.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.mep_weight < 0:
            _fail(f"TrainConfig.mep_weight must be >= 0, got {self.mep_weight}")
        if self.sda_weight < 0:
            _fail(f"TrainConfig.sda_weight must be >= 0, got {self.sda_weight}")
        if self.sda_weight == 0 and not self.uses_mep:
            _fail(
                "TrainConfig.sda_weight=0 leaves no loss to train: it needs MEP "
                f"(stage='pretrain' and mep_weight > 0; got stage={self.stage!r}, "
                f"mep_weight={self.mep_weight})"
            )
        if not 0 <= self.min_workers <= self.num_workers:
            _fail(
                f"TrainConfig.min_workers must be in [0, num_workers={self.num_workers}], "
                f"got {self.min_workers}"
            )
        for workers in range(self.min_workers or self.num_workers, self.num_workers):
            if self.global_batch_size % workers:
                _fail(
                    f"TrainConfig.global_batch_size={self.global_batch_size} is not divisible "
                    f"by {workers} workers, one of the sizes min_workers={self.min_workers}.."
                    f"num_workers={self.num_workers} allows: every size needs equal local "
                    "batches"
                )
        if self.global_batch_size % self.num_workers:
            _fail(
                f"TrainConfig.global_batch_size={self.global_batch_size} is not divisible by "
                f"num_workers={self.num_workers}: every worker needs the same local batch "
                "(the all-gather of embeddings needs equal sizes); pick a multiple of "
                f"{self.num_workers}"
            )

    @property
    def uses_mep(self) -> bool:
        """Whether the MEP loss is trained (pretrain stage with a positive λ)."""
        return self.stage == "pretrain" and self.mep_weight > 0

    @property
    def elastic(self) -> bool:
        """Whether the number of workers may change during the run (``min_workers``)."""
        return 0 < self.min_workers < self.num_workers

    def per_worker_batch_size(self, world_size: int | None = None) -> int:
        """Pairs each worker takes per step: ``global_batch_size / workers`` (the workers
        present, ``world_size``, in an elastic run; else ``num_workers``)."""
        return self.global_batch_size // (world_size or self.num_workers)

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return _from_dict(cls, values)


@dataclass(frozen=True, kw_only=True)
class NegativesConfig:
    """Hard negatives: where they come from, how they are mined, the miner's encoder pool.

    Read by the training loop (``source``, ``per_query``), the asynchronous miner actor and
    the offline miner (``ray_jobs.mine_negatives``, the pipeline's ANCE step, SCodeR's
    refresh) alike. Lengths and the seed are the ``train`` section's.
    """

    source: str = "none"
    """Where hard negatives come from: ``"none"``, ``"table:URI"`` (a table written by
    ``ray_jobs.mine_negatives``) or ``"async"`` (a miner actor re-mines them with the newest
    weights while training goes on)."""

    per_query: int = 0
    """Hard negatives encoded beside each query's positive (0: in-batch negatives only)."""

    refresh_every: int = 100
    """``async``: send the miner a weights snapshot every this many steps."""

    top_k: int = 100
    """Hits retrieved per query to sample hard negatives from (the paper: top 100)."""

    skip_top: int = 0
    """Skip this many top hits (after removing positives): fewer false negatives."""

    wait_for_first: bool = False
    """``async``: wait once, before the first step, for the first table."""

    index: str = "flat"
    """faiss index the miner builds: ``flat`` (exact), ``ivf``, ``hnsw`` or ``auto`` (flat,
    IVF from 500,000 documents on: exact search grows as queries × documents)."""

    encoder_actors: int = 1
    """Encoder actors a refresh shards the corpus over (``--miner-actors``): the pool asks for
    this many and starts encoding as soon as one is up, so an autoscaler can add the rest."""

    encoder_gpus: float = 0.0
    """GPUs per encoder actor (``--miner-gpus``; fractions such as 0.25 share a GPU); 0:
    encode on CPU. On a GPU the encoder runs under bf16 (fp16 without bf16) autocast."""

    encoder_cpus: float = 0.0
    """CPUs reserved per encoder actor; a CPU encoder runs that many torch threads (at least
    1). 0 fits beside trainers that hold every CPU but Ray Data's (they share cores)."""

    batch_size: int = 64
    """Texts per encoder batch when mining."""

    max_score_ratio: float | None = None
    """Positive-aware false-negative filter (NV-Retriever's TopK-PercPos, Moreira et al.,
    2024): drop a mined hit scoring above this share of its query's positive score (for a
    negative positive score ``p``: above ``p - (1 - ratio)·|p|``). Scores are the model's
    similarity (dot, or cosine), before any temperature. ``None`` (the default): off.
    NV-Retriever's best setting, 0.95, ranks with a strong separate teacher; santa mines
    with the model being trained, and every hit a weak model scores above the positive is
    dropped: at tiny scale (bench/quality/negative_filtering.py) 0.95, and 0.99 too, left two
    thirds of the queries without a mined negative. Turn it on when mining with a model
    that ranks positives near the top (the counts in the table say what it dropped)."""

    min_margin: float | None = None
    """Absolute false-negative filter (TopK-MarginPos): drop a mined hit scoring above the
    positive's score minus this margin; ``none``: off."""

    def __post_init__(self) -> None:
        if self.per_query < 0:
            _fail(f"NegativesConfig.per_query must be >= 0, got {self.per_query}")
        source = self.source
        if source not in ("none", "async") and not source.startswith("table:"):
            _fail(f"NegativesConfig.source must be 'none', 'async' or 'table:URI', got {source!r}")
        if source == "table:":
            _fail("NegativesConfig.source='table:' needs a URI after 'table:'")
        if source != "none" and self.per_query < 1:
            _fail(f"NegativesConfig.source={source!r} needs per_query >= 1")
        if self.index not in NEGATIVE_INDEXES:
            _fail(f"NegativesConfig.index must be one of {NEGATIVE_INDEXES}, got {self.index!r}")
        _check_positive(self, "refresh_every", "top_k", "encoder_actors", "batch_size")
        if self.encoder_gpus < 0 or self.encoder_cpus < 0:
            _fail(
                "NegativesConfig.encoder_gpus and encoder_cpus must be >= 0, got "
                f"{self.encoder_gpus} and {self.encoder_cpus}"
            )
        if self.skip_top < 0:
            _fail(f"NegativesConfig.skip_top must be >= 0, got {self.skip_top}")
        if self.max_score_ratio is not None and not 0 < self.max_score_ratio <= 1:
            _fail(
                "NegativesConfig.max_score_ratio must be in (0, 1] or none, got "
                f"{self.max_score_ratio}"
            )
        if self.min_margin is not None and self.min_margin < 0:
            _fail(f"NegativesConfig.min_margin must be >= 0 or none, got {self.min_margin}")

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> NegativesConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return _from_dict(cls, values)


# The hard-negative fields that lived in the train section before the negatives section:
# stored configs (checkpoints, sweeps) are read into the new place, overrides are told it.
MOVED_TO_NEGATIVES = {
    "hard_negatives": "source",
    "hard_negatives_per_query": "per_query",
    "negatives_refresh_every": "refresh_every",
    "negatives_top_k": "top_k",
    "negatives_skip_top": "skip_top",
    "negatives_wait_for_first": "wait_for_first",
    "negatives_index": "index",
    "negatives_encoder_actors": "encoder_actors",
    "negatives_encoder_gpus": "encoder_gpus",
    "negatives_encoder_cpus": "encoder_cpus",
}


@dataclass(frozen=True, kw_only=True)
class ScoderConfig:
    """SCodeR's soft-labeled training (Algorithm 2): iterations, discriminators, λ.

    Used by ``ray_jobs.scoder`` only; the dual encoder's own settings (backbone, batch,
    learning rate, lengths, similarity) are the ``model`` and ``train`` sections. The
    discriminators share the backbone and the global batch size of the dual encoder.
    """

    iterations: int = 4
    """I in Algorithm 2: rounds of mine → train discriminators → train the dual encoder."""

    adversarial_weight: float = 0.2
    """λ in ``L = λ·L_adv + (1 − λ)·L_distill`` (Eq. 10; 0.2 in the paper's Table 7)."""

    negatives_per_query: int = 7
    """Hard negatives X⁻ scored with each positive (the paper's "negative size")."""

    negatives_top_k: int = 100
    """K: the dual encoder's top-K hits (positives removed) the negatives come from."""

    negatives_pool: int = 30
    """Negatives kept per query from the top K; every stage samples its X⁻ from them.

    santa's choice: each query's X⁻ is sampled from this pool once per iteration (the
    ``examples/`` of ``iter-<i>``), and both the discriminators and the dual encoder train
    on those examples, so that offline soft labels can be scored once for exactly what the
    dual encoder sees. The paper's Algorithm 2 samples X⁻ at every training step (lines 6
    and 10); across iterations santa re-mines and re-samples, as Algorithm 2's line 13."""

    discriminator_learning_rate: float = 1e-5
    """Peak learning rate of the discriminators (optimizer: ``train.optimizer``)."""

    discriminator_steps: int | None = None
    """Discriminator steps per iteration; ``None``: one pass over the examples."""

    dual_encoder_steps: int | None = None
    """Dual-encoder steps per iteration; ``None``: one pass over the examples."""

    warmup_steps: int | None = None
    """Steps of the in-batch-negative warm-up; ``None``: ``train.max_steps`` or its epochs."""

    max_pair_length: int | None = None
    """Tokens of a discriminator's ``[x; y]`` input; ``None``: query + document lengths."""

    soft_labels: str = "offline"
    """``offline``: discriminator scores precomputed into Parquet with Ray Data (saves
    accelerator memory, the paper's Limitations); ``online``: the training workers run the
    discriminators, without gradient, on every batch."""

    heldout_fraction: float = 0.1
    """Share of the examples the discriminators never train on (their held-out accuracy).
    santa's choice, not the paper's (which trains the discriminators on every example):
    it buys a measure of the discriminators; 0 trains them on everything."""

    discriminator_gradient_checkpointing: bool = False
    """Recompute the discriminators' activations in backward (also on with
    ``model.gradient_checkpointing``): a cross-encoder sees every query with each of its
    1 + n candidates at ``max_pair_length`` tokens, the stage's memory peak."""

    def __post_init__(self) -> None:
        _check_positive(
            self,
            "iterations",
            "negatives_per_query",
            "negatives_top_k",
            "negatives_pool",
            "discriminator_learning_rate",
            "discriminator_steps",
            "dual_encoder_steps",
            "warmup_steps",
            "max_pair_length",
        )
        if not 0.0 <= self.adversarial_weight <= 1.0:
            _fail(
                f"ScoderConfig.adversarial_weight must be in [0, 1], got {self.adversarial_weight}"
            )
        if self.negatives_pool < self.negatives_per_query:
            _fail(
                f"ScoderConfig.negatives_pool={self.negatives_pool} must be at least "
                f"negatives_per_query={self.negatives_per_query}"
            )
        if self.negatives_top_k < self.negatives_pool:
            _fail(
                f"ScoderConfig.negatives_top_k={self.negatives_top_k} must be at least "
                f"negatives_pool={self.negatives_pool}"
            )
        if self.soft_labels not in SOFT_LABEL_MODES:
            _fail(
                f"ScoderConfig.soft_labels must be one of {SOFT_LABEL_MODES}, "
                f"got {self.soft_labels!r}"
            )
        if not 0.0 <= self.heldout_fraction < 1.0:
            _fail(f"ScoderConfig.heldout_fraction must be in [0, 1), got {self.heldout_fraction}")

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ScoderConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return _from_dict(cls, values)


@dataclass(frozen=True, kw_only=True)
class SantaConfig:
    """A whole run's config: the model and how to train it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Backbone, pooling and similarity."""

    train: TrainConfig = field(default_factory=TrainConfig)
    """Stage, optimisation, batch and loss weights."""

    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    """Hard negatives: their source, mining and the miner's encoder pool."""

    scoder: ScoderConfig = field(default_factory=ScoderConfig)
    """SCodeR's soft-labeled training (``ray_jobs.scoder`` only)."""

    def __post_init__(self) -> None:
        if self.model.kind != "t5" and self.train.uses_mep:
            _fail(
                f"MEP (train.mep_weight={self.train.mep_weight}) needs a T5 backbone "
                f"(model.kind='t5'), not kind={self.model.kind!r}: encoder-only backbones "
                "train with the SDA/DR loss only; set train.mep_weight=0"
            )
        if (
            self.train.uses_mep
            and self.negatives.source != "none"
            and not self.model.embed_unmasked_document
        ):
            # Single-pass MEP embeds positives from the *masked* document (sentinels inside)
            # while mined hard negatives are plain text: the model could tell them apart by
            # the sentinels alone. With hard negatives, positives are embedded unmasked too
            # (a second pass gives the MEP loss), so both sides of the softmax look alike.
            model = dataclasses.replace(self.model, embed_unmasked_document=True)
            object.__setattr__(self, "model", model)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"model": {...}, "train": {...}, "negatives": {...}, "scoder": {...}}``."""
        return {
            "model": self.model.to_dict(),
            "train": self.train.to_dict(),
            "negatives": self.negatives.to_dict(),
            "scoder": self.scoder.to_dict(),
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SantaConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        unknown = set(values) - set(SECTIONS)
        if unknown:
            _fail(f"unknown SantaConfig keys {sorted(unknown)}; expected {', '.join(SECTIONS)}")
        train = dict(values.get("train", {}))
        negatives = dict(values.get("negatives", {}))
        for old, new in MOVED_TO_NEGATIVES.items():  # a config stored by an older santa
            if old in train:
                negatives.setdefault(new, train.pop(old))
        return cls(
            model=ModelConfig.from_dict(values.get("model", {})),
            train=TrainConfig.from_dict(train),
            negatives=NegativesConfig.from_dict(negatives),
            # Checkpoints from before SCodeR have no such section.
            scoder=ScoderConfig.from_dict(values.get("scoder", {})),
        )

    def with_overrides(self, overrides: Iterable[str]) -> SantaConfig:
        """Return a copy with dotted ``section.field=value`` overrides applied and validated.

        Values are parsed by the field's type: ``true``/``false`` for booleans, ``none``
        for optional fields, numbers in any Python form (``1e-4``, ``128``).
        """
        changes: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for override in overrides:
            key, separator, raw_value = override.partition("=")
            section, dot, name = key.strip().partition(".")
            if not separator or not dot:
                _fail(f"override {override!r} must look like 'train.learning_rate=1e-4'")
            if section not in changes:
                _fail(f"override {override!r}: section must be one of {', '.join(SECTIONS)}")
            if section == "train" and name in MOVED_TO_NEGATIVES:
                _fail(
                    f"override {override!r}: train.{name} is now negatives."
                    f"{MOVED_TO_NEGATIVES[name]} (--set negatives.{MOVED_TO_NEGATIVES[name]}=...)"
                )
            section_class = type(getattr(self, section))
            types_by_name = typing.get_type_hints(section_class)
            field_names = [f.name for f in dataclasses.fields(section_class)]
            if name not in field_names:
                _fail(f"override {override!r}: unknown field; {section} has {field_names}")
            changes[section][name] = _parse_value(raw_value.strip(), types_by_name[name], key)
        return SantaConfig(
            model=dataclasses.replace(self.model, **changes["model"]),
            train=dataclasses.replace(self.train, **changes["train"]),
            negatives=dataclasses.replace(self.negatives, **changes["negatives"]),
            scoder=dataclasses.replace(self.scoder, **changes["scoder"]),
        )


def _from_dict(cls: type, values: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
        _fail(f"unknown {cls.__name__} keys {sorted(unknown)}; known keys: {sorted(names)}")
    return cls(**values)


def _parse_value(raw: str, annotation: Any, key: str) -> Any:
    """Parse an override's text as ``annotation`` (bool, int, float, str or Optional)."""
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    if type(None) in options:
        if raw.lower() in ("none", "null"):
            return None
        options = tuple(option for option in options if option is not type(None))
    (value_type,) = options
    if value_type is bool:
        lowered = raw.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        _fail(f"override {key}={raw!r}: expected true or false")
    if value_type in (int, float):
        try:
            return value_type(raw)
        except ValueError:
            _fail(f"override {key}={raw!r}: expected {value_type.__name__}")
    return raw


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)
