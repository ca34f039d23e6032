"""The pipeline submitted with `ray job submit` to a real multi-node cluster started from the
shell (`ray start --head` + 2 × `ray start --address`), storing to S3 on a moto server; then
a second job stopped with `ray job stop` mid-run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from santa.data.source import default_source_root
from santa.files import storage

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")
# A few real stdlib modules: enough functions for a short run, quick to preprocess.
CORPUS_FILES = (
    "json",
    "textwrap.py",
    "shlex.py",
    "csv.py",
    "fractions.py",
    "string.py",
    "calendar.py",
    "argparse.py",
    "configparser.py",
    "difflib.py",
    "gettext.py",
    "heapq.py",
    "ipaddress.py",
    "pathlib.py",
    "pprint.py",
    "statistics.py",
    "tarfile.py",
    "zipfile.py",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RAY, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _stop_processes_of(temp_dir: Path) -> None:
    """Kill this cluster's processes only (`ray stop` would kill every Ray on the machine,
    e.g. the test session's own cluster): those whose command line names its temp dirs.
    Their worker processes exit when their raylet goes."""
    mine = str(temp_dir).encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if mine in cmdline.read_bytes():
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to kill
    time.sleep(2)


@pytest.fixture
def shell_cluster(moto_s3, tmp_path):
    """A head and two worker nodes started with the `ray` command line, stopped after."""
    port, dashboard = _free_port(), _free_port()
    temp_dir = Path("/tmp") / f"santa-ray-{port}"  # short: Ray's socket paths have a limit
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",  # harmless without a token; required once one exists
    }
    # Each node's dashboard agent on a port of its own: Ray's default (52365) may be held by
    # another Ray on this machine (the test session's own cluster), and a job is submitted
    # through the head's agent.
    head = _ray(
        ["start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=true"]
        + [f"--dashboard-port={dashboard}", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
        + [f"--dashboard-agent-listen-port={_free_port()}"],
        env,
    )
    assert head.returncode == 0, head.stdout + head.stderr
    try:
        for index in range(2):
            # Each node its own temp dir, as on separate machines: nodes sharing one would
            # unpack the job's working_dir over each other's (and under the running driver).
            worker = _ray(
                ["start", f"--address=127.0.0.1:{port}", "--num-cpus=1", "--disable-usage-stats"]
                + [f"--temp-dir={temp_dir}-w{index}"]
                + [f"--dashboard-agent-listen-port={_free_port()}"],
                env,
            )
            assert worker.returncode == 0, worker.stdout + worker.stderr
        yield {"address": f"http://127.0.0.1:{dashboard}", "env": env, "temp_dir": temp_dir}
    finally:
        _stop_processes_of(temp_dir)
        for directory in (temp_dir, Path(f"{temp_dir}-w0"), Path(f"{temp_dir}-w1")):
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
def test_pipeline_submitted_to_a_shell_cluster_writes_to_s3(shell_cluster, moto_s3, tmp_path):
    corpus = tmp_path / "corpus"
    for name in CORPUS_FILES:
        source = Path(default_source_root()) / name
        if not source.exists():
            continue  # a module that is a package in some Python versions, a file in others
        if source.is_dir():
            shutil.copytree(source, corpus / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            corpus.mkdir(exist_ok=True)
            shutil.copy(source, corpus / name)
    bucket = moto_s3.create_bucket("santa-jobs")
    env = shell_cluster["env"]
    for _ in range(36):  # the job agent comes up a little after `ray start` returns
        job = _ray(
            ["job", "submit", "--address", shell_cluster["address"], "--working-dir", str(REPO)]
            + ["--", "python", "-m", "ray_jobs.pipeline", "--storage", f"{bucket}/runs"]
            + ["--name", "e2e", "--input", str(corpus), "--max-steps", "12"]
            + ["--recipe", "tiny-ci", "--stages", "pretrain"]
            + ["--cpus-per-worker", "0.5", "--set", "train.log_every=3"],
            env,
            timeout=900,
        )
        if "No available agent to submit job" not in job.stdout + job.stderr:
            break
        time.sleep(5)
    output = job.stdout + job.stderr
    (tmp_path / "job.log").write_text(output)
    if job.returncode:  # keep the head's logs for the failure report
        logs = Path(shell_cluster["temp_dir"]) / "session_latest" / "logs"
        shutil.copytree(logs, tmp_path / "ray-logs", dirs_exist_ok=True)
    assert job.returncode == 0, output[-5000:]
    assert "succeeded" in output
    run = f"{bucket}/runs/e2e"
    report = storage.read_json(storage.join(run, "report.json"))
    # One stage: that each stage starts from the one before is the three-stage test's
    # (tests/test_train.py), on the session's cluster.
    assert [stage["stage"] for stage in report["stages"]] == ["pretrain"]
    assert report["stages"][0]["final_metrics"]["step"] == 12
    assert set(report["metrics"]) == {"untrained", "santa (pretrain)", "bm25"}
    for metrics in report["metrics"].values():
        assert 0 <= metrics["mrr@100"] <= 1
    checkpoint = report["checkpoint"]
    assert checkpoint.startswith(f"{bucket}/runs/e2e/pretrain/checkpoint_")
    for name in ("model/config.json", "model/model.safetensors", "trainer_state.json"):
        assert storage.exists(storage.join(checkpoint, name)), name
    markdown = storage.read_bytes(storage.join(run, "report.md")).decode()
    assert "| santa (pretrain) |" in markdown and "| bm25 |" in markdown
    # Every logged step is in the run's history (and so in the plot).
    history = storage.read_bytes(storage.join(run, "pretrain", "metrics.jsonl")).decode()
    assert [json.loads(line)["step"] for line in history.splitlines()] == [3, 6, 9, 12]
    assert storage.exists(storage.join(run, "losses.png"))
    assert storage.exists(storage.join(run, "report.html"))
    # The run ran on the cluster's nodes, not in this process.
    nodes = json.loads(
        _ray(["list", "nodes", "--address", shell_cluster["address"], "--format=json"], env).stdout
    )
    assert len(nodes) == 3

    _a_job_stopped_mid_run_ends_as_ctrl_c_does(
        shell_cluster, data=report["data"]["train"], storage=f"{bucket}/runs"
    )


def _a_job_stopped_mid_run_ends_as_ctrl_c_does(cluster: dict, data: str, storage: str) -> None:
    """`ray job stop` sends the driver SIGTERM (SIGKILL 3 s later) after ``ray.init`` turned
    SIGTERM into ``sys.exit(15)``: santa's handler, put back after it, ends the job with its
    one interrupt line. (That the run's ``PlacementGroupCleaner`` goes too is
    tests/test_cluster_leftovers.py's, on a head without the dashboard: here, with it, Ray
    Train's cleaner is DEAD while the run still trains, so there is none to leave.)"""
    address, env = cluster["address"], cluster["env"]
    submitted = _ray(
        ["job", "submit", "--no-wait", "--address", address, "--working-dir", str(REPO)]
        + ["--", "python", "-m", "ray_jobs.pretrain", "--recipe", "tiny-ci", "--data", data]
        + ["--num-workers", "1", "--cpus-per-worker", "0.5", "--max-steps", "400"]
        + ["--set", "train.log_every=1", "--storage", storage, "--name", "cut"],
        env,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = next(
        word.strip("'")
        for word in submitted.stdout.split()
        if word.strip("'").startswith("raysubmit_")
    )
    logs = ""
    deadline = time.monotonic() + 300
    while "[train] step 2/" not in logs:
        assert time.monotonic() < deadline, logs[-3000:]
        time.sleep(2)
        logs = _ray(["job", "logs", "--address", address, job_id], env).stdout
    stopped = _ray(["job", "stop", "--address", address, job_id], env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    status = _ray(["job", "status", "--address", address, job_id], env).stdout
    assert f"Job {job_id!r} was stopped" in status, status
    logs = _ray(["job", "logs", "--address", address, job_id], env).stdout
    assert "santa: interrupted" in logs, logs[-3000:]
