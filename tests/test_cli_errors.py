"""The jobs' command lines: bad input is one line on stderr and exit 2, before any Ray work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from santa.files.runlock import RunLock
from tests.training import stdlib_pair_rows, write_pairs


def _job(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def test_zero_steps_is_an_error_not_unset(tmp_path: Path) -> None:
    proc = _job(
        "ray_jobs.pretrain", "--data", str(tmp_path), "--storage", str(tmp_path), "--name", "x",
        "--max-steps", "0", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "santa: error: TrainConfig.max_steps must be positive, got 0"
    ]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_locked_run_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    with RunLock(str(tmp_path / "runs" / "busy"), description="pipeline"):
        proc = _job(
            "ray_jobs.pretrain", "--data", data, "--storage", str(tmp_path / "runs"),
            "--name", "busy", cwd=tmp_path,
        )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("santa: error: run ")
    assert f"in use by pid {os.getpid()}" in lines[0] and "(pipeline)" in lines[0]
    assert "Ray:" not in proc.stdout  # refused before starting Ray


def test_missing_inputs_are_one_line_with_the_path(tmp_path: Path) -> None:
    proc = _job(
        "ray_jobs.evaluate", "--checkpoint", str(tmp_path / "no-such-model"), "--data",
        str(tmp_path / "no-such-beir"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("santa: error: ")
    assert "no-such" in lines[0]
    debug = _job(
        "ray_jobs.evaluate", "--checkpoint", str(tmp_path / "no-such-model"), "--data",
        str(tmp_path / "no-such-beir"), "--debug", cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" in debug.stderr and debug.returncode == 2
