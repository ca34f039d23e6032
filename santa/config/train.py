"""The ``train`` section: stage, optimisation, batches, lengths, losses and the loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from santa.config.common import (
    COMPILE_MODES,
    COMPILE_SCOPES,
    DISTRIBUTED_BACKENDS,
    EPOCH_UNITS,
    MEP_REDUCTIONS,
    OPTIMIZERS,
    SHUFFLES,
    STAGES,
    STRATEGIES,
    check_positive,
    fail,
    section_from_dict,
)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train: stage, optimisation, batch shape, lengths and loss weights."""

    stage: str = "pretrain"
    """``"pretrain"`` (SDA + λ·MEP on structured/unstructured pairs) or ``"finetune"``
    (DR loss, paper Eq. 3, with in-batch and hard negatives)."""

    objective: str = "santa"
    """What the loop trains: a name in ``santa.train.loop_config.OBJECTIVES`` (``santa``:
    SANTA's SDA / DR + λ·MEP), checked when training starts; a new objective's line there is
    all ``--set train.objective=NAME`` needs. SCodeR's algorithm names its stages' own."""

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

    keep_best_by: str | None = None
    """A metric every checkpoint reports (``dev_mrr``, ``dev_ndcg``: with a dev set) to keep
    the run's best checkpoint by: Ray Train keeps the ``num_to_keep`` best by it (and the
    latest, to resume from), and the run's result, what a pipeline chains and evaluates, is
    the best one, as SANTA's released ``dev_*.sh`` scripts keep their best dev checkpoint.
    ``None``: the latest checkpoint."""

    keep_best_mode: str = "max"
    """``max`` (a score: MRR, NDCG) or ``min`` (a loss) for :attr:`keep_best_by`."""

    shuffle: str = "global"
    """The order of each epoch's rows, one order for the whole run whatever its number of
    workers (each worker takes its slice of every global batch; :mod:`santa.train.order`).
    ``global``: a new seeded permutation of every training row each epoch. ``local``: the
    rows in corpus order (all functions of a file together) through a seeded shuffle
    buffer of ``shuffle_buffer`` rows, as SANTA's released code streams its files through a
    10,000-row buffer (OpenMatch's ``StreamTrainDatasetMixin``; its code pretraining file
    shuffled once when built)."""

    shuffle_buffer: int = 2048
    """``shuffle="local"``: the shuffle buffer's rows (seeded by seed and epoch); 0 keeps
    corpus order."""

    epoch_unit: str = "pair"
    """What an epoch passes over once: every training ``pair``, or every ``query`` (one
    example per query and epoch, the query's positive rotated by seed + epoch among its
    Exact judgments, queries without a judged negative left out: SANTA's released product
    fine-tuning, ``Sdataset.get_process_fn`` over ``build_product.py``'s groups)."""

    drop_last: bool = True
    """Drop an epoch's last, incomplete global batch; False completes it with the epoch's
    first rows (every step keeps one shape), as ``DistributedSampler`` pads, so that no row
    is left out of an epoch (SANTA's released code: Hugging Face's ``dataloader_drop_last``
    default, False)."""

    input_threads: int = 1
    """Threads per worker that read, tokenize and collate the next batches while the
    current step trains (the tokenizers release the GIL): more when one thread does not
    keep up with the device (``bench/scale``: pairs tokenized per second per core)."""

    token_cache: bool = True
    """Keep each training row's token ids in the node's token cache
    (:mod:`santa.train.tokens`, beside the row file): a row is tokenized once per data
    version, tokenizer and lengths, not once per epoch and run; False tokenizes every batch
    as it is collated."""

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

    strategy: str = "ddp"
    """How the workers hold the model: ``ddp`` (a whole copy each, gradients averaged) or
    ``fsdp`` (PyTorch's FSDP2 ``fully_shard``: parameters, gradients and optimizer state
    sharded over the workers, each transformer block gathered only while it runs; bf16
    parameters with fp32 gradient reduction on GPU). FSDP checkpoints are sharded
    (``torch.distributed.checkpoint``) and resume on another number of workers
    (:mod:`santa.train.sharding`)."""

    matryoshka_dims: tuple[int, ...] = ()
    """Matryoshka representation learning (Kusupati et al., 2022; sentence-transformers'
    ``MatryoshkaLoss``): the SDA/DR loss is also computed on these leading dimensions of
    every embedding (e.g. ``768,256,64``) and the losses summed with
    ``matryoshka_weights``, so that truncated vectors (``--dim``) still rank well. Empty:
    the full vectors only."""

    matryoshka_weights: tuple[float, ...] = ()
    """One weight per ``matryoshka_dims`` entry; empty: 1 each."""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            fail(f"TrainConfig.stage must be one of {STAGES}, got {self.stage!r}")
        if not self.objective.isidentifier():
            fail(f"TrainConfig.objective must name an objective, got {self.objective!r}")
        if self.compile not in COMPILE_MODES:
            fail(f"TrainConfig.compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.keep_best_mode not in ("max", "min"):
            fail(f"TrainConfig.keep_best_mode must be max or min, got {self.keep_best_mode!r}")
        if self.epoch_unit not in EPOCH_UNITS:
            fail(f"TrainConfig.epoch_unit must be one of {EPOCH_UNITS}, got {self.epoch_unit!r}")
        if self.shuffle not in SHUFFLES:
            fail(f"TrainConfig.shuffle must be one of {SHUFFLES}, got {self.shuffle!r}")
        if self.compile_scope not in COMPILE_SCOPES:
            fail(
                f"TrainConfig.compile_scope must be one of {COMPILE_SCOPES}, "
                f"got {self.compile_scope!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            fail(f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.mep_reduction not in MEP_REDUCTIONS:
            fail(
                f"TrainConfig.mep_reduction must be one of {MEP_REDUCTIONS}, "
                f"got {self.mep_reduction!r}"
            )
        if self.distributed_backend not in DISTRIBUTED_BACKENDS:
            fail(
                f"TrainConfig.distributed_backend must be one of {DISTRIBUTED_BACKENDS}, "
                f"got {self.distributed_backend!r}"
            )
        check_positive(
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
            "input_threads",
        )
        if self.strategy not in STRATEGIES:
            fail(f"TrainConfig.strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.strategy == "fsdp" and self.bf16_weights:
            fail(
                "TrainConfig.bf16_weights is DDP's master-weight scheme; train.strategy=fsdp "
                "keeps bf16 parameters by its own mixed precision (set train.bf16_weights=false)"
            )
        # Tuples from a stored dict come back as lists (JSON).
        object.__setattr__(self, "matryoshka_dims", tuple(int(d) for d in self.matryoshka_dims))
        object.__setattr__(
            self, "matryoshka_weights", tuple(float(w) for w in self.matryoshka_weights)
        )
        if any(dim <= 0 for dim in self.matryoshka_dims):
            fail(f"TrainConfig.matryoshka_dims must be positive, got {self.matryoshka_dims}")
        if len(set(self.matryoshka_dims)) != len(self.matryoshka_dims):
            fail(f"TrainConfig.matryoshka_dims has a dimension twice: {self.matryoshka_dims}")
        if self.matryoshka_weights and len(self.matryoshka_weights) != len(self.matryoshka_dims):
            fail(
                f"TrainConfig.matryoshka_weights needs one weight per dimension "
                f"({len(self.matryoshka_dims)}), got {self.matryoshka_weights}"
            )
        if any(weight < 0 for weight in self.matryoshka_weights):
            fail(f"TrainConfig.matryoshka_weights must be >= 0, got {self.matryoshka_weights}")
        if self.grad_cache_chunk_size < 0:
            fail(
                "TrainConfig.grad_cache_chunk_size must be >= 0 (0: off), got "
                f"{self.grad_cache_chunk_size}"
            )
        if self.weight_decay < 0:
            fail(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_ratio < 1:
            fail(f"TrainConfig.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.mep_weight < 0:
            fail(f"TrainConfig.mep_weight must be >= 0, got {self.mep_weight}")
        if self.sda_weight < 0:
            fail(f"TrainConfig.sda_weight must be >= 0, got {self.sda_weight}")
        if self.sda_weight == 0 and not self.uses_mep:
            fail(
                "TrainConfig.sda_weight=0 leaves no loss to train: it needs MEP "
                f"(stage='pretrain' and mep_weight > 0; got stage={self.stage!r}, "
                f"mep_weight={self.mep_weight})"
            )
        if not 0 <= self.min_workers <= self.num_workers:
            fail(
                f"TrainConfig.min_workers must be in [0, num_workers={self.num_workers}], "
                f"got {self.min_workers}"
            )
        for workers in range(self.min_workers or self.num_workers, self.num_workers):
            if self.global_batch_size % workers:
                fail(
                    f"TrainConfig.global_batch_size={self.global_batch_size} is not divisible "
                    f"by {workers} workers, one of the sizes min_workers={self.min_workers}.."
                    f"num_workers={self.num_workers} allows: every size needs equal local "
                    "batches"
                )
        if self.global_batch_size % self.num_workers:
            fail(
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
        return section_from_dict(cls, values)
