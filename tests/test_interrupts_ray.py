"""Ctrl-C to the process group of running Ray jobs (issue 33): a pretrain and a sweep end
with exit 130 and one ``santa: interrupted`` line, keep what they wrote, release their lock,
and the same command resumes (the pretrain's losses equal an uninterrupted run's)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from santa.files.layout import RUN_SNAPSHOT_FILE
from santa.models.checkpoints import best_checkpoint
from tests.conftest import CHECKPOINT_NEAR_STEP_5, TINY_PRETRAIN_STEPS, start_job
from tests.training import stdlib_pair_rows, write_beir, write_pairs

TINY = [
    "--recipe", "tiny-ci", "--num-workers", "1", "--cpus-per-worker", "0.5",
    "--set", "train.log_every=1",
    "--address", "local",
]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    rows = stdlib_pair_rows()
    root = tmp_path_factory.mktemp("interrupt-data")
    return {
        "train": write_pairs(root / "train", rows[:-24]),
        "dev": write_beir(root / "dev", rows[-24:]),
    }


def _interrupt_after(proc: subprocess.Popen, marker: str) -> tuple[str, str]:
    """Ctrl-C (SIGINT to the process group) once a stdout line starts with ``marker``."""
    head = []
    for line in proc.stdout:
        head.append(line)
        if line.startswith(marker):
            break
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    return "".join(head) + stdout, stderr


@pytest.mark.long(seconds=120)  # both jobs of cut_then_killed (tests/fault_runs.py)
@pytest.mark.timeout(1800)
def test_ctrl_c_mid_pretrain_keeps_its_checkpoint_and_resumes_exactly(
    cut_then_killed, pretrain_reference
):
    runs = cut_then_killed["runs"]
    cut, rerun = cut_then_killed["cut"], cut_then_killed["rerun"]
    assert cut["returncode"] == 130, cut["stderr"][-3000:]
    assert cut["seconds"] < 300
    lines = cut["stderr"].strip().splitlines()
    assert len(lines) == 1, cut["stderr"]
    kept = re.match(
        rf"santa: interrupted: run {runs / 'cut'} kept its checkpoint at step "
        rf"{CHECKPOINT_NEAR_STEP_5} ",
        lines[0],
    )
    assert kept, lines[0]
    assert lines[0].endswith("; run the same command to resume")
    assert cut["lock_released"] is True, cut["lock_released"]
    # Tracked in MLflow: the interrupted run is marked KILLED, the resumed one FINISHED,
    # with each step logged once (a worker killed in the rerun logs none twice either).
    assert cut["mlflow_runs"] == ["KILLED"]

    # The same command resumes (its worker killed on the way: tests/test_recovery.py).
    assert rerun["returncode"] == 0, rerun["stderr"][-3000:]
    assert f"[train] step {TINY_PRETRAIN_STEPS}/{TINY_PRETRAIN_STEPS}" in rerun["stdout"]
    assert rerun["losses"] == pretrain_reference["losses"]
    assert rerun["mlflow_status"] == "FINISHED"
    assert rerun["mlflow_loss_steps"] == list(range(1, TINY_PRETRAIN_STEPS + 1))


@pytest.mark.long(seconds=60)
@pytest.mark.timeout(1500)
def test_ctrl_c_mid_sweep_writes_no_best_json_and_the_same_command_resumes(data, tmp_path):
    """Two trials, one at a time, each trained in its trial's process (``--in-process``:
    what is cut and resumed is the sweep's driver and Tune's experiment, the same for both
    kinds of trial; Ray Train trials are resumed by tests/test_sweep.py's killed sweep)."""
    sets = [arg for item in ("train.eval_every=2",) for arg in ("--set", item)]
    args = [
        "tuning.sweep", "--data", data["train"], "--eval-data", data["dev"],
        "--storage", str(tmp_path / "sweeps"), "--name", "cut", "--num-samples", "2",
        "--max-steps", "6", "--eval-every", "2", "--scheduler", "fifo", "--max-concurrent", "1",
        "--seed", "0", "--in-process", *TINY, *sets,
    ]  # fmt: skip
    root = tmp_path / "sweeps" / "cut"
    proc = start_job(args, tmp_path)
    stdout, stderr = _interrupt_after(proc, "[sweep] trial")  # started: cut before a result
    assert "in process)" in stdout  # the sizing line: each trial trains in its own process
    assert proc.returncode == 130, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"santa: interrupted: sweep {root}: "), stderr
    assert "no best.json written; run the same command to resume the unfinished trials" in lines[0]
    assert not (root / "best.json").exists()
    assert "╭" not in stdout and "Trial name" not in stdout  # no Tune status boxes

    rerun = start_job(args, tmp_path)
    stdout, stderr = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, stderr[-3000:]
    assert "resuming the sweep" in stdout
    table = stdout[stdout.index("trial  ") :].splitlines()
    assert len(table) >= 3
    assert all(row.split()[-2:] == ["6", "done"] for row in table[1:3]), table
    best = json.loads((root / "best.json").read_text())
    assert best["step"] == 6
    # The checkpoint an in-process trial kept and forwarded is the one best.json names.
    run = root / "runs" / f"cut-{best['trial_id']}"
    assert Path(best["checkpoint"]) == run / "checkpoint_000006"
    assert best_checkpoint(str(root)).step == 6
    assert not list((root / "runs").rglob(RUN_SNAPSHOT_FILE))  # no Ray Train run
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
