"""On an autoscaling cluster: work starts with the head alone and lands on added workers.

Ray's fake multi-node provider (``ray.autoscaler._private.fake_multi_node``, what Ray tests
its own autoscaler with) runs the real autoscaler, which starts worker nodes as local
raylets. The config is ``cluster.yaml`` scaled down: a head with the custom ``head``
resource and no room for the work, and one worker type with ``min_workers: 0``.

Ray's own ``AutoscalingCluster`` helper runs ``ray stop --force`` (every Ray on the
machine) and reads a config file the wheel does not ship, so the cluster is started here
with ``ray start`` on free ports and stopped by killing exactly its own processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.training import tiny_config

pytestmark = pytest.mark.slow

WORKER_CPUS = 1
MAX_WORKERS = 2


def fake_cluster_config(gcs_address: str) -> dict:
    return {
        "cluster_name": "santa-fake",
        "max_workers": MAX_WORKERS,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,
        },
        "available_node_types": {
            "ray.head.default": {
                "resources": {"CPU": 1, "head": 1},
                "node_config": {},
                "max_workers": 0,
            },
            "ray.worker.cpu": {
                "resources": {"CPU": WORKER_CPUS, "worker_node": 1},
                "node_config": {},
                "min_workers": 0,
                "max_workers": MAX_WORKERS,
            },
        },
        "head_node_type": "ray.head.default",
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "auth": {},
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def kill_cluster(markers: list[bytes]) -> None:
    """Kill every process of one Ray cluster: those whose command line names its session
    folder or its GCS port (the GCS, the monitor, the fake provider's worker raylets)."""
    victims = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(marker in cmdline for marker in markers):
            victims.append(int(entry.name))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        # Up to 3 s for them to go (they were given that much before each next step),
        # not 3 s whatever: most exit at once.
        deadline = time.monotonic() + 3
        while (victims := [pid for pid in victims if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not victims:
            return


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting for its parent does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def autoscaling_cluster(tmp_path):
    import ray

    from santa.cluster.ray_utils import init_ray

    previous = None
    if ray.is_initialized():  # the session's test cluster: reconnected afterwards
        previous = ray.get_runtime_context().gcs_address
        ray.shutdown()
    port = free_port()
    address = f"127.0.0.1:{port}"
    config_path = tmp_path / "autoscaling.json"
    config_path.write_text(json.dumps(fake_cluster_config(address)))
    # No token auth on this throwaway cluster (a ~/.ray/auth_token would turn it on).
    auth = {"RAY_AUTH_MODE": "disabled"}
    env = {**os.environ, **auth, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    ray_cli = str(Path(sys.executable).with_name("ray"))
    started = subprocess.run(
        [
            ray_cli,
            "start",
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            '--resources={"head": 1}',
            f"--autoscaling-config={config_path}",
            "--include-dashboard=true",  # the state API (actors' node ids) needs it
            f"--dashboard-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    saved = {key: os.environ.get(key) for key in auth}
    os.environ.update(auth)
    session_dir = None
    try:
        init_ray(address, log_to_driver=False)
        session_dir = ray._private.worker._global_node.get_session_dir_path()
        yield ray
    finally:
        ray.shutdown()
        markers = [f"127.0.0.1:{port}".encode(), f"gcs_server_port={port}".encode()]
        if session_dir:
            markers.append(os.path.basename(session_dir.rstrip("/")).encode())
        kill_cluster(markers)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if previous:
            init_ray(previous, log_to_driver=False)


def worker_nodes(ray) -> set[str]:
    return {
        node["NodeID"]
        for node in ray.nodes()
        if node["Alive"] and "worker_node" in node["Resources"]
    }


def actors(class_name: str) -> dict[str, str]:
    """Actor id → node id of every actor whose class name holds ``class_name`` (state API)."""
    from ray.util.state import list_actors

    return {
        actor.actor_id: actor.node_id
        for actor in list_actors(detail=True, limit=10_000)
        if class_name in actor.class_name
    }


def test_jobs_start_on_the_head_alone_and_run_on_added_workers(autoscaling_cluster, tmp_path):
    ray = autoscaling_cluster
    from santa.cluster.ray_utils import cluster_capacity
    from santa.data.plan import PreprocessConfig, run_preprocess
    from santa.data.source import default_source_root
    from santa.train.trainer import RunSpec, fit

    assert worker_nodes(ray) == set()  # min_workers 0: only the head
    # What the cluster can grow to, from the autoscaler's config: head + 2 workers.
    capacity = cluster_capacity()
    assert capacity["CPU"] == 1 + MAX_WORKERS * WORKER_CPUS, capacity

    # Preprocessing: a pool that wants three 1-CPU actors on a 1-CPU head.
    sources = tmp_path / "stdlib"
    sources.mkdir()
    for path in sorted(Path(default_source_root()).glob("*.py"))[:12]:
        (sources / path.name).write_bytes(path.read_bytes())
    report = run_preprocess(
        PreprocessConfig(
            dataset="source",
            input=str(sources),
            output=str(tmp_path / "pairs"),
            languages=("python",),
            min_actors=3,
        )
    )
    assert report["rows_written"] > 0, report
    added = worker_nodes(ray)
    assert added, "the autoscaler added no worker node for preprocessing"
    builders = actors("MapWorker")
    assert set(builders.values()) & added, builders

    # Training: two 1-CPU workers; the head has one CPU, so a worker lands on an added node.
    config = tiny_config(max_steps=2, log_every=1, num_workers=2)
    result = fit(
        config,
        RunSpec.of(data=str(tmp_path / "pairs"), storage=str(tmp_path / "runs"), name="scale"),
    )
    assert result.error is None and result.metrics["step"] == 2
    trainers = actors("RayTrainWorker")
    assert len(trainers) >= 2, trainers
    assert set(trainers.values()) & worker_nodes(ray), trainers
