"""The resource plan of a job against the cluster: fail fast, wait with an autoscaler, and
a trainer that shares its GPU with the miner's encoder (checked against fake GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from santa.cluster.resources import (
    Bundle,
    ClusterShape,
    ResourceError,
    ResourcePlan,
    check_plan,
    never_fits,
    trainer_gpus,
    training_plan,
)
from tests.training import stdlib_pair_rows, tiny_config, write_pairs

ROOT = Path(__file__).resolve().parents[1]
TWO_CPU_LAPTOP = ClusterShape(nodes=({"CPU": 2.0},), capacity={"CPU": 2.0})


def test_workers_that_read_their_own_rows_fit_every_cpu_and_no_more() -> None:
    """No Ray Data task runs beside the trainers (they read their own rows): two workers
    of one CPU fit two CPUs, and three fail in one line naming what they ask for."""
    plan = training_plan(tiny_config(num_workers=2), cpus_per_worker=1.0)
    assert "Ray Data" not in plan.describe()
    assert check_plan(plan, TWO_CPU_LAPTOP) == "fits"
    three = training_plan(tiny_config(num_workers=3, global_batch_size=9), cpus_per_worker=1.0)
    with pytest.raises(ResourceError) as raised:
        check_plan(three, TWO_CPU_LAPTOP, job="ray_jobs.pretrain")
    line = str(raised.value)
    assert "\n" not in line
    assert "3 training workers × {1 CPU} (3 CPUs in all)" in line
    assert "the cluster has 2 CPUs, 0 GPUs on 1 node, no autoscaler" in line


def test_a_gpu_on_a_cluster_without_one_is_named_as_the_reason() -> None:
    plan = training_plan(tiny_config(use_gpu="true"), cpus_per_worker=1.0)
    reason = never_fits(plan, TWO_CPU_LAPTOP)
    assert reason == "no node has {1 CPU, 1 GPU} for one training worker"


def test_an_autoscaler_that_can_grow_to_the_plan_makes_it_wait_and_says_so_once(capsys) -> None:
    cluster = ClusterShape(
        nodes=({"CPU": 4.0, "head": 1.0},),
        node_types=({"CPU": 8.0, "GPU": 1.0},),
        capacity={"CPU": 20.0, "GPU": 2.0, "head": 1.0},
        autoscaler=True,
    )
    plan = training_plan(tiny_config(use_gpu="true", num_workers=2), cpus_per_worker=4.0)
    assert check_plan(plan, cluster, job="the pretrain stage") == "waits"
    assert check_plan(plan, cluster, job="the pretrain stage") == "waits"
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("santa: waiting for the autoscaler:")
    assert "an autoscaler up to 20 CPUs, 2 GPUs" in lines[0]
    # More GPUs than the autoscaler's declared max: never.
    big = training_plan(tiny_config(use_gpu="true", num_workers=4), cpus_per_worker=4.0)
    with pytest.raises(ResourceError, match=r"more GPU \(4 > 2\) than the cluster can grow to"):
        check_plan(big, cluster)


def test_first_fit_packs_requests_onto_the_nodes_together() -> None:
    two_nodes = ClusterShape(nodes=({"CPU": 1.0}, {"CPU": 1.0}), capacity={"CPU": 2.0})
    plan = ResourcePlan((Bundle("worker", {"CPU": 0.75}, 2), Bundle("task", {"CPU": 0.5})))
    # 2 CPUs in all, yet no node keeps half a CPU once a worker sits on each.
    assert never_fits(plan, two_nodes) == "the requests do not fit on its nodes together"
    plan = ResourcePlan((Bundle("worker", {"CPU": 0.5}, 2), Bundle("task", {"CPU": 0.5})))
    assert never_fits(plan, two_nodes) is None


def test_a_trainer_sharing_its_gpu_with_encoder_actors_asks_for_the_rest() -> None:
    shared = tiny_config({"source": "async", "per_query": 1, "encoder_gpus": 0.25}, use_gpu="true")
    assert trainer_gpus(shared) == 0.75
    two_per_gpu = tiny_config(
        {"source": "async", "per_query": 1, "encoder_gpus": 0.25, "encoder_actors": 2},
        use_gpu="true",
    )
    assert trainer_gpus(two_per_gpu) == 0.5
    whole = tiny_config({"source": "async", "per_query": 1, "encoder_gpus": 1}, use_gpu="true")
    assert trainer_gpus(whole) == 1.0
    assert trainer_gpus(tiny_config()) == 0.0
    one_gpu_node = ClusterShape(nodes=({"CPU": 8.0, "GPU": 1.0},), capacity={"CPU": 8, "GPU": 1})
    assert never_fits(training_plan(shared, cpus_per_worker=1.0), one_gpu_node) is None


# --------------------------------------------------------------------------- on Ray


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return write_pairs(tmp_path_factory.mktemp("pairs"), stdlib_pair_rows()[:64])


@pytest.mark.usefixtures("ray_cluster")
def test_fit_refuses_a_miner_and_trainers_larger_than_the_cluster_before_any_work(
    pairs, tmp_path
) -> None:
    """Two 1-CPU nodes: 2 trainers of 0.5 CPU, Ray Data, and 3 encoder actors of 1 CPU."""
    from santa.train.trainer import RunSpec, fit

    config = tiny_config(
        {"source": "async", "per_query": 1, "encoder_actors": 3, "encoder_cpus": 1},
        num_workers=2,
        max_steps=2,
    )
    started = time.perf_counter()
    with pytest.raises(ResourceError) as raised:
        fit(config, RunSpec.of(data=pairs, storage=str(tmp_path), name="too-big"))
    assert time.perf_counter() - started < 60
    assert "3 miner encoder actors × {1 CPU}" in str(raised.value)
    assert str(raised.value).endswith(
        "the cluster has 2 CPUs, 0 GPUs, 1 head on 2 nodes, no autoscaler: "
        "more CPU (4 > 2) than the cluster has"
    )
    assert not (tmp_path / "too-big" / "init_model").exists()  # nothing was built


def test_a_gpu_run_on_a_cluster_without_gpus_fails_in_one_line_within_a_minute(
    ray_cluster, pairs, tmp_path
) -> None:
    """``ray_jobs.pretrain --gpu`` joining a CPU-only cluster: exit 2, one line, fast."""
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.address}
    command = [sys.executable, "-m", "ray_jobs.pretrain", "--data", pairs, "--gpu"]
    command += ["--storage", str(tmp_path), "--name", "gpu", "--max-steps", "2"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - started < 60
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("santa:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith(
        "santa: error: the santa run 'gpu' asks for 2 training workers × {0.5 CPUs, 1 GPU}"
    )
    assert errors[0].endswith(
        "the cluster has 2 CPUs, 0 GPUs on 2 nodes, no autoscaler: "
        "no node has {0.5 CPUs, 1 GPU} for one training worker"
    )
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_trainer_and_the_miners_encoder_share_one_fake_gpu(async_run_on_fake_gpus):
    """A node of (fake) GPUs holds each trainer at 0.75 GPU and the encoder actor at 0.25 on
    a GPU a trainer holds (two trainers, two GPUs: none is left whole for it): the run
    starts, gets its first hard negatives from that encoder, and finishes (the run:
    tests/negatives_runs.py, which the async-swap test reads too)."""
    run = async_run_on_fake_gpus
    assert run["result"].error is None, run["result"].error
    assert {"CPU": 0.5, "GPU": 0.75} in run["bundles"], run["bundles"]
    history = run["history"]
    assert history[-1]["step"] == 60
    assert history[0]["negatives_step"] >= 0  # the table came from the GPU encoder
