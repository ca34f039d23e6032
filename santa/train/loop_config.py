"""What the driver hands every training worker: :class:`LoopConfig` and the objectives
the one worker loop can train.

Light to import (no torch): the driver and Ray Train's controller pickle and unpickle it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from santa.config import SantaConfig

# What the one worker loop (santa.train.loop) can train, by name: the objective class (its
# model, a batch's losses, the saved model), imported in the worker only, and the format of
# the batches it takes (numpy: tokenized by Ray Data; pyarrow: raw rows it tokenizes itself).
OBJECTIVES: dict[str, tuple[str, str]] = {
    "santa": ("santa.train.objectives:SantaObjective", "numpy"),
    "discriminators": ("santa.scoder.objectives:DiscriminatorObjective", "pyarrow"),
    "dual_encoder": ("santa.scoder.objectives:SoftLabelObjective", "pyarrow"),
}


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
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {sorted(OBJECTIVES)}, got {self.objective!r}"
            )
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
        return OBJECTIVES[self.objective][1]

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> LoopConfig:
        """Rebuild from :meth:`to_dict`, rejecting unknown keys."""
        unknown = set(payload) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown loop config keys: {sorted(unknown)}")
        return cls(**{**payload, "santa": SantaConfig.from_dict(payload["santa"])})
