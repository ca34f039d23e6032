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
