"""A job's local Ray does not outlive the job (issue 33): killed outright (``kill -9``), the
job's watcher stops every process of that Ray session, and nothing else."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from santa.cluster.reaper import process_start_time, session_processes

REPO = Path(__file__).resolve().parents[1]
SLEEPER = "import time; time.sleep(300)"


def _sleeper(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLEEPER, *args])


def test_the_watcher_kills_the_sessions_processes_once_the_job_is_gone(tmp_path: Path) -> None:
    session = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    ours = [_sleeper(f"--session-dir={session}"), _sleeper(f"--log-dir={session}/logs")]
    other = _sleeper(f"--session-dir={tmp_path / 'session_of_another_ray'}")
    job = _sleeper()
    try:
        assert sorted(session_processes(str(session))) == sorted(p.pid for p in ours)
        reaper = subprocess.Popen(
            [sys.executable, "-m", "santa.cluster.reaper", str(job.pid)]
            + [process_start_time(job.pid), str(session)],
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        time.sleep(1.5)
        assert all(p.poll() is None for p in ours)  # the job lives: nothing is touched
        job.kill()
        job.wait()
        assert reaper.wait(timeout=30) == 0
        for process in ours:
            assert process.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None  # another Ray's process is left alone
    finally:
        for process in (*ours, other, job):
            if process.poll() is None:
                process.kill()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_job_killed_outright_leaves_no_ray_process(tmp_path: Path) -> None:
    from tests.datagen import stdlib_python_records, write_jsonl_gz

    source = tmp_path / "csn" / "python" / "final" / "jsonl" / "train"
    write_jsonl_gz(source / "python_train_0.jsonl.gz", stdlib_python_records(limit=400))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env["PYTHONPATH"] = str(REPO)
    job = subprocess.Popen(
        [sys.executable, "-m", "ray_jobs.preprocess", "--dataset", "codesearchnet", "--input"]
        + [str(tmp_path / "csn"), "--output", str(tmp_path / "out"), "--address", "local"],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "stderr.txt", "w"),  # noqa: SIM115 - closed with the process
        text=True,
        env=env,
    )
    first = job.stdout.readline()
    found = re.search(r"logs in (\S+)/logs[;)]", first)
    assert found, (first, (tmp_path / "stderr.txt").read_text()[-2000:])
    session = found.group(1)
    assert session_processes(session)  # Ray of the job's own is up
    job.kill()  # kill -9: no shutdown of its own
    job.wait()
    deadline = time.time() + 60
    while time.time() < deadline and session_processes(session):
        time.sleep(1)
    assert session_processes(session) == []
