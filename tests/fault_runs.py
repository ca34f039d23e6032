"""One pretrain run through two faults, for the Ctrl-C and killed-worker tests (issue 33):
``TINY_PRETRAIN`` tracked in MLflow is interrupted (SIGINT to its process group, a terminal's
Ctrl-C) once step 5 is printed; then the same command, whose training worker is killed
(SIGKILL) once it trains past the last step the first job logged, recovers and finishes.

Two jobs where the two tests ran three (~45 s less); each test reads its part of the record
(tests/test_interrupts_ray.py: the interrupt and the resume; tests/test_recovery.py: the
recovery inside the second job).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import TINY_PRETRAIN, start_job


def descendant(pid: int, title: str, timeout: float = 120) -> psutil.Process:
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


def step_of(line: str) -> int:
    """The step of a ``[train] step N/M ...`` line; 0 for any other line."""
    if not line.startswith("[train] step "):
        return 0
    return int(line.split()[2].split("/")[0])


def losses(run: Path) -> dict[int, float]:
    """The run's loss by step, from its ``metrics.jsonl``."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {int(m["step"]): m["loss"] for m in map(json.loads, lines)}


def _read_until(proc: subprocess.Popen, stop: Callable[[str], bool], action) -> list[str]:
    """Stdout lines up to the first that ``stop`` accepts, then ``action()`` (not called
    when the job ended before such a line)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if stop(line):
            action()
            break
    return lines


def cut_then_kill(data: str, root: Path) -> dict[str, Any]:
    """The two jobs (see the module's docstring); what each test asserts on."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the jobs' (MLflow 3)
        return _cut_then_kill(data, root)


def _interrupt(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)


def _cut_then_kill(data: str, root: Path) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    from santa.files.runlock import RunLock

    runs = root / "runs"
    store = f"file://{root / 'mlruns'}"
    command = [*TINY_PRETRAIN, "--data", data, "--storage", str(runs), "--name", "cut"]
    command += ["--mlflow", store]  # the interrupted run KILLED, the resumed one FINISHED

    proc = start_job(command, root)
    started = time.monotonic()
    head = _read_until(
        proc,
        lambda line: line.startswith("[train] step 5/"),
        lambda: _interrupt(proc),
    )
    stdout, stderr = proc.communicate(timeout=300)
    cut: dict[str, Any] = {
        "returncode": proc.returncode,
        "seconds": time.monotonic() - started,
        "stdout": "".join(head) + stdout,
        "stderr": stderr,
    }
    try:
        with RunLock(str(runs / "cut")):  # released (a flock the kernel would free anyway)
            cut["lock_released"] = True
    except Exception as error:  # noqa: BLE001 - the test says what it was
        cut["lock_released"] = f"{type(error).__name__}: {error}"
    client = MlflowClient(tracking_uri=store)
    tracked = client.search_runs([client.get_experiment_by_name("santa").experiment_id])
    cut["mlflow_runs"] = [run.info.status for run in tracked]
    # The steps the first job logged: the same command prints them again from its checkpoint
    # (a new job), and a worker group restarted within it hides what it printed already.
    logged = max(losses(runs / "cut"), default=0)
    cut["logged"] = logged

    rerun = start_job(command, root)
    killed: list[int] = []

    def kill_worker() -> None:
        worker = descendant(rerun.pid, "ray::RayTrainWorker")
        killed.append(worker.pid)
        worker.kill()

    head = _read_until(rerun, lambda line: step_of(line) > logged, kill_worker)
    stdout, stderr = rerun.communicate(timeout=600)
    states = [
        json.loads(path.read_text())
        for path in (runs / "cut").glob("checkpoint_*/trainer_state.json")
    ]
    run_id = tracked[0].info.run_id if len(tracked) == 1 else ""
    return {
        "runs": runs,
        "cut": cut,
        "rerun": {
            "returncode": rerun.returncode,
            "stdout": "".join(head) + stdout,
            "stderr": stderr,
            "killed": killed,
            "losses": losses(runs / "cut"),
            "last_state": max(states, key=lambda state: state["step"], default={}),
            "mlflow_status": client.get_run(run_id).info.status if run_id else "",
            "mlflow_loss_steps": sorted(m.step for m in client.get_metric_history(run_id, "loss"))
            if run_id
            else [],
        },
    }
