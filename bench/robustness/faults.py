"""Fault injection against the real command lines (issues 17, 33 and 40).

Each fault runs a job in a subprocess, in a process group of its own as a terminal would:
bad input met before the job starts (bad paths, a missing bucket and refused credentials on
moto's S3 server, a silent S3 endpoint, bad files, a corrupt checkpoint, a locked run) and
faults while it runs (Ctrl-C to the process group, ``ray job stop``'s SIGTERM, a killed
training worker, driver or miner actor, moto's server stopped mid-training, two writers, hard
negatives that never come, a lost node of a two-node cluster; issue 40: Ctrl-C of index and
export, two writers into export, index and mine_negatives, S3 stopped while Ray Data reads).
Each is recorded as: exit code (and the one expected), seconds to the end (and from the
fault), lines on the terminal (stdout and stderr) and on stderr, the message (the last
``santa:`` line on stderr, else the first stderr line, or for a success the line that shows
the fault was handled), the last terminal line, whether the data was safe (outputs
untouched or whole afterwards, runs resumable, locks released) and, for a re-run compared
with an uninterrupted run, whether it ended the same.

    python bench/robustness/faults.py [--only SUBSTRING] [--bad-input-only]

Writes bench/results/faults.json (``--only``: the faults it ran replace their rows there)
and prints the table. The faults themselves (each a ``Fault`` of ``fault.py``: a command line,
the exit code it must end with and what must stay untouched) are built in a scratch folder
by ``bad_input.py`` (before a job starts) and ``while_running.py`` (while it runs).
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
from pathlib import Path

if not __package__:  # run as a file (python bench/robustness/faults.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.results import faults_table
from bench.robustness.bad_input import build_faults
from bench.robustness.fault import ROOT, Fault, corrupt_latest_checkpoint, free_port, job_env
from bench.robustness.while_running import build_more_running_faults, build_running_faults

RESULTS = common.RESULTS_DIR / "faults.json"


def snapshot(paths: list[Path]) -> dict[str, bytes]:
    """The bytes of every file under ``paths`` (run locks left out)."""
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
    """Run one fault's command in a subprocess and judge its exit, message and data."""
    env = job_env(fault.env)
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
    lines: list[tuple[str, str]] = []  # (stream, line) in the order they arrived
    arrived = threading.Condition()

    def pump(stream, name: str) -> None:
        for line in stream:
            with arrived:
                lines.append((name, line.rstrip("\n")))
                arrived.notify_all()

    pumps = [
        threading.Thread(target=pump, args=(proc.stdout, "out"), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, "err"), daemon=True),
    ]
    for thread in pumps:
        thread.start()

    def stdout_so_far() -> list[str]:
        with arrived:
            return [line for name, line in lines if name == "out"]

    marker = fault.at_line or fault.interrupt_after
    if marker:
        deadline = time.monotonic() + fault.timeout_s
        with arrived:
            while proc.poll() is None and time.monotonic() < deadline:
                if any(n == "out" and line.startswith(marker) for n, line in lines):
                    break
                arrived.wait(timeout=1.0)
        if fault.action is not None:
            fault.action(proc, stdout_so_far())
        else:
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
        faulted = time.monotonic()
    elif fault.action is not None:
        time.sleep(fault.delay_s)
        fault.action(proc, stdout_so_far())
        faulted = time.monotonic()
    else:
        faulted = None
    try:
        proc.wait(timeout=max(1.0, fault.timeout_s - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for thread in pumps:
        thread.join(timeout=30)
    stdout = "".join(line + "\n" for name, line in lines if name == "out")
    stderr = "".join(line + "\n" for name, line in lines if name == "err")
    ended = time.monotonic()
    seconds = ended - started
    if fault.after is not None:
        fault.after()
    err_lines = [line for line in stderr.splitlines() if line.strip()]
    santa_lines = [line for line in err_lines if line.startswith("santa:")]
    if fault.success_line:
        shown = [line for line in (stdout + stderr).splitlines() if fault.success_line in line]
        message = shown[0].strip() if shown else "(expected line missing)"
    else:
        message = (santa_lines[-1:] or err_lines[:1] or ["(no message)"])[0]  # how it ended
    safe = snapshot(fault.watch) == before and (fault.check() if fault.check else True)
    terminal = [line for _, line in lines if line.strip()]
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
        "after_fault_s": None if faulted is None else round(ended - faulted, 1),
        "data_safe": bool(safe),
        "last_line": terminal[-1] if terminal else "",
        "resume_exact": fault.resume() if fault.resume is not None else None,
        "stderr_tail": stderr[-1500:] if proc.returncode != fault.expected else "",
        "ok": proc.returncode == fault.expected
        # a success, or a process killed outright (no line of its own), or one line
        and (fault.expected <= 0 or len(santa_lines) == fault.santa_lines)
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


def merge_rows(kept: list[dict], fresh: list[dict]) -> list[dict]:
    """A re-run of some faults (``--only``): their rows replace the recorded ones, in the
    recorded order; the other faults' rows stay; new faults come last."""
    by_name = {row["fault"]: row for row in fresh}
    names = {row["fault"] for row in kept}
    return [by_name.get(row["fault"], row) for row in kept] + [
        row for row in fresh if row["fault"] not in names
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the faults (or those ``--only`` names), print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run the faults whose name has this text (repeatable)",
    )
    parser.add_argument(
        "--bad-input-only", action="store_true", help="skip the faults while jobs run (long)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON to write")
    args = parser.parse_args(argv)
    common.use_shared_nltk_data()
    from santa.files.runlock import RunLock

    bench = common.BenchRun(__file__, argv)

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
            faults += build_more_running_faults(work, pausable, pausable_url)
        for fault in faults:
            if args.only and not any(text in fault.name for text in args.only):
                continue
            if fault.name.startswith("pretrain: corrupt latest"):
                print(f"  corrupted {corrupt_latest_checkpoint(work / 'runs' / 'r')}", flush=True)
            if fault.name.startswith("pretrain: run locked"):
                with RunLock(
                    str(work / "locked" / "busy"), description="bench/robustness/faults.py"
                ):
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
            server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(faults_table(rows))
    passed = sum(row["ok"] and row["data_safe"] for row in rows)
    running = [row for row in rows if row.get("running")]
    print(f"\n{passed}/{len(rows)} faults: right exit code, its santa line(s), data safe")
    print(
        f"{sum(r['ok'] and r['data_safe'] for r in running)}/{len(running)} of them while a "
        "job runs"
    )
    code = 0 if passed == len(rows) else 1
    if args.only and args.results.exists():
        rows = merge_rows(json.loads(args.results.read_text()).get("faults", []), rows)
    bench.write_json(args.results, {"faults": rows})
    print(f"wrote {args.results}")
    return code


if __name__ == "__main__":
    sys.exit(main())
