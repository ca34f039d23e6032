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
and prints the table. The faults themselves (each a
command line, the exit code it must end with and what must stay untouched) are built by
``build_faults`` below, in a scratch folder.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
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

if not __package__:  # run as a file (python bench/robustness/faults.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.results import faults_table
from bench.robustness.lost_node import ELASTIC_STEPS

ROOT = common.ROOT
RESULTS = common.RESULTS_DIR / "faults.json"
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


def build_faults(work: Path, moto: str, auth_moto: str, silent: str) -> list[Fault]:
    """Every fault: its inputs built under ``work``, S3 on the three endpoints given."""
    from bench.corpora import (
        other_language_records,
        stdlib_pair_rows,
        stdlib_python_records,
        write_beir,
        write_csn_layout,
        write_pairs,
    )
    from santa.runtime import storage

    s3 = {
        "AWS_ENDPOINT_URL": moto,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    bad_keys = {**s3, "AWS_ENDPOINT_URL": auth_moto, "AWS_ACCESS_KEY_ID": "AKIABADKEY0000000000"}
    hanging = {**s3, "AWS_ENDPOINT_URL": silent}
    closed = {**s3, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    os.environ.update(s3)
    import boto3

    boto3.client("s3", endpoint_url=moto, region_name="us-east-1").create_bucket(Bucket="faults")

    pairs = write_pairs(work / "pairs", stdlib_pair_rows()[:160])
    beir = write_beir(work / "beir", stdlib_pair_rows()[-24:])
    (work / "empty").mkdir()
    (work / "a-file").write_text("not a folder")
    csn = work / "csn"
    write_csn_layout(csn, languages=("ruby",))
    arrays = work / "arrays"
    arrays.mkdir()
    (arrays / "data.json").write_text(json.dumps(other_language_records("ruby", 5)))
    jsonl_array = work / "jsonl-array"
    jsonl_array.mkdir()
    (jsonl_array / "train.jsonl").write_text(
        json.dumps(other_language_records("ruby", 5), indent=1)
    )
    truncated = work / "truncated" / "python" / "final" / "jsonl" / "train"
    truncated.mkdir(parents=True)
    whole = gzip.compress(
        "".join(json.dumps(r) + "\n" for r in stdlib_python_records(limit=200)).encode()
    )
    (truncated / "python_train_0.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    big = work / "big" / "python" / "final" / "jsonl" / "train"
    big.mkdir(parents=True)
    (big / "python_train_0.jsonl.gz").write_bytes(
        gzip.compress(
            "".join(json.dumps(r) + "\n" for r in stdlib_python_records(limit=400)).encode()
        )
    )
    # A previous complete output, to be kept whole by the interrupted run.
    previous = work / "previous"
    from santa.data.outputs import staged_output

    with staged_output(str(previous)) as staged:
        storage.write_bytes(storage.join(staged.staging, "data", "part-0.parquet"), b"kept")
        staged.publish({"rows_written": 1, "config": {"dataset": "codesearchnet"}})
    runs = work / "runs"

    def pre(*args: str) -> list[str]:
        return ["ray_jobs.preprocess", "--dataset", "codesearchnet", *args]

    out = work / "out"
    faults = [
        Fault(
            "preprocess: --input missing",
            pre("--input", str(work / "nope"), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: --output under a file",
            pre("--input", str(csn), "--output", str(work / "a-file" / "out")),
            2,
            watch=[work / "a-file"],
        ),
        Fault(
            "preprocess: --input empty folder",
            pre("--input", str(work / "empty"), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: S3 bucket missing",
            pre("--input", str(csn), "--output", "s3://no-such-bucket/out"),
            2,
            env=s3,
        ),
        Fault(
            "preprocess: S3 credentials refused",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            2,
            env=bad_keys,
        ),
        Fault(
            "preprocess: S3 endpoint silent",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            1,
            env=hanging,
        ),
        Fault(
            "preprocess: S3 endpoint closed port",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            1,
            env=closed,
        ),
        Fault(
            "preprocess: bad SANTA_S3_READ_TIMEOUT",
            pre("--input", str(csn), "--output", "s3://faults/out"),
            2,
            env={**s3, "SANTA_S3_READ_TIMEOUT": "soon"},
        ),
        Fault(
            "preprocess: JSON array (.json)",
            pre("--input", str(arrays), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: .jsonl holding one JSON array",
            pre("--input", str(jsonl_array), "--output", str(out)),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: --languages python on Ruby input",
            pre("--input", str(csn), "--output", str(out), "--languages", "python"),
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: cosqa file missing",
            [
                "ray_jobs.preprocess",
                "--dataset",
                "cosqa",
                "--input",
                str(work / "cosqa.json"),
                "--output",
                str(out),
                "--stage",
                "eval",
            ],
            2,
            watch=[out],
        ),
        Fault(
            "preprocess: truncated .jsonl.gz",
            pre(
                "--input",
                str(work / "truncated"),
                "--output",
                str(work / "trunc-out"),
                "--address",
                "local",
            ),
            0,
            success_line="dropped  corrupt_file",
        ),
        Fault(
            "preprocess: Ctrl-C mid-run",
            pre("--input", str(work / "big"), "--output", str(previous), "--address", "local"),
            130,
            watch=[previous],
            interrupt_after="Ray:",
            check=lambda: not list(work.glob("previous.tmp-*")),
        ),
        Fault(
            "preprocess: re-run after Ctrl-C",
            pre("--input", str(work / "big"), "--output", str(previous), "--address", "local"),
            0,
            success_line="rows written",
            check=lambda: (
                (previous / "report.json").is_file()
                and not (previous / "data" / "part-0.parquet").exists()
            ),
        ),
    ]
    train = ["--storage", str(runs), "--name", "r", *TINY]
    faults += [
        Fault(
            "pretrain: --data missing",
            ["ray_jobs.pretrain", "--data", str(work / "nope"), *train],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: --data without pairs",
            ["ray_jobs.pretrain", "--data", str(work / "empty"), *train],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: --storage bucket missing",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                "s3://no-such-bucket/runs",
                "--name",
                "r",
                *TINY,
            ],
            2,
            env=s3,
        ),
        Fault(
            "pretrain: --eval-data missing",
            ["ray_jobs.pretrain", "--data", pairs, "--eval-data", str(work / "no-dev"), *train],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: --max-steps 0",
            ["ray_jobs.pretrain", "--data", pairs, *train, "--max-steps", "0"],
            2,
            watch=[runs],
        ),
        Fault(
            "finetune: --init-checkpoint mistyped",
            [
                "ray_jobs.finetune",
                "--data",
                pairs,
                *train,
                "--init-checkpoint",
                str(work / "runs-typo" / "model"),
            ],
            2,
            watch=[runs],
        ),
        Fault(
            "pretrain: run locked by another job",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                str(work / "locked"),
                "--name",
                "busy",
                *TINY,
            ],
            2,
            watch=[work / "locked"],
        ),
        Fault(
            "pretrain: 2 steps (setup for the next)",
            ["ray_jobs.pretrain", "--data", pairs, *train, "--max-steps", "2"],
            0,
            success_line="checkpoint:",
        ),
        Fault(
            "pretrain: corrupt latest checkpoint, re-run",
            ["ray_jobs.pretrain", "--data", pairs, *train, "--max-steps", "3"],
            0,
            success_line="cannot be loaded",
        ),
    ]
    evaluate = ["ray_jobs.evaluate", "--baseline", "none"]
    faults += [
        Fault(
            "evaluate: --checkpoint missing",
            [*evaluate, "--checkpoint", str(work / "nope"), "--data", beir],
            2,
        ),
        Fault(
            "evaluate: --data missing",
            [*evaluate, "--checkpoint", str(runs / "r"), "--data", str(work / "nope")],
            2,
        ),
        Fault(
            "evaluate: --data not BEIR",
            [*evaluate, "--checkpoint", str(runs / "r"), "--data", str(work / "empty")],
            2,
        ),
        Fault(
            "evaluate: --output bucket missing",
            [
                *evaluate,
                "--checkpoint",
                str(runs / "r"),
                "--data",
                beir,
                "--output",
                "s3://no-such-bucket/eval",
            ],
            2,
            env=s3,
        ),
        Fault(
            "export: --latest run missing",
            ["ray_jobs.export", "--latest", str(work / "nope"), "--to", str(work / "exported")],
            2,
            check=lambda: not (work / "exported").exists(),
        ),
        Fault(
            "export: S3 credentials refused",
            ["ray_jobs.export", "--latest", "s3://faults/runs/r", "--to", str(work / "exported")],
            2,
            env=bad_keys,
            check=lambda: not (work / "exported").exists(),
        ),
        Fault(
            "export: S3 endpoint silent",
            ["ray_jobs.export", "--latest", "s3://faults/runs/r", "--to", str(work / "exported")],
            1,
            env=hanging,
            check=lambda: not (work / "exported").exists(),
        ),
        Fault(
            "mine_negatives: --data missing",
            [
                "ray_jobs.mine_negatives",
                "--checkpoint",
                str(runs / "r"),
                "--data",
                str(work / "nope"),
                "--output",
                str(work / "neg"),
            ],
            2,
            check=lambda: not (work / "neg").exists(),
        ),
        Fault(
            "mine_negatives: --output under a file",
            [
                "ray_jobs.mine_negatives",
                "--checkpoint",
                str(runs / "r"),
                "--data",
                pairs,
                "--output",
                str(work / "a-file" / "neg"),
            ],
            2,
            watch=[work / "a-file"],
        ),
        Fault(
            "sweep: --eval-data missing",
            [
                "tuning.sweep",
                "--data",
                pairs,
                "--eval-data",
                str(work / "no-dev"),
                "--storage",
                str(work / "sweeps"),
                "--max-steps",
                "2",
            ],
            2,
            check=lambda: not (work / "sweeps").exists(),
        ),
        Fault(
            "sweep: --storage bucket missing",
            [
                "tuning.sweep",
                "--data",
                pairs,
                "--eval-data",
                beir,
                "--storage",
                "s3://no-such-bucket/sweeps",
                "--max-steps",
                "2",
            ],
            2,
            env=s3,
        ),
        Fault(
            "pipeline: --storage under a file",
            ["ray_jobs.pipeline", "--storage", str(work / "a-file" / "runs"), "--name", "p"],
            2,
            watch=[work / "a-file"],
        ),
    ]
    return faults


def corrupt_latest_checkpoint(run: Path) -> str:
    """Truncate the optimizer state of the run's latest registered checkpoint."""
    from santa.train.resume import registered_checkpoints

    latest = Path(registered_checkpoints(str(run))[0])
    optimizer = latest / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:64])
    return str(latest)


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


def job_env(extra: dict[str, str]) -> dict[str, str]:
    """A job's environment: this one's without a cluster address or debug, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env.update(PYTHONPATH=str(ROOT), RAY_DATA_DISABLE_PROGRESS_BARS="1", **extra)
    return env


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


def free_port() -> int:
    """A TCP port that is free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    from santa.runtime.runlock import RunLock

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


# ============================================================================ while running
# Faults that hit a job while it runs (issue 33): Ctrl-C, `ray job stop`, a killed worker,
# driver or miner, S3 going silent, two writers, hard negatives that never come, a lost node.

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
    from santa.runtime.runlock import RunLock, RunLockedError

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
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from santa.recipes import get_recipe

    rows = stdlib_pair_rows()
    tokenizer = train_tokenizer([r["query"] for r in rows] + [r["document"] for r in rows], 500)
    DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0).save_pretrained(
        str(folder), santa_config=get_recipe("tiny")
    )


def lost_node(mode: str, work: Path) -> list[str]:
    """The lost-node scenario of bench/robustness/lost_node.py (its own 2-node cluster)."""
    return ["bench.robustness.lost_node", mode, str(work / "pairs"), str(work / f"lost-{mode}")]


def build_running_faults(work: Path, moto: str, pausable, pausable_url: str) -> list[Fault]:
    """The faults while jobs run (after :func:`build_faults`, whose data they reuse)."""
    from bench.corpora import other_language_records, stdlib_pair_rows, write_esci, write_pairs
    from santa.data.outputs import staged_output
    from santa.negatives.mining import NegativesTable
    from santa.runtime import storage
    from santa.runtime.reaper import session_processes

    pairs, beir = str(work / "pairs"), str(work / "beir")
    runs = work / "running"
    s3 = {
        "AWS_ENDPOINT_URL": moto,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    paused = {**s3, "AWS_ENDPOINT_URL": pausable_url, "SANTA_S3_READ_TIMEOUT": "3"}
    import boto3

    boto3.client("s3", endpoint_url=pausable_url, region_name="us-east-1").create_bucket(
        Bucket="paused"
    )

    def train(name: str, *extra: str, job: str = "ray_jobs.pretrain") -> list[str]:
        return [job, "--data", pairs, "--storage", str(runs), "--name", name, *RUN_TINY, *extra]

    # Inputs some faults need: a ghost table, a corrupt model, a flat Ruby folder, ESCI.
    ghost = NegativesTable({str(stdlib_pair_rows()[0]["query_id"]): ["no-such-doc"]})
    ghost.write_parquet(str(work / "ghost-table"))
    flat = work / "flat-ruby"
    flat.mkdir()
    flat.joinpath("part.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in other_language_records("ruby", 5))
    )
    write_esci(work / "esci")
    products = work / "esci" / "shopping_queries_dataset_products.parquet"
    products.write_bytes(products.read_bytes()[:-200])
    previous_eval = work / "previous-eval"
    with staged_output(str(previous_eval), tool="evaluate") as staged:
        storage.write_bytes(storage.join(staged.staging, "metrics.json"), b"{}")
        staged.publish({"systems": ["model"]})
    previous_neg = work / "previous-neg"
    with staged_output(str(previous_neg), tool="mine_negatives") as staged:
        storage.write_bytes(storage.join(staged.staging, "negatives.parquet"), b"kept")
        staged.publish({"queries": 0})
    corrupt_model(work / "corrupt-model")
    # A corpus whose refresh (encoding every document) outlasts a short stage.
    copies = [
        dict(row, id=f"{row['id']}-{k}", doc_id=f"{row['doc_id']}-{k}")
        | {"query_id": f"{row['query_id']}-{k}", "document": f"{row['document']} # {k}"}
        for k in range(40)
        for row in stdlib_pair_rows()
    ]
    big_pairs = write_pairs(work / "big-pairs", copies)
    session: dict[str, str] = {}
    holders = contextlib.ExitStack()

    def hold_busy() -> None:  # another preprocess writing into the output
        from santa.data.outputs import claim_output

        holders.enter_context(claim_output(str(work / "busy-out"), "preprocess"))

    def release_busy() -> None:
        holders.close()

    def kill_driver(proc, head) -> None:
        session["dir"] = _session_of(head)
        proc.kill()

    def ray_gone() -> bool:
        deadline = time.time() + 60
        while time.time() < deadline and session_processes(session.get("dir") or "/nonexistent"):
            time.sleep(1)
        return bool(session.get("dir")) and not session_processes(session["dir"])

    def stop_s3(proc, head) -> None:
        os.kill(pausable.pid, signal.SIGSTOP)

    def resume_s3() -> None:
        os.kill(pausable.pid, signal.SIGCONT)

    evaluate = ["ray_jobs.evaluate", "--checkpoint", str(runs / "cut"), "--data", beir]
    sweep = [
        "tuning.sweep", "--data", pairs, "--eval-data", beir, "--storage", str(work / "sweeps"),
        "--name", "cut", "--num-samples", "2", "--max-steps", "4", "--eval-every", "2",
        "--scheduler", "fifo", "--max-concurrent", "1", "--seed", "0", *TINY,
    ]  # fmt: skip
    step = "[train] step "
    faults = [
        # ---------------------------------------------------------------- Ctrl-C, job stop
        Fault(
            "pretrain: Ctrl-C mid-run (process group)",
            train("cut", "--max-steps", "8"),
            130,
            at_line=f"{step}5/",
            action=_killpg(signal.SIGINT),
            check=lambda: _kept(runs / "cut"),
            running=True,
        ),
        Fault(
            "pretrain: re-run after Ctrl-C",
            train("cut", "--max-steps", "8"),
            0,
            success_line="checkpoint:",
            check=lambda: _finished(runs / "cut", 8),
            running=True,
        ),
        Fault(
            "pretrain: ray job stop (SIGTERM) mid-run",
            train("stopped", "--max-steps", "8"),
            130,
            at_line=f"{step}3/",
            action=_job_stop,
            check=lambda: _kept(runs / "stopped"),
            running=True,
        ),
        Fault(
            "pretrain: Ctrl-C twice",
            train("twice", "--max-steps", "8"),
            130,
            at_line=f"{step}3/",
            action=_ctrl_c_twice,
            check=lambda: _kept(runs / "twice"),
            running=True,
        ),
        Fault(
            "finetune: Ctrl-C mid-run",
            train("ft-cut", "--max-steps", "8", job="ray_jobs.finetune"),
            130,
            at_line=f"{step}3/",
            action=_killpg(signal.SIGINT),
            check=lambda: _kept(runs / "ft-cut"),
            running=True,
        ),
        Fault(
            "pipeline: Ctrl-C mid-stage",
            [
                "ray_jobs.pipeline",
                "--data",
                pairs,
                "--eval-data",
                beir,
                "--storage",
                str(runs),
                "--name",
                "pipe",
                "--max-steps",
                "4",
                "--baseline",
                "none",
                *RUN_TINY,
            ],  # fmt: skip
            130,
            at_line="[train] step 3/",
            action=_killpg(signal.SIGINT),
            check=lambda: _lock_free(runs / "pipe"),
            running=True,
        ),
        Fault(
            "sweep: Ctrl-C before a trial's first result",
            sweep,
            130,
            at_line="[sweep] trial",
            action=_killpg(signal.SIGINT),
            check=lambda: not (work / "sweeps" / "cut" / "best.json").exists(),
            running=True,
        ),
        Fault(
            "sweep: re-run after Ctrl-C",
            sweep,
            0,
            success_line="wrote ",
            check=lambda: (
                json.loads((work / "sweeps" / "cut" / "best.json").read_text())["step"] == 4
            ),
            running=True,
        ),
        Fault(
            "evaluate: Ctrl-C mid-run keeps the output",
            [*evaluate, "--output", str(previous_eval)],
            130,
            action=_killpg(signal.SIGINT, pause_s=0.0),
            delay_s=4.0,
            watch=[previous_eval],
            running=True,
        ),
        Fault(
            "mine_negatives: Ctrl-C mid-run keeps the output",
            [
                "ray_jobs.mine_negatives",
                "--checkpoint",
                str(runs / "cut"),
                "--data",
                pairs,
                "--output",
                str(previous_neg),
            ],  # fmt: skip
            130,
            at_line="mining",
            action=_killpg(signal.SIGINT, pause_s=0.2),
            watch=[previous_neg],
            running=True,
        ),
        Fault(
            "preprocess: ray job stop (SIGTERM) mid-run",
            [
                "ray_jobs.preprocess",
                "--dataset",
                "codesearchnet",
                "--input",
                str(work / "big"),
                "--output",
                str(work / "previous"),
                "--address",
                "local",
            ],  # fmt: skip
            130,
            at_line="Ray:",
            action=_job_stop,
            watch=[work / "previous"],
            running=True,
        ),
        # ---------------------------------------------------------------- workers, driver
        Fault(
            "pretrain: kill -9 a training worker",
            train("worker", "--max-steps", "8", "--max-failures", "1"),
            0,
            at_line=f"{step}5/",
            action=_kill_process("ray::RayTrainWorker"),
            success_line="santa: warning: a training worker died",
            check=lambda: _finished(runs / "worker", 8),
            running=True,
        ),
        Fault(
            "pretrain: kill -9 a training worker, --max-failures 0",
            train("worker0", "--max-steps", "8", "--max-failures", "0"),
            1,
            at_line=f"{step}3/",
            action=_kill_process("ray::RayTrainWorker"),
            check=lambda: _kept(runs / "worker0"),
            running=True,
        ),
        Fault(
            "pretrain: kill -9 the driver (its local Ray goes too)",
            train("driver", "--max-steps", "8"),
            -9,
            at_line=f"{step}2/",
            action=kill_driver,
            check=ray_gone,
            running=True,
        ),
        Fault(
            "finetune: kill -9 the miner actor",
            train(
                "miner",
                "--max-steps",
                "60",
                "--hard-negatives",
                "async",
                "--set",
                "negatives.refresh_every=5",
                "--set",
                "negatives.wait_for_first=true",
                "--set",
                "train.checkpoint_every=60",
                job="ray_jobs.finetune",
            ),  # fmt: skip
            0,
            at_line=f"{step}10/",
            action=_kill_process("ray::HardNegativeMiner"),
            success_line="santa: warning: the hard-negative miner died",
            check=lambda: _finished(runs / "miner", 60),
            running=True,
        ),
        Fault(
            "finetune: async negatives that never come",
            [
                "ray_jobs.finetune",
                "--data",
                big_pairs,
                "--storage",
                str(runs),
                "--name",
                "never",
                *RUN_TINY,
                "--max-steps",
                "4",
                "--hard-negatives",
                "async",
                "--set",
                "negatives.refresh_every=1000",
            ],
            0,
            success_line="santa: warning: hard negatives: no table arrived",
            check=lambda: _finished(runs / "never", 4),
            running=True,
        ),
        Fault(
            "finetune: a table naming unknown documents (fails in the worker)",
            train(
                "ghost",
                "--max-steps",
                "4",
                "--hard-negatives",
                f"table:{work / 'ghost-table'}",
                job="ray_jobs.finetune",
            ),  # fmt: skip
            2,
            check=lambda: _lock_free(runs / "ghost"),
            running=True,
        ),
        # ---------------------------------------------------------------- checked before Ray
        # ---------------------------------------------------------------- a plan that can run
        Fault(
            "pretrain: --gpu on a machine without one",
            train("no-gpu", "--gpu"),
            2,
            watch=[runs / "no-gpu"],
        ),
        Fault(
            "pretrain: 2 workers of 1 CPU on 2 CPUs (Ray Data starved)",
            train("starved", "--num-workers", "2", "--cpus-per-worker", "1"),
            2,
            watch=[runs / "starved"],
        ),
        Fault(
            "finetune: --init-checkpoint cut short",
            train(
                "corrupt", "--init-checkpoint", str(work / "corrupt-model"), job="ray_jobs.finetune"
            ),
            2,
            watch=[runs / "corrupt"],
        ),
        Fault(
            "finetune: --hard-negatives table: missing",
            train(
                "notable", "--hard-negatives", f"table:{work / 'no-table'}", job="ray_jobs.finetune"
            ),
            2,
            watch=[runs / "notable"],
        ),
        Fault(
            "preprocess: --languages python on a flat Ruby folder",
            ["ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", str(flat)]
            + ["--output", str(work / "flat-out"), "--languages", "python"],
            2,
            check=lambda: not (work / "flat-out").exists(),
        ),
        Fault(
            "preprocess: ESCI products cut short",
            ["ray_jobs.preprocess", "--dataset", "esci", "--input", str(work / "esci")]
            + ["--output", str(work / "esci-out")],
            2,
            check=lambda: not (work / "esci-out").exists(),
        ),
        Fault(
            "evaluate: checkpoint cut short",
            ["ray_jobs.evaluate", "--checkpoint", str(work / "corrupt-model"), "--data", beir]
            + ["--baseline", "none"],
            2,
        ),
        # ---------------------------------------------------------------- one writer per output
        Fault(
            "evaluate: --output holding a preprocess output",
            [*evaluate, "--output", str(work / "previous"), "--baseline", "none"],
            2,
            watch=[work / "previous"],
        ),
        Fault(
            "evaluate: re-run into its own output leaves no stale file",
            [*evaluate, "--output", str(previous_eval), "--baseline", "none"],
            0,
            success_line="output:",
            check=lambda: (
                sorted(p.name for p in previous_eval.iterdir())
                == ["info.json", "metrics.json", "metrics.md", "report.json", "run.model.trec"]
            ),
            running=True,
        ),
        Fault(
            "export: --to holding a training run",
            ["ray_jobs.export", "--latest", str(runs / "cut"), "--to", str(runs / "worker")]
            + ["--overwrite"],
            2,
            check=lambda: _finished(runs / "worker", 8),
        ),
        Fault(
            "preprocess: a second job into an output in use",
            [
                "ray_jobs.preprocess",
                "--dataset",
                "codesearchnet",
                "--input",
                str(work / "big"),
                "--output",
                str(work / "busy-out"),
            ],  # fmt: skip
            2,
            before=hold_busy,
            after=release_busy,
            check=lambda: not (work / "busy-out").exists(),
            running=True,
        ),
        # ---------------------------------------------------------------- S3 lost mid-run
        Fault(
            "pretrain: S3 silent mid-training (moto stopped)",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                "s3://paused/runs",
                "--name",
                "r",
                *RUN_TINY,
                "--max-steps",
                "8",
                "--max-failures",
                "0",
            ],  # fmt: skip
            1,
            env=paused,
            at_line=f"{step}3/",
            action=stop_s3,
            after=resume_s3,
            running=True,
            timeout_s=600,
        ),
        Fault(
            "pretrain: re-run once S3 answers again",
            [
                "ray_jobs.pretrain",
                "--data",
                pairs,
                "--storage",
                "s3://paused/runs",
                "--name",
                "r",
                *RUN_TINY,
                "--max-steps",
                "8",
            ],  # fmt: skip
            0,
            env=paused,
            success_line="checkpoint: s3://paused/runs/r/",
            running=True,
        ),
        # ---------------------------------------------------------------- a lost node
        Fault(
            "pretrain: lost node, fixed size (waits 2 x 20 s, ends)",
            lost_node("fixed", work),
            1,
            running=True,
            santa_lines=2,
            timeout_s=1500,
        ),
        Fault(
            "pretrain: lost node, --num-workers 1-2 (goes on, grows back)",
            lost_node("elastic", work),
            0,
            success_line="training is back to 2 of 1-2 workers",
            check=lambda: _finished(work / "lost-elastic" / "elastic", ELASTIC_STEPS),
            running=True,
            timeout_s=1500,
        ),
    ]
    return faults


# ============================================================================ issue 40
# Point 9's faults: Ctrl-C of index and export, two writers into export, index and
# mine_negatives, S3 silent while Ray Data reads. (Ctrl-C of mine_negatives, the miner killed
# mid-ANCE and an async stage too short for any table are the rows above.)


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


def build_more_running_faults(work: Path, pausable, pausable_url: str) -> list[Fault]:
    """Issue 40's faults (after :func:`build_running_faults`, whose inputs they reuse)."""
    import boto3

    from santa.runtime.layout import output_lock

    pairs, big_pairs, model = str(work / "pairs"), str(work / "big-pairs"), work / "tiny-model"
    tiny_model(model)
    # A model folder of 640 MB (a padding file), so that its export copy takes a while.
    big_model = work / "big-model"
    shutil.copytree(model, big_model)
    block = os.urandom(64 << 20)
    with open(big_model / "padding.bin", "wb") as padding:
        for _ in range(10):
            padding.write(block)
    # The JSON lines of a CodeSearchNet layout on the S3 server that is stopped.
    s3 = {
        "AWS_ENDPOINT_URL": pausable_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = boto3.client("s3", endpoint_url=pausable_url, region_name="us-east-1")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket="paused")
    body = work / "big" / "python" / "final" / "jsonl" / "train" / "python_train_0.jsonl.gz"
    for k in range(4):
        key = f"csn/python/final/jsonl/train/python_train_{k}.jsonl.gz"
        client.put_object(Bucket="paused", Key=key, Body=body.read_bytes())

    exported, idx_whole, idx_cut, neg = (
        work / "exported", work / "idx-whole", work / "idx-cut", work / "neg-first"
    )  # fmt: skip
    export = ["ray_jobs.export", "--checkpoint", str(model), "--to", str(exported)]
    first_export = FirstWriter(export, Path(output_lock(str(exported))))

    def index(output: Path) -> list[str]:
        return [
            "ray_jobs.index", "--checkpoint", str(model), "--corpus", big_pairs,
            "--output", str(output), "--shard-size", "1000", "--actors", "1",
        ]  # fmt: skip

    first_index = FirstWriter(index(idx_whole), Path(output_lock(str(idx_whole))))
    mine = ["ray_jobs.mine_negatives", "--checkpoint", str(model), "--data", pairs]
    mine += ["--output", str(neg)]
    first_mine = FirstWriter(mine, Path(output_lock(str(neg))))

    def stop_s3(proc, head) -> None:
        os.kill(pausable.pid, signal.SIGSTOP)

    def resume_s3() -> None:
        os.kill(pausable.pid, signal.SIGCONT)

    read = ["ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", "s3://paused/csn"]
    read += ["--output", str(work / "s3-read-out"), "--address", "local"]
    write = ["ray_jobs.preprocess", "--dataset", "codesearchnet", "--input", str(work / "big")]
    write += ["--output", "s3://paused/write-out", "--address", "local"]

    def nothing_published() -> bool:
        listed = client.list_objects_v2(Bucket="paused", Prefix="write-out/")
        return not any(item["Key"].endswith("report.json") for item in listed.get("Contents", []))

    return [
        Fault(
            "export: a second job into an output in use (the first finishes)",
            export,
            2,
            before=first_export.start,
            after=first_export.finish,
            check=lambda: first_export.finished(exported / "model.safetensors"),
            running=True,
        ),
        Fault(
            "export: Ctrl-C mid-copy keeps the output",
            ["ray_jobs.export", "--checkpoint", str(big_model), "--to", str(exported)]
            + ["--overwrite"],
            130,
            action=_when(_exists(work, ".exported.partial-*"), _killpg(signal.SIGINT, 0.0)),
            watch=[exported],
            check=lambda: not list(work.glob(".exported.partial-*")),
            running=True,
        ),
        Fault(
            "index: a second job into an output in use (the first finishes)",
            index(idx_whole),
            2,
            before=first_index.start,
            after=first_index.finish,
            check=lambda: first_index.finished(idx_whole / "report.json"),
            running=True,
            timeout_s=900,
        ),
        Fault(
            "index: Ctrl-C mid-encode (a shard written)",
            index(idx_cut),
            130,
            action=_when(
                _exists(work, "idx-cut.partial-*/embeddings/*.parquet"),
                _killpg(signal.SIGINT, 0.0),
            ),
            check=lambda: not (idx_cut / "report.json").exists() and _lock_free(idx_cut),
            running=True,
        ),
        Fault(
            "index: re-run after Ctrl-C",
            index(idx_cut),
            0,
            success_line="[index] resuming",
            check=lambda: (idx_cut / "report.json").is_file(),
            resume=lambda: _same_embeddings(idx_cut, idx_whole),
            running=True,
        ),
        Fault(
            "mine_negatives: a second job into an output in use (the first finishes)",
            mine,
            2,
            before=first_mine.start,
            after=first_mine.finish,
            check=lambda: first_mine.finished(neg / "report.json"),
            running=True,
        ),
        Fault(
            "preprocess: S3 silent during a Ray Data read (moto stopped)",
            read,
            1,
            env=s3,
            action=_when(_descendant("CodePairBuilder"), stop_s3),
            after=resume_s3,
            check=lambda: not (work / "s3-read-out").exists(),
            running=True,
        ),
        Fault(
            "preprocess: re-run once S3 answers again",
            read,
            0,
            env=s3,
            success_line="rows written",
            check=lambda: (work / "s3-read-out" / "report.json").is_file(),
            running=True,
        ),
        Fault(
            "preprocess: S3 silent during Ray Data's Parquet upload (moto stopped)",
            write,
            1,
            env=s3,
            # The task that writes the Parquet files to S3 has started (its first S3 call).
            action=_when(_descendant("Write"), stop_s3),
            after=resume_s3,
            check=nothing_published,
            running=True,
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
