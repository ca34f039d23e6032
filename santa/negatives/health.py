"""Hard negatives that never came: a stage trained with ``async`` negatives that ended with no
table from the miner, or with one staler than a few refresh intervals, says so in one line,
with the refresh time and the step time, and what to change."""

from __future__ import annotations

from typing import Any

from santa.config import SantaConfig

__all__ = ["STALE_INTERVALS", "negatives_warning"]

STALE_INTERVALS = 3
"""A table older than this many refresh intervals at the end of a stage is called stale."""


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


def negatives_warning(
    config: SantaConfig, metrics: dict[str, Any], miner_info: dict[str, Any] | None
) -> str | None:
    """The ``santa: warning: ...`` line for a stage whose hard negatives never came, or None.

    ``metrics``: the stage's final metrics (``step``, ``step_time_s``, ``negatives_step``,
    ``negatives_staleness``, ``negatives_refresh_s``); ``miner_info``: the miner's
    ``info()`` at the end (its last refresh time, the one still running), if reachable.
    """
    negatives = config.negatives
    if negatives.source != "async" or not metrics:
        return None
    step = int(metrics.get("step") or 0)
    table_step = metrics.get("negatives_step", -1)
    staleness = metrics.get("negatives_staleness", -1)
    every = negatives.refresh_every
    if isinstance(table_step, int | float) and table_step >= 0:
        if not (isinstance(staleness, int | float) and staleness > STALE_INTERVALS * every):
            return None
        what = (
            f"the newest table was mined at step {int(table_step)}, {int(staleness)} steps "
            f"before the end (more than {STALE_INTERVALS} refreshes of "
            f"negatives.refresh_every={every})"
        )
    else:
        what = f"no table arrived in {step} steps: the stage trained on in-batch negatives only"
    info = miner_info or {}
    refresh_s = _seconds(info.get("last_build_s")) or _seconds(metrics.get("negatives_refresh_s"))
    running_s = _seconds(info.get("refresh_running_s"))
    step_s = _seconds(metrics.get("step_time_s"))
    if refresh_s is not None:
        refresh = f"a refresh takes {refresh_s:.1f} s"
    elif running_s is not None:
        refresh = f"the first refresh was still running after {running_s:.1f} s"
    else:
        refresh = "the miner never finished a refresh"
    timing = refresh + (f", a step {step_s:.2f} s" if step_s is not None else "")
    slowest = refresh_s or running_s
    if slowest is not None and step_s:
        timing += f" (one refresh spans about {slowest / step_s:.0f} steps)"
    fixes = (
        "wait for the first table (--set negatives.wait_for_first=true), add miner actors "
        "(--miner-actors N, --miner-gpus G), or refresh less often "
        "(--set negatives.refresh_every=N)"
    )
    return f"santa: warning: hard negatives: {what}; {timing}; {fixes}"
