"""The lost-node scenario (issue 33), in a process of its own: a two-node
``ray.cluster_utils.Cluster`` (its own, apart from any other Ray on the machine), the real
``ray_jobs.pretrain`` command joined to it, and the node holding a training worker removed
mid-run (``elastic``: a node added back a little later). ``elastic-kill`` kills the node's
processes outright (its raylet SIGKILLed, as a crashed host looks to Ray: the GCS marks it
DEAD after its health checks) instead of shutting them down.

    python -m bench.robustness.lost_node {fixed,elastic,elastic-kill} PAIRS STORAGE

prints the job's own output and ends with its exit status, as if it had been run directly
(the faults bench runs it so). ``tests/test_lost_node.py`` runs both of its scenarios on one
cluster (:func:`scenarios`: one cluster start less) and checks what they return.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from santa.cluster.ray_utils import _node_start_wait

REPO = Path(__file__).resolve().parents[2]
NODE_START_WAIT_S = 180.0
# Long enough that the node added at step 12 joins before the end: taken in by the resize
# monitor (every 2 s) once Ray's coordinator has counted it (_recount_nodes). Without that
# count, up to 20 s later, 150 steps (~20 s idle) ended first twice (2026-12-03, 12-04).
ELASTIC_STEPS = 150
# How often the GCS checks a raylet (Ray's default 3 s, 5 misses: a killed node is DEAD after
# ~15 s). 1 s makes it ~5 s; a live raylet still has 5 checks of 10 s each to answer.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000}
TINY = [
    "--recipe", "tiny-ci", "--cpus-per-worker", "1.5", "--max-failures", "2",
    "--set", "train.log_every=1",
    "--set", "train.checkpoint_every=2",
]  # fmt: skip


def _start_cluster(attempts: int = 2, system_config: dict | None = None):
    """A head and a worker node (2 CPUs each). A loaded machine starts a node slowly: Ray's
    30 s for a raylet is stretched, and a start that still times out is tried once more.
    ``system_config``: the head's Ray settings (e.g. :data:`FAST_HEALTH_CHECKS`)."""
    from ray.cluster_utils import Cluster

    head = {"_system_config": system_config} if system_config else {}
    for attempt in range(attempts):
        cluster = Cluster()
        try:
            with _node_start_wait(NODE_START_WAIT_S):
                cluster.add_node(num_cpus=2, include_dashboard=False, **head)  # the head
                node = cluster.add_node(num_cpus=2)
                cluster.wait_for_nodes()
            return cluster, node
        except Exception:
            cluster.shutdown()
            if attempt == attempts - 1:
                raise
            print("lost_node: the cluster did not start in time; once more", file=sys.stderr)
    raise AssertionError("unreachable")


def scenario(
    mode: str, data: str, storage: str, result_file: str = "", placement_wait_s: float = 20.0
) -> dict:
    """Run in its own process: a head and a worker node (2 CPUs each; a 1.5-CPU trainer
    fits once per node), the pretrain job joined to it, the worker node removed at step 5
    and (``elastic``) a node added back a little later. ``placement_wait_s``: Ray Train's
    wait for a worker group's placement (``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``), twice
    (one retry) before a fixed-size run gives up."""
    cluster, node = _start_cluster()
    try:
        result = _run_on(cluster, node, mode, data, storage, placement_wait_s)
    finally:
        _shutdown(cluster)
    result.pop("node_left", None)
    if result_file:
        Path(result_file).write_text(json.dumps(result))
    return result


def scenarios(
    modes: dict[str, float], data: str, storage: str, result_file: str, fast: bool = True
) -> dict[str, dict]:
    """Several scenarios one after the other on one cluster (``modes``: each mode and its
    placement wait, in order), each on a worker node of its own: the one an ``elastic``
    mode added back, else a new one. ``fast``: :data:`FAST_HEALTH_CHECKS`. Results by mode,
    written to ``result_file`` as each one ends."""
    cluster, node = _start_cluster(system_config=FAST_HEALTH_CHECKS if fast else None)
    results: dict[str, dict] = {}
    try:
        for mode, placement_wait_s in modes.items():
            if node is None:
                with _node_start_wait(NODE_START_WAIT_S):
                    node = cluster.add_node(num_cpus=2)
                cluster.wait_for_nodes()
            _wait_until_idle(cluster)  # the last job's workers and placement groups gone
            results[mode] = _run_on(cluster, node, mode, data, storage, placement_wait_s)
            node = results[mode].pop("node_left", None)
            Path(result_file).write_text(json.dumps(results))
    finally:
        _shutdown(cluster)
    return results


def _recount_nodes(cluster) -> None:
    """Have Ray Train's view of the cluster take in a node just added. An elastic run grows
    when Ray's ``AutoscalingCoordinator`` actor has reserved room for more workers, and that
    actor reads the cluster's nodes every 20 s, so a tiny run's remaining steps (~20 s on an
    idle machine) could end before it looked. Its ``recompute`` reads them now; the run then
    grows within its resize monitor's 2 s, as a real run grows within 20 s."""
    import ray

    if not ray.is_initialized():
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    except ValueError:  # none yet: the run's own request starts it, and reads the nodes
        return
    ray.get(coordinator.get_reserved_resources.remote("lost-node-bench", recompute=True))


def _shutdown(cluster) -> None:
    """The bench's own connection (:func:`_recount_nodes`), then the cluster."""
    import ray

    ray.shutdown()
    cluster.shutdown()


def _wait_until_idle(cluster, timeout_s: float = 120.0) -> None:
    """Until every CPU of the cluster's live nodes is free again (a job that just ended
    still held its placement group for a moment): the next job's first placement must not
    wait (a fixed-size run's retries are counted in its lines)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = cluster.global_state
        if state.available_resources().get("CPU", 0) >= state.cluster_resources().get("CPU", 0):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the cluster's CPUs were not all free within {timeout_s:g} s")


def _run_on(cluster, node, mode: str, data: str, storage: str, placement_wait_s: float) -> dict:
    """One scenario on a running cluster whose worker node ``node`` holds a training worker:
    the job, the node removed at step 5 and (``elastic``) one added at step 12. The worker
    node the cluster has after it (the one added, or ``node`` if never removed) is under
    ``node_left``: a handle, not JSON, popped by the callers."""
    elastic = mode.startswith("elastic")
    workers = "1-2" if elastic else "2"
    # Elastic: long enough that the node added at step 12 is found (every 2 s) and joins
    # before the end (a tiny step takes a fraction of a second).
    steps = str(ELASTIC_STEPS) if elastic else "16"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env.update(
        PYTHONPATH=str(REPO),
        RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=f"{placement_wait_s:g}",  # one wait
        SANTA_PLACEMENT_RETRIES="1",  # two waits in all (40 s by default)
        SANTA_RESIZE_INTERVAL_S="2",  # an elastic run looks for room every 2 s
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
    timed: list[tuple[float, str, str]] = []  # (seconds, stream, line)
    started = time.monotonic()
    stderr: list[str] = []
    added = None

    def read_stderr() -> None:
        for line in proc.stderr:
            stderr.append(line)
            timed.append((time.monotonic() - started, "stderr", line.rstrip("\n")))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    for line in proc.stdout:
        stdout.append(line)
        timed.append((time.monotonic() - started, "stdout", line.rstrip("\n")))
        if line.startswith("[train] step 5/") and not events:
            # The worker on it dies with it; SIGKILL when the mode says so.
            cluster.remove_node(node, allow_graceful=mode != "elastic-kill")
            events.append(("removed", time.monotonic() - started))
        if elastic and line.startswith("[train] step 12/") and len(events) == 1:
            with _node_start_wait(NODE_START_WAIT_S):
                added = cluster.add_node(num_cpus=2)
            events.append(("added", time.monotonic() - started))
            _recount_nodes(cluster)
    proc.wait()
    reader.join(timeout=30)
    return {
        "returncode": proc.returncode,
        "stdout": "".join(stdout),
        "stderr": "".join(stderr),
        "events": events,
        "timed": timed,
        "seconds": time.monotonic() - started,
        "node_left": added if added is not None else (None if events else node),
    }


def goes_on_after(result: dict) -> dict[str, float]:
    """Seconds from the node's removal to santa's first line after it (``said``) and to the
    first training step printed after that line (``trains``: the restarted group, past the
    steps it repeats); a key is missing where that never came."""
    removed = dict(result["events"]).get("removed")
    found: dict[str, float] = {}
    if removed is None:
        return found
    for seconds, stream, line in result["timed"]:
        if seconds < removed:
            continue
        if "said" not in found and stream == "stderr" and line.startswith("santa: "):
            found["said"] = seconds - removed
        elif "said" in found and stream == "stdout" and line.startswith("[train] step "):
            found["trains"] = seconds - removed
            break
    return found


if __name__ == "__main__":
    outcome = scenario(*sys.argv[1:4])
    # The job's lines in the order it printed them (written whole per stream, stdout's
    # buffer would reach a reader after stderr's lines and move the santa line up).
    for _, stream, text in outcome["timed"]:
        print(text, file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)
    sys.exit(outcome["returncode"])
