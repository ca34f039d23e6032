"""Fault injection against the real command lines (issue 17).

Each fault runs a job in a subprocess (bad paths, a missing bucket and refused
credentials on moto's S3 server, a silent S3 endpoint, bad files, a corrupt checkpoint, a
locked run, Ctrl-C mid-preprocess, ...) and is recorded as: exit code (and the one
expected), lines on stderr, the message (the first ``santa:`` line on stderr, else the
first stderr line, or for a success the line that shows the fault was handled), seconds,
and whether the data was safe (outputs untouched or whole afterwards).

    python bench/robustness/faults.py [--only SUBSTRING]

Writes bench/results/faults.json and prints the table. The faults themselves (each a
command line, the exit code it must end with and what must stay untouched) are built by
``build_faults`` below, in a scratch folder.
"""

from __future__ import annotations

import argparse
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

ROOT = common.ROOT
RESULTS = common.RESULTS_DIR / "faults.json"
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


def run_fault(fault: Fault) -> dict:
    """Run one fault's command in a subprocess and judge its exit, message and data."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env.update(PYTHONPATH=str(ROOT), RAY_DATA_DISABLE_PROGRESS_BARS="1", **fault.env)
    before = snapshot(fault.watch)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", *fault.command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    stdout_head = []
    if fault.interrupt_after:
        for line in proc.stdout:
            stdout_head.append(line)
            if line.startswith(fault.interrupt_after):
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    seconds = time.monotonic() - started
    stdout = "".join(stdout_head) + stdout
    err_lines = [line for line in stderr.splitlines() if line.strip()]
    santa_lines = [line for line in err_lines if line.startswith("santa:")]
    if fault.success_line:
        shown = [line for line in (stdout + stderr).splitlines() if fault.success_line in line]
        message = shown[0].strip() if shown else "(expected line missing)"
    else:
        message = (santa_lines or err_lines or ["(no message)"])[0]
    safe = snapshot(fault.watch) == before and (fault.check() if fault.check else True)
    return {
        "fault": fault.name,
        "exit": proc.returncode,
        "expected": fault.expected,
        "stderr_lines": len(err_lines),
        "santa_lines": len(santa_lines),
        "message": message,
        "seconds": round(seconds, 1),
        "data_safe": bool(safe),
        "stderr_tail": stderr[-1500:] if proc.returncode != fault.expected else "",
        "ok": proc.returncode == fault.expected
        and (fault.expected == 0 or len(santa_lines) == 1)
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


def format_table(rows: list[dict]) -> str:
    """A markdown table of the faults' outcomes (long messages cut at 160 characters)."""
    table = []
    for row in rows:
        message = row["message"]
        if len(message) > 160:
            message = message[:157] + "..."
        table.append(
            [
                row["fault"],
                f"{row['exit']} ({row['expected']})",
                row["stderr_lines"],
                message,
                f"{row['seconds']:.1f}",
                "yes" if row["data_safe"] else "NO",
            ]
        )
    header = ["fault", "exit (want)", "stderr lines", "message", "s", "data safe"]
    return common.format_table(header, table, align="lrrlrl")


def main(argv: list[str] | None = None) -> int:
    """Run the faults (or those ``--only`` names), print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run the faults whose name has this text")
    args = parser.parse_args(argv)
    os.environ.setdefault("NLTK_DATA", str(ROOT.parent / "shared" / "nltk_data"))
    from santa.runtime.runlock import RunLock

    bench = common.BenchRun(__file__, argv)

    work = Path(tempfile.mkdtemp(prefix="santa-faults-"))
    moto, moto_url = start_moto()
    auth, auth_url = start_moto(auth=True)
    silent = SilentEndpoint()
    rows = []
    try:
        faults = build_faults(work, moto_url, auth_url, silent.endpoint)
        for fault in faults:
            if args.only and args.only not in fault.name:
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
        for server in (moto, auth):
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(format_table(rows))
    passed = sum(row["ok"] and row["data_safe"] for row in rows)
    print(f"\n{passed}/{len(rows)} faults: right exit code, one message line, data safe")
    if not args.only:
        bench.write_json(RESULTS, {"faults": rows})
        print(f"wrote {RESULTS}")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
