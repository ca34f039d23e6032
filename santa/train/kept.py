"""What an interrupted training run kept: its newest registered checkpoint and step.

The line a job prints after Ctrl-C or ``ray job stop`` (``santa: interrupted: ...``) is
built here: for Ray Train runs from Ray's own record of registered checkpoints (a folder an
interrupted upload left behind is never counted); for in-process runs from their checkpoint
folders (each appears whole, by a rename).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from santa.files import storage
from santa.files.layout import RUN_SNAPSHOT_FILE, RunLayout
from santa.models.checkpoints import _snapshot_candidates

__all__ = [
    "KeptCheckpoint",
    "describe_local_run",
    "describe_run",
    "final_metrics_lines",
    "kept_checkpoint",
    "latest_registered",
]

RESUME_HINT = "run the same command to resume"


def latest_registered(run_uri: str) -> tuple[str, int | None] | None:
    """``(checkpoint URI, step)`` of the run's newest registered checkpoint, or None."""
    location = storage.open_location(run_uri)
    snapshot = storage.read_json_or_none(location.child(RUN_SNAPSHOT_FILE), invalid_ok=True)
    candidates = _snapshot_candidates(snapshot) if snapshot is not None else None
    if not candidates:
        return None
    name, metrics = candidates[0]
    step = metrics.get("step")
    return RunLayout(run_uri).checkpoint(name), int(step) if isinstance(step, int | float) else None


class KeptCheckpoint(NamedTuple):
    """The checkpoint a finished run hands on, and why that one."""

    checkpoint: Any
    """A ``ray.train.Checkpoint``."""
    step: int | None
    by: str | None
    """The metric it was chosen by (``train.keep_best_by``), None: the latest."""
    value: float | None
    """Its value of that metric."""

    def describe(self) -> str:
        """``the best dev_mrr (0.4312) of the run's checkpoints, at step 40`` or ``the
        latest, at step 60``."""
        at = f"at step {self.step}" if self.step is not None else "at its step"
        if self.by is None:
            return f"the latest checkpoint, {at}"
        return f"the best {self.by} ({self.value:.4f}) of the run's checkpoints, {at}"

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "by": self.by, "value": self.value}


def kept_checkpoint(result: Any, train: Any) -> KeptCheckpoint:
    """The checkpoint of a finished ``ray.train.Result`` to chain and evaluate: the best by
    ``train.keep_best_by`` among those Ray Train kept (``best_checkpoints``), else the
    latest."""
    if train.keep_best_by:
        scored = [
            (checkpoint, metrics)
            for checkpoint, metrics in (result.best_checkpoints or [])
            if isinstance(metrics.get(train.keep_best_by), int | float)
        ]
        if scored:
            sign = 1.0 if train.keep_best_mode == "max" else -1.0
            checkpoint, metrics = max(
                scored,
                key=lambda item: (sign * item[1][train.keep_best_by], item[1].get("step", 0)),
            )
            step = metrics.get("step")
            return KeptCheckpoint(
                checkpoint,
                int(step) if isinstance(step, int | float) else None,
                train.keep_best_by,
                float(metrics[train.keep_best_by]),
            )
    step = (result.metrics or {}).get("step")
    return KeptCheckpoint(
        result.checkpoint, int(step) if isinstance(step, int | float) else None, None, None
    )


def describe_local_run(root: str, checkpoints: list[str]) -> str:
    """:func:`describe_run` of an in-process run (``fit_in_process``) from its checkpoint
    folders ``checkpoint_<step>``, newest first (``LocalSession.checkpoints()``)."""
    if not checkpoints:
        return f"run {root} has no checkpoint yet (it starts over)"
    step = int(checkpoints[0].rsplit("checkpoint_", 1)[1])
    return f"run {root} kept its checkpoint at step {step} ({checkpoints[0]})"


def describe_run(run_uri: str, what: str = "run") -> str:
    """``run RUN kept its checkpoint at step 6 (URI)`` or ``run RUN has no checkpoint yet``."""
    found = latest_registered(run_uri)
    if found is None:
        return f"{what} {run_uri} has no checkpoint yet (it starts over)"
    uri, step = found
    at = f"step {step}" if step is not None else "its latest step"
    return f"{what} {run_uri} kept its checkpoint at {at} ({uri})"


# The figures of a finished run worth a line of their own, in this order (the rest stay in
# the run's metrics.jsonl).
_SUMMARY_FIGURES = (
    "loss",
    "loss_sda",
    "loss_mep",
    "accuracy",
    "dev_mrr",
    "dev_ndcg",
    "pairs_per_s",
    "run_pairs_per_s",
)


def final_metrics_lines(metrics: dict, metrics_uri: str = "") -> list[str]:
    """A finished run's last figures as a short two-column table (instead of every metric
    as JSON), and where the whole history is."""
    step = metrics.get("step")
    lines = [f"finished at step {int(step)}" if isinstance(step, int | float) else "finished"]
    for key in _SUMMARY_FIGURES:
        value = metrics.get(key)
        if isinstance(value, int | float):
            lines.append(f"  {key:<16} {value:.4f}")
    if metrics_uri:
        lines.append(f"every logged window: {metrics_uri}")
    return lines
