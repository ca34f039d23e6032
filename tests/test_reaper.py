"""A job's local Ray does not outlive the job (issue 33): killed outright (``kill -9``), the
job's watcher stops every process of that Ray session, and nothing else."""

from __future__ import annotations

import os
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
def test_a_job_killed_outright_leaves_no_ray_process(own_local_ray) -> None:
    """conftest's ``own_local_ray``: a driver's own local Ray (``init_ray()``, as every job
    starts one), a worker mid-task, the driver killed with ``kill -9``."""
    assert own_local_ray["session"], (own_local_ray["first_line"], own_local_ray["stderr"][-2000:])
    assert own_local_ray["alive_before_kill"]  # Ray of the job's own was up
    assert own_local_ray["left_after_kill"] == []
