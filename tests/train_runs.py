"""Which tests start a Ray Train run: with ``SANTA_COUNT_TRAIN_RUNS=FILE`` set, every Ray
Train trainer built anywhere in the suite (the test process, a job's driver, a Tune trial,
a job submitted to a shell cluster) appends its time to FILE, through Ray Train's own hook
for callbacks named in ``RAY_TRAIN_CALLBACKS``; the session's summary attributes each to
the test running then (a module-scoped run to the test whose set-up started it).

    SANTA_COUNT_TRAIN_RUNS=/tmp/runs.txt python -m pytest -m ""
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ray.train.v2.api.callback import RayTrainCallback

COUNT_ENV = "SANTA_COUNT_TRAIN_RUNS"
CALLBACKS_ENV = "RAY_TRAIN_CALLBACKS"  # ray.train.v2._internal.constants


class CountRuns(RayTrainCallback):
    """Built once per trainer, in the process that builds it: one line to the count file."""

    def __init__(self) -> None:
        path = os.environ.get(COUNT_ENV)
        if path:
            with open(path, "a") as file:  # one short append: whole lines from any process
                file.write(f"{time.time():.6f} {os.getpid()}\n")


def enable(repo: Path) -> str | None:
    """From conftest, before any Ray starts: the callback for every process to come (they
    inherit the environment and import it from ``repo``); the count file, or None when not
    counting."""
    path = os.environ.get(COUNT_ENV)
    if not path:
        return None
    os.environ[CALLBACKS_ENV] = f"{__name__}.CountRuns"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p
    )
    return path


def attribute(path: str, spans: list[tuple[str, float, float]]) -> dict[str, int]:
    """Runs per test: each run's time within a test's span (set-up to teardown)."""
    counts: dict[str, int] = {}
    times = [float(line.split()[0]) for line in Path(path).read_text().splitlines() if line]
    for moment in times:
        owner = next((test for test, start, end in spans if start <= moment <= end), "?")
        counts[owner] = counts.get(owner, 0) + 1
    return counts
