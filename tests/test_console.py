"""A job's terminal shows santa's lines only (issue 33): what Ray forwards from its workers
and what Ray logs in the driver go to the log file in Ray's session folder."""

from __future__ import annotations

from pathlib import Path

from santa.jobs import console


def test_santa_lines_are_told_from_ray_lines() -> None:
    for line in (
        "santa: warning: the hard-negative miner died",
        "[train] step 5/40 loss 8.1937 (sda 1.8892, mep 6.3046) 24.4 pairs/s lr 4.72e-04",
        "[dual_encoder] step 3/10 loss 1.2",
        "[iter 2] dev_mrr 0.31",
    ):
        assert console.is_santa_line(line), line
    for line in (
        "2026-11-25 16:59:07 INFO parquet_datasource.py:1416 -- Estimated parquet encoding ratio",
        "[2026-11-25 16:59:07,766 E 15570 15813] core_worker.cc:2465: Actor with class name",
        "Traceback (most recent call last):",
        "(raylet) Raylet is terminated.",
        "✔️  Dataset train_0 execution finished in 4.05 seconds",
    ):
        assert not console.is_santa_line(line), line


def test_forwarded_worker_lines_other_than_santas_go_to_the_log_file(tmp_path: Path, capsys):
    from ray._private import worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    printer = ray_worker.print_to_stdstream
    path = console.keep_ray_logs_off_the_terminal(str(tmp_path))
    try:
        dispatcher.emit(
            {
                "pid": 4242,
                "actor_name": "RayTrainWorker",
                "is_err": True,
                "lines": ["Traceback (most recent call last):", "santa: warning: a line"],
            }
        )
        dispatcher.emit({"pid": 7, "is_err": False, "lines": ["[train] step 1/2 loss 1.0"]})
        # The errors Ray pushes to the driver bypass the dispatcher (a killed worker).
        ray_worker.print_to_stdstream(
            {"lines": ["A worker died or was killed while executing a task"], "pid": "raylet",
             "is_err": False},
            ignore_prefix=False,
        )  # fmt: skip
    finally:
        dispatcher.remove_handler("ray_print_logs")
        ray_worker.print_to_stdstream = printer
    captured = capsys.readouterr()
    assert captured.err == "santa: warning: a line\n"
    assert captured.out == "[train] step 1/2 loss 1.0\n"
    # Driver-side records buffered earlier in this process (other tests' Ray) go there too.
    forwarded = [line for line in Path(path).read_text().splitlines() if line.startswith("(")]
    assert forwarded == [
        "(RayTrainWorker pid=4242) Traceback (most recent call last):",
        "(pid=raylet) A worker died or was killed while executing a task",
    ]


_NATIVE = """
import os, sys
from santa.jobs import console
console.divert_native_stderr(sys.argv[1])  # a library call: nothing diverted
os.write(2, b"native before\\n")
console.mark_command_line()
assert console.divert_native_stderr(sys.argv[1])
os.write(2, b"[2026-11-26 07:41:23,785 E 1 1] core_worker.cc:2465: native after\\n")
print("santa: error: a python line", file=sys.stderr, flush=True)
console.say("santa: warning: said")
"""


def test_native_stderr_of_a_command_line_job_goes_to_its_log_file(tmp_path: Path) -> None:
    """C++ code (Ray's core worker in the driver) writes to fd 2 itself: in a job run from
    the command line that goes to the log file; Python's stderr keeps the terminal."""
    import subprocess
    import sys

    log = tmp_path / "logs" / "job.log"
    done = subprocess.run(
        [sys.executable, "-c", _NATIVE, str(log)], capture_output=True, text=True, check=True
    )
    assert done.stderr == ("native before\nsanta: error: a python line\nsanta: warning: said\n")
    assert log.read_text() == (
        "[2026-11-26 07:41:23,785 E 1 1] core_worker.cc:2465: native after\n"
    )
