"""The lost-node scenario (issue 33), in a process of its own: a two-node
``ray.cluster_utils.Cluster`` (its own, apart from any other Ray on the machine), the real
``ray_jobs.pretrain`` command joined to it, and the node holding a training worker removed
mid-run (``elastic``: a node added back a little later).

    python -m bench.robustness.lost_node {fixed,elastic} PAIRS STORAGE

prints the job's own output and ends with its exit status, as if it had been run directly
(the faults bench runs it so); ``tests/test_lost_node.py`` checks what it returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ELASTIC_STEPS = 150
TINY = [
    "--recipe", "tiny-ci", "--cpus-per-worker", "1.5", "--max-failures", "2",
    "--set", "train.log_every=1",
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


if __name__ == "__main__":
    outcome = scenario(*sys.argv[1:4])
    sys.stdout.write(outcome["stdout"])
    sys.stderr.write(outcome["stderr"])
    sys.exit(outcome["returncode"])
