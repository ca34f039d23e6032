"""What the driver hands every training worker: :class:`LoopConfig` and the objectives
the one worker loop can train.

Light to import (no torch): the driver and Ray Train's controller pickle and unpickle it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from santa.config import SantaConfig


def tokenized_pairs(config: SantaConfig, data_uri: str, init_model: str) -> Any:
    """SANTA's data: the preprocessed pairs, tokenized by Ray Data for ``init_model``."""
    from santa.train.data import build_train_dataset, tokenization_settings

    return build_train_dataset(data_uri, init_model, tokenization_settings(config))


def listwise_rows(config: SantaConfig, data_uri: str, init_model: str) -> Any:
    """SCodeR's data: listwise examples as raw rows, which the objective tokenizes in the
    worker."""
    from santa.scoder.examples import read_listwise_dataset

    return read_listwise_dataset(data_uri)


class TrainData(NamedTuple):
    """What an objective trains on: how the driver builds it, and the batches it makes."""

    build_dataset: Callable[[SantaConfig, str, str], Any]
    """``(config, data_uri, init_model) -> ray.data.Dataset``, called by ``trainer.fit`` on
    the driver (so it imports neither torch's model side nor transformers)."""
    batch_format: str
    """The batches the workers read: ``numpy`` (tokenized by Ray Data) or ``pyarrow`` (raw
    rows the objective tokenizes itself)."""


TOKENIZED_PAIRS = TrainData(tokenized_pairs, "numpy")
LISTWISE_ROWS = TrainData(listwise_rows, "pyarrow")


class ObjectiveEntry(NamedTuple):
    """One objective the worker loop can train: everything the driver and the loop need to
    know of it, so that neither names an objective."""

    objective: str
    """``module:Class`` of its :class:`santa.train.loop.Objective` (its model, a batch's
    losses, the saved model), imported in the worker only."""
    data: TrainData
    """Its training data (``trainer.fit`` calls ``data.build_dataset``)."""
    own_start: bool = False
    """True: it starts from a folder of its own (``RunSpec.warm_start``, required), handed
    to it as is; False: from a model (a warm start, the backbone or a new tiny T5)."""


# What the one worker loop (santa.train.loop) can train, by name. Adding a loss: its
# objective module, and its line here (with the data it trains on).
OBJECTIVES: dict[str, ObjectiveEntry] = {
    "santa": ObjectiveEntry("santa.train.objectives:SantaObjective", TOKENIZED_PAIRS),
    "discriminators": ObjectiveEntry(
        "santa.scoder.objectives:DiscriminatorObjective", LISTWISE_ROWS, own_start=True
    ),
    "dual_encoder": ObjectiveEntry("santa.scoder.objectives:SoftLabelObjective", LISTWISE_ROWS),
}


def objective_entry(name: str) -> ObjectiveEntry:
    """The registered objective ``name``, or one line naming those there are."""
    if name not in OBJECTIVES:
        raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {name!r}")
    return OBJECTIVES[name]


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """What the driver hands every training worker; travels through Ray as a plain dict."""

    santa: SantaConfig
    init_model: str
    """The model folder every worker starts from (see ``trainer.prepare_initial_model``); for
    the ``discriminators`` objective, the discriminators' folder."""
    objective: str = "santa"
    """What the loop trains (a key of ``OBJECTIVES``): SANTA's SDA/DR + MEP, or SCodeR's
    discriminators or soft-labeled dual encoder."""
    discriminators: str = ""
    """``dual_encoder`` with online soft labels: the discriminators' folder."""
    train_rows: int | None = None
    """Pairs in the training data, when counted (an epoch-based schedule needs it)."""
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
    """The preprocessed pairs (hard negatives look their documents up there)."""
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
    """MLflow / W&B (``santa.runtime.tracking.Tracking``): rank 0 logs every logged step."""

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

    @property
    def batch_format(self) -> str:
        """The format of the batches the objective takes."""
        return objective_entry(self.objective).data.batch_format

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> LoopConfig:
        """Rebuild from :meth:`to_dict`, rejecting unknown keys."""
        unknown = set(payload) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown loop config keys: {sorted(unknown)}")
        return cls(**{**payload, "santa": SantaConfig.from_dict(payload["santa"])})
