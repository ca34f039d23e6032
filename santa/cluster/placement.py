"""How long a run waits for its training workers to be placed, and then ends in one line.

When a node is lost, Ray Train restarts the worker group from the latest checkpoint and
waits for the cluster to place every worker (an autoscaler may be adding a node): each
wait lasts ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (Ray's, 60 s by default), and Ray
retries a timed-out wait without end (``FailureConfig(controller_failure_limit=-1)``). santa
bounds the retries (``SANTA_PLACEMENT_RETRIES``, 4 by default: 5 waits, 5 minutes with Ray's
timeout), then the job ends with one line saying so. An elastic run (``--num-workers
MIN-MAX``) does not wait: it goes on with the workers that fit.

Whether a plan can *ever* fit the cluster is checked before the run starts
(``santa.cluster.resources``, issue 28); this module is about waiting at run time.
"""

from __future__ import annotations

import os

__all__ = [
    "PLACEMENT_RETRIES_ENV",
    "WAIT_ENV",
    "describe_wait",
    "placement_retries",
    "placement_wait_s",
]

WAIT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
"""Ray Train's bound on one wait for the worker group to be placed (it propagates this
variable from the driver to its controller)."""
RAY_DEFAULT_WAIT_S = 60.0
PLACEMENT_RETRIES_ENV = "SANTA_PLACEMENT_RETRIES"
# 5 waits of Ray's 60 s: 5 minutes in all. Long enough for what can bring a lost node back
# on its own: a cloud autoscaler replacing it (a VM booted and Ray started on it take 2 to 4
# minutes on the usual clouds) or a raylet restarted by hand. A cluster without either never
# gets the node back, and a longer wait only keeps its other nodes idle: the run keeps its
# checkpoints and the same command resumes it when the cluster has room, or an elastic run
# (--num-workers MIN-MAX) goes on at once with the workers left.
DEFAULT_PLACEMENT_RETRIES = 4


def _number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value >= 0 else default


def placement_retries() -> int:
    """How many timed-out waits for the workers are retried (``controller_failure_limit``)."""
    return int(_number(PLACEMENT_RETRIES_ENV, DEFAULT_PLACEMENT_RETRIES))


def placement_wait_s() -> float:
    """The longest a run waits for its workers in all: one wait per try."""
    return _number(WAIT_ENV, RAY_DEFAULT_WAIT_S) * (placement_retries() + 1)


def describe_wait(seconds: float) -> str:
    """A wait as a user reads it: ``40 s`` below two minutes, ``5 min`` (or ``2.5 min``)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes == round(minutes) else f"{minutes:.1f} min"
