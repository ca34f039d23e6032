"""A local Ray that does not come up in time: one retry with a longer wait, then one line.

The start is made to time out for real: Ray's own testing hook (``RAY_testing_asio_delay_us``)
holds the GCS's handler of the raylet's registration for minutes, and santa's wait
(``SANTA_RAY_START_WAIT_S``) is made short so that the test does not wait out Ray's 30 s.
Both probes run at once, in conftest's ``ray_start_attempts`` (tests/local_ray_runs.py).
"""

from __future__ import annotations

import inspect
import os
import re

import pytest

GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"  # Ray's spelling


def _santa_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("santa: ")]


def test_a_local_ray_that_does_not_start_is_retried_once_then_ends_in_one_line(
    ray_start_attempts,
) -> None:
    done = ray_start_attempts["hold-every-start"]
    temp = ray_start_attempts["temp"]["hold-every-start"]
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
def test_a_retried_start_that_comes_up_runs_the_job(ray_start_attempts) -> None:
    done = ray_start_attempts["let-the-retry-start"]
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
    listed = next(i for i, line in enumerate(lines) if line.startswith("ray processes: "))
    sessions = {re.search(r"/session_[^/ ]+", line).group(0) for line in lines[listed + 1 :]}
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
