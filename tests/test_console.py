"""A job's terminal shows santa's lines only (issue 33): what Ray forwards from its workers
and what Ray logs in the driver go to the log file in Ray's session folder."""

from __future__ import annotations

from pathlib import Path

from santa.runtime import console


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
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

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
    finally:
        dispatcher.remove_handler("ray_print_logs")
    captured = capsys.readouterr()
    assert captured.err == "santa: warning: a line\n"
    assert captured.out == "[train] step 1/2 loss 1.0\n"
    assert Path(path).read_text() == (
        "(RayTrainWorker pid=4242) Traceback (most recent call last):\n"
    )
