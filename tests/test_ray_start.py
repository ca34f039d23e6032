"""A local Ray that does not come up in time: one retry with a longer wait, then one line.

The start is made to time out for real: Ray's own testing hook (``RAY_testing_asio_delay_us``)
holds the GCS's handler of the raylet's registration for minutes, and santa's wait
(``SANTA_RAY_START_WAIT_S``) is made short so that the test does not wait out Ray's 30 s.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"  # Ray's spelling
HOLD_REGISTRATION = "NodeInfoGcsService.grpc_server.RegisterNode=600000000:600000000"

PROBE = """
import os, subprocess, sys
from santa.cluster import ray_utils
from santa.jobs.errors import exit_with, run_job

TEMP = sys.argv[1]
if sys.argv[2] == "let-the-retry-start":
    clean_up = ray_utils._clean_up_failed_start

    def clean_up_then_let_it_register(error):
        os.environ.pop("RAY_testing_asio_delay_us")  # the retry's GCS registers the raylet
        return clean_up(error)

    ray_utils._clean_up_failed_start = clean_up_then_let_it_register


def main():
    try:
        print(ray_utils.init_ray(_temp_dir=TEMP), flush=True)
        import ray
        print("answer:", ray.get(ray.remote(num_cpus=0)(lambda: 42).remote()), flush=True)
    finally:
        # Every process of both attempts, while this driver still lives (its children
        # would die with it anyway: Ray ties them to the driver).
        table = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True)
        left = [line for line in table.stdout.splitlines() if TEMP + "/session" in line]
        print(f"ray processes: {len(left)}", *left, sep="\\n", flush=True)


exit_with(run_job(main))
"""


@pytest.fixture
def temp():
    """A short folder for Ray's sessions: its socket paths must stay within 107 characters."""
    folder = tempfile.mkdtemp(prefix="santa-rs-", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _run_probe(mode: str, first_wait: str, temp: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        PYTHONPATH=str(ROOT),
        SANTA_RAY_START_WAIT_S=first_wait,
        RAY_testing_asio_delay_us=HOLD_REGISTRATION,
        # Each of the driver's asks for the node waits 1 s (Ray's default: 30 s).
        RAY_raylet_start_wait_time_s="1",
        SANTA_LOG_FILE=os.path.join(temp, "job.log"),
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, temp, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    return done


def _santa_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("santa: ")]


def test_a_local_ray_that_does_not_start_is_retried_once_then_ends_in_one_line(temp) -> None:
    done = _run_probe("hold-every-start", first_wait="1", temp=temp)
    retry, error = _santa_lines(done.stderr)  # nothing else of santa's, Ray's words not at all
    # The real time each attempt took (more than Ray's wait for the raylet: the node's other
    # processes start first), then the wait it was given.
    found = re.fullmatch(
        r"santa: local Ray did not start in (\d+) s \(its raylet did not register within "
        r"Ray's 1 s wait; load \d+\.\d on \d+ CPUs?\); retrying once with a 3 s wait",
        retry,
    )
    assert found, done.stderr[-3000:]
    assert int(found.group(1)) >= 1
    found = re.fullmatch(
        r"santa: error: local Ray did not start, twice \(in (\d+) s, then (\d+) s: its raylet "
        r"did not register within Ray's 1 s, then 3 s wait; load \d+\.\d on \d+ CPUs?\): "
        r"set RAY_ADDRESS to a running cluster \(ray start --head\) or retry when the machine "
        r"is less busy; Ray's logs in " + re.escape(temp) + r"/session_[^ ]+/logs",
        error,
    )
    assert found, done.stderr[-3000:]
    assert int(found.group(2)) >= 3
    assert done.stderr.rstrip().splitlines()[-1] == error  # the last line
    assert "timed out during startup" not in done.stderr
    assert done.returncode == 1
    assert "ray processes: 0" in done.stdout.splitlines(), done.stdout


@pytest.mark.slow  # two real starts and a task: 30-80 s on a busy 2-core machine
def test_a_retried_start_that_comes_up_runs_the_job(temp) -> None:
    done = _run_probe("let-the-retry-start", first_wait="10", temp=temp)
    assert done.returncode == 0, done.stderr[-3000:]
    (retry,) = _santa_lines(done.stderr)
    assert retry.startswith("santa: local Ray did not start in ")
    assert "(its raylet did not register within Ray's 10 s wait; " in retry
    assert retry.endswith("; retrying once with a 30 s wait")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Ray: started a local cluster (")
    assert "answer: 42" in lines
    # What runs at the end is the retry's node (the first attempt's processes were stopped):
    # one session folder, the second.
    sessions = {re.search(r"/session_[^/ ]+", line).group(0) for line in lines[3:]}
    assert len(sessions) == 1 and sessions.pop() in lines[0]


def test_joining_a_cluster_is_not_retried(monkeypatch) -> None:
    import ray

    from santa.cluster import ray_utils

    calls = []

    def init(**kwargs):
        calls.append(kwargs["address"])
        raise Exception("The current node timed out during startup. This could happen ...")  # noqa: TRY002

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_utils._start_or_join("10.0.0.7:6379")
    assert calls == ["10.0.0.7:6379"]


def test_the_wait_santa_stretches_is_still_rays_30_s_constant() -> None:
    """``_StretchedClock`` relies on Ray's node module: a 30 s constant on ``time.monotonic``."""
    import time

    import ray._private.node as node

    from santa.cluster import ray_utils

    source = inspect.getsource(node.Node.__init__)
    assert "raylet_start_wait_time_s = 30\n" in source
    assert "time.monotonic() - start_time > raylet_start_wait_time_s" in source
    assert node.time is time
    before = os.environ.get(GCS_WAIT_ENV)
    with ray_utils._node_start_wait(90):
        assert node.time.monotonic() == pytest.approx(time.monotonic() / 3, abs=1)
        assert node.time.sleep is time.sleep
        assert os.environ[GCS_WAIT_ENV] == "90"
    assert node.time is time
    assert os.environ.get(GCS_WAIT_ENV) == before


def test_a_ray_start_error_is_one_line_at_exit_code_1() -> None:
    from santa.jobs.errors import RUNTIME_FAULT, RayStartError, describe

    line, code = describe(RayStartError("local Ray did not start, twice (...): set RAY_ADDRESS"))
    assert (line, code) == (
        "santa: error: local Ray did not start, twice (...): set RAY_ADDRESS",
        RUNTIME_FAULT,
    )
