"""One error style for every job: ``santa: error: <what> (<where>)`` on stderr.

Exit codes: 2 for bad input (a missing file, a bad flag value, an unreadable corpus, a
checkpoint that is not one), 1 for faults at run time, 130 for Ctrl-C. The traceback is
kept for ``--debug`` or ``SANTA_DEBUG=1``. Errors raised inside Ray tasks and actors
arrive wrapped in Ray's exceptions; the original cause is what the user sees.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

__all__ = ["BAD_INPUT", "RUNTIME_FAULT", "debug_enabled", "describe", "exit_with", "run_job"]

BAD_INPUT = 2
RUNTIME_FAULT = 1
INTERRUPTED = 130


def debug_enabled(argv: list[str] | None = None) -> bool:
    """Whether ``--debug`` is on the command line or ``SANTA_DEBUG`` is set."""
    arguments = sys.argv[1:] if argv is None else argv
    return "--debug" in arguments or os.environ.get("SANTA_DEBUG", "") not in ("", "0")


def _root_cause(error: BaseException) -> BaseException:
    """The user's error inside Ray's wrappers (RayTaskError, ActorDiedError causes)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        cause = getattr(error, "cause", None)  # RayTaskError keeps the original here
        if isinstance(cause, BaseException):
            error = cause
            continue
        if type(error).__name__.startswith("RayTaskError") and error.__cause__ is not None:
            error = error.__cause__
            continue
        break
    return error


def _is_bad_input(error: BaseException) -> bool:
    from santa.runtime.storage import StorageError

    if isinstance(error, StorageError):
        # A missing object or bucket is bad input; an unreachable endpoint is a fault.
        return not getattr(error, "transient", False)
    return isinstance(error, ValueError | FileNotFoundError | NotADirectoryError | KeyError)


def describe(error: BaseException) -> tuple[str, int]:
    """The one line and the exit code for ``error``."""
    error = _root_cause(error)
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if _is_bad_input(error):
        return f"santa: error: {message or type(error).__name__}", BAD_INPUT
    from santa.runtime.storage import StorageError

    if isinstance(error, StorageError) and message:  # its message names the URI and why
        return f"santa: error: {message}", RUNTIME_FAULT
    name = type(error).__name__
    return f"santa: error: {name}: {message}" if message else f"santa: error: {name}", (
        RUNTIME_FAULT
    )


def exit_with(code: int) -> None:
    """End a job's process with ``code`` (its ``__main__``: ``exit_with(main())``).

    After Ctrl-C, Ray is stopped here and the process ends at once: left to the exit
    hooks, Ray's shutdown after an interrupted execution sometimes ended the process with
    status 1 instead of 130.
    """
    if code == INTERRUPTED:
        ray = sys.modules.get("ray")
        try:
            if ray is not None and ray.is_initialized():
                ray.shutdown()
        except BaseException:  # noqa: BLE001, S110 - already exiting on an interrupt
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    sys.exit(code)


def run_job(main: Callable[[], int | None], argv: list[str] | None = None) -> int:
    """Run a job's ``main`` and turn any exception into one line and an exit code."""
    debug = debug_enabled(argv)
    try:
        return int(main() or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print("santa: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    except BaseException as error:  # noqa: BLE001 - every error becomes one line
        if debug:
            traceback.print_exc()
        line, code = describe(error)
        print(line, file=sys.stderr, flush=True)
        return code
