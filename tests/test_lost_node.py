"""A lost node (issue 33): on a two-node ``ray.cluster_utils.Cluster``, the node holding a
training worker is removed mid-run. At a fixed size the run waits for the workers a bounded
time and ends in one line; with ``--num-workers 1-2`` (elastic) it goes on with the worker
left, at the same global batch, and grows back when a node returns.

Each scenario runs in a process of its own (it starts its own cluster, apart from the test
session's), which runs the real ``ray_jobs.pretrain`` command joined to that cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training import stdlib_pair_rows, write_pairs

REPO = Path(__file__).resolve().parents[1]
ELASTIC_STEPS = 150
TINY = [
    "--recipe", "tiny", "--cpus-per-worker", "1.5", "--max-failures", "2",
    "--set", "train.global_batch_size=8", "--set", "train.max_query_length=24",
    "--set", "train.max_document_length=96", "--set", "train.max_target_length=32",
    "--set", "model.tiny_vocab_size=2000", "--set", "train.log_every=1",
    "--set", "train.checkpoint_every=2",
]  # fmt: skip


def scenario(mode: str, data: str, storage: str, result_file: str = "") -> dict:
    """Run in its own process: a head and a worker node (2 CPUs each; a 1.5-CPU trainer
    fits once per node), the pretrain job joined to it, the worker node removed at step 5
    and (``elastic``) a node added back a little later."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    node = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    workers = "1-2" if mode == "elastic" else "2"
    # Elastic: long enough that the node added at step 12 is found (every 5 s) and joins
    # before the end (a tiny step takes a fraction of a second).
    steps = str(ELASTIC_STEPS) if mode == "elastic" else "16"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env.update(
        PYTHONPATH=str(REPO),
        RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="20",  # one wait for the workers
        SANTA_PLACEMENT_RETRIES="1",  # two waits in all: 40 s
        SANTA_RESIZE_INTERVAL_S="5",  # an elastic run looks for room every 5 s
    )
    args = ["ray_jobs.pretrain", "--data", data, "--storage", storage, "--name", mode, *TINY]
    args += ["--num-workers", workers, "--max-steps", steps, "--address", cluster.address]
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    events: list[tuple[str, float]] = []
    stdout: list[str] = []
    started = time.monotonic()
    for line in proc.stdout:
        stdout.append(line)
        if line.startswith("[train] step 5/") and not events:
            cluster.remove_node(node)  # the worker on it dies with it
            events.append(("removed", time.monotonic() - started))
        if mode == "elastic" and line.startswith("[train] step 12/") and len(events) == 1:
            cluster.add_node(num_cpus=2)
            events.append(("added", time.monotonic() - started))
    stderr = proc.stderr.read()
    proc.wait()
    result = {
        "returncode": proc.returncode,
        "stdout": "".join(stdout),
        "stderr": stderr,
        "events": events,
        "seconds": time.monotonic() - started,
    }
    if result_file:
        Path(result_file).write_text(json.dumps(result))
    cluster.shutdown()
    return result


def _run_scenario(mode: str, tmp_path: Path) -> dict:
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows())
    result_file = tmp_path / "result.json"
    code = (
        "from tests.test_lost_node import scenario; "
        f"scenario({mode!r}, {data!r}, {str(tmp_path / 'runs')!r}, {str(result_file)!r})"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=1500,
        check=True,
    )
    return json.loads(result_file.read_text())


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_lost_node_at_a_fixed_size_waits_a_bounded_time_then_ends_in_one_line(tmp_path):
    result = _run_scenario("fixed", tmp_path)
    assert result["events"] and result["events"][0][0] == "removed", result["stdout"][-2000:]
    assert result["returncode"] == 1, result["stderr"][-3000:]
    lines = result["stderr"].strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["warning", "error"], lines
    assert lines[0].startswith("santa: warning: a training worker died"), lines[0]
    waits = r"resumes from checkpoint step [24] once 2 workers fit \(waiting up to 40 s\)"
    assert re.search(waits, lines[0]), lines[0]
    assert lines[1].startswith(
        "santa: error: the cluster could not place 2 training workers within 40 s"
    )
    assert "--num-workers MIN-MAX" in lines[1]
    # Bounded: two waits of 20 s (and the job's start and end), not forever.
    assert result["seconds"] - result["events"][0][1] < 240


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_an_elastic_run_goes_on_with_the_worker_left_and_grows_back(tmp_path):
    result = _run_scenario("elastic", tmp_path)
    assert [name for name, _ in result["events"]] == ["removed", "added"], result["stdout"][-2000:]
    assert result["returncode"] == 0, result["stderr"][-3000:]
    lines = result["stderr"].strip().splitlines()
    assert "with the workers that fit (1-2)" in lines[0], lines
    shrunk = [line for line in lines if "training goes on with 1 worker(s) of 1-2" in line]
    grown = [line for line in lines if "training goes on with 2 worker(s) of 1-2" in line]
    assert shrunk and grown, lines
    assert "the global batch stays 8: 8 pairs per worker" in shrunk[0]
    assert "the global batch stays 8: 4 pairs per worker" in grown[0]
    history = [
        json.loads(line)
        for line in (tmp_path / "runs" / "elastic" / "metrics.jsonl").read_text().splitlines()
    ]
    # every step once, to the end
    assert [h["step"] for h in history] == list(range(1, ELASTIC_STEPS + 1))


if __name__ == "__main__":
    # bench/robustness/faults.py: python -m tests.test_lost_node MODE DATA STORAGE (the job's own output
    # and exit status, as if it had been run directly).
    outcome = scenario(*sys.argv[1:4])
    sys.stdout.write(outcome["stdout"])
    sys.stderr.write(outcome["stderr"])
    sys.exit(outcome["returncode"])
