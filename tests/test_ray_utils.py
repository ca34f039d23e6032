"""santa's own local Ray: which cluster a job uses, and the priority of its workers.

The local Rays are started once for several tests (tests/local_ray_runs.py)."""

from __future__ import annotations

import sys

import pytest


def _priorities(request, run: str) -> tuple[str, int, int]:
    """The first line, a worker's and the driver's nice level of a local Ray santa started:
    conftest's ``own_local_ray`` (no setting), or the retried start of
    ``ray_start_attempts``, whose environment sets ``RAY_worker_niceness=15``."""
    if run == "own_local_ray":
        seen = request.getfixturevalue(run)
        facts = seen["facts"]
        assert facts, seen["stderr"][-2000:]
        return seen["first_line"], facts["worker"]["nice"], facts["driver_nice"]
    done = request.getfixturevalue(run)["let-the-retry-start"]
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    worker, driver = map(int, next(line for line in lines if line.startswith("nice ")).split()[1:])
    return lines[0], worker, driver


@pytest.mark.parametrize(("run", "expected"), [("own_local_ray", 0), ("ray_start_attempts", 15)])
def test_local_ray_workers_run_at_the_drivers_priority(request, run, expected) -> None:
    """Ray's default puts workers at nice 15; the local Ray santa starts keeps them at the
    driver's nice level unless the user sets RAY_worker_niceness."""
    first_line, worker, driver = _priorities(request, run)
    assert first_line.startswith("Ray: started a local cluster (")
    assert driver == 0 and worker == expected


def test_capacity_is_what_the_autoscaler_declares_or_what_is_here() -> None:
    from santa.cluster.ray_utils import POOL_LIMIT, capacity_of, merge_capacity

    here = {"CPU": 4.0, "memory": 1e9, "head": 1.0}
    assert merge_capacity(here, None) == here
    # cluster.yaml scaled: head 4 CPUs, GPU workers 0..2 × (8 CPU, 1 GPU)
    declared = {"CPU": 20, "GPU": 2, "head": 1}
    merged = merge_capacity(here, declared)
    assert merged["CPU"] == 20 and merged["GPU"] == 2 and merged["memory"] == 1e9
    # a node type without a max: unbounded, and pools built from it are capped
    unbounded = merge_capacity(here, {"CPU": sys.maxsize})
    assert unbounded["CPU"] == float("inf")
    assert capacity_of("CPU", unbounded) == POOL_LIMIT
    assert capacity_of("GPU", merged) == 2 and capacity_of("GPU", here) == 0


def test_long_lived_drivers_go_to_the_head_resource(ray_cluster) -> None:
    """cluster.yaml's head node carries a custom ``head`` resource; santa's miner and Tune
    trial drivers ask for a sliver of it, so they land there (here: the test cluster's
    head node has it, the other node does not)."""
    import ray

    from santa.cluster.ray_utils import head_placement

    assert head_placement() == {"head": 0.001}

    @ray.remote(num_cpus=0)
    class Where:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    head_id = next(
        node["NodeID"] for node in ray.nodes() if node["Alive"] and "head" in node["Resources"]
    )
    placed = [Where.options(resources=head_placement()).remote() for _ in range(3)]
    assert {ray.get(actor.node.remote()) for actor in placed} == {head_id}


def test_declared_max_from_an_autoscaler_config() -> None:
    from santa.cluster.ray_utils import declared_max_resources

    config = {
        "max_workers": 3,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 4, "head": 1, "GPU": 0}, "max_workers": 0},
            "gpu": {"resources": {"CPU": 8, "GPU": 1}, "min_workers": 0, "max_workers": 2},
            "spot": {"resources": {"CPU": 16}, "min_workers": 0, "max_workers": 4},
        },
    }
    declared = declared_max_resources(config)
    # per type: 4 + 2×8 + 4×16 = 84 CPUs, but at most 3 workers: 4 + 3×16 = 52
    assert declared == {"CPU": 52.0, "GPU": 2.0, "head": 1.0}
    del config["max_workers"]
    assert declared_max_resources(config)["CPU"] == 84.0


def test_local_ray_workers_inherit_settings_without_a_job_runtime_env(own_local_ray) -> None:
    """The local Ray santa starts hands its workers santa's settings through the raylet's
    environment, not a job runtime_env (which would keep the workers Ray prestarts from
    serving the job); the driver's own environment is left as it was."""
    facts = own_local_ray["facts"]
    assert facts, own_local_ray["stderr"][-2000:]
    assert facts["job_runtime_env"] == []
    assert (facts["worker"]["SANTA_QUIET"], facts["worker"]["NLTK_DATA"]) == (
        "1",
        own_local_ray["nltk_data"],
    )
    assert facts["driver_keeps_santa_quiet"] is False


def test_import_in_background_imports_and_leaves_failures_to_the_job(tmp_path, monkeypatch):
    from santa.cluster.ray_utils import import_in_background

    (tmp_path / "santa_probe_ok.py").write_text("VALUE = 7\n")
    (tmp_path / "santa_probe_broken.py").write_text("raise ImportError('no such backend')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_in_background(("santa_probe_broken", "santa_probe_ok")).join(30)
    assert sys.modules["santa_probe_ok"].VALUE == 7
    assert "santa_probe_broken" not in sys.modules
    with pytest.raises(ImportError, match="no such backend"):
        import santa_probe_broken  # noqa: F401
