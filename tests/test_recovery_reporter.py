"""The recovery line of Ray Train's controller (issue 33): one ``santa: warning`` per failure
it recovers from; a failure on bad input is not retried (it would fail the same way)."""

from __future__ import annotations

import pytest

from santa.runtime.errors import BAD_INPUT, describe
from santa.train.recovery import BadInputInWorker, RecoveryReporter


def test_a_failure_on_bad_input_ends_the_run_with_its_message(tmp_path, capfd) -> None:
    reporter = RecoveryReporter(str(tmp_path / "run"), max_failures=2)
    problem = ValueError("the negatives table names documents not in /data/pairs: 'no-such-doc'")
    with pytest.raises(BadInputInWorker) as raised:
        reporter.after_exception(None, {1: RuntimeError("gloo: connection reset"), 0: problem})
    assert describe(raised.value) == (
        "santa: error: the negatives table names documents not in /data/pairs: 'no-such-doc'",
        BAD_INPUT,
    )
    assert reporter.failures == 0
    assert capfd.readouterr().err == ""  # the job's error line is the only one


def test_a_runtime_failure_is_retried_with_one_line(tmp_path, capfd) -> None:
    reporter = RecoveryReporter(str(tmp_path / "run"), max_failures=2)
    reporter.after_exception(None, {0: RuntimeError("CUDA error: an illegal memory access")})
    assert capfd.readouterr().err == (
        "santa: warning: training worker rank 0 failed: RuntimeError: CUDA error: an illegal "
        "memory access; training resumes from the start once its workers fit (waiting up to "
        "60 s) (retry 1 of 2)\n"
    )
    reporter.after_exception(None, {0: RuntimeError("again")})
    reporter.after_exception(None, {0: RuntimeError("past the retries")})
    assert reporter.failures == 3
    assert capfd.readouterr().err.count("santa: warning") == 1  # the last one: the job's line
