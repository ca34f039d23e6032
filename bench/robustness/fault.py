"""What a fault of the faults bench is (``Fault``) and the helpers its cases share: the
tiny job settings, checks on a run folder (kept, finished, lock free), ways to hit a running
job (signals, a killed process, a lost node) and triggers (a line, a process, a file).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import common

ROOT = common.ROOT
TINY = [
    "--recipe", "tiny-ci", "--num-workers", "1", "--cpus-per-worker", "0.5",
    "--set", "train.checkpoint_every=1",
    "--set", "train.log_every=1", "--address", "local",
]  # fmt: skip


@dataclass
class Fault:
    """One fault: a command, the exit code it must end with, and how to judge safety."""

    name: str
    command: list[str]
    expected: int
    env: dict[str, str] = field(default_factory=dict)
    watch: list[Path] = field(default_factory=list)
    """Paths whose files must be unchanged afterwards (or still absent)."""
    success_line: str = ""
    """For an expected exit 0: the output line that shows the fault was handled."""
    interrupt_after: str = ""
    """Send SIGINT this long after a stdout line starting with this text."""
    check: Callable[[], bool] | None = None
    """An extra data-safety check."""
    at_line: str = ""
    """A fault while the job runs: once a stdout line starts with this, ``action`` runs."""
    action: Callable[[subprocess.Popen, list[str]], None] | None = None
    """What happens to the running job (a signal to its process group, a killed worker,
    S3 stopped); it gets the process and the stdout lines read so far."""
    after: Callable[[], None] | None = None
    """Undo the fault once the job ended (S3 answering again, a holder letting go)."""
    before: Callable[[], None] | None = None
    """Set the fault up right before the job starts (another job holding the output)."""
    delay_s: float = 0.0
    """Without ``at_line``: run ``action`` this long after the job started."""
    timeout_s: float = 540.0
    running: bool = False
    resume: Callable[[], bool] | None = None
    """For a re-run after a fault: whether it ended as an uninterrupted run would have
    (recorded as ``resume_exact``; None when the row does not compare)."""
    santa_lines: int = 1
    """santa's lines on stderr for a failure: its one error line, after any line that said
    what a recovery waits for (a lost node at a fixed size: the loss, then the end)."""
    """A fault while the job runs (rather than bad input met before it starts)."""


def corrupt_latest_checkpoint(run: Path) -> str:
    """Truncate the optimizer state of the run's latest registered checkpoint."""
    from santa.train.resume import registered_checkpoints

    latest = Path(registered_checkpoints(str(run))[0])
    optimizer = latest / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:64])
    return str(latest)


RUN_TINY = [*TINY, "--set", "train.checkpoint_every=2"]


def _killpg(signum: int, pause_s: float = 0.5):
    def action(proc, head) -> None:
        time.sleep(pause_s)
        os.killpg(proc.pid, signum)

    return action


def _ctrl_c_twice(proc, head) -> None:
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)


def _job_stop(proc, head) -> None:
    """`ray job stop`: SIGTERM to the driver (SIGKILL would follow 3 s later)."""
    proc.send_signal(signal.SIGTERM)


def _kill_process(title: str):
    """SIGKILL the job's own Ray process whose command line starts with ``title``."""

    def action(proc, head) -> None:
        import psutil

        deadline = time.time() + 120
        while time.time() < deadline:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if " ".join(child.cmdline()).startswith(title):
                        child.kill()
                        return
                except psutil.Error:
                    continue
            time.sleep(0.5)

    return action


def _session_of(head: list[str]) -> str:
    import re

    for line in head:
        found = re.search(r"logs in (\S+)/logs[;)]", line)
        if found:
            return found.group(1)
    return ""


def _registered(run: Path) -> set[str]:
    snapshot = run / "checkpoint_manager_snapshot.json"
    if not snapshot.is_file():
        return set()
    from santa.models.checkpoints import _snapshot_candidates

    return {name for name, _ in _snapshot_candidates(json.loads(snapshot.read_text())) or []}


def _lock_free(run: Path) -> bool:
    from santa.files.runlock import RunLock, RunLockedError

    try:
        with RunLock(str(run)):
            return True
    except RunLockedError as error:
        fuser = shutil.which("fuser")
        holders = (
            subprocess.run(
                [fuser, str(run / ".santa-lock")], capture_output=True, text=True
            ).stdout.split()
            if fuser
            else "?"
        )
        print(f"  {error} (processes with the lock file open: {holders})", flush=True)
        return False


def _kept(run: Path) -> bool:
    """An interrupted run: its newest registered checkpoint is whole, its lock free."""
    from santa.models.checkpoints import latest_checkpoint

    problems = []
    if _registered(run) and latest_checkpoint(str(run)).checkpoint_uri is None:
        problems.append("no whole registered checkpoint")
    if not _lock_free(run):
        problems.append("its lock is held")
    if problems:
        print(f"  {run}: {'; '.join(problems)}", flush=True)
    return not problems


def _finished(run: Path, steps: int) -> bool:
    """A finished run: at its last step, registered checkpoints only, its lock free."""
    from santa.models.checkpoints import latest_checkpoint

    folders = {p.name for p in run.glob("checkpoint_*") if p.is_dir()}
    registered = _registered(run)
    latest = latest_checkpoint(str(run)) if folders else None
    problems = [
        *(["no checkpoint"] if not folders else []),
        *([f"unregistered: {sorted(folders - registered)}"] if folders - registered else []),
        *([f"registered, missing: {sorted(registered - folders)}"] if registered - folders else []),
        *([f"latest step {latest.step}, not {steps}"] if latest and latest.step != steps else []),
        *(["its lock is held"] if not _lock_free(run) else []),
    ]
    if problems:
        print(f"  {run}: {'; '.join(problems)}", flush=True)
    return not problems


def corrupt_model(folder: Path) -> None:
    """A tiny model folder whose model.safetensors is cut short (its header is gone)."""
    tiny_model(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])


def tiny_model(folder: Path) -> None:
    """A tiny model folder (its tokenizer trained on the stdlib pairs)."""
    from bench.corpora import stdlib_pair_rows
    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer

    rows = stdlib_pair_rows()
    tokenizer = train_tokenizer([r["query"] for r in rows] + [r["document"] for r in rows], 500)
    DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0).save_pretrained(
        str(folder), santa_config=get_recipe("tiny")
    )


def lost_node(mode: str, work: Path) -> list[str]:
    """The lost-node scenario of bench/robustness/lost_node.py (its own 2-node cluster)."""
    return ["bench.robustness.lost_node", mode, str(work / "pairs"), str(work / f"lost-{mode}")]


def _when(found: Callable[[subprocess.Popen], bool], then, limit_s: float = 300.0):
    """An action: ``then`` once ``found(proc)`` holds (polled every 20 ms)."""

    def action(proc, head) -> None:
        deadline = time.monotonic() + limit_s
        while proc.poll() is None and time.monotonic() < deadline and not found(proc):
            time.sleep(0.02)
        then(proc, head)

    return action


def _descendant(text: str) -> Callable[[subprocess.Popen], bool]:
    """Whether a process of the job (its local Ray's workers too) has ``text`` in its
    command line (a Ray actor's title names its class)."""

    def found(proc) -> bool:
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if text in " ".join(child.cmdline()):
                        return True
        return False

    return found


def _exists(root: Path, pattern: str) -> Callable[[subprocess.Popen], bool]:
    """Whether a path under ``root`` matches ``pattern`` (a glob)."""
    return lambda proc: next(root.glob(pattern), None) is not None


class FirstWriter:
    """The job already writing an output when the fault's job asks for it: started in
    ``start`` (a Fault's ``before``) and paused (SIGSTOP) once it holds the output's lock,
    so it holds it while the second runs; ``finish`` (``after``) lets it go on to its end."""

    def __init__(self, command: list[str], lock: Path) -> None:
        self.command, self.lock = command, lock
        self.proc: subprocess.Popen | None = None
        self.stderr = ""

    def _holds(self) -> bool:
        import psutil

        with contextlib.suppress(psutil.Error):
            return any(f.path == str(self.lock) for f in psutil.Process(self.proc.pid).open_files())
        return False

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *self.command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=job_env({}),
            cwd=ROOT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while self.proc.poll() is None and time.monotonic() < deadline and not self._holds():
            time.sleep(0.02)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)  # its driver only: its Ray runs on
        else:
            print(f"  the first writer ended (exit {self.proc.returncode}) before", flush=True)

    def finish(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        try:
            self.stderr = self.proc.communicate(timeout=600)[1]
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.stderr = self.proc.communicate()[1]

    def finished(self, output: Path) -> bool:
        """It ended with exit 0 and published ``output``."""
        if self.proc.returncode != 0 or not output.exists():
            print(f"  the first writer: exit {self.proc.returncode}; {self.stderr[-600:]}")
        return self.proc.returncode == 0 and output.exists()


def _same_embeddings(one: Path, other: Path) -> bool:
    """Whether two index folders hold the same ids and embeddings, shard by shard."""
    import pyarrow.parquet as pq

    shards = sorted(p.name for p in (one / "embeddings").glob("*.parquet"))
    same = bool(shards) and shards == sorted(
        p.name for p in (other / "embeddings").glob("*.parquet")
    )
    return same and all(
        pq.read_table(one / "embeddings" / name).equals(pq.read_table(other / "embeddings" / name))
        for name in shards
    )


def free_port() -> int:
    """A TCP port that is free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_env(extra: dict[str, str]) -> dict[str, str]:
    """A job's environment: this one's without a cluster address or debug, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env.update(PYTHONPATH=str(ROOT), RAY_DATA_DISABLE_PROGRESS_BARS="1", **extra)
    return env
