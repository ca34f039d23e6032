"""Early checks and storage faults: one line naming the URI, before any Ray work, in seconds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from santa.files import storage
from santa.files.storage import StorageError
from santa.jobs.errors import describe
from santa.jobs.preflight import check_beir, check_input, check_pairs, check_writable
from tests.training import stdlib_pair_rows, write_beir, write_pairs

REPO = Path(__file__).resolve().parents[1]


class SilentEndpoint:
    """A TCP server on loopback that accepts connections and never answers."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections.append(connection)  # held open, never read or answered

    def close(self) -> None:
        self.server.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture
def silent_endpoint():
    server = SilentEndpoint()
    yield server
    server.close()


def _job(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    full["PYTHONPATH"] = str(REPO)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=REPO,
        timeout=300,
    )


def _in_process(monkeypatch, capfd, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module *args`` as a library call (``main(argv)``), from this repository's
    folder as ``_job``: the same checks and line without a Python of its own to start (3-5 s
    each); what it printed (file descriptors 1 and 2) and returned. It must not start Ray."""
    import importlib

    from santa.cluster import ray_utils

    started: list = []
    monkeypatch.setattr(ray_utils, "init_ray", lambda *a, **k: started.append(a) or "")
    monkeypatch.chdir(REPO)
    capfd.readouterr()
    code = importlib.import_module(module).main(list(args))
    out, err = capfd.readouterr()
    assert started == [], err
    return subprocess.CompletedProcess([module, *args], code, out, err)


@pytest.fixture(scope="module", autouse=True)
def silent_preprocess_cli(tmp_path_factory):
    """The preprocess command line writing to a silent S3 endpoint, santa's default timeouts:
    ~20 s of waiting on a socket (no CPU), started with the module so that its other tests
    run meanwhile; the last test of the file reads it. ``{"proc", "seconds", "endpoint"}``
    once the thread is joined."""
    server = SilentEndpoint()
    source = tmp_path_factory.mktemp("silent-source")
    (source / "mod.py").write_text('def f():\n    """Doc."""\n    return 1\n')
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env.update(PYTHONPATH=str(REPO), AWS_ENDPOINT_URL=server.endpoint)
    args = ["ray_jobs.preprocess", "--dataset", "source", "--input", str(source)]
    args += ["--output", "s3://santa-silent/out"]
    started = time.monotonic()
    job = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    outcome: dict = {"endpoint": server.endpoint}

    def wait() -> None:
        stdout, stderr = job.communicate()
        outcome["seconds"] = time.monotonic() - started
        outcome["proc"] = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    yield waiter, outcome
    if job.poll() is None:  # its test was not selected
        job.kill()
    waiter.join(timeout=30)
    server.close()


def _one_line(proc: subprocess.CompletedProcess, code: int, start: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(start), lines[0]
    assert "Ray:" not in proc.stdout  # refused before starting Ray
    return lines[0]


def test_local_output_checks(tmp_path):
    check_writable(str(tmp_path / "new" / "deeper"))  # not made yet: its parent is probed
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match=r"cannot write the --output .*/file/out: .* is a file"):
        check_writable(str(tmp_path / "file" / "out"), "--output")
    with pytest.raises(StorageError, match="unsupported --to URI 'gs://b/x'"):
        check_writable("gs://b/x", "--to")


def test_missing_inputs_pairs_and_beir(tmp_path):
    with pytest.raises(StorageError, match=f"no --input at {tmp_path}/nothing"):
        check_input(str(tmp_path / "nothing"), "--input")
    with pytest.raises(StorageError, match="holds no preprocessed pairs"):
        check_pairs(str(tmp_path))
    check_pairs(write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:4]))
    beir = write_beir(tmp_path / "beir", stdlib_pair_rows()[:4], split="valid")
    check_beir(beir, "valid")
    with pytest.raises(StorageError, match=r"--eval-data: .* has no qrels/test.tsv"):
        check_beir(beir, "test")


def test_s3_missing_bucket_is_bad_input_naming_the_uri(moto_s3):
    with pytest.raises(StorageError) as caught:
        check_writable("s3://santa-no-such-bucket/out", "--output")
    line, code = describe(caught.value)
    assert line == (
        "santa: error: cannot write the --output s3://santa-no-such-bucket/out: "
        "no such bucket: s3://santa-no-such-bucket"
    )
    assert code == 2
    bucket = moto_s3.create_bucket("santa-probe")
    check_writable(f"{bucket}/out")
    assert storage.list_files(bucket) == []  # the probe was deleted


def test_s3_bad_credentials_are_bad_input(monkeypatch):
    from tests.test_export import AuthMotoServer

    server = AuthMotoServer()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
        with pytest.raises(StorageError) as caught:
            check_writable("s3://santa-auth/out", "--output")
        line, code = describe(caught.value)
        assert code == 2 and "access denied to s3://santa-auth" in line, line
        assert "wrong-secret" not in line and server.key_id not in line
    finally:
        server.stop()


def test_silent_s3_endpoint_fails_in_seconds(silent_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", silent_endpoint.endpoint)
    monkeypatch.setenv("SANTA_S3_READ_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        storage.read_bytes("s3://santa-silent/data/x.json")
    assert time.monotonic() - started < 10
    line, code = describe(caught.value)
    assert line == (
        f"santa: error: cannot reach the S3 endpoint {silent_endpoint.endpoint} to read "
        "s3://santa-silent/data/x.json (no answer in time)"
    )
    assert code == 1  # a fault at run time, not bad input


def test_default_timeouts_are_bounded():
    assert storage.S3_CONNECT_TIMEOUT_S <= 10 and storage.S3_REQUEST_TIMEOUT_S <= 60
    assert 1 <= storage.S3_MAX_ATTEMPTS <= 3


def test_preprocess_cli_missing_bucket_before_ray(moto_s3, tmp_path):
    (tmp_path / "mod.py").write_text('def f():\n    """Doc."""\n    return 1\n')
    proc = _job(
        "ray_jobs.preprocess",
        "--dataset",
        "source",
        "--input",
        str(tmp_path),
        "--output",
        "s3://santa-missing-bucket/out",
    )
    _one_line(proc, 2, "santa: error: cannot write the --output s3://santa-missing-bucket/out")


def test_sweep_with_missing_eval_data_fails_before_any_trial(tmp_path, monkeypatch, capfd):
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    started = time.monotonic()
    proc = _in_process(
        monkeypatch,
        capfd,
        "tuning.sweep",
        "--data",
        data,
        "--eval-data",
        str(tmp_path / "no-dev"),
        "--storage",
        str(tmp_path / "sweeps"),
        "--max-steps",
        "2",
    )
    line = _one_line(proc, 2, "santa: error: no --eval-data at ")
    assert "no-dev" in line and time.monotonic() - started < 60
    assert not (tmp_path / "sweeps").exists()


def test_train_cli_missing_data_and_unwritable_storage(tmp_path):
    common = ("--storage", str(tmp_path / "runs"), "--name", "x", "--max-steps", "1")
    proc = _job("ray_jobs.pretrain", "--data", str(tmp_path / "none"), *common)
    _one_line(proc, 2, f"santa: error: no --data at {tmp_path / 'none'}")
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    (tmp_path / "blocker").write_text("a file")
    proc = _job(
        "ray_jobs.finetune", "--data", data, "--storage", str(tmp_path / "blocker" / "runs"),
        "--name", "x",
    )  # fmt: skip
    _one_line(proc, 2, "santa: error: cannot write the --storage ")


def test_bad_timeout_setting_is_named(monkeypatch):
    monkeypatch.setenv("SANTA_S3_READ_TIMEOUT", "soon")
    with pytest.raises(StorageError, match="SANTA_S3_READ_TIMEOUT must be a number of seconds"):
        storage.resolve("s3://santa-settings/x")


def test_mine_negatives_and_finetune_warm_start_fail_before_work(tmp_path, monkeypatch, capfd):
    proc = _in_process(
        monkeypatch, capfd, "ray_jobs.mine_negatives", "--checkpoint", str(tmp_path / "model"),
        "--data", str(tmp_path / "none"), "--output", str(tmp_path / "neg"),
    )  # fmt: skip
    _one_line(proc, 2, f"santa: error: no --data at {tmp_path / 'none'}")
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    proc = _in_process(
        monkeypatch, capfd, "ray_jobs.finetune", "--data", data, "--storage",
        str(tmp_path / "runs"), "--name", "x",
        "--init-checkpoint", str(tmp_path / "typo" / "model"),
    )  # fmt: skip
    line = _one_line(proc, 2, "santa: error: ")
    assert str(tmp_path / "typo" / "model") in line


def test_unreachable_s3_stays_a_runtime_fault_through_checkpoint_errors(
    silent_endpoint, monkeypatch
):
    from santa.models import checkpoints

    monkeypatch.setenv("AWS_ENDPOINT_URL", silent_endpoint.endpoint)
    monkeypatch.setenv("SANTA_S3_READ_TIMEOUT", "1")
    with pytest.raises(checkpoints.CheckpointError) as caught:
        checkpoints.latest_checkpoint("s3://santa-silent/runs/r")
    line, code = describe(caught.value)
    assert code == 1 and line.startswith("santa: error: cannot reach the S3 endpoint"), line


@pytest.mark.slow
def test_preprocess_cli_silent_endpoint_with_default_timeouts(silent_preprocess_cli):
    """Last in the file: its job (``silent_preprocess_cli``) ran beside the tests above."""
    waiter, outcome = silent_preprocess_cli
    waiter.join(timeout=300)
    line = _one_line(outcome["proc"], 1, "santa: error: cannot reach the S3 endpoint")
    assert "s3://santa-silent/out" in line
    assert outcome["seconds"] < 60
