"""Recoveries said in one line (issue 33): a killed training worker and a killed miner actor —
real processes, real signals. (A stage in which no hard-negatives table arrives: its line is
tested without Ray in tests/test_negatives_health.py.)"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import CHECKPOINT_NEAR_STEP_5, TINY_PRETRAIN_STEPS, start_job
from tests.fault_runs import descendant, step_of
from tests.training import stdlib_pair_rows, write_pairs

TINY = [
    "--recipe", "tiny-ci", "--num-workers", "1", "--cpus-per-worker", "0.5",
    "--set", "train.log_every=1",
    "--address", "local",
]  # fmt: skip


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return write_pairs(tmp_path_factory.mktemp("recovery-pairs"), stdlib_pair_rows())


def _run_until(proc: subprocess.Popen, marker: str, action) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(marker):
            action()
            break
    return lines


@pytest.mark.long(seconds=5)  # the jobs: cut_then_killed, with the Ctrl-C test
@pytest.mark.timeout(1800)
def test_a_killed_worker_is_one_line_and_training_resumes_exactly(
    cut_then_killed, pretrain_reference
):
    # The second job of tests/fault_runs.py: the same command as a job Ctrl-C stopped, its
    # training worker killed once it trained past the first job's last logged step.
    rerun, runs = cut_then_killed["rerun"], cut_then_killed["runs"]
    assert rerun["killed"], rerun["stdout"][-3000:]  # it got that far: a worker was killed
    assert rerun["returncode"] == 0, rerun["stderr"][-3000:]
    steps = [step_of(line) for line in rerun["stdout"].splitlines() if step_of(line)]
    resumed = steps[0] - 1  # the first job's checkpoint: printed again from the next step
    assert re.fullmatch(CHECKPOINT_NEAR_STEP_5, str(resumed)), steps
    # Every step once: those the restarted worker group repeated are not shown again.
    assert steps == list(range(resumed + 1, TINY_PRETRAIN_STEPS + 1)), steps
    lines = rerun["stderr"].strip().splitlines()
    # The resume said once (not again when the worker group restarts), then the death: no
    # traceback, no Ray lines.
    assert len(lines) == 2, rerun["stderr"]
    assert lines[0].startswith(
        f"santa: resuming the pretrain run {runs / 'cut'} from step {resumed} ("
    ), lines[0]
    assert lines[1].startswith("santa: warning: a training worker died (pid ")
    restart = re.search(r"training resumes from checkpoint step (\d+) once its worker", lines[1])
    assert restart, lines[1]
    restarted = int(restart.group(1))  # the newest checkpoint registered when it died
    assert restarted % 2 == 0 and resumed <= restarted <= TINY_PRETRAIN_STEPS, lines[1]
    assert lines[1].endswith("(retry 1 of 1)")
    assert rerun["losses"] == pretrain_reference["losses"]
    # The last checkpoint says where each worker group started: the first job's checkpoint,
    # then (if the restarted group saved one) the checkpoint it resumed from, once each.
    last = rerun["last_state"]
    again = [restarted] if resumed < restarted < TINY_PRETRAIN_STEPS else []
    assert last["step"] == TINY_PRETRAIN_STEPS and last["resumed_at"] == [resumed, *again], last


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_killed_miner_is_one_line_and_refreshes_go_on(pairs, tmp_path):
    runs = tmp_path / "runs"
    args = [
        "ray_jobs.finetune", "--data", pairs, "--storage", str(runs), "--name", "miner",
        *TINY, "--max-steps", "120", "--hard-negatives", "async",
        "--set", "negatives.refresh_every=5", "--set", "negatives.wait_for_first=true",
        "--set", "train.log_every=10", "--set", "train.checkpoint_every=120",
    ]  # fmt: skip
    proc = start_job(args, tmp_path)
    _run_until(
        proc,
        "[train] step 20/120",
        lambda: descendant(proc.pid, "ray::HardNegativeMiner").kill(),
    )
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("santa: warning: the hard-negative miner died")
    assert "training goes on with the table of step" in lines[0]
    history = [
        json.loads(line) for line in (runs / "miner" / "metrics.jsonl").read_text().splitlines()
    ]
    assert history[-1]["step"] == 120
    assert history[-1]["miner_restarts"] >= 1  # a table of the restarted miner arrived
    # ... mined after the kill at step 20 (with weights the trainers pushed since).
    assert history[-1]["negatives_step"] > 20, history[-1]
