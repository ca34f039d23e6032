"""Hard negatives that never came (issue 33): one line with the refresh and step times."""

from __future__ import annotations

from santa.negatives.health import negatives_warning
from tests.training import tiny_config


def test_no_table_in_the_whole_stage_is_said_with_the_times() -> None:
    config = tiny_config(
        stage="finetune", negatives={"source": "async", "per_query": 1, "refresh_every": 10}
    )
    metrics = {"step": 40, "step_time_s": 0.15, "negatives_step": -1.0, "negatives_staleness": -1}
    line = negatives_warning(config, metrics, {"last_build_s": None, "refresh_running_s": 28.0})
    assert line == (
        "santa: warning: hard negatives: no table arrived in 40 steps: the stage trained on "
        "in-batch negatives only; the first refresh was still running after 28.0 s, a step "
        "0.15 s (one refresh spans about 187 steps); wait for the first table (--set "
        "negatives.wait_for_first=true), add miner actors (--miner-actors N, --miner-gpus G), "
        "or refresh less often (--set negatives.refresh_every=N)"
    )


def test_a_stale_table_is_said_and_a_fresh_one_is_not() -> None:
    config = tiny_config(
        stage="finetune", negatives={"source": "async", "per_query": 1, "refresh_every": 10}
    )
    fresh = {"step": 100, "step_time_s": 0.2, "negatives_step": 90.0, "negatives_staleness": 10}
    assert negatives_warning(config, fresh, {"last_build_s": 1.5}) is None
    stale = dict(fresh, negatives_step=50.0, negatives_staleness=50)
    line = negatives_warning(config, stale, {"last_build_s": 9.0})
    assert line is not None and "mined at step 50, 50 steps before the end" in line
    assert "a refresh takes 9.0 s, a step 0.20 s (one refresh spans about 45 steps)" in line
    offline = tiny_config(stage="finetune", negatives={"source": "none"})
    assert negatives_warning(offline, stale, None) is None
