"""One error line per failure, with the exit code saying whose fault it was."""

from __future__ import annotations

import pytest

from santa.files.storage import StorageError
from santa.jobs.errors import BAD_INPUT, RUNTIME_FAULT, describe, run_job


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


def test_worker_group_errors_show_the_failing_workers_cause() -> None:
    """Ray Train's WorkerGroupError holds each rank's exception (with its traceback as a
    string): the line is the root cause and names the file, not 'WorkerGroupError: ...:'."""
    from ray.train import ControllerError, WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    cause = ValueError("cannot load checkpoint /r/model/model.safetensors: invalid header length")
    wrapped = UserExceptionWithTraceback(cause, "Traceback (most recent call last):\n  ...")
    error = WorkerGroupError("Worker 1 failed", {1: wrapped, 3: RuntimeError("other")})
    assert describe(error) == (f"santa: error: {cause}", BAD_INPUT)
    controller = ControllerError(
        StorageError("cannot write s3://b/r/checkpoint_1: timed out", transient=True)
    )
    assert describe(controller) == (
        "santa: error: cannot write s3://b/r/checkpoint_1: timed out",
        RUNTIME_FAULT,
    )


def test_a_dead_worker_process_is_one_line_naming_it() -> None:
    from ray.exceptions import ActorDiedError

    text = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker\n"
        "\tactor_id: 1234\n\tpid: 4242\n\tname: x\n\tnamespace: y\n\tip: 10.0.0.7\n"
        "The actor is dead because its worker process has died. Worker exit type: "
        "UNEXPECTED_SYSTEM_EXIT Worker exit detail: Worker unexpectedly exits with a "
        "connection error code 2. End of LogMonitorForMsgs."
    )
    error = ActorDiedError()
    error.error_msg = text
    error.args = (text,)
    line, code = describe(error)
    assert code == RUNTIME_FAULT
    assert line == (
        "santa: error: a training worker died (pid 4242 on 10.0.0.7): Worker unexpectedly "
        "exits with a connection error code 2"
    )


def test_the_dead_worker_is_the_cause_not_its_peers_collective_errors() -> None:
    """A node lost: the worker on it died, and the others fail in gloo's collectives."""
    from ray.exceptions import ActorDiedError
    from ray.train import WorkerGroupError

    died = ActorDiedError()
    died.error_msg = "\tclass_name: RayTrainWorker\n\tpid: 77\n\tip: 10.0.0.8\nnode died"
    died.args = (died.error_msg,)
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    line, code = describe(WorkerGroupError("workers failed", {0: gloo, 1: died}))
    assert line == "santa: error: a training worker died (pid 77 on 10.0.0.8): its node died"
    assert code == RUNTIME_FAULT


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("worker died")])
def test_worker_lines_stop_before_the_jobs_last_line(error, capsys) -> None:
    """Ray forwards what workers print to the driver seconds late (a progress line after
    Ctrl-C's line): the job stops that forwarding before its own last line."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    seen: list[str] = []
    dispatcher.add_handler("ray_print_logs", lambda data: seen.append(data["line"]))
    try:
        dispatcher.emit({"line": "[train] step 5/12"})
        run_job(_raise(error), argv=[])
        dispatcher.emit({"line": "[train] step 10/12"})  # arrives after the job's line
    finally:
        dispatcher.remove_handler("ray_print_logs")
    assert seen == ["[train] step 5/12"]
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("santa: ")


def test_a_placement_timeout_states_the_whole_wait_as_a_user_reads_it(monkeypatch) -> None:
    """Ray Train giving up on its workers: the line states the whole wait santa allowed
    (one wait per try), in minutes once it is long: the default is 5 min."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    from santa.cluster.placement import PLACEMENT_RETRIES_ENV, WAIT_ENV

    monkeypatch.delenv(WAIT_ENV, raising=False)
    monkeypatch.delenv(PLACEMENT_RETRIES_ENV, raising=False)
    line, code = describe(WorkerGroupStartupTimeoutError(num_workers=2))
    assert "could not place 2 training workers within 5 min (a node lost" in line, line
    assert code == RUNTIME_FAULT
    monkeypatch.setenv(WAIT_ENV, "20")
    monkeypatch.setenv(PLACEMENT_RETRIES_ENV, "1")
    line, _ = describe(WorkerGroupStartupTimeoutError(num_workers=2))
    assert "within 40 s (a node lost" in line, line
