"""One writer per run: a second job on the same --name fails at once, naming the holder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from santa.files import storage
from santa.files.layout import S3_LEASE_FILE
from santa.files.runlock import RunLock, RunLockedError


def _holder(run: Path) -> subprocess.Popen:
    """A real second process holding the run's lock until killed."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from santa.files.runlock import RunLock
        lock = RunLock({str(run)!r}, description="pretrain").acquire()
        print("locked", flush=True)
        time.sleep(120)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert process.stdout.readline().strip() == "locked"
    return process


def test_local_lock_refuses_a_second_writer_until_the_first_dies(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "demo"
    holder = _holder(run)
    try:
        with pytest.raises(RunLockedError, match=rf"in use by pid {holder.pid} on .*\(pretrain\)"):
            RunLock(str(run)).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean release: the kernel frees the flock
        holder.wait()
    with RunLock(str(run)), pytest.raises(RunLockedError):  # a second open file, same process
        RunLock(str(run)).acquire()
    RunLock(str(run)).acquire().release()  # released on exit of the with block


def test_s3_lease_blocks_live_holders_and_force_takes_stale_ones(moto_s3) -> None:
    bucket = moto_s3.create_bucket("run-locks")
    run = f"{bucket}/runs/demo"
    first = RunLock(run, settle_s=0.1, heartbeat_s=0.2).acquire()
    try:
        written = storage.read_json(storage.join(run, S3_LEASE_FILE))
        assert written["id"] == first.owner["id"]
        deadline = time.time() + 10
        while time.time() < deadline:  # the heartbeat thread refreshes the lease
            lease = first.read_lease()
            if lease["heartbeat"] > written["heartbeat"]:
                break
            time.sleep(0.1)
        assert lease["id"] == first.owner["id"] and lease["heartbeat"] > written["heartbeat"]
        with pytest.raises(RunLockedError, match="in use by pid .*heartbeat"):
            RunLock(run, settle_s=0.1, force=True).acquire()  # force never takes a live lease
    finally:
        first.release()
    assert not storage.exists(storage.join(run, S3_LEASE_FILE))

    # A job that died: its lease stops beating and goes stale.
    dead = {
        "id": "dead",
        "host": "node-7",
        "pid": 4242,
        "started": 0,
        "heartbeat": time.time() - 600,
    }
    storage.write_bytes(storage.join(run, S3_LEASE_FILE), json.dumps(dead).encode())
    with pytest.raises(RunLockedError, match="stale lock from pid 4242 on node-7.*--force"):
        RunLock(run, settle_s=0.1).acquire()
    taker = RunLock(run, settle_s=0.1, force=True).acquire()
    assert storage.read_json(storage.join(run, S3_LEASE_FILE))["id"] == taker.owner["id"]
    taker.release()


def test_a_lease_left_by_a_dead_job_of_this_machine_is_taken_over(moto_s3) -> None:
    """A job that ended while S3 was unreachable could not delete its lease: the next run on
    the same machine takes it over at once (the holder's process is gone)."""
    import socket

    run = f"{moto_s3.create_bucket('dead-holders')}/runs/demo"
    dead = {
        "id": "dead",
        "host": socket.gethostname(),
        "pid": 2**22 + 12345,  # above any pid Linux hands out by default: no such process
        "started": time.time() - 30,
        "heartbeat": time.time() - 5,  # fresh: not stale by age
    }
    storage.write_bytes(storage.join(run, S3_LEASE_FILE), json.dumps(dead).encode())
    taker = RunLock(run, settle_s=0.1).acquire()
    assert storage.read_json(storage.join(run, S3_LEASE_FILE))["id"] == taker.owner["id"]
    taker.release()
    alive = dict(dead, pid=os.getpid(), started=time.time())  # this process: alive
    storage.write_bytes(storage.join(run, S3_LEASE_FILE), json.dumps(alive).encode())
    with pytest.raises(RunLockedError, match="in use by pid"):
        RunLock(run, settle_s=0.1).acquire()


def test_no_release_is_tried_after_an_unreachable_endpoint(tmp_path: Path, monkeypatch) -> None:
    """Issue 40: leaving with "cannot reach the S3 endpoint", the lock is not released (on S3
    that would wait the whole timeouts again before the job's line); the lease goes stale."""
    from santa.files.storage import StorageError

    released = []
    monkeypatch.setattr(RunLock, "release", lambda self: released.append(self))
    with pytest.raises(StorageError), RunLock(str(tmp_path / "run")):
        raise StorageError(
            "cannot reach the S3 endpoint http://x to write s3://b/r", transient=True
        )
    assert released == []
    with pytest.raises(ValueError), RunLock(str(tmp_path / "run2")):
        raise ValueError("anything else")
    assert len(released) == 1


def test_a_heartbeat_to_a_silent_endpoint_holds_up_neither_a_new_s3_client_nor_the_exit(
    monkeypatch,
) -> None:
    """pyarrow makes a new S3 client of a process, and the process's exit, wait for that
    process's requests in flight. A lease refreshed from a thread of the job's driver held
    its way out up to the whole timeouts (~20 s: Ray Train's result, unpickled with its
    filesystem, then the exit) when the endpoint went silent; the heartbeat's child holds
    up neither."""
    from tests.conftest import MotoServer

    server = MotoServer()
    beater: list[psutil.Process] = []
    try:
        keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        for name, value in {**keys, "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(name, value)
        server.create_bucket("silent-lease")
        code = textwrap.dedent(
            """
            import pickle, sys, time
            from santa.files import storage
            from santa.files.runlock import RunLock
            lock = RunLock("s3://silent-lease/runs/r", settle_s=0.1, heartbeat_s=0.3).acquire()
            filesystem, _ = storage.resolve("s3://silent-lease/runs/r")
            print("locked", flush=True)
            sys.stdin.readline()
            time.sleep(1.0)  # a beat on its way to the silent endpoint by now
            started = time.monotonic()
            pickle.loads(pickle.dumps(filesystem))  # a new client, as Ray Train's result makes
            print(f"client {time.monotonic() - started:.2f}", flush=True)
            """
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANTA_S3_")}
        env["AWS_ENDPOINT_URL"] = server.endpoint  # with santa's default timeouts
        holder = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
        beater += [c for c in psutil.Process(holder.pid).children() if "runlock" in c.cmdline()[-1]]
        assert len(beater) == 1  # the heartbeat's own process
        os.kill(server.process.pid, signal.SIGSTOP)  # silent: connections hang
        started = time.monotonic()
        stdout, stderr = holder.communicate("go\n", timeout=120)
        seconds = time.monotonic() - started
        assert holder.returncode == 0, stderr
        assert stderr == ""  # the child's beats fail quietly
        client = float(stdout.split()[-1])
        # Waiting on the beat in flight took (5 + 10) s and more; here both are at once.
        assert client < 2.0, stdout
        assert seconds < 6.0, seconds
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
    # Its holder gone, the child leaves once its request gives up (the endpoint's end here).
    beater[0].wait(timeout=30)


def test_the_heartbeat_ends_with_a_killed_holder_and_a_stopped_one_is_told(moto_s3, caplog) -> None:
    """The heartbeat's child outlives no holder and no holder's lease: Ctrl-C or SIGTERM to the
    process group leave it to its holder; kill -9 of the holder ends it too (the pipe it reads
    is closed by the kernel), so the lease goes stale as it should. A child that stopped
    beating while its holder ran is said when the lock is released."""
    run = f"{moto_s3.create_bucket('killed-holders')}/runs/demo"
    code = textwrap.dedent(
        f"""
        import time
        from santa.files.runlock import RunLock
        RunLock({run!r}, settle_s=0.1, heartbeat_s=0.2).acquire()
        print("locked", flush=True)
        time.sleep(120)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    (beater,) = psutil.Process(holder.pid).children()
    assert os.getpgid(beater.pid) != os.getpgid(holder.pid)  # the group's Ctrl-C: the holder's
    first = storage.read_json(storage.join(run, S3_LEASE_FILE))["heartbeat"]
    deadline = time.time() + 10
    while storage.read_json(storage.join(run, S3_LEASE_FILE))["heartbeat"] == first:
        assert time.time() < deadline, "no heartbeat from the child"
        time.sleep(0.1)
    for signal_number in (signal.SIGINT, signal.SIGTERM):  # not its holder: it beats on
        beater.send_signal(signal_number)
    time.sleep(0.5)
    assert beater.status() != psutil.STATUS_ZOMBIE
    holder.kill()
    holder.wait()
    beater.wait(timeout=10)  # raises TimeoutExpired if it beat on
    lease = storage.read_json(storage.join(run, S3_LEASE_FILE))
    time.sleep(0.6)
    assert storage.read_json(storage.join(run, S3_LEASE_FILE)) == lease  # no beat since

    lock = RunLock(run, settle_s=0.1, heartbeat_s=0.2, force=True, stale_after_s=0.1)
    time.sleep(0.2)
    lock.acquire()
    lock._beater.kill()
    lock._beater.wait()
    with caplog.at_level("WARNING", logger="santa.files.runlock"):
        lock.release()
    assert "heartbeat" in caplog.text and "had stopped" in caplog.text
    assert not storage.exists(storage.join(run, S3_LEASE_FILE))
