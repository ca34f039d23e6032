"""santa's own progress lines for long phases that are not training steps.

A phase that works for minutes (evaluation's encoding, a preprocessing job's parsing) says
how far it got at least every :data:`EVERY_S` seconds, as a tagged line like training's
``[train] step 5/40 ...``::

    [eval] documents: 2,048/5,427 texts (38%), 41 texts/s, 50 s
    [eval] documents: 5,427 texts in 131 s (41 texts/s)

Plain lines, not a progress bar: a bar redrawn with carriage returns becomes empty or
escape-only lines once the terminal is a log file, a pipe or Ray's log forwarding. A phase
shorter than the interval prints nothing. ``SANTA_PROGRESS_EVERY_S`` sets the interval.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

__all__ = ["EVERY_S", "ProgressLines", "counted", "progress_interval"]

EVERY_S = 15.0
"""Seconds between two progress lines of one phase (``SANTA_PROGRESS_EVERY_S``)."""


def progress_interval() -> float:
    """The interval between progress lines: ``SANTA_PROGRESS_EVERY_S``, else :data:`EVERY_S`."""
    try:
        return max(0.0, float(os.environ.get("SANTA_PROGRESS_EVERY_S", EVERY_S)))
    except ValueError:
        return EVERY_S


class ProgressLines:
    """Progress of one phase of ``total`` units, one line every ``every_s`` seconds.

    Args:
        tag: the line's tag, without brackets (``eval``, ``preprocess``).
        what: what is being done (``documents``, ``source files``).
        total: the units the phase will do (0: unknown, no percentage).
        unit: the units' name (``texts``, ``rows``).
        every_s: seconds between lines (default :func:`progress_interval`).
        clock: the time source (tests pass their own).
        out: the stream (default: stdout, looked up when printing).

    Example:
        >>> lines = ProgressLines("eval", "documents", total=5427)
        >>> for batch in batches:
        ...     lines.advance(len(batch))
        >>> lines.finish()
    """

    def __init__(
        self,
        tag: str,
        what: str,
        total: int = 0,
        *,
        unit: str = "texts",
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        out: TextIO | None = None,
    ) -> None:
        self.tag, self.what, self.total, self.unit = tag, what, int(total), unit
        self.every_s = progress_interval() if every_s is None else every_s
        self.clock = clock
        self.out = out
        self.started = self.last = clock()
        self.done = 0
        self.lines = 0

    def advance(self, count: int) -> None:
        """``count`` more units done; a line when the interval has passed since the last."""
        self.done += int(count)
        now = self.clock()
        if now - self.last >= self.every_s and (not self.total or self.done < self.total):
            self.last = now
            self._say(self._progress(now))

    def finish(self) -> None:
        """The phase's closing line, where it lasted an interval or printed progress (a
        short phase stays silent)."""
        seconds = self.clock() - self.started
        if not self.lines and (seconds < self.every_s or not self.done):
            return
        rate = f" ({self.done / seconds:,.0f} {self.unit}/s)" if seconds > 0 else ""
        self._say(f"{self.what}: {self.done:,} {self.unit} in {seconds:.0f} s{rate}")

    def _progress(self, now: float) -> str:
        seconds = now - self.started
        count = f"{self.done:,}/{self.total:,}" if self.total else f"{self.done:,}"
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        rate = f", {self.done / seconds:,.0f} {self.unit}/s" if seconds > 0 else ""
        return f"{self.what}: {count} {self.unit}{share}{rate}, {seconds:.0f} s"

    def _say(self, text: str) -> None:
        print(f"[{self.tag}] {text}", file=self.out or sys.stdout, flush=True)
        self.lines += 1


@contextlib.contextmanager
def counted(
    progress: ProgressLines,
    read: Callable[[], int],
    poll_s: float = 1.0,
    final: Callable[[], int] | None = None,
) -> Iterator[ProgressLines]:
    """Feed ``progress`` from ``read()`` (the units done so far, e.g. a Ray actor's count
    that workers add to) every ``poll_s`` while the block runs, then close it: the block
    itself only waits (a Ray Data execution). A ``read`` that fails costs a line, never the
    work.

    The closing line's count is ``final()`` where the block ended without an error and
    ``final`` is given (the count the finished work itself tells: workers' additions to a
    counter actor may still be on their way), else one more ``read()``. A phase too
    short for any line (:meth:`ProgressLines.finish`) does not wait for a read in flight:
    a counter actor still starting (a new worker process) would cost a short job seconds.
    """
    stop = threading.Event()
    seen = 0
    closed = False
    lock = threading.Lock()

    def poll() -> None:
        nonlocal seen
        try:
            now = int(read())
        except Exception:  # noqa: BLE001 - progress must never stop the work
            return
        with lock:
            if not closed:
                progress.advance(now - seen)
                seen = now

    def watch() -> None:
        while not stop.wait(poll_s):
            poll()

    watcher = threading.Thread(target=watch, name="santa-progress", daemon=True)
    watcher.start()
    completed = False
    try:
        yield progress
        completed = True
    finally:
        stop.set()
        exact = final is not None and completed
        if not exact and (
            progress.lines or progress.clock() - progress.started >= progress.every_s
        ):
            watcher.join(15)
            poll()  # the closing line's count
        with lock:
            closed = True  # a read still in flight no longer counts
            if exact:
                progress.done = int(final())
        progress.finish()
