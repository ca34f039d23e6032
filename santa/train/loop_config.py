"""What the driver hands every training worker: :class:`LoopConfig` and the objectives
the one worker loop can train.

Light to import (no torch): the driver and Ray Train's controller pickle and unpickle it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from santa.config import SantaConfig


class TrainingData(NamedTuple):
    """What an objective trains on, as a worker reads it (:mod:`santa.train.epochs`)."""

    source: Any
    """The rows (:class:`santa.train.rows.RowSource`): files, columns, which rows train."""
    collate: Callable[[Any], Any]
    """A Table of a worker's slice of a global batch → the batch the objective takes."""
    units: str = "rows"
    """What an epoch is made of: ``rows``, or ``groups`` (the row file's units, e.g.
    ESCI's one example per query and epoch; :class:`santa.train.order.EpochPlan`)."""


class ObjectiveEntry(NamedTuple):
    """One objective the worker loop can train: everything the driver and the loop need to
    know of it, so that neither names an objective."""

    objective: str
    """``module:Class`` of its :class:`santa.train.objective.Objective` (its model, a
    batch's losses, the saved model), imported in the worker only."""
    data: str
    """``module:function`` of its training data, ``(LoopConfig) -> TrainingData``, in a
    module light to import (the worker starts reading before it imports the objective)."""
    own_start: bool = False
    """True: it starts from a folder of its own (``RunSpec.warm_start``, required), handed
    to it as is; False: from a model (a warm start, the backbone or a new tiny T5)."""


# What the one worker loop (santa.train.loop) can train, by name. Adding a loss: its
# objective module, its data function, and its line here.
OBJECTIVES: dict[str, ObjectiveEntry] = {
    "santa": ObjectiveEntry(
        "santa.train.santa_objective:SantaObjective", "santa.train.data:pair_data"
    ),
    "discriminators": ObjectiveEntry(
        "santa.scoder.objectives:DiscriminatorObjective",
        "santa.scoder.rows:listwise_data",
        own_start=True,
    ),
    "dual_encoder": ObjectiveEntry(
        "santa.scoder.objectives:SoftLabelObjective", "santa.scoder.rows:listwise_data"
    ),
}


def objective_entry(name: str) -> ObjectiveEntry:
    """The registered objective ``name``, or one line naming those there are."""
    if name not in OBJECTIVES:
        raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {name!r}")
    return OBJECTIVES[name]


def training_data(loop: LoopConfig) -> TrainingData:
    """The training data of ``loop``'s objective (its registered data function)."""
    import importlib

    module_name, _, function = objective_entry(loop.objective).data.partition(":")
    return getattr(importlib.import_module(module_name), function)(loop)


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """What the driver hands every training worker; travels through Ray as a plain dict."""

    santa: SantaConfig
    init_model: str
    """The model folder every worker starts from (see ``trainer.initial_model``); for the
    ``discriminators`` objective, the discriminators' folder."""
    build_init_model: bool = False
    """``init_model`` is the tiny recipe's new model, not built yet: the rank-0 worker
    builds it (``santa.train.initial_model.build_tiny_model``) before any worker reads it."""
    objective: str = "santa"
    """What the loop trains (a key of ``OBJECTIVES``): SANTA's SDA/DR + MEP, or SCodeR's
    discriminators or soft-labeled dual encoder."""
    discriminators: str = ""
    """``dual_encoder`` with online soft labels: the discriminators' folder."""
    torch_threads: int = 1
    """Intra-op threads of each worker's torch."""
    tensorboard_dir: str = ""
    """Where rank 0 writes TensorBoard events; empty: none."""
    tensorboard_uri: str = ""
    """Storage copy of ``tensorboard_dir`` (S3 runs), refreshed at every checkpoint, so the
    curves outlive the rank-0 node; empty: the events are written in storage already."""
    metrics_uri: str = ""
    """Rank 0 keeps every logged step's metrics here as JSON lines (the run's whole history;
    Ray keeps metrics only with checkpoints); empty: not kept."""
    stop_at_step: int = 0
    """Stop (with a checkpoint) at this step though the schedule spans the run; 0: no."""
    data_uri: str = ""
    """What the objective trains on (the preprocessed pairs, SCodeR's listwise examples);
    hard negatives look their documents up there."""
    row_cache: str = ""
    """Where each node keeps its row files (:mod:`santa.train.rows`); empty:
    ``SANTA_ROW_CACHE``, else ``<tmp>/santa-rows``."""

    miner_name: str = ""
    """The named actor of ``async`` hard negatives."""
    eval_data: str = ""
    """A BEIR folder for dev metrics; empty: none."""
    eval_split: str = "test"
    """The qrels split of ``eval_data``."""
    registered_checkpoints: tuple[str, ...] = ()
    """The run's registered checkpoints, newest first: resume falls back along them when
    the latest does not load (``santa.train.resume``)."""
    cache_root: str = ""
    """The storage's cache folder (``RunLayout.cache``): torch.compile's saved work; empty:
    none kept."""
    startup: dict[str, float] = field(default_factory=dict)
    """Seconds of the driver's phases before submitting (``startup_*_s``), reported with
    the workers' own."""
    submitted_at: float = 0.0
    """``time.time()`` when the driver submitted the run (the workers' start is measured
    from it)."""
    logged_before: int = 0
    """The last step ``metrics_uri`` held when the job started: steps logged after it were
    printed by this job, so a worker restarted by Ray Train repeats them without printing
    them again (a rerun of the command prints its steps anew)."""

    tracking: dict[str, Any] = field(default_factory=dict)
    """MLflow / W&B (``santa.train.tracking.Tracking``): rank 0 logs every logged step."""

    def __post_init__(self) -> None:
        objective_entry(self.objective)
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be at least 1, got {self.torch_threads}")
        if self.stop_at_step < 0:
            raise ValueError(f"stop_at_step must not be negative, got {self.stop_at_step}")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict for Ray's ``train_loop_config``."""
        payload = {f.name: getattr(self, f.name) for f in fields(self)}
        payload["santa"] = self.santa.to_dict()
        return payload

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> LoopConfig:
        """Rebuild from :meth:`to_dict`, rejecting unknown keys."""
        unknown = set(payload) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown loop config keys: {sorted(unknown)}")
        return cls(**{**payload, "santa": SantaConfig.from_dict(payload["santa"])})
