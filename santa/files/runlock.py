"""One writer per run: a lock on ``STORAGE/NAME`` held for as long as a job writes there.

Two runs with the same ``--name`` would interleave their checkpoints and overwrite each
other's reports. The first job to take the lock writes; a second one fails at once with
one line naming the holder.

- Local storage: an exclusive ``flock`` on ``NAME/.santa-lock`` (released by the kernel
  when the holder exits, even on ``kill -9``; the file says who holds it).
- S3: a lease object ``NAME/.santa-lock.json`` with the owner, host, pid and a heartbeat
  refreshed every ``heartbeat_s`` by a small child process (``python -m
  santa.files.runlock``), not a thread: pyarrow makes every new S3 client of a process,
  and the process's exit, wait for that process's requests in flight, so a heartbeat to an
  endpoint gone silent held the job's way out up to its whole timeouts (Ray Train's result,
  unpickled with its filesystem, and the exit each waited ~20 s). The child ends when the
  lock is released or its holder is gone (the pipe it reads from closes, even on kill -9).
  A lease whose heartbeat is older than ``stale_after_s`` belongs to a run that died;
  ``force=True`` (``--force``) takes it over.
  S3 has no compare-and-swap that pyarrow exposes, so taking a lease is write-then-verify:
  after writing, the job waits ``settle_s`` and reads the lease back; of two jobs starting
  together, the one whose write landed last keeps it and the other fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

from santa.files import storage
from santa.files.layout import RunLayout

__all__ = ["RunLock", "RunLockedError"]


class RunLockedError(ValueError):
    """Another job holds the run's lock (bad input: pick another --name or wait)."""


class RunLock:
    """The lock of one run folder; use as a context manager or acquire()/release()."""

    def __init__(
        self,
        run_uri: str,
        *,
        force: bool = False,
        stale_after_s: float = 120.0,
        heartbeat_s: float = 20.0,
        settle_s: float = 1.0,
        description: str = "",
        lock_uri: str = "",
        what: str = "run",
        hint: str = "pick another --name",
    ) -> None:
        self.run_uri = run_uri
        # Where the lock lives: inside the run folder, unless the folder itself is replaced
        # whole when published (a job's --output: RunLayout.output_lock puts it beside).
        self.lock_uri = lock_uri
        self.what = what
        self.hint = hint
        self.force = force
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self.settle_s = settle_s
        self.owner = {
            "id": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "job": description,
        }
        self._fd: int | None = None
        self._beater: subprocess.Popen | None = None

    # ------------------------------------------------------------------ public

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the holder."""
        if storage.is_s3(self.run_uri):
            self._acquire_lease()
        else:
            self._acquire_flock()
        return self

    def release(self) -> None:
        """Give the lock back (idempotent)."""
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._beater is not None:
            self._stop_heartbeat()
            lease = self.read_lease()
            if lease is not None and lease.get("id") == self.owner["id"]:
                fs, path = storage.resolve(self._lease_uri)
                fs.delete_file(path)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        if exc_type is None:
            self.release()
            return
        # Leaving with an error (S3 gone silent, Ctrl-C): the error the user sees is that
        # one, never one raised while releasing; a lease left behind goes stale. After an
        # S3 endpoint that did not answer, no release is tried: it would wait the whole
        # timeouts again before the job's line (issue 40).
        from santa.files.storage import unreachable
        from santa.jobs.errors import root_cause

        error = exc_info[0] if exc_info else None
        if isinstance(error, BaseException) and unreachable(root_cause(error)) is not None:
            self._stop_heartbeat()
            return
        try:
            self.release()
        except Exception as error:  # noqa: BLE001 - cleanup after another error
            import logging

            logging.getLogger(__name__).warning("could not release %s: %s", self.run_uri, error)

    # ------------------------------------------------------------------ local

    def _acquire_flock(self) -> None:
        import fcntl

        path = self.lock_uri or RunLayout(self.run_uri).local_lock
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            raise RunLockedError(
                f"{self.what} {self.run_uri} is in use by {_describe(_parse(holder))}; "
                f"wait for it or {self.hint}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.owner).encode(), 0)
        self._fd = fd

    # ------------------------------------------------------------------ S3

    @property
    def _lease_uri(self) -> str:
        return self.lock_uri or RunLayout(self.run_uri).s3_lease

    def read_lease(self) -> dict[str, Any] | None:
        """The S3 lease as it stands (its holder and last heartbeat), or None if free.

        A read racing the holder's heartbeat can see a torn object (pyarrow sizes the
        object first, then reads it): read again until it parses."""
        for attempt in range(10):
            if not storage.exists(self._lease_uri):
                return None
            lease = _parse(storage.read_bytes(self._lease_uri).decode("utf-8", "replace"))
            if lease.get("id"):
                return lease
            time.sleep(0.05 * (attempt + 1))
        # Unreadable for seconds: someone holds it; treat it as a live lease of unknown owner.
        return {"id": "?", "heartbeat": time.time()}

    def _write_lease(self) -> None:
        payload = {**self.owner, "heartbeat": time.time(), "stale_after_s": self.stale_after_s}
        storage.write_bytes(self._lease_uri, json.dumps(payload).encode())

    def _acquire_lease(self) -> None:
        lease = self.read_lease()
        if (
            lease is not None
            and lease.get("id") != self.owner["id"]
            and not _died_here(lease)  # a job of this machine that is gone: taken over
        ):
            age = time.time() - float(lease.get("heartbeat", 0))
            if age < self.stale_after_s:
                raise RunLockedError(
                    f"{self.what} {self.run_uri} is in use by {_describe(lease)} "
                    f"(heartbeat {age:.0f} s ago); wait for it or {self.hint}"
                )
            if not self.force:
                raise RunLockedError(
                    f"{self.what} {self.run_uri} has a stale lock from {_describe(lease)} "
                    f"(no heartbeat for {age:.0f} s: that job died); rerun with --force "
                    "to take it over"
                )
        self._write_lease()
        time.sleep(self.settle_s)
        lease = self.read_lease()
        if lease is None or lease.get("id") != self.owner["id"]:
            raise RunLockedError(
                f"{self.what} {self.run_uri} was taken by {_describe(lease or {})} at the same time"
            )
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        """Start the child that refreshes the lease (see the module's docstring)."""
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        path = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, path) if p)}
        self._beater = subprocess.Popen(
            [sys.executable, "-m", "santa.files.runlock"],
            stdin=subprocess.PIPE,
            # Not the holder's output: whoever reads it to its end (a shell's pipe, the
            # job's supervisor) would wait for this process too.
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: Ctrl-C in a terminal and `ray job stop` signal the holder's
            # process group, and the holder decides when the lease ends.
            start_new_session=True,
            env=env,
            text=True,
        )
        order = {"uri": self._lease_uri, "every_s": self.heartbeat_s}
        order["lease"] = {**self.owner, "stale_after_s": self.stale_after_s}
        self._beater.stdin.write(json.dumps(order) + "\n")
        self._beater.stdin.flush()

    def _stop_heartbeat(self) -> None:
        """End the heartbeat's child: its pipe closed, it leaves between two beats; one that
        is still waiting on a request after a moment is killed."""
        beater, self._beater = self._beater, None
        if beater is None:
            return
        if beater.poll() is not None:  # it should beat until told
            import logging

            logging.getLogger(__name__).warning(
                "the heartbeat of %s's lock had stopped (exit status %s): its lease may "
                "have gone stale while the job ran",
                self.run_uri,
                beater.returncode,
            )
        with contextlib.suppress(OSError):
            beater.stdin.close()
        try:
            beater.wait(timeout=2)
        except subprocess.TimeoutExpired:
            beater.kill()
            beater.wait()


def beat(order: dict[str, Any], pipe: Any) -> None:
    """Write ``order["lease"]`` with a fresh heartbeat to ``order["uri"]`` every
    ``order["every_s"]`` seconds until ``pipe`` is readable (closed by the lock's holder, or
    by the kernel when the holder is gone)."""
    while not select.select([pipe], [], [], float(order["every_s"]))[0]:
        payload = {**order["lease"], "heartbeat": time.time()}
        # A brief outage: the next beat retries; a long one lets the lease go stale.
        with contextlib.suppress(storage.StorageError):
            storage.write_bytes(order["uri"], json.dumps(payload).encode())


def _died_here(lease: dict[str, Any]) -> bool:
    """Whether the lease's holder ran on this machine and its process is gone (a job that
    ended while S3 was unreachable could not delete its lease)."""
    if lease.get("host") != socket.gethostname() or not os.path.isdir("/proc"):
        return False
    try:
        pid = int(lease.get("pid", 0))
    except (TypeError, ValueError):
        return False
    if pid <= 0 or pid == os.getpid():
        return False
    started = _process_started_at(pid)
    if started is None:
        return True  # no such process
    # The pid was reused by a process started after the lease's holder.
    return started > float(lease.get("started", 0)) + 2.0


def _process_started_at(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None when there is no such process."""
    from santa.cluster.reaper import process_start_time

    ticks = process_start_time(pid)
    if not ticks:
        return None
    try:
        with open("/proc/stat") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return 0.0  # cannot tell: count it as the holder's own process
    return boot + int(ticks) / os.sysconf("SC_CLK_TCK")


def _parse(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another job"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
    job = f" ({holder['job']})" if holder.get("job") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{job}, started {started}"


if __name__ == "__main__":  # the heartbeat's child (RunLock._start_heartbeat)
    # Signalled by anyone but its holder, it still beats: it ends with its holder's pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    beat(json.loads(sys.stdin.readline()), sys.stdin)
