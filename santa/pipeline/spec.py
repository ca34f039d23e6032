"""What one pipeline run does and where (:class:`PipelineSpec`, the command line's options
as data), and each stage's config: the recipe family (``<recipe>``, ``<recipe>-finetune``,
``<recipe>-ance``) with the cluster flags, the step budget and the user's overrides.
:mod:`santa.pipeline.stages` runs it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from santa.config import SantaConfig
from santa.config.recipes import PIPELINE_STAGES, stage_recipe, with_recipes_that_fit
from santa.files import storage
from santa.files.layout import RunLayout

__all__ = ["DEFAULT_RECIPE", "DEFAULT_STEPS", "PipelineSpec", "checked_stages", "stage_config"]

# The default run: sized to finish in under 10 minutes on a 2-core laptop.
DEFAULT_STEPS = {
    "tiny": {"pretrain": 150, "finetune": 100, "ance": 50},
    "minilm": {"pretrain": 20, "finetune": 10, "ance": 10},
}
# With the default step budget, MiniLM also trains at a batch and lengths that fit it (and
# its dev evaluation runs once per stage, at the end).
DEFAULT_OVERRIDES = {
    "minilm": (
        "train.global_batch_size=32",
        "train.max_query_length=32",
        "train.max_document_length=128",
    )
}
# The default MiniLM run leaves out ANCE: mining re-encodes all 5,400 training documents
# and queries, about 4 minutes of a 22M-parameter encoder on 2 CPU cores, for +0.005
# held-out MRR (bench/RESULTS.md). stages=("pretrain", "finetune", "ance") runs it.
DEFAULT_STAGES = {"minilm": ("pretrain", "finetune")}
# The recipe of a run that names none: all-MiniLM-L6-v2 (ships with santa's dependencies).
DEFAULT_RECIPE = "minilm"
HARD_NEGATIVE_MODES = ("table", "async")


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """What one pipeline run does and where (the command line's options, as data)."""

    name: str = "default"
    """Run name: the run folder is ``storage/name`` (same name = reuse and resume)."""
    storage: str = "./runs"
    """Local path or ``s3://`` URI."""
    recipe: str = DEFAULT_RECIPE
    """The recipe family of the stages."""
    stages: tuple[str, ...] | None = None
    """Stages to run, a prefix-ordered subset of ``pretrain, finetune, ance``; None: all
    three, or the recipe's default stages when it has a default step budget (MiniLM's
    default run leaves ANCE out)."""
    input: str = ""
    """Source tree for the default corpus (empty: this Python's standard library)."""
    data: str = ""
    """Preprocessed training pairs (skips the corpus; needs ``eval_data``)."""
    finetune_data: str = ""
    """Pairs of the finetune and ance stages (empty: the pretraining pairs)."""
    eval_data: str = ""
    """A BEIR set to evaluate on (with ``data``)."""
    eval_split: str = "test"
    hard_negatives: str = "table"
    """The ance stage: mine once with the fine-tuned model (``table``, the paper) or re-mine
    while training (``async``)."""
    baseline: str = "bm25"
    """``bm25`` or ``none``."""
    max_steps: int | None = None
    """Steps of every stage (default: the recipe's epochs; tiny: 150/100/50)."""
    num_workers: int = 2
    cpus_per_worker: float = 0.0
    cluster_overrides: tuple[str, ...] = ()
    """Config overrides of the cluster flags (``--gpu``, ``--miner-*``): before the stages'."""
    overrides: tuple[str, ...] = field(default_factory=tuple)
    """The user's ``section.field=value`` overrides: after everything else."""
    index: bool = True
    in_process: bool = False
    """Train every stage in this process on one worker, without Ray Train (the model a
    one-worker Ray run computes; :attr:`santa.train.trainer.RunSpec.in_process`): the
    corpus, mining, evaluation and the index go as they do without it."""
    tracking: dict[str, Any] = field(default_factory=dict)
    """MLflow / W&B (``santa.train.tracking.Tracking.to_dict``): each stage is a tracked
    run, closed with its model's evaluation."""
    """Last step: index the held-out corpus with the final model, show example searches."""

    def __post_init__(self) -> None:
        for name in ("storage", "data", "finetune_data", "eval_data", "input"):
            object.__setattr__(self, name, storage.absolute(getattr(self, name)))
        if self.stages is None:
            default = DEFAULT_STAGES.get(self.recipe) if self.max_steps is None else None
            object.__setattr__(self, "stages", default or PIPELINE_STAGES)
        object.__setattr__(self, "stages", checked_stages(self.stages))
        if bool(self.data) != bool(self.eval_data):
            raise ValueError("data and eval_data go together (or neither: the default corpus)")
        if self.hard_negatives not in HARD_NEGATIVE_MODES:
            raise ValueError(f"hard_negatives must be one of {HARD_NEGATIVE_MODES}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("max_steps must be a positive number of steps")
        if self.in_process:
            self._check_in_process()

    def _check_in_process(self) -> None:
        """What an in-process run cannot do, said before anything runs."""
        if self.num_workers != 1:
            raise ValueError(f"in_process trains on one worker, not num_workers={self.num_workers}")
        if "ance" in self.stages and self.hard_negatives == "async":
            raise ValueError("hard_negatives=async re-mines in a Ray actor: not in_process")
        if storage.is_s3(self.storage):
            raise ValueError(f"in_process keeps checkpoints on this machine, not {self.storage}")

    @functools.cached_property
    def layout(self) -> RunLayout:
        """The run folder (built once: the spec is frozen)."""
        return RunLayout.of(self.storage, self.name)


def checked_stages(stages: Sequence[str]) -> tuple[str, ...]:
    """``stages`` as a tuple, if they are some of the pipeline's, in its order, each once."""
    stages = tuple(stages)
    unknown = [stage for stage in stages if stage not in PIPELINE_STAGES]
    if unknown or not stages:
        raise ValueError(
            f"stages must be among {', '.join(PIPELINE_STAGES)}; got {','.join(stages) or 'none'}"
        )
    if list(stages) != sorted(stages, key=PIPELINE_STAGES.index) or len(set(stages)) < len(stages):
        raise ValueError(f"stages must be in the order {','.join(PIPELINE_STAGES)}, each once")
    return stages


def stage_config(spec: PipelineSpec, stage: str, negatives: str = "none") -> SantaConfig:
    """The stage's recipe with the cluster flags, its step budget and the user's --set."""
    config = stage_recipe(spec.recipe, stage)
    overrides = [f"train.num_workers={spec.num_workers}", *spec.cluster_overrides]
    steps = spec.max_steps or DEFAULT_STEPS.get(spec.recipe, {}).get(stage)
    if steps:
        overrides += [f"train.max_steps={steps}", f"train.checkpoint_every={max(1, steps // 2)}"]
    if not spec.max_steps and spec.recipe in DEFAULT_OVERRIDES:
        overrides += [*DEFAULT_OVERRIDES[spec.recipe], f"train.eval_every={steps}"]
    if stage == "ance":
        overrides.append(f"negatives.source={negatives}")
        if negatives == "async":
            overrides.append(f"negatives.refresh_every={max(1, (steps or 400) // 4)}")
    return with_recipes_that_fit(
        spec.recipe, lambda: config.with_overrides([*overrides, *spec.overrides])
    )
