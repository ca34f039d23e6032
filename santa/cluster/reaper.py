"""The local Ray a job starts ends with the job, even when the job is killed outright.

``ray.init()`` without an address starts a Ray of the job's own (GCS, raylet, dashboard,
agents). A job that ends normally, fails or is interrupted stops it (``ray.shutdown``); one
killed with ``kill -9`` (or by the OOM killer) cannot, and Ray's agent processes then stay
alive. The job therefore starts this small watcher, in a session of its own, which waits for
the job's process to go and then kills every process of that Ray session (the processes
whose command line names its session folder), and nothing else.

    python -m santa.cluster.reaper PID START_TIME SESSION_DIR
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

__all__ = ["kill_session", "process_start_time", "start_reaper"]

POLL_S = 1.0


def process_start_time(pid: int) -> str:
    """The start time of ``pid`` (``/proc/PID/stat`` field 22): a pid reused by another
    process has another one. Empty when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    return fields[19] if len(fields) > 19 else ""


def session_processes(session_dir: str) -> list[int]:
    """Pids of the processes whose command line names ``session_dir`` (this Ray's)."""
    marker = session_dir.rstrip("/").encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_session(session_dir: str) -> list[int]:
    """SIGKILL every process of the Ray session at ``session_dir``; returns their pids."""
    killed = []
    for pid in session_processes(session_dir):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            continue
    return killed


def start_reaper(session_dir: str) -> subprocess.Popen | None:
    """Start the watcher of this process's local Ray session (Linux only; else None)."""
    if not os.path.isdir("/proc") or not session_dir:
        return None
    pid = os.getpid()
    return subprocess.Popen(
        [sys.executable, "-m", "santa.cluster.reaper", str(pid), process_start_time(pid)]
        + [session_dir],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the job's process group: Ctrl-C leaves it be
        close_fds=True,
    )


def main(argv: list[str]) -> int:
    """Wait for the job (pid, start time) to end, then kill its Ray session's processes."""
    pid, started, session_dir = int(argv[0]), argv[1], argv[2]
    while process_start_time(pid) == started and started:
        time.sleep(POLL_S)
    # A job that stopped its Ray itself leaves nothing here; a killed one leaves everything.
    for _ in range(3):  # processes a dying raylet was still starting
        if not kill_session(session_dir):
            break
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
