"""How long a run waits for its training workers to be placed, and then ends in one line.

When a node is lost, Ray Train restarts the worker group from the latest checkpoint and
waits for the cluster to place every worker (an autoscaler may be adding a node): each
wait lasts ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (Ray's, 60 s by default), and Ray
retries a timed-out wait without end (``FailureConfig(controller_failure_limit=-1)``). santa
bounds the retries (``SANTA_PLACEMENT_RETRIES``, 10 by default: 11 waits, about 11 minutes
with Ray's timeout, time for an autoscaler to add a node), then the job ends with one line saying so. An elastic run
(``--num-workers MIN-MAX``) does not wait: it goes on with the workers that fit.

Whether a plan can *ever* fit the cluster is checked before the run starts
(``santa.runtime.resources``, issue 28); this module is about waiting at run time.
"""

from __future__ import annotations

import os

__all__ = ["PLACEMENT_RETRIES_ENV", "WAIT_ENV", "placement_retries", "placement_wait_s"]

WAIT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
"""Ray Train's bound on one wait for the worker group to be placed (it propagates this
variable from the driver to its controller)."""
RAY_DEFAULT_WAIT_S = 60.0
PLACEMENT_RETRIES_ENV = "SANTA_PLACEMENT_RETRIES"
DEFAULT_PLACEMENT_RETRIES = 10


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
