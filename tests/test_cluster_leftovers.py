"""A job interrupted on a long-lived cluster (`ray start`) leaves nothing behind: Ray
Train's detached ``PlacementGroupCleaner`` actor of the run is stopped. In Ray 2.60 it stayed
ALIVE after every Ctrl-C or ``ray job stop`` (about 200 MB each), on a cluster that runs
jobs for weeks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import job_env
from tests.test_job_submit import _free_port, _ray, _stop_processes_of
from tests.training import stdlib_pair_rows, write_pairs

ACTORS = """
import json, sys
from santa.cluster.ray_utils import init_ray
init_ray(sys.argv[1], log_to_driver=False)
from ray._private import state
print(json.dumps([
    {"class": a["ActorClassName"], "state": a["State"], "job": a["JobID"]}
    for a in state.actors().values()
]))
"""


def _actors(address: str) -> list[dict]:
    """Every actor the cluster's GCS knows (no dashboard needed), from a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", ACTORS, address],
        env={**job_env(), "RAY_AUTH_MODE": "token"},  # the cluster's mode (see head_node)
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def head_node(tmp_path):
    """One `ray start --head` node of 2 CPUs, as an operator starts a long-lived cluster."""
    port = _free_port()
    temp_dir = Path("/tmp") / f"santa-ray-{port}"
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    started = _ray(
        ["start", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={temp_dir}"]
        + ["--include-dashboard=false", "--disable-usage-stats"]
        + [f"--dashboard-agent-listen-port={_free_port()}"],
        env,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        _stop_processes_of(temp_dir)
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.long(seconds=90)
@pytest.mark.timeout(900)
def test_an_interrupted_job_leaves_no_placement_group_cleaner(head_node, tmp_path):
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:64])
    args = ["ray_jobs.pretrain", "--recipe", "tiny-ci", "--num-workers", "1"]
    args += ["--cpus-per-worker", "0.5", "--set", "train.log_every=1", "--max-steps", "400"]
    args += ["--data", data, "--storage", str(tmp_path / "runs"), "--name", "cut"]
    proc = subprocess.Popen(  # as start_job, in the cluster's auth mode
        [sys.executable, "-m", *args, "--address", head_node],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**job_env(), "RAY_AUTH_MODE": "token"},
        cwd=tmp_path,
        start_new_session=True,
    )
    for line in proc.stdout:
        if line.startswith("[train] step 2/"):
            break
    assert [a for a in _actors(head_node) if a["class"] == "PlacementGroupCleaner"]
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-3000:]

    deadline = time.monotonic() + 60  # Ray's own GCS marks the job's actors DEAD
    while True:
        left = [
            a
            for a in _actors(head_node)
            if a["class"] == "PlacementGroupCleaner" and a["state"] != "DEAD"
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert left == [], left
