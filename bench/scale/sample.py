"""Peak memory of every process of a job: its process tree sampled while it runs.

A job started here (``python -m ray_jobs.X``) starts its own local Ray: the GCS, the
raylet and every Ray worker (Ray Train's workers and controller, Ray Data's tasks and
actors, the miner) are its descendants. :class:`TreeSampler` reads the resident set size
of each of them every ``interval`` seconds and keeps each process's peak, named by its
role (Ray's process titles: ``ray::RayTrainWorker``, ``ray::_StatsActor``, ...).

RSS counts the shared pages a process has touched, and Ray's object store is shared
memory: a Ray Data task that writes or reads blocks, or a driver that gets them
zero-copy, shows them in its RSS although one copy exists on the node. So each process's
peak *private* memory (RSS less its resident shared pages, ``/proc/<pid>/statm``) is kept
beside it: what the process itself allocated, the figure that grows when a process holds
the data set.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

__all__ = ["TreeSampler", "role"]


def role(process: psutil.Process) -> str:
    """A process's role: Ray's title (``ray::Name``, its method cut), else its program."""
    try:
        command = process.cmdline()
        name = process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"
    title = command[0] if command else name
    if title.startswith("ray::"):
        return title.split(".")[0].split(" ")[0]
    program = os.path.basename(title)
    if program in ("raylet", "gcs_server"):
        return program
    joined = " ".join(command)
    # Ray's Python processes by their script (a worker's command line names the raylet too).
    for marker in ("default_worker.py", "dashboard.py", "agent.py", "log_monitor.py", "monitor.py"):
        if marker in joined:
            return "ray worker" if marker == "default_worker.py" else marker
    if "-m" in command:
        return " ".join(command[command.index("-m") : command.index("-m") + 2])
    return name


class TreeSampler:
    """Each process's peak RSS in the tree under ``pid``, sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peaks: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in processes:
            try:
                memory = process.memory_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            seen = self.peaks.get(process.pid)
            if seen is None:
                seen = self.peaks[process.pid] = {
                    "role": role(process),
                    "peak_mb": 0.0,
                    "private_mb": 0.0,
                }
            elif seen["role"] in ("?", "python", "ray::IDLE", "ray worker"):
                seen["role"] = role(process)  # a pooled worker that took a task since
            seen["peak_mb"] = max(seen["peak_mb"], memory.rss / 2**20)
            private = memory.rss - getattr(memory, "shared", 0)
            seen["private_mb"] = max(seen["private_mb"], private / 2**20)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def stop(self) -> dict[str, float]:
        """Stop sampling; the peak RSS (MB) of each role (its largest process)."""
        self._stop.set()
        self._thread.join()
        return self.by_role("peak_mb")

    def by_role(self, figure: str = "peak_mb") -> dict[str, float]:
        """The peak ``figure`` (``peak_mb``: RSS, ``private_mb``: RSS less shared pages)
        of each role, largest first."""
        by_role: dict[str, float] = {}
        for seen in self.peaks.values():
            by_role[seen["role"]] = max(by_role.get(seen["role"], 0.0), round(seen[figure], 1))
        return dict(sorted(by_role.items(), key=lambda item: -item[1]))
