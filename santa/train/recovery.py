"""Recoveries said in one line: a dead worker or a lost node, and where training resumes.

Ray Train restarts its worker group from the latest registered checkpoint when a worker
fails (``FailureConfig(max_failures)``), and prints an actor's traceback on the way.
:class:`RecoveryReporter` runs in Ray Train's controller and prints one ``santa:`` line per
failure it recovers from (the traceback stays in the log folder)::

    santa: warning: a training worker died (pid 4242 on 10.0.0.7): killed; training resumes
    from checkpoint step 4 (retry 1 of 2)

A failure past the last retry prints nothing here: the job's error line says it. Nor is a
failure on bad input retried (it would fail the same way), nor an S3 endpoint that did not
answer past santa's timeouts and attempts (a new worker group would first start, then wait
the same timeouts on the same endpoint, and its error would hide the first): the run ends
with the first failure's line, naming its operation and URI.
"""

from __future__ import annotations

from typing import Any

from ray.train import UserCallback

from santa.runtime.storage import StorageError

__all__ = ["BadInputInWorker", "RecoveryReporter", "StorageUnreachableInWorker", "first_failure"]


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
    from santa.runtime.errors import root_cause
    from santa.runtime.storage import unreachable

    for rank in sorted(failures):
        found = unreachable(root_cause(failures[rank]))
        if found is not None:
            return found
    return None


def first_failure(failures: dict[int, BaseException]) -> tuple[int, BaseException]:
    """The failure that caused the others: a worker that died (its peers then fail in their
    collective calls, e.g. gloo's connection errors), else the lowest rank's."""
    from santa.runtime.errors import describe

    for rank in sorted(failures):
        if describe(failures[rank])[0].startswith("santa: error: a training worker died"):
            return rank, failures[rank]
    rank = min(failures)
    return rank, failures[rank]


class RecoveryReporter(UserCallback):
    """One line per worker-group failure Ray Train recovers from (on the controller)."""

    def __init__(self, run_uri: str, max_failures: int, placement_wait_s: float = 60.0) -> None:
        self.run_uri = run_uri
        self.max_failures = max_failures
        # Read in the driver: the controller does not see the job's SANTA_* variables.
        self.placement_wait_s = placement_wait_s
        self.failures = 0
        self.checkpoint_step: int | None = None
        self.started_from: int | None = None

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
        from santa.runtime.console import say
        from santa.runtime.errors import BAD_INPUT, describe

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
        if not what.startswith("a training worker died"):
            what = f"training worker rank {rank} failed: {what}"
        step = self.checkpoint_step
        if step is None:
            step = self._registered_step()
        where = f"checkpoint step {step}" if step is not None else "the start"
        limit = "" if self.max_failures < 0 else f" of {self.max_failures}"
        say(
            f"warning: {what}; training resumes from {where} {self._waits_for(run_context)} "
            f"(retry {self.failures}{limit})"
        )

    def _waits_for(self, run_context: Any) -> str:
        """What the restart waits for: the workers that fit (elastic) or all of them."""
        scaling = getattr(run_context, "scaling_config", None)
        least = getattr(scaling, "min_workers", None)
        most = getattr(scaling, "max_workers", None) or getattr(scaling, "num_workers", None)
        if least and most and least < most:
            return f"with the workers that fit ({least}-{most})"
        wait = f"waiting up to {self.placement_wait_s:.0f} s"
        if most == 1:
            return f"once its worker fits ({wait})"
        count = f"{most} workers" if isinstance(most, int) else "its workers"
        return f"once {count} fit ({wait})"

    def _registered_step(self) -> int | None:
        try:
            from santa.train.kept import latest_registered

            found = latest_registered(self.run_uri)
        except Exception:  # noqa: BLE001 - the line without a step is still the line
            return None
        return found[1] if found else None
