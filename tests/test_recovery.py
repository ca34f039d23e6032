"""Recoveries said in one line (issue 33): a killed training worker, a killed miner actor, and a
stage in which no hard-negatives table arrives — real processes, real signals."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import CHECKPOINT_NEAR_STEP_5, TINY_PRETRAIN, start_job
from tests.training import stdlib_pair_rows, write_pairs

TINY = [
    "--recipe", "tiny-ci", "--num-workers", "1", "--cpus-per-worker", "0.5",
    "--set", "train.log_every=1",
    "--address", "local",
]  # fmt: skip


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return write_pairs(tmp_path_factory.mktemp("recovery-pairs"), stdlib_pair_rows())


def _descendant(pid: int, title: str, timeout: float = 120) -> psutil.Process:
    """The process of this job's local Ray whose command line starts with ``title``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if " ".join(child.cmdline()).startswith(title):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.5)
    raise AssertionError(f"no {title} process under {pid}")


def _run_until(proc: subprocess.Popen, marker: str, action) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(marker):
            action()
            break
    return lines


def _losses(run: Path) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {int(m["step"]): m["loss"] for m in map(json.loads, lines)}


@pytest.mark.long(seconds=80)
@pytest.mark.timeout(1500)
def test_a_killed_worker_is_one_line_and_training_resumes_exactly(pretrain_reference, tmp_path):
    runs = tmp_path / "runs"
    train = [*TINY_PRETRAIN, "--data", pretrain_reference["data"], "--storage", str(runs)]
    train += ["--max-failures", "1"]
    proc = start_job([*train, "--name", "killed"], tmp_path)
    killed = []
    head = _run_until(
        proc,
        "[train] step 5/8",
        lambda: killed.append(_descendant(proc.pid, "ray::RayTrainWorker").kill()),
    )
    stdout, stderr = proc.communicate(timeout=600)
    stdout = "".join(head) + stdout
    assert proc.returncode == 0, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr  # no traceback, no Ray lines
    assert lines[0].startswith("santa: warning: a training worker died (pid ")
    resumes = rf"training resumes from checkpoint step {CHECKPOINT_NEAR_STEP_5} once its worker"
    assert re.search(resumes, lines[0]), lines[0]
    assert lines[0].endswith("(retry 1 of 1)")
    steps = [line.split()[2] for line in stdout.splitlines() if line.startswith("[train] step")]
    assert steps == [f"{step}/8" for step in range(1, 9)]  # repeated steps not shown again
    assert _losses(runs / "killed") == pretrain_reference["losses"]
    # The last checkpoint says where the restarted group resumed: a checkpoint step, once.
    states = [
        json.loads(path.read_text())
        for path in (runs / "killed").glob("checkpoint_*/trainer_state.json")
    ]
    last = max(states, key=lambda state: state["step"])
    assert last["step"] == 8 and len(last["resumed_at"]) == 1, last
    assert re.fullmatch(CHECKPOINT_NEAR_STEP_5, str(last["resumed_at"][0])), last


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
        lambda: _descendant(proc.pid, "ray::HardNegativeMiner").kill(),
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_stage_without_any_table_says_so_with_the_times(tmp_path):
    # A corpus whose refresh (encoding every document) outlasts the whole short stage.
    rows = [
        dict(row, id=f"{row['id']}-{copy}", doc_id=f"{row['doc_id']}-{copy}",
             query_id=f"{row['query_id']}-{copy}", document=f"{row['document']} # {copy}")
        for copy in range(40)
        for row in stdlib_pair_rows()
    ]  # fmt: skip
    pairs = write_pairs(tmp_path / "big-pairs", rows)
    args = [
        "ray_jobs.finetune", "--data", pairs, "--storage", str(tmp_path / "runs"),
        "--name", "never", *TINY, "--max-steps", "4", "--hard-negatives", "async",
        "--set", "negatives.refresh_every=1000", "--set", "train.checkpoint_every=4",
    ]  # fmt: skip
    proc = start_job(args, tmp_path)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(
        "santa: warning: hard negatives: no table arrived in 4 steps: the stage trained on "
        "in-batch negatives only; "
    )
    assert "a step " in lines[0] and "--set negatives.wait_for_first=true" in lines[0]
