"""CI's time budget for the long tests (issue 39): under SANTA_CI_DEADLINE they run last, in
an order drawn from the day, and one that would not end in time is skipped with the reason."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, budget_order, budget_skip_reason, budget_slack, long_seconds


class Item:
    """What the budget reads of a collected test: its id and its ``long`` marker."""

    def __init__(self, nodeid: str, seconds: float | None) -> None:
        self.nodeid = nodeid
        self.marker = None if seconds is None else pytest.mark.long(seconds=seconds).mark

    def get_closest_marker(self, name: str):
        return self.marker if name == "long" else None


def test_long_tests_go_last_in_an_order_drawn_from_the_day() -> None:
    items = [Item("a::quick", None), Item("b::long1", 60), Item("c::quick", None)]
    items += [Item(f"d::long{i}", 60 + i) for i in range(2, 9)]
    orders = {day: budget_order(items, day) for day in range(740_000, 740_010)}
    for order in orders.values():
        assert [i.nodeid for i in order[:2]] == ["a::quick", "c::quick"]
        assert sorted(i.nodeid for i in order[2:]) == sorted(
            i.nodeid for i in items[1:2] + items[3:]
        )
    assert budget_order(items, 740_000) == orders[740_000]  # the same day, the same order
    assert len({tuple(i.nodeid for i in order) for order in orders.values()}) > 5
    assert long_seconds(items[1]) == 60 and long_seconds(items[0]) is None


def test_a_long_test_runs_only_if_it_ends_in_time_with_its_slack() -> None:
    assert budget_skip_reason("t", 100, now=1000, deadline=1200) is None
    reason = budget_skip_reason("test_x", 100, now=1000, deadline=1199)
    assert reason.startswith("CI's time budget: 3.3 min left, test_x takes ~100 s")
    assert "python -m pytest -m long" in reason
    assert "0.0 min left" in budget_skip_reason("t", 100, now=2000, deadline=1000)
    assert budget_skip_reason("t", 100, now=1000, deadline=1130, slack=1.25) is None


def test_the_slack_follows_how_fast_the_long_tests_ran_here() -> None:
    assert budget_slack([]) == 2.0  # before any has run
    assert budget_slack([0.9, 1.2]) == pytest.approx(1.5)  # the slowest, with a margin
    assert budget_slack([0.3]) == 1.0  # never less than the declared seconds
    assert budget_slack([2.4]) == pytest.approx(3.0)  # a slow machine


def test_past_the_deadline_every_long_test_is_skipped_with_the_reason() -> None:
    pattern = re.compile(r"^@pytest\.mark\.long\(", re.MULTILINE)
    files = [p for p in (REPO / "tests").glob("*.py") if p.name != Path(__file__).name]
    counts = {p: len(pattern.findall(p.read_text())) for p in files}
    marked = sum(counts.values())
    # Only the files with long tests: collecting the whole suite took most of this test.
    env = dict(os.environ, SANTA_CI_DEADLINE=str(time.time() + 20))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "long", "-p", "no:cacheprovider"]
        + sorted(str(p.relative_to(REPO)) for p, n in counts.items() if n),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("CI's time budget" in line for line in skipped), proc.stdout[-3000:]
    assert f" {marked} skipped" in proc.stdout.splitlines()[-1] and " passed" not in proc.stdout
    assert "for the long tests (SANTA_CI_DEADLINE)" in proc.stdout  # the run's header
    # Each skip names its test.
    assert "test_an_elastic_run_goes_on_with_the_worker_left" in proc.stdout


LONG_TEST = """
import time

import pytest


@pytest.mark.long(seconds=1)
def test_{name}():
    time.sleep(4)
"""


def test_a_machine_slower_than_declared_gets_more_slack_for_the_next_test(tmp_path) -> None:
    """Two long tests each declared at 1 s take 4 s: the first runs (8 s left, 2 s needed);
    the second, with ~3.7 s left, would run at the first guess of twice its seconds but is
    skipped at 1.25 times the ratio seen (5 s)."""
    conftest = (REPO / "tests" / "conftest.py").read_text()
    deadline = "import os, time\nos.environ['SANTA_CI_DEADLINE'] = str(time.time() + 8)\n"
    future = "from __future__ import annotations\n"
    (tmp_path / "conftest.py").write_text(conftest.replace(future, future + deadline, 1))
    for name in ("first", "second"):
        (tmp_path / f"test_{name}.py").write_text(LONG_TEST.format(name=name))
    env = {k: v for k, v in os.environ.items() if k != "SANTA_CI_DEADLINE"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "1 passed, 1 skipped" in proc.stdout.splitlines()[-1], proc.stdout[-3000:]
    assert "takes ~1 s" in proc.stdout
