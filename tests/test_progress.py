"""santa's progress lines for long phases (santa/jobs/progress.py): one line per interval
with the count, share and rate, a closing line where any was printed, silence for a short
phase."""

from __future__ import annotations

import io

from santa.jobs.progress import ProgressLines


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_every_interval_and_a_closing_line():
    clock, out = Clock(), io.StringIO()
    lines = ProgressLines("eval", "documents", total=1000, every_s=15, clock=clock, out=out)
    for _ in range(10):  # 100 texts every 5 s
        clock.now += 5
        lines.advance(100)
    lines.finish()
    assert out.getvalue().splitlines() == [
        "[eval] documents: 300/1,000 texts (30%), 20 texts/s, 15 s",
        "[eval] documents: 600/1,000 texts (60%), 20 texts/s, 30 s",
        "[eval] documents: 900/1,000 texts (90%), 20 texts/s, 45 s",
        "[eval] documents: 1,000 texts in 50 s (20 texts/s)",
    ]


def test_a_short_phase_prints_nothing_and_an_unknown_total_no_share():
    clock, out = Clock(), io.StringIO()
    short = ProgressLines("eval", "queries", total=50, every_s=15, clock=clock, out=out)
    clock.now += 3
    short.advance(50)
    short.finish()
    assert out.getvalue() == ""
    open_ended = ProgressLines("preprocess", "rows", every_s=15, unit="rows", clock=clock, out=out)
    clock.now += 20
    open_ended.advance(4096)
    assert out.getvalue() == "[preprocess] rows: 4,096 rows, 205 rows/s, 20 s\n"


def test_counted_closes_a_short_phase_without_waiting_for_a_slow_read():
    """A counter still starting (a Ray actor's new process) does not hold a short phase; a
    phase that prints lines reads once more for its closing line's count."""
    import threading
    import time

    from santa.jobs.progress import counted

    release = threading.Event()
    out = io.StringIO()
    short = ProgressLines("preprocess", "rows", every_s=15, unit="rows", out=out)
    started = time.monotonic()
    with counted(short, lambda: release.wait(10) and 7, poll_s=0.01):
        time.sleep(0.05)  # the first read is in flight, blocked
    assert time.monotonic() - started < 2 and out.getvalue() == ""
    release.set()
    time.sleep(0.05)  # the read in flight returns after the phase: it counts for nothing
    assert short.done == 0 and out.getvalue() == ""

    count = iter(range(1, 1000))
    lines = ProgressLines("preprocess", "rows", every_s=0, unit="rows", out=out)
    with counted(lines, lambda: next(count) * 10, poll_s=0.01):
        time.sleep(0.05)
    closing = out.getvalue().splitlines()[-1]
    assert closing.startswith(f"[preprocess] rows: {lines.done} rows in ")
    assert lines.done == 10 * (next(count) - 1)  # the last read counted


def test_counted_closes_with_the_count_the_finished_work_tells():
    """Workers' additions to a counter may still be on their way when the work ends: the
    closing line takes ``final()``, where the block ended without an error."""
    import pytest

    from santa.jobs.progress import counted

    out = io.StringIO()
    lines = ProgressLines("preprocess", "files", total=8, every_s=0, unit="files", out=out)
    with counted(lines, lambda: 0, poll_s=0.01, final=lambda: 8):
        pass
    assert out.getvalue().splitlines()[-1].startswith("[preprocess] files: 8 files in ")
    failed = ProgressLines("preprocess", "files", total=8, every_s=0, unit="files", out=out)
    with pytest.raises(RuntimeError), counted(failed, lambda: 3, final=lambda: 8):
        raise RuntimeError("the work failed")
    assert failed.done == 3  # a failed block's count is what was read, not the total
