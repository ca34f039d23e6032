"""Worker groups whose Ray Train controller died: removed by a warden of the driver.

A Ray Train controller reserves its workers in a placement group. A group belongs to the
job, not to the controller, so when the controller dies without removing it (a Tune trial
that ASHA stops at an intermediate rung: Tune ends the trial's actor and the controller it
owns goes with it) the group keeps its CPUs until the job ends. In a one-run job that is
the end anyway; in a sweep the next trial then waits for those CPUs forever. Ray Train's
own cleaner asks the state API whether the controller lives, which needs the dashboard.

A long-lived driver (the sweep) starts one :class:`GroupWarden` actor; each controller
registers its worker group with it (:func:`watch_group`, from ``ClusterWatch``). The warden
asks each controller directly whether it is alive (a call on its handle, no dashboard) and
removes the group of a controller that is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

logger = logging.getLogger(__name__)

WARDEN_NAME = "santa-group-warden"
# How often the warden looks, and how long one controller may take to answer.
CHECK_EVERY_S = 2.0
PING_TIMEOUT_S = 10.0
SETTLE_S = 30.0


class GroupWarden:
    """Removes the placement group of each registered controller once it is dead."""

    def __init__(self, check_every_s: float = CHECK_EVERY_S) -> None:
        self.check_every_s = check_every_s
        self.watched: list[tuple[Any, Any]] = []  # (controller handle, placement group)
        self.counts = {"registered": 0, "removed": 0, "ended": 0}
        self.lock = threading.Lock()
        self.round_lock = threading.Lock()  # one round at a time (the thread or settle)
        threading.Thread(target=self._loop, name="santa-group-warden", daemon=True).start()

    def watch(self, controller: Any, group: Any) -> None:
        with self.lock:
            self.watched.append((controller, group))
            self.counts["registered"] += 1

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {**self.counts, "watched": len(self.watched)}

    def settle(self, timeout_s: float) -> dict[str, int]:
        """At the driver's end: look until every group is removed (or the time is up)."""
        deadline = time.monotonic() + timeout_s
        while self._round() and time.monotonic() < deadline:
            time.sleep(0.5)
        return self.stats()

    def _loop(self) -> None:
        while True:
            time.sleep(self.check_every_s)
            self._round()

    def _round(self) -> int:
        """Check every watched group once; the number still watched."""
        with self.round_lock:
            with self.lock:
                watched = list(self.watched)
            for entry in watched:
                try:
                    outcome = self._check(*entry)
                except Exception:  # noqa: BLE001 - the next round looks again
                    logger.warning("could not check a worker group", exc_info=True)
                    continue
                if outcome:
                    with self.lock:
                        self.watched.remove(entry)
                        self.counts[outcome] += 1
            with self.lock:
                return len(self.watched)

    def _check(self, controller: Any, group: Any) -> str | None:
        """``ended`` (its controller removed it), ``removed`` (removed here) or None."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        if group_state(group) == "REMOVED":
            return "ended"
        try:
            ray.get(controller.__ray_ready__.remote(), timeout=PING_TIMEOUT_S)
            return None
        except (ActorUnavailableError, GetTimeoutError):  # busy or a network blip: alive
            return None
        except RayActorError:  # dead for good
            pass
        ray.util.remove_placement_group(group)
        logger.warning(
            "removed placement group %s: its Ray Train controller died without removing it",
            group.id.hex(),
        )
        return "removed"


def group_state(group: Any) -> str:
    """The placement group's state in the GCS (no dashboard needed): CREATED, REMOVED, …"""
    import ray

    return ray.util.placement_group_table(group).get("state", "REMOVED")


@contextmanager
def group_warden() -> Iterator[Any]:
    """A warden for the controllers started while the block runs (a sweep's trials)."""
    import ray

    warden = (
        ray.remote(num_cpus=0)(GroupWarden)
        .options(name=WARDEN_NAME, get_if_exists=True, max_concurrency=4)
        .remote()
    )
    try:
        yield warden
        try:  # the trials' controllers end with the sweep: the groups of dead ones go
            stats = ray.get(warden.settle.remote(SETTLE_S), timeout=SETTLE_S + PING_TIMEOUT_S)
            logger.info("worker groups: %s", stats)
        except Exception:  # noqa: BLE001 - the job's end removes what is left
            logger.warning("the worker groups were not all checked", exc_info=True)
    finally:  # (an interrupted driver ends its job, and Ray removes the job's groups)
        with suppress(Exception):  # Ray already gone: the warden went with it
            ray.kill(warden)


def watch_group(worker_group: Any) -> bool:
    """From a controller: register its worker group with the driver's warden, if any."""
    import ray

    try:
        warden = ray.get_actor(WARDEN_NAME)
    except ValueError:  # no long-lived driver asked for one: the job's end removes the group
        return False
    try:
        group = worker_group.get_worker_group_state().placement_group_handle.placement_group
        controller = ray.get_runtime_context().current_actor
        ray.get(warden.watch.remote(controller, group), timeout=PING_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - watching must never stop training
        logger.warning("could not register the worker group with %s", WARDEN_NAME, exc_info=True)
        return False
    return True


# Ray Train's own cleaner of a run (one detached PlacementGroupCleaner actor per controller):
# its handle, kept in Ray's internal KV under the job, for the driver to stop at the end of
# an interrupted job.
CLEANER_NAMESPACE = "santa"
CLEANER_KEY_PREFIX = "train-cleaner:"


def _cleaner_key_prefix(job_id: str) -> str:
    return f"{CLEANER_KEY_PREFIX}{job_id}:"


def register_train_cleaner() -> bool:
    """From a Ray Train controller (after its start): keep the handle of the run's
    ``PlacementGroupCleaner`` where the driver finds it (:func:`stop_train_cleaners`).

    The cleaner is detached so that it outlives a controller that dies. When the controller
    ends normally it stops the cleaner; when the driver is interrupted (Ctrl-C, ``ray job
    stop``) the controller dies with the job and the cleaner, which asks the state API
    whether the controller lives (the dashboard's) and, when it finds it dead, exits from a
    thread that no task follows, stays ALIVE on the cluster (about 200 MB each). Only the
    handle reaches it: it has no name, and is found here among the controller's objects."""
    import gc
    import pickle

    import ray
    from ray.experimental.internal_kv import _internal_kv_put

    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import (
            PlacementGroupCleanerCallback,
        )
    except ImportError:  # another Ray layout: nothing to keep
        return False
    cleaners = [
        obj._cleaner
        for obj in gc.get_objects()
        if isinstance(obj, PlacementGroupCleanerCallback) and getattr(obj, "_cleaner", None)
    ]
    if not cleaners:
        return False
    context = ray.get_runtime_context()
    key = _cleaner_key_prefix(context.get_job_id()) + (context.get_actor_id() or "driver")
    try:
        _internal_kv_put(key, pickle.dumps(cleaners[-1]), namespace=CLEANER_NAMESPACE)
    except Exception:  # noqa: BLE001 - keeping it must never stop training
        logger.warning("could not keep Ray Train's placement-group cleaner", exc_info=True)
        return False
    return True


def stop_train_cleaners() -> int:
    """In the driver, at the end of an interrupted job: stop the ``PlacementGroupCleaner``
    of each Ray Train run the job started (their placement groups go with the job); returns
    how many were stopped. Nothing to do without Ray."""
    import pickle
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return 0
    from ray.experimental.internal_kv import (
        _internal_kv_del,
        _internal_kv_get,
        _internal_kv_list,
    )

    stopped = 0
    prefix = _cleaner_key_prefix(ray.get_runtime_context().get_job_id())
    for key in _internal_kv_list(prefix, namespace=CLEANER_NAMESPACE):
        try:
            payload = _internal_kv_get(key, namespace=CLEANER_NAMESPACE)
            if payload:
                ray.kill(pickle.loads(payload), no_restart=True)
                stopped += 1
        except Exception:  # noqa: BLE001 - gone already (a run that ended), or Ray is going
            logger.debug("could not stop a placement-group cleaner", exc_info=True)
        finally:
            with suppress(Exception):
                _internal_kv_del(key, namespace=CLEANER_NAMESPACE)
    return stopped
