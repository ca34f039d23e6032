"""One error style for every job: ``santa: error: <what> (<where>)`` on stderr.

Exit codes: 2 for bad input (a missing file, a bad flag value, an unreadable corpus, a
checkpoint that is not one), 1 for faults at run time, 130 for Ctrl-C. The traceback is
kept for ``--debug`` or ``SANTA_DEBUG=1``. Errors raised inside Ray tasks and actors
arrive wrapped in Ray's exceptions; the original cause is what the user sees.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Callable

__all__ = [
    "BAD_INPUT",
    "EXIT_CODES",
    "INTERRUPTED",
    "RUNTIME_FAULT",
    "RayStartError",
    "debug_enabled",
    "describe",
    "exit_codes_help",
    "exit_with",
    "root_cause",
    "run_job",
    "stop_worker_lines",
    "with_exit_codes",
]

BAD_INPUT = 2
RUNTIME_FAULT = 1
INTERRUPTED = 130

EXIT_CODES = {
    0: "done",
    RUNTIME_FAULT: "a fault at run time: storage unreachable, a worker or node lost past its "
    "retries (--max-failures), a wait for workers past its bound, a local Ray that did not "
    "start (twice)",
    BAD_INPUT: "bad input, found before any work where it can be: a missing or corrupt file, a "
    "bad flag, an output in use or holding another tool's output",
    INTERRUPTED: "interrupted (Ctrl-C, ray job stop): the last line says what was kept and "
    "how to go on",
}
"""Every job's exit status (the README's table and each job's --help say the same)."""


class RayStartError(RuntimeError):
    """A local Ray that did not come up (a fault at run time, exit 1); the message is the
    whole line: what happened, the load seen, and what to do."""


def with_exit_codes(parser):
    """``parser`` (an ``argparse.ArgumentParser``) with the exit statuses at the end of its
    ``--help``: every job's command line documents them the same way."""
    import argparse

    parser.epilog = (parser.epilog + "\n\n" if parser.epilog else "") + exit_codes_help()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def exit_codes_help() -> str:
    """The exit statuses as a ``--help`` epilog."""
    lines = ["exit status:"] + [f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items()]
    return "\n".join(lines)


def debug_enabled(argv: list[str] | None = None) -> bool:
    """Whether ``--debug`` is on the command line or ``SANTA_DEBUG`` is set."""
    arguments = sys.argv[1:] if argv is None else argv
    return "--debug" in arguments or os.environ.get("SANTA_DEBUG", "") not in ("", "0")


# Where Ray keeps the exception it wraps: Ray Train's worker group (the first failing
# rank's), its controller's, a worker's user code with its traceback, a failed health check,
# a task's (RayTaskError.cause).
_WRAPPED_ATTRIBUTES = ("controller_failure", "_base_exc", "health_check_failure", "cause")
_WRAPPERS_BY_NAME = ("RayTaskError", "UserCodeException", "TuneError", "RayTrainError")


def _unwrap_once(error: BaseException) -> BaseException | None:
    failures = getattr(error, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        # A worker that died is the cause; its peers' collective errors follow from it.
        for rank in sorted(failures):
            if _describe_process_death(_root_cause(failures[rank])) is not None:
                return failures[rank]
        return failures[min(failures)]
    for attribute in _WRAPPED_ATTRIBUTES:
        inner = getattr(error, attribute, None)
        if isinstance(inner, BaseException):
            return inner
    name = type(error).__name__
    if name.startswith(_WRAPPERS_BY_NAME) and error.__cause__ is not None:
        return error.__cause__
    return None


def _root_cause(error: BaseException) -> BaseException:
    """The user's error inside Ray's wrappers (Ray Train's WorkerGroupError and
    ControllerError, RayTaskError, Ray Data's UserCodeException)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = _unwrap_once(error)
        if inner is None:
            break
        error = inner
    return error


def root_cause(error: BaseException) -> BaseException:
    """The exception the user's code (or a storage call) raised, out of Ray's wrappers."""
    return _root_cause(error)


def _is_bad_input(error: BaseException) -> bool:
    from santa.files.storage import StorageError

    if isinstance(error, StorageError):
        # A missing object or bucket is bad input; an unreachable endpoint is a fault.
        return not getattr(error, "transient", False)
    return isinstance(error, ValueError | FileNotFoundError | NotADirectoryError | KeyError)


def _field(text: str, name: str) -> str:
    match = re.search(rf"\b{name}:\s*(\S+)", text)
    return match.group(1) if match else ""


def process_died(error: BaseException) -> bool:
    """Whether ``error`` (or its root cause) is a Ray worker process that died: killed, out
    of memory, its node lost; with or without the actor's class in Ray's message."""
    return _describe_process_death(_root_cause(error)) is not None


def _describe_process_death(error: BaseException) -> str | None:
    """One line for a Ray worker process that died (killed, out of memory, node lost)."""
    name = type(error).__name__
    deaths = ("ActorDiedError", "ActorUnavailableError", "WorkerCrashedError", "NodeDiedError")
    if not any(death in name for death in (*deaths, "OwnerDiedError")):
        return None
    text = str(error)
    who = _field(text, "class_name") or "a Ray worker"
    where = " ".join(
        part
        for part in (
            f"pid {_field(text, 'pid')}" if _field(text, "pid") else "",
            f"on {_field(text, 'ip')}" if _field(text, "ip") else "",
        )
        if part
    )
    detail = ""
    match = re.search(r"Worker exit detail: ([^\n]*?)(\.|$)", text)
    if match:
        detail = match.group(1).strip()
    elif "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        detail = "its node died"
    what = {"RayTrainWorker": "a training worker"}.get(who, who)
    line = f"{what} died" + (f" ({where})" if where else "")
    return line + (f": {detail}" if detail else "")


def _describe_placement_timeout(error: BaseException) -> str | None:
    """One line for Ray Train giving up waiting for its workers to be placed."""
    if type(error).__name__ != "WorkerGroupStartupTimeoutError":
        return None
    from santa.cluster.placement import (
        PLACEMENT_RETRIES_ENV,
        WAIT_ENV,
        describe_wait,
        placement_wait_s,
    )

    workers = getattr(error, "num_workers", None)
    return (
        f"the cluster could not place {workers or 'the'} training workers within "
        f"{describe_wait(placement_wait_s())} (a node lost and not replaced, or too few resources); "
        "the run kept its checkpoints: run the same command when the cluster has room, wait "
        f"longer ({WAIT_ENV}, {PLACEMENT_RETRIES_ENV}), or go on with fewer "
        "(--num-workers MIN-MAX)"
    )


def describe(error: BaseException) -> tuple[str, int]:
    """The one line and the exit code for ``error``."""
    error = _root_cause(error)
    from santa.files.storage import s3_error

    error = s3_error(error) or error  # pyarrow's AWS errors from Ray's processes: the URI
    death = _describe_process_death(error) or _describe_placement_timeout(error)
    if death is not None:
        return f"santa: error: {death}", RUNTIME_FAULT
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else ""
    if message.startswith("Traceback (most recent call last)"):
        # A traceback carried as text (Tune's TuneError): its last line is the cause.
        message = lines[-1].strip()
    if _is_bad_input(error):
        return f"santa: error: {message or type(error).__name__}", BAD_INPUT
    from santa.files.storage import StorageError

    if isinstance(error, StorageError | RayStartError) and message:  # says what and why
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
    _stop_train_cleaners(timeout_s=10.0)
    if code == INTERRUPTED:
        _shutdown_ray(timeout_s=20.0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    sys.exit(code)


def _stop_train_cleaners(timeout_s: float) -> None:
    """Stop the ``PlacementGroupCleaner`` actors of the job's Ray Train runs (see
    :func:`santa.train.warden.stop_train_cleaners`): an interrupted run's stayed ALIVE on a
    long-lived cluster. At most ``timeout_s`` (a cluster that went away)."""
    if "ray" not in sys.modules:
        return
    import threading

    def stop() -> None:
        try:
            from santa.train.warden import stop_train_cleaners

            stop_train_cleaners()
        except BaseException:  # noqa: BLE001, S110 - the job is ending anyway
            pass

    thread = threading.Thread(target=stop, name="santa-stop-cleaners", daemon=True)
    thread.start()
    thread.join(timeout_s)


def _shutdown_ray(timeout_s: float) -> None:
    """Stop (a local Ray of the job's own) or leave the cluster, waiting at most
    ``timeout_s``: the job's actors (Ray Train's controller and workers, the miner) end with
    the driver. A second Ctrl-C meanwhile ends the process at once."""
    ray = sys.modules.get("ray")
    if ray is None:
        return

    def shutdown() -> None:
        try:
            if ray.is_initialized():
                ray.shutdown()
        except BaseException:  # noqa: BLE001, S110 - already exiting on an interrupt
            pass

    import threading

    thread = threading.Thread(target=shutdown, name="santa-ray-shutdown", daemon=True)
    thread.start()
    thread.join(timeout_s)


def stop_worker_lines() -> None:
    """Stop printing what Ray workers print (their progress lines reach the driver through
    Ray's log forwarding, seconds late): the job's own last line must stay the last. A line
    being printed finishes first (the dispatcher's lock); later ones stay in Ray's log
    files. Nothing to do in a job that never imported Ray."""
    if "ray" not in sys.modules:
        return
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher
    except ImportError:  # another Ray layout: the lines may follow, as before
        return
    global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")


def run_job(main: Callable[[], int | None], argv: list[str] | None = None) -> int:
    """Run a job's ``main`` and turn any exception into one line and an exit code."""
    from santa.jobs import interrupts
    from santa.jobs.workdir import steady_working_directory

    debug = debug_enabled(argv)
    if argv is None:  # the process's own command line (``__main__``), not a library call
        from santa.jobs import console
        from santa.jobs.quiet import quiet_driver

        console.mark_command_line()
        if "--verbose" not in sys.argv[1:]:
            from santa.jobs.quiet import progress_bars_off, quiet_job_logging

            # Also for a job that never starts Ray (evaluate, export): faiss's loader lines,
            # Python warnings and the job's log records (bm25s's, santa's INFO) go to its
            # log file; santa's own warnings still show as santa lines.
            quiet_job_logging(quiet_driver())
            if "--progress" not in sys.argv[1:]:
                # Other libraries' progress bars (transformers' "Loading weights", Ray
                # Data's) are most of what a job prints, before every answer of a search.
                progress_bars_off()
    previous = interrupts.install()
    steady_working_directory()  # an MKL abort at `import torch` when the cwd vanished
    try:
        code = int(main() or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        # Ctrl-C, or `ray job stop` (SIGTERM): santa's handlers stay, so that a second
        # signal while the process winds down stops it at once.
        stop_worker_lines()
        print(interrupts.interrupted_line(), file=sys.stderr, flush=True)
        interrupts.said()
        if not interrupts.interrupted():  # raised by the code itself, not by a signal
            interrupts.restore(previous)
        return INTERRUPTED
    except BaseException as error:  # noqa: BLE001 - every error becomes one line
        from santa.jobs import console

        console.log_exception(error)  # the whole story, in the job's log file
        if debug:
            traceback.print_exc()
        line, code = describe(error)
        stop_worker_lines()
        print(line, file=sys.stderr, flush=True)
        interrupts.restore(previous)
        return code
    interrupts.restore(previous)
    return code
