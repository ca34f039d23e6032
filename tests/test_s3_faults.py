"""S3 lost mid-run (issue 33): an endpoint that goes silent (moto's server stopped by its PID)
during a Ray Data read, and during a training run's checkpoint uploads, ends within santa's
timeouts in one line naming the URI; nothing half-written is left in a finished run, and the
re-run resumes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from santa.files import storage
from santa.jobs.errors import describe
from tests.conftest import MotoServer
from tests.training import stdlib_pair_rows, write_pairs

REPO = Path(__file__).resolve().parents[1]
TIMEOUTS = {"SANTA_S3_CONNECT_TIMEOUT": "2", "SANTA_S3_READ_TIMEOUT": "3"}


@pytest.fixture
def own_moto():
    """A moto server of this test's own (stopping it must not stop the session's)."""
    server = MotoServer()
    yield server
    os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


def _job_env(server: MotoServer, **extra: str) -> dict[str, str]:
    """A job subprocess's environment: this test's moto, its keys, santa's default S3
    timeouts unless ``extra`` sets them, no cluster address or debug of the caller's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "SANTA_DEBUG") and not k.startswith("SANTA_S3_")
    }
    env.update(
        PYTHONPATH=str(REPO),
        AWS_ENDPOINT_URL=server.endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        RAY_DATA_DISABLE_PROGRESS_BARS="1",
        **extra,
    )
    return env


def _upload_pairs(server: MotoServer, tmp_path: Path, bucket: str) -> str:
    local = Path(write_pairs(tmp_path / "pairs", stdlib_pair_rows()))
    client = server.client()
    client.create_bucket(Bucket=bucket)
    body = io.BytesIO((local / "data" / "part-0.parquet").read_bytes())
    client.upload_fileobj(body, bucket, "pairs/data/part-0.parquet")
    return f"s3://{bucket}/pairs"


def test_a_silent_endpoint_while_a_worker_reads_its_rows_ends_in_one_line(
    own_moto, tmp_path, monkeypatch
):
    """A worker building its node's row file from S3 pairs reads through santa's S3
    filesystem (its timeouts): an endpoint that goes silent fails the build within them,
    named by its URI, and leaves no half-written row file."""
    from santa.train.data import pairs_source
    from santa.train.rows import open_rows

    env = {**TIMEOUTS, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    for name, value in {**env, "AWS_ENDPOINT_URL": own_moto.endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    uri = _upload_pairs(own_moto, tmp_path, "silent-read")
    source = pairs_source(uri)
    os.kill(own_moto.process.pid, signal.SIGSTOP)  # silent: connections hang, nothing answers
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as failed:  # noqa: B017 - the cause, described below
            open_rows(source, str(tmp_path / "rows"))
    finally:
        os.kill(own_moto.process.pid, signal.SIGCONT)
    seconds = time.monotonic() - started
    line, code = describe(failed.value)
    assert code == 1, line
    assert line.startswith(
        f"santa: error: cannot reach the S3 endpoint {own_moto.endpoint} to read"
    )
    assert f"{uri}/data/part-0.parquet" in line
    assert seconds < 60, seconds  # connect 2 s + request 3 s per attempt, not minutes
    assert not list((tmp_path / "rows").glob("*.arrow*"))


def _upload_code(server: MotoServer, bucket: str, files: int = 4) -> str:
    """A CodeSearchNet layout of ``files`` gzipped JSON-lines files on moto; its URI."""
    import gzip

    from bench.corpora import stdlib_python_records

    body = gzip.compress(
        "".join(json.dumps(r) + "\n" for r in stdlib_python_records(limit=400)).encode()
    )
    client = server.client()
    client.create_bucket(Bucket=bucket)
    for k in range(files):
        key = f"csn/python/final/jsonl/train/python_train_{k}.jsonl.gz"
        client.put_object(Bucket=bucket, Key=key, Body=body)
    return f"s3://{bucket}/csn"


def test_a_silent_endpoint_while_reading_json_lines_is_a_fault_not_a_corrupt_file(
    own_moto, monkeypatch
):
    """Issue 40: the JSON-lines reader of Ray Data's read tasks counted an S3 endpoint that
    stopped answering as a corrupt file (0 rows kept) and preprocess published what the
    other files held, exit 0. It raises the one-line storage fault instead."""
    from santa.data.readers import read_lines_part
    from santa.files.storage import StorageError

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", own_moto.endpoint)
    for name, value in {**TIMEOUTS, "SANTA_S3_READ_TIMEOUT": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SANTA_S3_MAX_ATTEMPTS", "1")
    uri = f"{_upload_code(own_moto, 'silent-lines', files=1)}/python/final/jsonl/train"
    path = f"{uri}/python_train_0.jsonl.gz"
    (whole,) = read_lines_part(path, "train", 0, 1, 1000)  # one block: every line, read
    assert whole.num_rows > 100 and set(whole.column("drop_reason").to_pylist()) == {""}
    os.kill(own_moto.process.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(StorageError) as failed:
        list(read_lines_part(path, "train", 0, 1, 1000))
    assert failed.value.transient
    assert str(failed.value) == (
        f"cannot reach the S3 endpoint {own_moto.endpoint} to read {path} (no answer in time)"
    )
    assert time.monotonic() - started < 30


def test_a_silent_endpoint_while_publishing_leaves_the_staging_folder_alone(
    own_moto, monkeypatch, caplog
):
    """Issue 40: an output staged on S3 whose endpoint stops answering ended after the
    write's timeouts and then those of deleting the staging folder (65 s for preprocess,
    a warning before its line); the delete is not tried (the next run clears what is left)."""
    from santa.files.outputs import staged_output
    from santa.files.storage import StorageError

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", own_moto.endpoint)
    for name, value in {**TIMEOUTS, "SANTA_S3_READ_TIMEOUT": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SANTA_S3_MAX_ATTEMPTS", "1")
    own_moto.create_bucket("silent-publish")
    with pytest.raises(StorageError) as failed, staged_output("s3://silent-publish/out") as staged:
        os.kill(own_moto.process.pid, signal.SIGSTOP)
        storage.write_json(storage.join(staged.staging, "report.json"), {})
    assert failed.value.transient and "to write s3://silent-publish/out/" in str(failed.value)
    assert "could not delete the staging folder" not in caplog.text


def _time_a_call(filesystem, path: str) -> float:
    started = time.perf_counter()
    with pytest.raises(OSError, match="AWS Error"):
        filesystem.get_file_info(path)
    return time.perf_counter() - started


def test_ray_processes_get_santas_attempts_on_a_silent_endpoint(own_moto, ray_cluster, monkeypatch):
    """santa's S3 filesystem, pickled into a Ray task (as Ray Data and Ray Train carry it),
    still makes ``SANTA_S3_MAX_ATTEMPTS`` attempts: pyarrow's own pickle dropped them (3)."""
    import ray

    own_moto.create_bucket("silent-attempts")
    monkeypatch.setenv("AWS_ENDPOINT_URL", own_moto.endpoint)
    for name, value in (("ACCESS_KEY_ID", "testing"), ("SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(f"AWS_{name}", value)
    monkeypatch.setenv("SANTA_S3_CONNECT_TIMEOUT", "1")
    monkeypatch.setenv("SANTA_S3_READ_TIMEOUT", "2")
    monkeypatch.setenv("SANTA_S3_MAX_ATTEMPTS", "1")
    path, filesystem = storage.for_ray("s3://silent-attempts/key")
    os.kill(own_moto.process.pid, signal.SIGSTOP)  # connections hang, nothing answers
    # One attempt: the read timeout once (2 s); three would be 6 s and their backoff.
    assert _time_a_call(filesystem, path) < 4.5
    in_ray = ray.get(ray.remote(num_cpus=0)(_time_a_call).remote(filesystem, path))
    assert in_ray < 4.5, f"{in_ray:.1f} s in a Ray task: more attempts than santa's"


def test_a_ray_data_write_to_s3_creates_no_directories(moto_s3, ray_cluster):
    """Ray Data's Parquet writes to S3 create no directories: pyarrow's ``create_dir`` wrote
    marker objects (``out/``) from the driver and, in every write task, probed the bucket
    twice before the upload; against a silent endpoint that doubled the time to fail
    (a silent server logging each request showed the two probes)."""
    import ray.data

    moto_s3.create_bucket("no-dirs")
    path, sink = storage.for_ray_write("s3://no-dirs/out/data")
    ray.data.from_items([{"x": i} for i in range(10)]).write_parquet(path, **sink)
    listed = moto_s3.client().list_objects_v2(Bucket="no-dirs").get("Contents", [])
    keys = [item["Key"] for item in listed]
    assert keys and all(key.startswith("out/data/") and key.endswith(".parquet") for key in keys)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_silent_endpoint_during_a_preprocess_read_ends_the_job_in_the_bound(
    own_moto, tmp_path, monkeypatch
):
    """Issue 40: ray_jobs.preprocess reading s3:// JSON lines, moto stopped once Ray Data's
    readers (fused into the parser tasks) start: with santa's default timeouts (connect 5 s,
    read 10 s, 2 attempts) the job ends within (5 + 10) x 2 s and a few more, exit 1, its
    last line the santa line naming the file read; nothing is published."""
    import psutil

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    data = _upload_code(own_moto, "silent-preprocess")
    output = tmp_path / "out"
    args = [
        sys.executable, "-m", "ray_jobs.preprocess", "--dataset", "codesearchnet",
        "--input", data, "--output", str(output), "--address", "local",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_job_env(own_moto)
    )
    stopped = None
    deadline = time.monotonic() + 300
    while stopped is None and proc.poll() is None and time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "build_code_pairs" in " ".join(child.cmdline()):  # a read task running
                    os.kill(own_moto.process.pid, signal.SIGSTOP)
                    stopped = time.monotonic()
                    break
        time.sleep(0.2)
    stdout, stderr = proc.communicate(timeout=300)
    assert stopped is not None, stderr[-3000:]
    seconds = time.monotonic() - stopped
    assert proc.returncode == 1, stdout + stderr[-3000:]
    terminal = [line for line in (stdout + stderr).splitlines() if line.strip()]
    errors = [line for line in stderr.splitlines() if line.startswith("santa: error:")]
    assert len(errors) == 1 and terminal[-1] == errors[0], stdout + stderr
    assert errors[0].startswith(
        f"santa: error: cannot reach the S3 endpoint {own_moto.endpoint} to read {data}/python/"
    ), errors[0]
    assert not output.exists()
    print(f"paused -> exit: {seconds:.1f} s; {errors[0]}")
    assert seconds < (5 + 10) * 2 + 15, seconds


@pytest.fixture(scope="module")
def silent_training(tmp_path_factory) -> dict:
    """One pretrain job on S3 whose endpoint goes silent mid-run, then the same command once
    it answers again: what both tests below read (one job less than a run each, ~60 s).

    santa's default timeouts (connect 5 s, read 10 s, 2 attempts) and --max-failures, a
    checkpoint every step; moto is stopped once step 4 is printed: step 1's checkpoint is
    registered by then (a report waits for the poll that takes the one before it, so step
    3's report, returned before step 4, means step 2's report was taken after step 1's
    checkpoint was registered) and every later step uploads one."""
    server = MotoServer()
    bucket = "silent-train"
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AWS_ENDPOINT_URL", server.endpoint)  # this fixture's reads too
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                patch.setenv(name, "testing")
            for name in [name for name in os.environ if name.startswith("SANTA_S3_")]:
                patch.delenv(name)  # santa's defaults here too
            data = _upload_pairs(server, tmp_path_factory.mktemp("silent-train"), bucket)
            env = _job_env(server)  # santa's default timeouts
            args = [
                sys.executable, "-m", "ray_jobs.pretrain", "--data", data,
                "--storage", f"s3://{bucket}/runs", "--name", "r", "--recipe", "tiny-ci",
                "--num-workers", "1", "--cpus-per-worker", "0.5",
                "--set", "train.log_every=1", "--set", "train.checkpoint_every=1",
                "--max-steps", "12", "--address", "local",
            ]  # fmt: skip
            proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            stopped = None
            for line in proc.stdout:
                if line.startswith("[train] step 4/"):
                    os.kill(server.process.pid, signal.SIGSTOP)
                    stopped = time.monotonic()
                    break
            _, stderr = proc.communicate(timeout=400)
            seconds = None if stopped is None else time.monotonic() - stopped
            os.kill(server.process.pid, signal.SIGCONT)
            cut = {"returncode": proc.returncode, "stderr": stderr, "seconds": seconds}
            print(f"paused -> exit: {seconds} s; {stderr.strip().splitlines()[:1]}")

            rerun = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
            run = f"s3://{bucket}/runs/r"
            snapshot = storage.read_json(f"{run}/checkpoint_manager_snapshot.json")
            registered = {r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]}
            inside = [uri.split("/runs/r/", 1)[1] for uri in storage.list_files(run)]
            history = storage.read_bytes(f"{run}/metrics.jsonl").decode().splitlines()
            return {
                "endpoint": server.endpoint,
                "run": run,
                "cut": cut,
                "rerun": {"returncode": rerun.returncode, "stderr": rerun.stderr},
                "registered": registered,
                "folders": {
                    path.split("/", 1)[0]
                    for path in inside
                    if path.startswith("checkpoint_") and "/" in path
                },
                "state": storage.read_json(f"{run}/{sorted(registered)[-1]}/trainer_state.json")
                if registered
                else {},
                "steps": [json.loads(h)["step"] for h in history],
            }
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


@pytest.mark.long(seconds=130)
@pytest.mark.timeout(1500)
def test_a_silent_endpoint_at_a_checkpoint_ends_in_the_bound_with_the_first_fault(
    silent_training,
):
    """Issue 40: with santa's default timeouts (connect 5 s, read 10 s, 2 attempts) and the
    default --max-failures, moto stopped while every step writes its metrics and uploads a
    checkpoint ends the job within (5 + 10) x 2 s and a few more, not retried (a new worker
    group would wait the same timeouts on init_model), its line the first fault's URI."""
    cut = silent_training["cut"]
    assert cut["seconds"] is not None, cut["stderr"][-3000:]  # step 4 was printed
    lines = cut["stderr"].strip().splitlines()
    assert cut["returncode"] == 1, cut["stderr"][-3000:]
    assert len(lines) == 1, cut["stderr"]  # no retry's warning: the first fault ends the job
    # The first call the silence meets under the run: a metrics line, a checkpoint's file, Ray
    # Train's read of its storage marker (`.validate_storage_marker`, checked before each
    # checkpoint upload), or the copy of the TensorBoard events that goes with each checkpoint.
    endpoint = re.escape(silent_training["endpoint"])
    assert re.match(
        rf"santa: error: cannot reach the S3 endpoint {endpoint} to "
        rf"(read|write|upload to) {re.escape(silent_training['run'])}/",
        lines[0],
    ), lines[0]
    assert "init_model" not in lines[0]
    # The timeouts' 30 s, then the job's way out (Ray Train's controller and worker group,
    # the local Ray): up to 16 s of it on a busy 2-core CI machine, so 25 s for the way out.
    # It once took 79.7 s: the run lock's heartbeat, a thread of the driver then, was on its
    # way to the silent endpoint, and pyarrow made Ray Train's result (a new S3 client) and
    # the exit wait for it; the heartbeat is a child process now (santa.files.runlock).
    # Another took 105.8 s: Ray Train 2.60 tries a checkpoint upload that meets "AWS Error
    # NETWORK_CONNECTION" three times (santa.train.session.persist_checkpoint now uploads).
    # With the TensorBoard copy the first fault and two busy loops beside: 32.9 s in all,
    # 7.3 s of it after the line; with the storage marker's read first: 30.5 s (2026-11-28).
    assert cut["seconds"] < (5 + 10) * 2 + 25, cut["seconds"]


@pytest.mark.long(seconds=5)  # the job and its rerun: the fixture, with the test above
@pytest.mark.timeout(1500)
def test_a_silent_endpoint_during_training_ends_in_one_line_and_the_rerun_resumes(
    silent_training,
):
    """The run cut short by the silence (above) is resumed by the same command once the
    endpoint answers: nothing half-written is left in the finished run."""
    cut, rerun = silent_training["cut"], silent_training["rerun"]
    assert cut["returncode"] == 1 and len(cut["stderr"].strip().splitlines()) == 1, cut
    assert rerun["returncode"] == 0, rerun["stderr"][-3000:]
    # no half-written checkpoint (the upload the silence cut) left in the finished run
    assert silent_training["folders"] == silent_training["registered"]
    state = silent_training["state"]
    assert state["step"] == 12 and state["resumed_at"], state
    assert silent_training["steps"] == list(range(1, 13))


def test_a_checkpoint_upload_to_a_silent_endpoint_is_one_try_of_santas_attempts(
    own_moto, tmp_path, monkeypatch
):
    """Ray Train 2.60 tries a checkpoint upload whose error reads "AWS Error
    NETWORK_CONNECTION" three times (its own retry, around all of pyarrow's attempts): ~63 s
    on a silent endpoint with santa's timeouts. santa's upload (``checkpoint_upload_fn``)
    fails once, in one line naming the URI, and Ray Train's retry does not try it again."""
    from ray._common.retry import call_with_retry
    from ray.train.v2._internal.constants import AWS_RETRYABLE_TOKENS

    from santa.train.session import persist_checkpoint

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", own_moto.endpoint)
    monkeypatch.setenv("SANTA_S3_READ_TIMEOUT", "1")
    own_moto.create_bucket("ckpt-upload")
    local = tmp_path / "checkpoint"
    local.mkdir()
    (local / "model.bin").write_bytes(b"weights")
    filesystem, run = storage.resolve("s3://ckpt-upload/runs/r")

    def upload(name: str) -> None:
        persist_checkpoint(str(local), pafs.LocalFileSystem(), filesystem, run, f"{run}/{name}")

    with pytest.raises(storage.StorageError, match=r"cannot be seen from this node \(no s3://ckpt"):
        upload("checkpoint_1")  # no storage marker: Ray Train's check, in one line
    storage.write_bytes("s3://ckpt-upload/runs/r/.validate_storage_marker", b"")
    upload("checkpoint_1")
    assert storage.read_bytes("s3://ckpt-upload/runs/r/checkpoint_1/model.bin") == b"weights"

    os.kill(own_moto.process.pid, signal.SIGSTOP)
    calls = []

    def counted() -> None:
        calls.append(time.monotonic())
        upload("checkpoint_2")

    started = time.monotonic()
    with pytest.raises(storage.StorageError) as raised:
        call_with_retry(counted, "upload checkpoint", match=AWS_RETRYABLE_TOKENS, max_attempts=3)
    assert len(calls) == 1  # not tried again by Ray Train's retry
    assert str(raised.value) == (
        f"cannot reach the S3 endpoint {own_moto.endpoint} to read "
        "s3://ckpt-upload/runs/r/.validate_storage_marker (no answer in time)"
    )
    assert time.monotonic() - started < 2 * (1 + 1) + 3  # santa's 2 attempts of 1 s, once
