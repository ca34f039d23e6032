"""One error line per failure, with the exit code saying whose fault it was."""

from __future__ import annotations

import pytest

from santa.runtime.errors import BAD_INPUT, RUNTIME_FAULT, describe, run_job
from santa.runtime.storage import StorageError


def _raise(error: BaseException):
    def main() -> int:
        raise error

    return main


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (ValueError("bad --max-steps 0 (must be positive)"), BAD_INPUT, "bad --max-steps 0"),
        (FileNotFoundError("no such corpus: /x/y"), BAD_INPUT, "no such corpus: /x/y"),
        (StorageError("no bucket 'b' (s3://b/x)"), BAD_INPUT, "no bucket 'b' (s3://b/x)"),
        (RuntimeError("training failed\nwith details"), RUNTIME_FAULT, "RuntimeError: training"),
    ],
)
def test_errors_become_one_line(capsys, monkeypatch, error, code, line) -> None:
    monkeypatch.delenv("SANTA_DEBUG", raising=False)
    assert run_job(_raise(error), argv=[]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("santa: error: ") and line in err
    assert "Traceback" not in err


def test_debug_keeps_the_traceback(capsys) -> None:
    assert run_job(_raise(ValueError("bad")), argv=["--debug"]) == BAD_INPUT
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("santa: error: bad")


def test_ray_wrapped_errors_show_their_cause() -> None:
    from ray.exceptions import RayTaskError

    wrapped = RayTaskError(
        "read", "Traceback (most recent call last):\n  ...", ValueError("corpus s3://b/c is empty")
    )
    line, code = describe(wrapped.as_instanceof_cause())
    assert (line, code) == ("santa: error: corpus s3://b/c is empty", BAD_INPUT)


def test_success_and_interrupt(capsys) -> None:
    assert run_job(lambda: None, argv=[]) == 0
    assert run_job(_raise(KeyboardInterrupt()), argv=[]) == 130
    assert capsys.readouterr().err == "santa: interrupted\n"
