"""Ctrl-C and ``ray job stop`` answered the same way by every job: one line, exit 130.

A terminal's Ctrl-C sends SIGINT to the job's whole process group; ``ray job stop`` sends
SIGTERM to the driver (and SIGKILL 3 s later). Either way the first signal raises
:class:`Interrupted` in the job's main thread: what the job was doing unwinds (staged
outputs are deleted, the run lock is released), and :func:`santa.jobs.errors.run_job`
prints one line saying what was kept and how to go on — the job registers that with
:func:`keeping` while it works::

    with interrupts.keeping(lambda: f"checkpoint step {step()} kept; run the same command"):
        fit(...)

A second signal ends the process at once (``os._exit(130)``), whatever it was doing.

Ray installs handlers of its own in the driver: ``ray.init`` turns SIGTERM into
``sys.exit(15)``, and Ray Train's ``fit()`` takes SIGINT over to abort its controller (and
then exits with status 1 and no message). santa's handlers are put back after ``ray.init``
(:func:`reinstall`), and Ray Train runs in a helper thread (:func:`call_in_thread`), where
it registers no handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = [
    "INTERRUPT_SIGNALS",
    "Interrupted",
    "call_in_thread",
    "install",
    "installed",
    "interrupted_line",
    "keeping",
    "reinstall",
    "restore",
]

T = TypeVar("T")

INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODE = 130


class Interrupted(KeyboardInterrupt):
    """The job was asked to stop (Ctrl-C or ``ray job stop``)."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


_state: dict[str, Any] = {"installed": False, "signals": 0}
_kept: list[tuple[Callable[[], str], str]] = []


def _handler(signum: int, frame: Any) -> None:
    _state["signals"] += 1
    if _state["signals"] > 1:
        # The first one is still unwinding (a checkpoint listing on a slow S3, Ray's
        # shutdown): stop now. Locks are freed by the kernel (local) or go stale (S3). Once
        # the job's line is out (what was kept), that stays its one line.
        if not _state.get("said"):
            os.write(_terminal_fd(), b"santa: interrupted again: stopped at once\n")
        os._exit(EXIT_CODE)
    raise Interrupted(signal.Signals(signum).name)


def _terminal_fd() -> int:
    """Where the job's own lines go: ``sys.__stderr__`` (a command-line job sends file
    descriptor 2 itself to its log file, see santa.jobs.console)."""
    try:
        return sys.__stderr__.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


def said() -> None:
    """The job's ``santa: interrupted`` line is out: a second signal ends it silently."""
    _state["said"] = True


def install() -> dict[int, Any]:
    """Answer SIGINT and SIGTERM in this process (main thread only; else a no-op).

    Returns the handlers it replaced, for :func:`restore`.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {signum: signal.getsignal(signum) for signum in INTERRUPT_SIGNALS}
    for signum in INTERRUPT_SIGNALS:
        signal.signal(signum, _handler)
    # Processes Ray starts block SIGINT (a driver run by Ray's job supervisor inherits that):
    # a blocked Ctrl-C would never arrive.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(INTERRUPT_SIGNALS))
    _state["installed"] = True
    return previous


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`install` replaced (a job called in-process, e.g. from
    tests or a notebook, leaves its caller's handlers as they were)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in previous.items():
        if handler is not None:
            signal.signal(signum, handler)
    _state["installed"] = False


def installed() -> bool:
    """Whether :func:`install` ran in this process (a job's driver)."""
    return bool(_state["installed"])


def reinstall() -> None:
    """Put santa's handlers back after a library replaced them (``ray.init``)."""
    if installed():
        install()


def interrupted() -> bool:
    """Whether a stop signal has arrived."""
    return _state["signals"] > 0


@contextlib.contextmanager
def keeping(describe: Callable[[], str], hint: str = "") -> Iterator[None]:
    """While the block runs, an interruption reports ``describe()`` (what was kept) and
    ``hint`` (how to go on). Nested blocks add to the line, outer first; the innermost
    hint given is the one printed."""
    entry = (describe, hint)
    _kept.append(entry)
    try:
        yield
    except KeyboardInterrupt:
        raise  # stays registered: the job's last line is printed after the unwinding
    except BaseException:
        _forget(entry)
        raise
    _forget(entry)


def _forget(entry: tuple[Callable[[], str], str]) -> None:
    with contextlib.suppress(ValueError):
        _kept.remove(entry)


def interrupted_line() -> str:
    """``santa: interrupted: <what was kept>; <how to go on>`` (or plain)."""
    parts: list[str] = []
    hint = ""
    for describe, entry_hint in _kept:
        try:
            what = describe()
        except Exception as error:  # noqa: BLE001 - never fail the line itself
            what = f"could not tell what was kept ({type(error).__name__}: {error})"
        if what and what not in parts:
            parts.append(what)
        hint = entry_hint or hint
    if hint:
        parts.append(hint)
    return "santa: interrupted" + (f": {'; '.join(parts)}" if parts else "")


def call_in_thread(function: Callable[[], T], name: str = "santa-call") -> T:
    """``function()`` run in a helper thread while the main thread waits, interruptibly.

    Ray Train's ``fit()`` (and Tune's) replace the SIGINT handler when called from the
    main thread; from a helper thread they leave santa's in place. When the wait is
    interrupted, the helper is left behind (a daemon): the process is about to end, which
    ends the Ray job's actors with it.
    """
    if threading.current_thread() is not threading.main_thread():
        return function()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            outcome["error"] = error

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=0.5)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def flush_streams() -> None:
    """Flush stdout and stderr (before ``os._exit``)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
