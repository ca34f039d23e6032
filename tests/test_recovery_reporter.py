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


def test_an_unreachable_endpoint_ends_the_run_with_the_first_fault(tmp_path, capfd) -> None:
    """A worker's S3 endpoint that did not answer past santa's timeouts and attempts (issue
    40): not retried (a new worker group would wait the same timeouts, and its error would
    replace the first); the run ends with the first fault's line, exit 1."""
    from santa.runtime.errors import RUNTIME_FAULT
    from santa.runtime.storage import StorageError
    from santa.train.recovery import StorageUnreachableInWorker

    reporter = RecoveryReporter(str(tmp_path / "run"), max_failures=2)
    first = StorageError(
        "cannot reach the S3 endpoint http://127.0.0.1:9 to write s3://b/runs/r/metrics.jsonl "
        "(no answer in time)",
        transient=True,
    )
    with pytest.raises(StorageUnreachableInWorker) as raised:
        reporter.after_exception(None, {0: RuntimeError("gloo: connection reset"), 1: first})
    assert describe(raised.value) == (f"santa: error: {first}", RUNTIME_FAULT)
    import pickle

    # From Ray Train's controller to the driver (through a ControllerError): the same line.
    assert describe(pickle.loads(pickle.dumps(raised.value))) == describe(raised.value)
    assert reporter.failures == 0
    assert capfd.readouterr().err == ""


def test_pyarrows_network_error_counts_as_unreachable_and_a_missing_object_does_not() -> None:
    from santa.runtime.storage import StorageError, unreachable

    aws = OSError(
        "When uploading part for key 'runs/r/checkpoint_x/model.safetensors' in bucket 'b': "
        "AWS Error NETWORK_CONNECTION during UploadPart operation: curlCode: 28, Timeout was "
        "reached"
    )
    found = unreachable(aws)
    assert found is not None and "to write s3://b/runs/r/checkpoint_x/model.safetensors" in str(
        found
    )
    assert unreachable(StorageError("not found: s3://b/x")) is None
    assert unreachable(RuntimeError("CUDA error")) is None
