"""The recovery line of Ray Train's controller (issue 33): one ``santa: warning`` per failure
it recovers from; a failure on bad input is not retried (it would fail the same way)."""

from __future__ import annotations

import threading

import pytest

from santa.jobs.errors import BAD_INPUT, describe
from santa.train.recovery import BadInputInWorker, RecoveryReporter


def _santa(err: str) -> list[str]:
    """The terminal's lines (the raw errors printed beside them go to the log folder)."""
    return [line for line in err.splitlines() if line.startswith("santa:")]


def test_a_failure_on_bad_input_ends_the_run_with_its_message(tmp_path, capfd) -> None:
    reporter = RecoveryReporter(str(tmp_path / "run"), max_failures=2)
    problem = ValueError("the negatives table names documents not in /data/pairs: 'no-such-doc'")
    with pytest.raises(BadInputInWorker) as raised:
        reporter.after_exception(None, {1: RuntimeError("gloo: connection reset"), 0: problem})
    assert describe(raised.value) == (
        "santa: error: the negatives table names documents not in /data/pairs: 'no-such-doc'",
        BAD_INPUT,
    )
    assert reporter.failures == 0
    assert _santa(capfd.readouterr().err) == []  # the job's error line is the only one


def test_a_runtime_failure_is_retried_with_one_line(tmp_path, capfd) -> None:
    reporter = RecoveryReporter(str(tmp_path / "run"), max_failures=2)
    reporter.after_exception(None, {0: RuntimeError("CUDA error: an illegal memory access")})
    assert _santa(capfd.readouterr().err) == [
        "santa: warning: training worker rank 0 failed: RuntimeError: CUDA error: an illegal "
        "memory access; training resumes from the start once its workers fit (waiting up to "
        "60 s) (retry 1 of 2)"
    ]
    reporter.after_exception(None, {0: RuntimeError("again")})
    reporter.after_exception(None, {0: RuntimeError("past the retries")})
    assert reporter.failures == 3
    assert len(_santa(capfd.readouterr().err)) == 1  # the last one: the job's line


def test_an_unreachable_endpoint_ends_the_run_with_the_first_fault(tmp_path, capfd) -> None:
    """A worker's S3 endpoint that did not answer past santa's timeouts and attempts (issue
    40): not retried (a new worker group would wait the same timeouts, and its error would
    replace the first); the run ends with the first fault's line, exit 1."""
    from santa.files.storage import StorageError
    from santa.jobs.errors import RUNTIME_FAULT
    from santa.train.recovery import StorageUnreachableInWorker

    reporter = RecoveryReporter(str(tmp_path / "run"), max_failures=2)
    first = StorageError(
        "cannot reach the S3 endpoint http://127.0.0.1:9 to write s3://b/runs/r/metrics.jsonl "
        "(no answer in time)",
        transient=True,
    )
    with pytest.raises(StorageUnreachableInWorker) as raised:
        reporter.after_exception(None, {0: RuntimeError("gloo: connection reset"), 1: first})
    assert describe(raised.value) == (f"santa: error: {first}", RUNTIME_FAULT)
    import pickle

    # From Ray Train's controller to the driver (through a ControllerError): the same line.
    assert describe(pickle.loads(pickle.dumps(raised.value))) == describe(raised.value)
    assert reporter.failures == 0
    assert _santa(capfd.readouterr().err) == []


def test_pyarrows_network_error_counts_as_unreachable_and_a_missing_object_does_not() -> None:
    from santa.files.storage import StorageError, unreachable

    aws = OSError(
        "When uploading part for key 'runs/r/checkpoint_x/model.safetensors' in bucket 'b': "
        "AWS Error NETWORK_CONNECTION during UploadPart operation: curlCode: 28, Timeout was "
        "reached"
    )
    found = unreachable(aws)
    assert found is not None and "to write s3://b/runs/r/checkpoint_x/model.safetensors" in str(
        found
    )
    assert unreachable(StorageError("not found: s3://b/x")) is None
    assert unreachable(RuntimeError("CUDA error")) is None


# --- a lost node named (issue 40, point 8) --------------------------------------------------

GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:3459: Connection reset by peer"
)
HEAD, LOST = "a1b2c3d4" + "0" * 48, "3f2a9c01" + "f" * 48
# Two entries of ``ray.nodes()`` as Ray 2.60 returns them (fields santa reads), the worker
# node dead.
NODE_TABLE = [
    {
        "NodeID": HEAD,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.5",
        "NodeManagerPort": 0,
        "Resources": {"CPU": 3.0, "memory": 8e9, "node:10.0.0.5": 1.0},
    },
    {
        "NodeID": LOST,
        "Alive": False,
        "NodeManagerAddress": "10.0.0.7",
        "NodeManagerPort": 0,
        "Resources": {"CPU": 2.0, "memory": 4e9, "node:10.0.0.7": 1.0},
    },
]


def _node_died(
    message: str = f"The actor died because its node has died. Node Id: {LOST}",
) -> BaseException:
    """The error Ray gives the controller for a worker whose node died."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    return ActorDiedError(
        ActorDiedErrorContext(
            error_message=message,
            node_ip_address="10.0.0.7",
            class_name="RayTrainWorker",
            pid=4242,
            actor_id=b"\x01" * 16,
        )
    )


def test_the_dead_node_is_the_one_ray_shows_dead_and_only_alive_nodes_count() -> None:
    from santa.train.recovery import alive_capacity, lost_nodes

    placed = {0: (HEAD, "10.0.0.5"), 1: (LOST, "10.0.0.7")}
    assert lost_nodes(placed, NODE_TABLE) == {LOST: "10.0.0.7"}
    assert lost_nodes(placed, []) == {}  # a table not read names nothing
    assert lost_nodes({0: (HEAD, "10.0.0.5")}, NODE_TABLE) == {}
    # 2 CPUs a worker: the head holds 1, the dead node none (its 2 CPUs do not count).
    assert alive_capacity({"CPU": 2.0}, NODE_TABLE) == 1
    assert alive_capacity({"CPU": 1.5, "GPU": 0.0}, NODE_TABLE) == 2
    revived = [{**node, "Alive": True} for node in NODE_TABLE]
    assert alive_capacity({"CPU": 2.0}, revived) == 2


def test_the_cause_is_the_dead_worker_not_its_peers_collective_error() -> None:
    from santa.train.recovery import first_failure, peer_lost

    assert peer_lost(RuntimeError(GLOO_RESET))
    assert peer_lost(RuntimeError("NCCL communicator was aborted on rank 0"))
    assert not peer_lost(RuntimeError("CUDA error: an illegal memory access"))
    died = _node_died()
    assert first_failure({0: RuntimeError(GLOO_RESET), 1: died}) == (1, died)
    # Without a death among them, a rank's own error before a peer's connection error.
    own = ValueError("bad")
    assert first_failure({0: RuntimeError(GLOO_RESET), 3: own}) == (3, own)


def test_a_worker_whose_error_does_not_say_its_class_waits_for_its_node_to_show_dead(
    tmp_path, capfd, monkeypatch
) -> None:
    """A host killed outright: Ray Train may hear of its worker's death before the GCS marks
    the node DEAD, from an error that names no actor class ("a Ray worker died"). That is a
    death all the same: the reporter waits for the node table (the raylet does not answer)
    and says the node lost, in the elastic resize's one line, not a worker failure first."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from santa.train import recovery

    bare = ActorDiedError()  # "The actor died unexpectedly before finishing this task."
    assert describe(bare)[0] == "santa: error: a Ray worker died"
    unavailable = ActorUnavailableError("The actor is unavailable: the node died", b"\x01" * 16)
    assert recovery._died(bare) and recovery._died(unavailable) and recovery._died(_node_died())
    assert not recovery._died(RuntimeError(GLOO_RESET)) and not recovery._died(ValueError("x"))
    assert recovery.first_failure({0: RuntimeError(GLOO_RESET), 1: bare}) == (1, bare)

    alive = [{**node, "Alive": True} for node in NODE_TABLE]
    tables = iter([alive, alive, NODE_TABLE])  # DEAD on the third read (~1 s)
    monkeypatch.setattr(recovery, "_node_table", lambda: next(tables, NODE_TABLE))
    monkeypatch.setattr(
        recovery, "_raylet_answers", lambda node, timeout_s=1.0: node["NodeID"] == HEAD
    )
    elastic = RecoveryReporter(str(tmp_path / "elastic"), max_failures=2)
    elastic.placed = {0: (HEAD, "10.0.0.5"), 1: (LOST, "10.0.0.7")}
    elastic.checkpoint_step = 40

    class Context:  # Ray Train's run context: an elastic run of 1-2 workers
        from ray.train import ScalingConfig

        scaling_config = ScalingConfig(num_workers=(1, 2))

    elastic.after_exception(Context(), {0: RuntimeError(GLOO_RESET), 1: bare})
    assert _santa(capfd.readouterr().err) == []  # said with the size it goes on with
    assert elastic.pending == (
        "node 10.0.0.7 lost (Ray node 3f2a9c01: DEAD) with training worker rank 1 (retry 1 of 2)"
    )


def test_a_peer_lost_without_a_known_node_is_not_quoted(tmp_path, capfd) -> None:
    reporter = RecoveryReporter(str(tmp_path / "run"), max_failures=2, placement_wait_s=300)
    reporter.after_exception(None, {0: RuntimeError(GLOO_RESET)})
    err = capfd.readouterr().err
    assert _santa(err) == [
        "santa: warning: training worker rank 0 lost its connection to another rank (a "
        "collective call failed; the raw error is in the log); training resumes from the "
        "start once its workers fit (waiting up to 5 min) (retry 1 of 2)"
    ]
    assert "pair.cc:537" in err  # the raw text, for the log folder


def test_the_default_wait_is_minutes_and_said_so(monkeypatch) -> None:
    from santa.cluster.placement import describe_wait, placement_wait_s

    monkeypatch.delenv("SANTA_PLACEMENT_RETRIES", raising=False)
    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", raising=False)
    assert placement_wait_s() == 300
    assert describe_wait(300) == "5 min"
    assert describe_wait(40) == "40 s"
    assert describe_wait(150) == "2.5 min"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_removed_node_is_named_and_an_elastic_run_counts_only_alive_nodes(
    ray_cluster, tmp_path, capfd
) -> None:
    """On the session's cluster, a node of 2 CPUs added for this test and removed (a Ray
    start of its own less): the nodes already there hold ``kept`` workers of 1 CPU."""
    import ray
    from ray.train import ScalingConfig
    from ray.train.v2._internal.execution.scaling_policy import ResizeDecision

    from santa.cluster.ray_utils import _node_start_wait

    alive = [node for node in ray.nodes() if node["Alive"]]
    kept = sum(int(node["Resources"].get("CPU", 0)) for node in alive)
    head_id = next(node["NodeID"] for node in alive if "head" in node["Resources"])
    added = []
    try:
        with _node_start_wait(120):  # a loaded machine starts a node slowly
            worker = ray_cluster.add_node(num_cpus=2)
            added.append(worker)
            ray_cluster.wait_for_nodes()
        ids = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        worker_id = worker.node_id
        placed = {0: (head_id, ids[head_id]), 1: (worker_id, ids[worker_id])}
        ip = ids[worker_id]
        # A node shut down gracefully: its worker is destroyed with its placement group while
        # its raylet still answers and before the node table shows it dead (seen at load 10).
        drained = _node_died("Destroying worker since its placement group was removed. ...")
        removal = threading.Timer(2.0, ray_cluster.remove_node, args=(worker,))
        removal.start()

        class Context:  # what Ray Train's TrainRunContext gives a callback: its scaling config
            def __init__(self, workers) -> None:
                self.scaling_config = ScalingConfig(num_workers=workers)

        # A fixed size: the line names the node and the rank, and the wait, in minutes.
        fixed = RecoveryReporter(str(tmp_path / "fixed"), max_failures=1, placement_wait_s=300)
        fixed.placed, fixed.checkpoint_step = dict(placed), 40
        fixed.after_exception(Context(2), {0: RuntimeError(GLOO_RESET), 1: drained})
        removal.join()
        added.remove(worker)
        lines = _santa(capfd.readouterr().err)
        assert lines == [
            f"santa: warning: node {ip} lost (Ray node {worker_id[:8]}: DEAD) with training "
            "worker rank 1; training resumes from checkpoint step 40 once 2 workers fit (waiting "
            "up to 5 min) (retry 1 of 1)"
        ]
        # Elastic: nothing at the failure; Ray Train's decision (one worker more than the
        # alive nodes hold, from a reservation that still counts the dead node's CPUs) is cut
        # to what alive nodes hold, in one line.
        most = kept + 1
        elastic = RecoveryReporter(str(tmp_path / "elastic"), max_failures=2)
        elastic.placed, elastic.size, elastic.checkpoint_step = dict(placed), most, 40
        elastic.after_exception(Context((1, most)), {0: RuntimeError(GLOO_RESET), 1: _node_died()})
        decision = ResizeDecision(num_workers=most, resources_per_worker={"CPU": 1.0})
        elastic.resizing(decision)
        assert decision.num_workers == kept
        lines = _santa(capfd.readouterr().err)
        assert lines == [
            f"santa: training goes on with {kept} of 1-{most} workers from step 40: node {ip} "
            f"lost (Ray node {worker_id[:8]}: DEAD) with training worker rank 1 (retry 1 of 2)"
        ]
        # The node back (a new one): the next decision grows the group, in one line.
        with _node_start_wait(120):
            added.append(ray_cluster.add_node(num_cpus=2))
            ray_cluster.wait_for_nodes()
        elastic.size, elastic.checkpoint_step = kept, 70
        grow = ResizeDecision(num_workers=most, resources_per_worker={"CPU": 1.0})
        elastic.resizing(grow)
        assert grow.num_workers == most
        lines = _santa(capfd.readouterr().err)
        assert lines == [f"santa: training is back to {most} of 1-{most} workers from step 70"]
    finally:
        for node in added:  # the session's cluster as it was
            ray_cluster.remove_node(node)


def test_a_resumed_run_says_so_once(tmp_path, capfd) -> None:
    """A run that starts from an earlier job's registered checkpoint says where from."""
    import json

    from ray.train import ScalingConfig

    class Context:  # what Ray Train's TrainRunContext gives a callback: its scaling config
        scaling_config = ScalingConfig(num_workers=2)

    run = tmp_path / "run"
    reporter = RecoveryReporter(str(run), max_failures=1)
    reporter.stage = "finetune"
    reporter.controller_started(Context())
    assert _santa(capfd.readouterr().err) == []  # a fresh run: nothing to say
    (run / "checkpoint_a").mkdir(parents=True)
    snapshot = {
        "checkpoint_results": [{"checkpoint_dir_name": "checkpoint_a", "metrics": {"step": 40}}]
    }
    (run / "checkpoint_manager_snapshot.json").write_text(json.dumps(snapshot))
    reporter.controller_started(Context())
    assert _santa(capfd.readouterr().err) == [
        f"santa: resuming the finetune run {run} from step 40 ({run / 'checkpoint_a'})"
    ]
