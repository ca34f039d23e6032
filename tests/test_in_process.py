"""santa.train.trainer.fit_in_process: a run of santa.train.fit trained in this process, without Ray (the same
worker loop on one LocalSession); its checkpoints, resume, history and refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from santa.files.layout import RUN_SNAPSHOT_FILE
from santa.train.loop_config import LoopConfig
from santa.train.trainer import InProcessResult, RunSpec, fit, fit_in_process
from tests.training import stdlib_pair_rows, tiny_config, train_on_ranks, write_pairs


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return write_pairs(tmp_path_factory.mktemp("pairs") / "train", stdlib_pair_rows()[:64])


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_in_process_run_trains_the_loops_model_keeps_checkpoints_and_resumes(pairs, tmp_path):
    config = tiny_config(max_steps=6, log_every=1, checkpoint_every=2, seed=3)
    spec = RunSpec.of(
        data=pairs, storage=str(tmp_path / "runs"), name="local", stop_at_step=4, in_process=True
    )
    result = fit(config, spec)  # RunSpec.in_process: fit hands the run to fit_in_process
    assert isinstance(result, InProcessResult)
    run = tmp_path / "runs" / "local"
    assert result.error is None and result.path == str(run) and result.metrics["step"] == 4
    assert [h["step"] for h in history(run)] == [1, 2, 3, 4]
    assert [metrics["step"] for _, metrics in result.best_checkpoints] == [2, 4]
    assert result.checkpoint.path == result.best_checkpoints[-1][0].path
    assert (Path(result.checkpoint.path) / "model" / "config.json").is_file()
    # The worker loop itself, from the run's initial model: the same losses step by step.
    loop = LoopConfig(
        santa=config,
        init_model=str(run / "init_model"),
        data_uri=pairs,
        stop_at_step=4,
        row_cache=str(tmp_path / "rows"),
    )
    (plain,) = train_on_ranks(1, loop, str(tmp_path / "plain"), str(tmp_path / "out"))
    assert [h["loss"] for h in history(run)] == pytest.approx(
        [r["loss"] for r in plain["reports"]], rel=1e-5
    )
    # The same call without the stop resumes from step 4's checkpoint to the end; each
    # report reaches on_report (a sweep's trial in process forwards them to Tune) with the
    # folder its checkpoint was kept in, once kept.
    spec = RunSpec.of(data=pairs, storage=str(tmp_path / "runs"), name="local")
    reported = []
    resumed = fit_in_process(
        config, spec, on_report=lambda metrics, kept: reported.append((metrics["step"], kept))
    )
    assert resumed.metrics["step"] == 6
    assert [h["step"] for h in history(run)] == [1, 2, 3, 4, 5, 6]
    assert [metrics["step"] for _, metrics in resumed.best_checkpoints] == [6]
    assert reported[0][0] == 5 and reported[-1] == (6, str(run / "checkpoint_000006"))
    assert [kept for _, kept in reported[:-1] if kept] == []  # step 5: no checkpoint
    assert Path(reported[-1][1], "model", "config.json").is_file()


def test_in_process_run_refuses_what_only_a_ray_run_does(pairs, tmp_path):
    spec = RunSpec.of(data=pairs, storage=str(tmp_path / "runs"), name="r")
    with pytest.raises(ValueError, match="one worker; train.num_workers is 2"):
        fit_in_process(tiny_config(num_workers=2), spec)
    with pytest.raises(ValueError, match="async needs the miner actor"):
        fit_in_process(tiny_config(negatives={"source": "async", "per_query": 1}), spec)
    with pytest.raises(ValueError, match="not s3://bucket/runs/r"):
        fit_in_process(tiny_config(), RunSpec.of(data=pairs, storage="s3://bucket/runs", name="r"))
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / RUN_SNAPSHOT_FILE).write_text("{}")
    with pytest.raises(ValueError, match="holds a Ray run"):
        fit_in_process(tiny_config(), spec)


def test_the_training_jobs_in_process_flag_trains_here_without_ray(pairs, tmp_path, capsys):
    """``ray_jobs.pretrain --in-process``: the job's checks and outputs, the run trained in
    this process (not a Ray Train run); with ``--num-workers 2`` a usage error in one line.
    (That it computes the one-worker Ray run's losses bit for bit: the Ctrl-C and
    killed-worker tests, against ``pretrain_reference``.)"""
    from ray_jobs import pretrain

    base = ["--recipe", "tiny-ci", "--data", pairs, "--storage", str(tmp_path / "runs")]
    base += ["--max-steps", "3", "--set", "train.log_every=1", "--in-process"]
    assert pretrain.main([*base, "--name", "here"]) == 0
    out = capsys.readouterr().out
    assert "finished at step 3" in out and "checkpoint: " in out
    # Not a Ray Train run: no controller snapshot, the local session's checkpoint names.
    assert not (tmp_path / "runs" / "here" / RUN_SNAPSHOT_FILE).exists()
    assert [h["step"] for h in history(tmp_path / "runs" / "here")] == [1, 2, 3]
    assert (tmp_path / "runs" / "here" / "checkpoint_000003" / "model").is_dir()
    with pytest.raises(SystemExit) as exited:
        pretrain.main([*base, "--name", "two", "--num-workers", "2"])
    assert exited.value.code == 2
    assert "--in-process trains on one worker: drop --num-workers" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "two").exists()


def test_an_interrupt_mid_in_process_run_names_the_checkpoint_it_kept(pairs, tmp_path):
    """While an in-process run trains, the line an interrupt would print (``santa:
    interrupted: ...``, tests/test_interrupts.py) names its newest checkpoint folder, as a
    Ray run's does; the run over, the line names nothing."""
    import threading
    import time

    from santa.jobs import interrupts

    config = tiny_config(max_steps=8, log_every=1, checkpoint_every=2)
    spec = RunSpec.of(data=pairs, storage=str(tmp_path / "runs"), name="cut", in_process=True)
    run = tmp_path / "runs" / "cut"
    said: list[str] = []

    def read_the_line_after_a_checkpoint() -> None:
        deadline = time.monotonic() + 120
        while not list(run.glob("checkpoint_*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        said.append(interrupts.interrupted_line())

    watcher = threading.Thread(target=read_the_line_after_a_checkpoint, daemon=True)
    watcher.start()
    fit_in_process(config, spec)
    watcher.join(timeout=30)
    (line,) = said
    kept = re.fullmatch(
        rf"santa: interrupted: run {run} kept its checkpoint at step (\d+) "
        rf"\({run}/checkpoint_(\d+)\)",
        line,
    )
    assert kept and int(kept[1]) == int(kept[2]) and int(kept[1]) in (2, 4, 6, 8), line
    assert interrupts.interrupted_line() == "santa: interrupted"
    # Each checkpoint folder appeared whole, by a rename: no copy left half-way.
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == [
        f"checkpoint_{step:06d}" for step in (2, 4, 6, 8)
    ]
