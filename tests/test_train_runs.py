"""The suite's own count of Ray Train runs (tests/train_runs.py): each run goes to the test
whose span holds its time."""

from __future__ import annotations

from tests.train_runs import attribute


def test_each_run_is_the_test_running_then_and_one_outside_every_test_is_named(tmp_path):
    runs = tmp_path / "runs.txt"
    runs.write_text("10.5 1\n11.0 2\n20.0 3\n30.0 4\n")
    spans = [("a.py::one", 10.0, 12.0), ("a.py::two", 12.5, 25.0)]
    assert attribute(str(runs), spans) == {"a.py::one": 2, "a.py::two": 1, "?": 1}
