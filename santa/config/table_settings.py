"""Where each setting of a table recipe comes from (:class:`Setting`: the paper, SANTA's
released code, santa's own choice, or a field the stage does not read) and the recipe
family that holds them (:class:`TableRecipe`); the recipes themselves are in
:mod:`santa.config.table_recipes`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from santa.config import ModelConfig, NegativesConfig, SantaConfig, TrainConfig

PAPER = "paper"
CODE = "SANTA code"
SANTA = "santa"
UNREAD = "not read"
SOURCES = (PAPER, CODE, SANTA, UNREAD)

# Fields no table recipe lists: they do not change what is computed. "section.field" →
# why not.
NOT_COMPUTATIONAL: dict[str, str] = {
    "model.gradient_checkpointing": "recomputes activations in the backward pass: same gradients",
    "model.padding_side": "where the tokenizer pads: pooling and positions read the real tokens",
    "train.strategy": "FSDP shards where the weights live: the same step as DDP's (a test)",
    "train.num_workers": "the global batch is the same on any number of workers (all-gather)",
    "train.min_workers": "elastic training keeps the global batch",
    "train.log_every": "logging cadence",
    "train.checkpoint_every": "checkpoint cadence",
    "train.eval_every": "dev-metric reporting cadence",
    "train.use_gpu": "the device (--gpu); the precision is train.bf16's",
    "train.compile": "torch.compile: the same model, compiled",
    "train.compile_backend": "torch.compile's backend",
    "train.compile_scope": "what torch.compile compiles",
    "train.compile_cache": "where torch.compile keeps its work",
    "train.grad_cache_chunk_size": "GradCache: the whole batch's exact gradients in less memory",
    "train.distributed_backend": "the collectives' transport (NCCL or gloo)",
    "train.fused_rms_norm": "the same RMS norm as one fused kernel",
    "train.input_threads": "threads that tokenize the next batches: the same batches",
    "train.token_cache": "token ids kept on the node's disk: the same ids",
    "negatives.encoder_actors": "how many actors share the mining",
    "negatives.encoder_gpus": "the miner's device (a GPU encoder runs under bf16 autocast)",
    "negatives.encoder_cpus": "CPUs reserved per mining actor",
    "negatives.batch_size": "texts per encoder batch when mining",
}


@dataclass(frozen=True)
class Setting:
    """One setting of a recipe: its value, its source and where that source says it."""

    value: Any
    source: str
    """``paper``, ``SANTA code``, ``santa`` or ``not read`` (the module doc)."""
    where: str
    """The paper's section/table, the released file and its flag or function, santa's
    reason, or why the stage does not read it."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Setting.source must be one of {SOURCES}, got {self.source!r}")


def paper(value: Any, where: str) -> Setting:
    """A setting the paper states (``where``: its section or table)."""
    return Setting(value, PAPER, where)


def code(value: Any, where: str) -> Setting:
    """A setting from SANTA's released code (``where``: the file and flag or function)."""
    return Setting(value, CODE, where)


def santa(value: Any, why: str) -> Setting:
    """A setting the paper and the code leave open: santa's choice and why."""
    return Setting(value, SANTA, why)


_DEFAULTS = {"model": ModelConfig(), "train": TrainConfig(), "negatives": NegativesConfig()}


def unread(*keys: str, why: str) -> dict[str, Setting]:
    """``keys`` (``section.field``) at their defaults, which the stage does not read."""
    settings = {}
    for key in keys:
        section, _, name = key.partition(".")
        settings[key] = Setting(getattr(_DEFAULTS[section], name), UNREAD, why)
    return settings


@dataclass(frozen=True)
class TableRecipe:
    """A family of stage recipes reproducing one table row of a paper."""

    name: str
    """The pretraining recipe's name; later stages are ``<name>-<stage>``."""
    reproduces: str
    """Paper, table and row (or column) the family reproduces."""
    chain: tuple[str, ...]
    """The stages that produced the row, in order (``pretrain``, ``finetune``, ``ance``)."""
    stages: Mapping[str, Mapping[str, Setting]]
    """stage → ``{"section.field": Setting}``."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What the recipe cannot pin down (data preparation, differences from SANTA's code)."""
    preprocess: Mapping[str, Setting] = field(default_factory=dict)
    """``ray_jobs.preprocess`` options its data is made with (``PreprocessConfig`` fields),
    applied by ``ray_jobs.preprocess --recipe NAME`` unless given on the command line."""

    def config(self, stage: str) -> SantaConfig:
        """The stage's :class:`SantaConfig` (settings applied to the dataclass defaults)."""
        if stage not in self.stages:
            raise ValueError(
                f"{self.name} reproduces {self.reproduces}, whose chain is "
                f"{','.join(self.chain)} (no {stage!r} stage): pass --stages {','.join(self.chain)}"
            )
        sections: dict[str, dict[str, Any]] = {"model": {}, "train": {}, "negatives": {}}
        for key, setting in self.stages[stage].items():
            section, _, name = key.partition(".")
            sections[section][name] = setting.value
        return SantaConfig(
            model=ModelConfig(**sections["model"]),
            train=TrainConfig(**sections["train"]),
            negatives=NegativesConfig(**sections["negatives"]),
        )

    def settings(self, stage: str, source: str | None = None) -> dict[str, Setting]:
        """The stage's settings, or those of one ``source``."""
        return {
            key: setting
            for key, setting in self.stages[stage].items()
            if source is None or setting.source == source
        }
