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

import pytest

from santa.runtime import storage
from santa.runtime.layout import S3_LEASE_FILE
from santa.runtime.runlock import RunLock, RunLockedError


def _holder(run: Path) -> subprocess.Popen:
    """A real second process holding the run's lock until killed."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from santa.runtime.runlock import RunLock
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
    from santa.runtime.storage import StorageError

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
