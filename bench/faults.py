"""Fault injection against the real command lines (issues 17 and 33).

Each fault runs a job in a subprocess, in a process group of its own as a terminal would:
bad input met before the job starts (bad paths, a missing bucket and refused credentials on
moto's S3 server, a silent S3 endpoint, bad files, a corrupt checkpoint, a locked run) and
faults while it runs (Ctrl-C to the process group, ``ray job stop``'s SIGTERM, a killed
training worker, driver or miner actor, moto's server stopped mid-training, two writers, hard
negatives that never come, a lost node of a two-node cluster). Each is recorded as: exit
code (and the one expected), seconds to the end, lines on the terminal (stdout and stderr)
and on stderr, the message (the first ``santa:`` line on stderr, else the first stderr line,
or for a success the line that shows the fault was handled), and whether the data was safe
(outputs untouched or whole afterwards, runs resumable, locks released).

    python bench/faults.py [--only SUBSTRING] [--bad-input-only]

Writes bench/results/faults.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "faults.json"
TINY = [
    "--recipe", "tiny", "--num-workers", "1", "--cpus-per-worker", "0.5",
    "--set", "train.global_batch_size=8", "--set", "train.max_query_length=24",
    "--set", "train.max_document_length=96", "--set", "train.max_target_length=32",
    "--set", "model.tiny_vocab_size=2000", "--set", "train.checkpoint_every=1",
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
    """A fault while the job runs (rather than bad input met before it starts)."""


def snapshot(paths: list[Path]) -> dict[str, bytes]:
    files = {}
    for root in paths:
        if root.is_file():
            files[str(root)] = root.read_bytes()
        elif root.is_dir():
            for path in sorted(root.rglob("*")):
                if path.is_file() and ".santa-lock" not in path.name:
                    files[str(path)] = path.read_bytes()
    return files


def run_fault(fault: Fault) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env.update(PYTHONPATH=str(ROOT), RAY_DATA_DISABLE_PROGRESS_BARS="1", **fault.env)
    before = snapshot(fault.watch)
    if fault.before is not None:
        fault.before()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", *fault.command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    stdout_head = []
    marker = fault.at_line or fault.interrupt_after
    if marker:
        for line in proc.stdout:
            stdout_head.append(line)
            if line.startswith(marker):
                break
        if fault.action is not None:
            fault.action(proc, stdout_head)
        else:
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
    elif fault.action is not None:
        time.sleep(fault.delay_s)
        fault.action(proc, stdout_head)
    try:
        stdout, stderr = proc.communicate(timeout=fault.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    seconds = time.monotonic() - started
    if fault.after is not None:
        fault.after()
    stdout = "".join(stdout_head) + stdout
    err_lines = [line for line in stderr.splitlines() if line.strip()]
    santa_lines = [line for line in err_lines if line.startswith("santa:")]
    if fault.success_line:
        shown = [line for line in (stdout + stderr).splitlines() if fault.success_line in line]
        message = shown[0].strip() if shown else "(expected line missing)"
    else:
        message = (santa_lines or err_lines or ["(no message)"])[0]
    safe = snapshot(fault.watch) == before and (fault.check() if fault.check else True)
    terminal = [line for line in (stdout + stderr).splitlines() if line.strip()]
    return {
        "fault": fault.name,
        "running": fault.running,
        "exit": proc.returncode,
        "expected": fault.expected,
        "terminal_lines": len(terminal),
        "stderr_lines": len(err_lines),
        "santa_lines": len(santa_lines),
        "message": message,
        "seconds": round(seconds, 1),
        "data_safe": bool(safe),
        "stderr_tail": stderr[-1500:] if proc.returncode != fault.expected else "",
        "ok": proc.returncode == fault.expected
        # a success, or a process killed outright (no line of its own), or one line
        and (fault.expected <= 0 or len(santa_lines) == 1)
        and (not fault.success_line or message != "(expected line missing)"),
    }


class SilentEndpoint:
    """Accepts TCP connections on loopback and never answers."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return


def start_moto(auth: bool = False) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on loopback; ``auth``: every request is checked (none passes)."""
    from tests.conftest import free_port

    port = free_port()
    env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {})}
    executable = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(executable), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(150):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def format_table(rows: list[dict]) -> str:
    head = (
        "| fault | exit (want) | s to the end | terminal lines | stderr lines | message "
        "| data safe |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for row in rows:
        message = row["message"].replace("|", "\\|")
        if len(message) > 160:
            message = message[:157] + "..."
        lines.append(
            f"| {row['fault']} | {row['exit']} ({row['expected']}) | {row['seconds']:.1f} | "
            f"{row.get('terminal_lines', '-')} | {row['stderr_lines']} | {message} | "
            f"{'yes' if row['data_safe'] else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run the faults whose name has this text")
    parser.add_argument(
        "--bad-input-only", action="store_true", help="skip the faults while jobs run (long)"
    )
    args = parser.parse_args()
    os.environ.setdefault("NLTK_DATA", str(ROOT.parent / "shared" / "nltk_data"))
    from bench.fault_cases import build_faults, build_running_faults, corrupt_latest_checkpoint
    from santa.runtime.runlock import RunLock

    work = Path(tempfile.mkdtemp(prefix="santa-faults-"))
    moto, moto_url = start_moto()
    auth, auth_url = start_moto(auth=True)
    pausable, pausable_url = start_moto()  # stopped (SIGSTOP) and resumed by faults
    silent = SilentEndpoint()
    rows = []
    try:
        faults = build_faults(work, moto_url, auth_url, silent.endpoint)
        if not args.bad_input_only:
            faults += build_running_faults(work, moto_url, pausable, pausable_url)
        for fault in faults:
            if args.only and args.only not in fault.name:
                continue
            if fault.name.startswith("pretrain: corrupt latest"):
                print(f"  corrupted {corrupt_latest_checkpoint(work / 'runs' / 'r')}", flush=True)
            if fault.name.startswith("pretrain: run locked"):
                with RunLock(str(work / "locked" / "busy"), description="bench/faults.py"):
                    row = run_fault(fault)
            else:
                row = run_fault(fault)
            rows.append(row)
            status = "ok" if row["ok"] and row["data_safe"] else "FAIL"
            if status == "FAIL" and row["stderr_tail"]:
                print(row["stderr_tail"], flush=True)
            print(f"{status:4} {row['fault']}: exit {row['exit']} in {row['seconds']}s: "
                  f"{row['message'][:140]}", flush=True)  # fmt: skip
    finally:
        os.kill(pausable.pid, signal.SIGCONT)
        for server in (moto, auth, pausable):
            server.terminate()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(format_table(rows))
    passed = sum(row["ok"] and row["data_safe"] for row in rows)
    running = [row for row in rows if row.get("running")]
    print(f"\n{passed}/{len(rows)} faults: right exit code, one message line, data safe")
    print(
        f"{sum(r['ok'] and r['data_safe'] for r in running)}/{len(running)} of them while a "
        "job runs"
    )
    if not args.only:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"faults": rows}, indent=2) + "\n")
        print(f"wrote {RESULTS}")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
