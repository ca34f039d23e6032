"""Recoveries said in one line: a dead worker or a lost node, and where training resumes.

Ray Train restarts its worker group from the latest registered checkpoint when a worker
fails (``FailureConfig(max_failures)``), and prints an actor's traceback on the way.
:class:`RecoveryReporter` runs in Ray Train's controller and prints one ``santa:`` line per
failure it recovers from (the workers' raw errors go to the log folder)::

    santa: warning: node 10.0.0.7 lost (node 3f2a9c01, Ray shows it DEAD) with training
    worker rank 1; training resumes from checkpoint step 40 once 2 workers fit (waiting up
    to 5 min) (retry 1 of 1)

A lost node is named from Ray's node table (the node each rank ran on, recorded when the
worker group started, shown DEAD there): the surviving ranks' collective errors (gloo's
"Connection reset by peer", NCCL's) are what follows from it, not its cause. An elastic run
(``--num-workers MIN-MAX``) says each resize in one line, when Ray Train starts the new
worker group::

    santa: training goes on with 1 of 1-2 workers from step 40: node 10.0.0.7 lost
    santa: training is back to 2 of 1-2 workers from step 70

and its sizes count only the nodes Ray's node table shows alive (:class:`ClusterWatch`).
A run that resumes a checkpoint of an earlier job says so once, when it starts.

A failure past the last retry prints nothing here: the job's error line says it. Nor is a
failure on bad input retried (it would fail the same way), nor an S3 endpoint that did not
answer past santa's timeouts and attempts (a new worker group would first start, then wait
the same timeouts on the same endpoint, and its error would hide the first): the run ends
with the first failure's line, naming its operation and URI.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from ray.train import UserCallback
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

from santa.cluster.placement import describe_wait
from santa.files.storage import StorageError

__all__ = [
    "BadInputInWorker",
    "ClusterWatch",
    "RecoveryReporter",
    "StorageUnreachableInWorker",
    "alive_capacity",
    "first_failure",
    "lost_nodes",
]

logger = logging.getLogger(__name__)

# What a rank's collective call says when a peer is gone (gloo over TCP, NCCL, torch's
# process group wrappers): the effect of another rank's loss, never its cause.
PEER_LOST_MARKERS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "nccl communicator was aborted",
    "ncclremoteerror",
    "ncclsystemerror",
    "remote process exited",
    "gloo/transport",
)
# How long a failure that looks like a lost node waits for Ray's node table to show it DEAD
# (a raylet killed outright is marked so after the GCS's health checks: about 15 s with
# Ray's defaults; a node shut down or removed is marked at once).
NODE_DEATH_WAIT_S = 20.0


class BadInputInWorker(ValueError):
    """A training worker failed on its input: ends the run without a retry (exit 2)."""


class StorageUnreachableInWorker(StorageError):
    """A training worker's storage did not answer past santa's timeouts and attempts: ends
    the run without a retry (exit 1); the message is the first failure's line."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)

    def __reduce__(self):  # from Ray Train's controller to the driver, as it is
        return (type(self), (str(self),))


def unreachable_storage(failures: dict[int, BaseException]) -> StorageError | None:
    """The first rank's error that says its S3 endpoint did not answer; None if none does."""
    from santa.files.storage import unreachable
    from santa.jobs.errors import root_cause

    for rank in sorted(failures):
        found = unreachable(root_cause(failures[rank]))
        if found is not None:
            return found
    return None


def _died(error: BaseException) -> bool:
    """Whether ``error`` is a worker process that died: a training worker Ray names, or one
    whose error does not say which (an actor that died before Ray knew its class, or whose
    node stopped answering), as a host killed outright gives."""
    from santa.jobs.errors import process_died

    return process_died(error)


def group_removed(error: BaseException) -> bool:
    """Whether ``error`` is a worker that Ray destroyed because its placement group went
    away under it: a node being shut down (drained) releases its bundles so, before the
    node table shows it dead and while its raylet still answers."""
    from santa.jobs.errors import root_cause

    return "placement group was removed" in str(root_cause(error)).lower()


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective call failing because a peer rank is gone."""
    from santa.jobs.errors import root_cause

    text = f"{type(root_cause(error)).__name__}: {root_cause(error)}".lower()
    return any(marker in text for marker in PEER_LOST_MARKERS)


def first_failure(failures: dict[int, BaseException]) -> tuple[int, BaseException]:
    """The failure that caused the others: a worker that died (its peers then fail in their
    collective calls, e.g. gloo's connection errors), else the lowest rank's that is not a
    peer's connection error, else the lowest rank's."""
    for rank in sorted(failures):
        if _died(failures[rank]):
            return rank, failures[rank]
    for rank in sorted(failures):
        if not peer_lost(failures[rank]):
            return rank, failures[rank]
    rank = min(failures)
    return rank, failures[rank]


def lost_nodes(placed: dict[int, tuple[str, str]], node_table: list[dict]) -> dict[str, str]:
    """``{node id: IP}`` of the nodes training ranks were ``placed`` on (rank -> (node id,
    IP)) that Ray's node table (``ray.nodes()``) shows dead (or no longer lists)."""
    if not node_table:  # not read: nothing is known lost
        return {}
    alive = {node.get("NodeID") for node in node_table if node.get("Alive")}
    return {node_id: ip for node_id, ip in sorted(set(placed.values())) if node_id not in alive}


def alive_capacity(resources_per_worker: dict[str, float], node_table: list[dict]) -> int:
    """How many workers the nodes Ray's node table shows alive hold, node by node (their
    total resources, as Ray Train's elastic policy counts them)."""
    wanted = {key: value for key, value in resources_per_worker.items() if value > 0}
    if not wanted:
        return sys.maxsize
    count = 0
    for node in node_table:
        if not node.get("Alive"):
            continue
        have = node.get("Resources") or {}
        count += int(min(have.get(key, 0.0) // value for key, value in wanted.items()))
    return count


def _node_table() -> list[dict]:
    import ray

    if not ray.is_initialized():
        return []
    try:
        return ray.nodes()
    except Exception:  # noqa: BLE001 - without the table the line names no node
        logger.warning("cannot read Ray's node table", exc_info=True)
        return []


def _nodes_of(placed: dict[int, tuple[str, str]], node_table: list[dict]) -> list[dict]:
    ids = {node_id for node_id, _ in placed.values()}
    return [node for node in node_table if node.get("NodeID") in ids]


def _raylet_answers(node: dict, timeout_s: float = 1.0) -> bool:
    """Whether the node's raylet accepts a connection (its node manager port)."""
    import socket

    address, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not address or not port:
        return True
    try:
        with socket.create_connection((address, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def _stage() -> str:
    """The job that runs the training (``pretrain``, ``finetune``): the driver's script."""
    name = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return name if name and name not in ("-c", "__main__", "pytest") else "training"


class RecoveryReporter(UserCallback):
    """One line per worker-group failure Ray Train recovers from (on the controller).

    :meth:`callbacks` gives it with its :class:`ClusterWatch` (they go in the same
    ``RunConfig(callbacks=...)``, so the controller holds one object of each, sharing what
    they see)."""

    def __init__(self, run_uri: str, max_failures: int, placement_wait_s: float = 60.0) -> None:
        self.run_uri = run_uri
        self.max_failures = max_failures
        # Read in the driver: the controller does not see the job's SANTA_* variables.
        self.placement_wait_s = placement_wait_s
        self.stage = _stage()
        self.failures = 0
        self.checkpoint_step: int | None = None
        self.started_from: int | None = None
        self.placed: dict[int, tuple[str, str]] = {}  # rank -> (node id, IP), this group
        self.size: int | None = None  # workers in the group that ran last
        self.scaling: Any = None
        self.pending: str | None = None  # an elastic run's loss, said with its resize

    def callbacks(self) -> list:
        """This reporter and its :class:`ClusterWatch`, for ``RunConfig(callbacks=...)``."""
        return [self, ClusterWatch(self)]

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any):
        """Remember the step of the newest checkpoint (where a restart resumes)."""
        if checkpoint is not None and metrics:
            step = metrics[0].get("step")
            if isinstance(step, int | float):
                self.checkpoint_step = int(step)

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]):
        """Say what failed and where training resumes, while retries are left. A failure
        on bad input (a table naming unknown documents, a corrupt shard) is not retried:
        the same input fails the same way, so the run ends at once with that one line."""
        from santa.jobs.console import say
        from santa.jobs.errors import BAD_INPUT, describe

        for failed, error in sorted(worker_exceptions.items()):
            # The raw text (gloo's, a traceback) for the log folder, not a santa line: the
            # controller's stderr is Ray's log file of it (and the job's, where forwarded).
            print(f"training worker rank {failed} failed: {error!r}", file=sys.stderr)
        rank, error = first_failure(worker_exceptions)
        line, code = describe(error)
        what = line.removeprefix("santa: error: ")
        if code == BAD_INPUT:
            # Raised in Ray Train's controller loop: a ControllerError, which its failure
            # policy never retries; the job's error line is this message.
            raise BadInputInWorker(what)
        storage_fault = unreachable_storage(worker_exceptions)
        if storage_fault is not None:
            # The same: a ControllerError, never retried. The first fault, not a retry's.
            raise StorageUnreachableInWorker(str(storage_fault))
        self.failures += 1
        if self.max_failures >= 0 and self.failures > self.max_failures:
            return  # no retry left: the job ends with one error line
        self.scaling = getattr(run_context, "scaling_config", None) or self.scaling
        what = self._cause(worker_exceptions, rank, what)
        limit = "" if self.max_failures < 0 else f" of {self.max_failures}"
        retry = f"(retry {self.failures}{limit})"
        if self._elastic() and what.startswith("node "):
            self.pending = f"{what} {retry}"  # said with the size it goes on with
            return
        say(f"warning: {what}; training resumes from {self._where()} {self._waits_for()} {retry}")

    def _cause(self, failures: dict[int, Exception], rank: int, what: str) -> str:
        """The lost node and its ranks when Ray's node table shows one of this group's
        nodes dead; else the worker that died; else the failing rank's error."""
        lost = self._lost_nodes(failures)
        if lost:
            ranks = sorted(r for r, (node_id, _) in self.placed.items() if node_id in lost)
            ips = ", ".join(sorted(set(lost.values())))
            ids = ", ".join(node_id[:8] for node_id in lost)
            workers = ""
            if ranks:
                noun = "rank" if len(ranks) == 1 else "ranks"
                workers = f" with training worker {noun} {', '.join(map(str, ranks))}"
            return f"node {ips} lost (Ray node {ids}: DEAD){workers}"
        if _died(failures[rank]):
            return what
        if peer_lost(failures[rank]):
            return (
                f"training worker rank {rank} lost its connection to another rank (a "
                "collective call failed; the raw error is in the log)"
            )
        return f"training worker rank {rank} failed: {what}"

    def _lost_nodes(self, failures: dict[int, Exception]) -> dict[str, str]:
        """This group's nodes Ray shows dead. A failure that looks like a lost node (a
        worker gone, a peer's connection cut) waits a little for the GCS to mark it."""
        if not self.placed:
            return {}
        table = _node_table()
        lost = lost_nodes(self.placed, table)
        if lost or not any(_died(e) or peer_lost(e) for e in failures.values()):
            return lost
        # A raylet that does not answer (killed outright, its host gone) is marked DEAD by
        # the GCS's health checks a little later; a worker killed on a live node is not. A
        # node being shut down still answers while it drains, but its workers die with
        # their placement group: that waits for the node table too.
        drained = any(group_removed(e) for e in failures.values())
        if not drained and all(_raylet_answers(node) for node in _nodes_of(self.placed, table)):
            return lost
        deadline = time.monotonic() + NODE_DEATH_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.5)
            lost = lost_nodes(self.placed, _node_table())
            if lost:
                break
        return lost

    def _elastic(self) -> bool:
        least = getattr(self.scaling, "min_workers", None)
        most = getattr(self.scaling, "max_workers", None)
        return bool(least and most and least < most)

    def _range(self) -> str:
        return f"{self.scaling.min_workers}-{self.scaling.max_workers}"

    def _where(self) -> str:
        step = self._step()
        return f"checkpoint step {step}" if step is not None else "the start"

    def _step(self) -> int | None:
        return self.checkpoint_step if self.checkpoint_step is not None else self._registered_step()

    def _waits_for(self) -> str:
        """What the restart waits for: the workers that fit (elastic) or all of them."""
        if self._elastic():
            return f"with the workers that fit ({self._range()})"
        most = getattr(self.scaling, "max_workers", None) or getattr(
            self.scaling, "num_workers", None
        )
        wait = f"waiting up to {describe_wait(self.placement_wait_s)}"
        if most == 1:
            return f"once its worker fits ({wait})"
        count = f"{most} workers" if isinstance(most, int) else "its workers"
        return f"once {count} fit ({wait})"

    def resizing(self, decision: Any) -> None:
        """Before Ray Train starts a worker group of ``decision.num_workers``: an elastic
        run counts only the nodes Ray shows alive (its policy reads a reservation that can
        still hold a node just lost), and says a new size in one line."""
        from santa.jobs.console import say

        if not self._elastic():
            return
        fits = alive_capacity(dict(decision.resources_per_worker), _node_table())
        if self.scaling.min_workers <= fits < decision.num_workers:
            logger.info("%d workers fit on the alive nodes, not %d", fits, decision.num_workers)
            decision.num_workers = fits
        count, before = decision.num_workers, self.size
        step = self._step()
        at = f"{count} of {self._range()} workers from " + (
            f"step {step}" if step is not None else "the start"
        )
        if self.pending is not None:
            say(f"training goes on with {at}: {self.pending}")
            self.pending = None
        elif before is not None and count > before:
            back = "is back to" if count == self.scaling.max_workers else "grows to"
            say(f"training {back} {at}")
        elif before is not None and count < before:
            say(f"training goes on with {at}: fewer workers fit the cluster")

    def started(self, worker_group: Any) -> None:
        """Remember each rank's node (a lost node is named from it)."""
        placed = {}
        for index, worker in enumerate(worker_group.get_workers()):
            context = getattr(worker, "distributed_context", None)
            rank = getattr(context, "world_rank", index)
            placed[rank] = (worker.metadata.node_id, worker.metadata.node_ip)
        self.placed, self.size = placed, len(placed)

    def controller_started(self, run_context: Any) -> None:
        """A run that resumes an earlier job's checkpoint says so, once."""
        from santa.jobs.console import say

        self.scaling = getattr(run_context, "scaling_config", None)
        try:
            from santa.train.kept import latest_registered

            found = latest_registered(self.run_uri)
        except Exception:  # noqa: BLE001 - a run whose record cannot be read starts over
            found = None
        if found is not None:
            uri, step = found
            at = f"step {step}" if step is not None else "its latest checkpoint"
            say(f"resuming the {self.stage} run {self.run_uri} from {at} ({uri})")

    def _registered_step(self) -> int | None:
        try:
            from santa.train.kept import latest_registered

            found = latest_registered(self.run_uri)
        except Exception:  # noqa: BLE001 - the line without a step is still the line
            return None
        return found[1] if found else None


class ClusterWatch(ControllerCallback, WorkerGroupCallback):
    """The controller's side of :class:`RecoveryReporter` (Ray Train V2's developer
    callbacks): the node of each rank, each resize, and the resumed run's line; and the
    worker group shown to a long-lived driver's warden (``santa.train.warden``)."""

    def __init__(self, reporter: RecoveryReporter) -> None:
        self.reporter = reporter

    def after_controller_start(self, train_run_context: Any) -> None:
        from santa.train.warden import register_train_cleaner

        self.reporter.controller_started(train_run_context)
        # Ray Train's cleaner of this run, for the driver to stop if the job is interrupted.
        register_train_cleaner()

    def after_worker_group_start(self, worker_group: Any) -> None:
        from santa.train.warden import watch_group

        self.reporter.started(worker_group)
        watch_group(worker_group)  # a sweep's warden removes it if this controller dies

    def before_controller_execute_resize_decision(self, resize_decision: Any) -> None:
        self.reporter.resizing(resize_decision)
