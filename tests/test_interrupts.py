"""Ctrl-C and ``ray job stop`` (issue 33): exit 130 and one ``santa: interrupted`` line saying
what was kept and how to go on; a second signal stops at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from santa.jobs import interrupts

REPO = Path(__file__).resolve().parents[1]

# A job whose work takes long and whose unwinding (a slow cleanup) takes long too.
SLOW_JOB = textwrap.dedent(
    """
    import sys, time
    from santa.jobs import interrupts
    from santa.jobs.errors import exit_with, run_job

    if sys.argv[1].startswith("diverted"):  # a command-line job: fd 2 to its log file
        from santa.jobs import console

        console.mark_command_line()
        console.divert_native_stderr(sys.argv[2])

    def main():
        with interrupts.keeping(lambda: "run X kept its checkpoint at step 5", hint="rerun"):
            try:
                print("working", flush=True)
                time.sleep(60)
            finally:
                if sys.argv[1].endswith("slow-cleanup"):
                    print("cleaning", flush=True)
                    time.sleep(60)
        return 0

    code = run_job(main, argv=[])
    if sys.argv[1] == "slow-exit":  # as Ray's shutdown after the line, in exit_with
        print("exiting", flush=True)
        time.sleep(60)
    exit_with(code)
    """
)


def _start(mode: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_JOB, mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


def _wait_for(proc: subprocess.Popen, text: str) -> None:
    for line in proc.stdout:
        if line.startswith(text):
            return
    raise AssertionError(f"no {text!r} line")


def test_ctrl_c_to_the_process_group_exits_130_with_what_was_kept() -> None:
    proc = _start("plain")
    _wait_for(proc, "working")
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert stderr.splitlines() == ["santa: interrupted: run X kept its checkpoint at step 5; rerun"]


def test_sigterm_is_answered_like_ctrl_c() -> None:
    """`ray job stop` sends SIGTERM (and SIGKILL 3 s later)."""
    proc = _start("plain")
    _wait_for(proc, "working")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - started < 3
    assert stderr.splitlines() == ["santa: interrupted: run X kept its checkpoint at step 5; rerun"]


@pytest.mark.parametrize("mode", ["slow-cleanup", "diverted-slow-cleanup"])
def test_a_second_ctrl_c_stops_at_once(mode: str, tmp_path: Path) -> None:
    """Also from a job whose file descriptor 2 goes to its log file: the line is the
    terminal's."""
    proc = _start(mode, str(tmp_path / "job.log"))
    _wait_for(proc, "working")
    os.killpg(proc.pid, signal.SIGINT)
    _wait_for(proc, "cleaning")
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - started < 5
    assert stderr.splitlines() == ["santa: interrupted again: stopped at once"]


def test_a_second_ctrl_c_after_the_line_adds_no_line() -> None:
    """Once the job said what was kept, a second Ctrl-C (while Ray shuts down) ends it at
    once and that one line stays the job's last word."""
    proc = _start("slow-exit")
    _wait_for(proc, "working")
    os.killpg(proc.pid, signal.SIGINT)
    _wait_for(proc, "exiting")
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - started < 5
    assert stderr.splitlines() == ["santa: interrupted: run X kept its checkpoint at step 5; rerun"]


def test_the_line_joins_what_each_level_kept_outer_first() -> None:
    outer = interrupts.keeping(lambda: "pipeline P: stages pretrain done", hint="resume")
    inner = interrupts.keeping(lambda: "run P/finetune kept its checkpoint at step 4")
    with outer, inner:
        line = interrupts.interrupted_line()
    assert line == (
        "santa: interrupted: pipeline P: stages pretrain done; run P/finetune kept its "
        "checkpoint at step 4; resume"
    )
    assert interrupts.interrupted_line() == "santa: interrupted"  # left the blocks normally


def test_call_in_thread_runs_off_the_main_thread_and_returns_or_raises() -> None:
    """Ray Train's fit() takes SIGINT over from the main thread only (then exits with 1 and
    no message): santa runs it in a helper thread."""
    assert interrupts.call_in_thread(lambda: threading.current_thread().name) == "santa-call"
    try:
        interrupts.call_in_thread(lambda: 1 / 0)
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the helper's exception must reach the caller")
