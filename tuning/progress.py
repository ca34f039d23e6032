"""What a sweep shows while it runs: one santa line per trial event, not Tune's status boxes.

Tune's own output (a status table with every trial's whole config, redrawn as trials
report) is switched off (``RunConfig(verbose=0)``); :class:`SweepProgress` prints instead::

    [sweep] trial 3f2a1_00000 started (lr 0.00123, λ 0.53)
    [sweep] trial 3f2a1_00000 step 4/12 dev_mrr 0.1234
    [sweep] trial 3f2a1_00000 done at step 12: dev_mrr 0.2345
    santa: warning: trial 3f2a1_00001 failed: <the root cause>

and the sweep ends with santa's table of trials (:func:`tuning.sweep.format_table`).
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

from santa.jobs.errors import describe

# Tune's trial statuses, as the sweep's table says them.
STATUS_WORDS = {
    "TERMINATED": "done",
    "ERROR": "error",
    "RUNNING": "unfinished",
    "PENDING": "unfinished",
    "PAUSED": "unfinished",
}


def status_word(trial: Any) -> str:
    """``done``, ``error`` or ``unfinished`` for a Tune trial."""
    return STATUS_WORDS.get(str(getattr(trial, "status", "")), "unfinished")


def _parameters(config: dict[str, Any]) -> str:
    parts = [f"lr {config['lr']:.3g}"] if isinstance(config.get("lr"), float) else []
    if isinstance(config.get("lambda"), float):
        parts.append(f"λ {config['lambda']:.3g}")
    return ", ".join(parts)


class SweepProgress(Callback):
    """Prints one ``[sweep]`` line per trial start, result and end."""

    def __init__(self, metric: str, time_attr: str, max_t: int | None) -> None:
        self.metric = metric
        self.time_attr = time_attr
        self.max_t = max_t

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        print(f"[sweep] trial {trial.trial_id} started ({_parameters(trial.config)})", flush=True)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        step = result.get(self.time_attr)
        of = f"/{self.max_t}" if self.max_t else ""
        value = result.get(self.metric)
        shown = f" {self.metric} {value:.4f}" if isinstance(value, float) else ""
        print(f"[sweep] trial {trial.trial_id} step {step}{of}{shown}", flush=True)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        value = last.get(self.metric)
        shown = f": {self.metric} {value:.4f}" if isinstance(value, float) else ""
        print(
            f"[sweep] trial {trial.trial_id} done at step {last.get(self.time_attr)}{shown}",
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        error = getattr(trial, "get_pickled_error", lambda: None)()
        reason = describe(error)[0].removeprefix("santa: error: ") if error else "see the log"
        print(f"santa: warning: trial {trial.trial_id} failed: {reason}", flush=True)
