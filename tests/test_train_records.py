"""The run's record of its logged windows (santa.train.metrics.MetricsRecord)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from santa.config.recipes import get_recipe
from santa.train.loop_config import LoopConfig
from santa.train.metrics import MetricsRecord


def test_a_progress_line_is_shown_only_once_its_step_is_in_the_history(tmp_path, monkeypatch):
    """A worker group that Ray Train restarts reads the history to know which progress lines
    were shown. A line shown before its step was recorded is shown again when the worker is
    killed between the two (as `test_a_killed_worker_is_one_line_and_training_resumes_exactly`
    caught: the kill follows the line): each line appears after its step is written."""
    history = tmp_path / "metrics.jsonl"
    loop = LoopConfig(santa=get_recipe("tiny"), init_model="unused", metrics_uri=str(history))
    shown: list[tuple[str, list[int]]] = []  # (line, the steps recorded when it was shown)

    class Terminal(io.StringIO):
        def write(self, text: str) -> int:
            if text.strip():
                lines = history.read_text().splitlines() if history.exists() else []
                shown.append((text.strip(), [json.loads(line)["step"] for line in lines]))
            return super().write(text)

    monkeypatch.setattr(sys, "__stdout__", Terminal())
    record = MetricsRecord(loop, rank=0)
    for step in (1, 2):
        record.keep({"step": step, "loss": 1.0}, step, f"[train] step {step}/3", publish=False)
    assert shown == [("[train] step 1/3", [1]), ("[train] step 2/3", [1, 2])]

    # The group restarted from step 1's checkpoint repeats step 2 quietly, then goes on.
    shown.clear()
    restarted = MetricsRecord(loop, rank=0)
    for step in (2, 3):
        restarted.keep({"step": step, "loss": 0.5}, step, f"[train] step {step}/3", publish=False)
    assert shown == [("[train] step 3/3", [1, 2, 3])]
    assert [json.loads(line)["loss"] for line in Path(history).read_text().splitlines()] == [
        1.0,
        0.5,
        0.5,
    ]


def test_a_run_hands_on_its_best_checkpoint_by_the_metric_it_keeps(tmp_path) -> None:
    """train.keep_best_by: the best of the checkpoints Ray Train kept (ties: the later);
    without it, the latest. fit refuses a dev metric without a dev set, before any work."""
    from types import SimpleNamespace

    from santa.train.kept import kept_checkpoint
    from santa.train.trainer import RunSpec, fit
    from tests.training import tiny_config

    first, second, third = object(), object(), object()
    result = SimpleNamespace(
        best_checkpoints=[
            (first, {"step": 3, "dev_mrr": 0.2}),
            (second, {"step": 6, "dev_mrr": 0.4}),
            (third, {"step": 9, "dev_mrr": 0.4}),
        ],
        checkpoint=third,
        metrics={"step": 9},
    )
    best = kept_checkpoint(result, tiny_config(keep_best_by="dev_mrr").train)
    assert (best.checkpoint, best.step, best.value) == (third, 9, 0.4)
    assert best.describe() == "the best dev_mrr (0.4000) of the run's checkpoints, at step 9"
    lowest = kept_checkpoint(
        result, tiny_config(keep_best_by="dev_mrr", keep_best_mode="min").train
    )
    assert lowest.checkpoint is first and lowest.step == 3
    latest = kept_checkpoint(result, tiny_config().train)
    assert (latest.checkpoint, latest.by) == (third, None)
    assert latest.describe() == "the latest checkpoint, at step 9"
    with pytest.raises(ValueError, match="keep_best_by=dev_mrr needs a dev set"):
        fit(
            tiny_config(keep_best_by="dev_mrr"),
            RunSpec.of(data=str(tmp_path), storage=str(tmp_path), name="r"),
        )
