"""Third-party chatter goes to a log file, in the driver and in every Ray worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLEANER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"

WORKER_PROBE = f"""
import logging, warnings
from santa.jobs import quiet
quiet.quiet_worker()
for _ in range(3):
    logging.getLogger("{CLEANER}").warning("Failed to query Ray Train Controller actor state.")
warnings.warn("invalid escape sequence '\\\\d'", SyntaxWarning)
logging.getLogger("faiss.loader").warning("Could not load library with AVX512 support")
logging.getLogger("santa.train").warning("santa's own warning")
print(quiet._installed["path"])
"""


def test_a_worker_keeps_third_party_warnings_in_its_log_file(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "santa's own warning"  # santa's own lines still print
    log = Path(done.stdout.strip().splitlines()[-1]).read_text()
    assert log.count("Failed to query Ray Train Controller actor state") == 3
    assert "SyntaxWarning" in log and "AVX512" in log


def test_a_jobs_first_line_is_santas_and_its_workers_are_quiet(own_local_ray) -> None:
    """On a local Ray (whose token-auth notice Ray logs at WARNING from ray.init): conftest's
    ``own_local_ray``, a driver's ``init_ray()`` with ``SANTA_LOG_FILE`` set."""
    first_line, facts = own_local_ray["first_line"], own_local_ray["facts"]
    assert facts, own_local_ray["stderr"][-2000:]
    assert first_line.startswith("Ray: started a local cluster (")
    assert first_line.endswith(f"; warnings in {own_local_ray['log_file']})")
    assert facts["worker"]["quiet"] is True
    assert "WARNING" not in own_local_ray["stderr"], own_local_ray["stderr"][-2000:]


def test_a_finished_training_job_prints_a_short_table_not_its_metrics_json() -> None:
    from santa.train.kept import final_metrics_lines

    metrics = {
        "step": 300.0,
        "loss": 1.23456,
        "loss_sda": 0.5,
        "loss_mep": 0.73456,
        "pairs_per_s": 480.2,
        "startup_total_s": 57.0,
        "max_rss_mb": 2308.0,
    }
    lines = final_metrics_lines(metrics, "runs/x/metrics.jsonl")
    assert lines == [
        "finished at step 300",
        "  loss             1.2346",
        "  loss_sda         0.5000",
        "  loss_mep         0.7346",
        "  pairs_per_s      480.2000",
        "every logged window: runs/x/metrics.jsonl",
    ]
    assert not any(line.lstrip().startswith(("{", '"')) for line in lines)
    assert final_metrics_lines({}) == ["finished"]


# What a successful job may print: santa's own lines. Everything else (logging-format lines,
# progress bars, a library's notes) belongs in the job's log file.
SANTAS_LINE = re.compile(
    r"^(santa: |\[[a-z][a-z_\-]*( \d+)?\] |\|.*\|$|model encoded at |output: |Ray: )"
)


def _not_santas(*outputs: str) -> list[str]:
    return [
        line
        for output in outputs
        for line in output.replace("\r", "\n").splitlines()
        if line.strip() and not SANTAS_LINE.match(line)
    ]


def test_a_successful_evaluate_prints_santas_lines_only(evaluate_cli_run) -> None:
    """Through the real command line (conftest's ``evaluate_cli_run``): no bm25s DEBUG, no
    INFO line, no progress bar."""
    done = evaluate_cli_run["proc"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert _not_santas(done.stdout, done.stderr) == []
    assert done.stdout.splitlines()[0].startswith("| system | mrr@100 |")
    assert f"output: {evaluate_cli_run['output']}" in done.stdout.splitlines()
    log = evaluate_cli_run["log"]
    assert "INFO santa.eval.evaluation: evaluation info: {" in log  # kept, in the log file
    assert "Building index from tokens" not in log  # bm25s's DEBUG: dropped


def test_a_quiet_jobs_logging_goes_to_its_file_and_santas_warnings_stay_lines(tmp_path) -> None:
    probe = """
import logging, sys
logging.basicConfig(level=logging.INFO)  # what the jobs do first
from santa.jobs import quiet
quiet.quiet_job_logging(sys.argv[1])
logging.basicConfig(level=logging.INFO)  # a second call: no terminal handler again
import bm25s
logging.getLogger("bm25s").debug("Building index from tokens")
logging.getLogger("santa.eval").info("evaluation info: {}")
logging.getLogger("santa.files.outputs").warning("deleted x, left by a run that died")
logging.getLogger("transformers").warning("a library's warning")
"""
    log = tmp_path / "job.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe, str(log)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr == "santa: warning: deleted x, left by a run that died\n"
    text = log.read_text()
    assert "evaluation info" in text and "a library's warning" in text and "left by" in text
    assert "Building index" not in text


def test_progress_bars_are_off_unless_asked(monkeypatch) -> None:
    """--progress on every job that starts Ray Data; transformers told even after import."""
    from ray_jobs import index, preprocess
    from santa.jobs import quiet

    assert (
        index.parse_args(["--checkpoint", "c", "--corpus", "c", "--output", "o"]).progress is False
    )
    assert preprocess.parse_args(
        ["--dataset", "codesearchnet", "--input", "i", "--output", "o", "--progress"]
    )[2]
    from santa.jobs.flags import run_parser

    assert run_parser().parse_args(["--progress"]).progress is True

    import transformers.utils.logging as transformers_logging

    for name in quiet.PROGRESS_BAR_ENV:
        monkeypatch.delenv(name, raising=False)
    transformers_logging.enable_progress_bar()
    try:
        env = quiet.progress_bars_off()
        assert env == {"RAY_DATA_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        assert not transformers_logging.is_progress_bar_enabled()
    finally:
        transformers_logging.enable_progress_bar()


def test_search_from_the_command_line_is_a_quiet_job(monkeypatch) -> None:
    """Its ``Loading weights ... 101/101`` bar came from being run as a library call."""
    from ray_jobs import search
    from santa.jobs import errors

    seen = []
    monkeypatch.setattr(errors, "run_job", lambda work, argv: seen.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", ["search", "--index", "i", "a query"])
    search.main()
    search.main(["--index", "i", "a query"])
    assert seen == [None, ["--index", "i", "a query"]]


def test_serves_driver_lines_go_to_the_log_file() -> None:
    """``ray_jobs.serve`` / ``search --serve`` printed Serve's ``INFO ... -- Started Serve in
    namespace "serve"`` (its own stream handler, installed when ``ray.serve`` is imported)."""
    script = (
        "import logging\n"
        "import ray.serve\n"
        "from santa.jobs import console\n"
        "console.quiet_driver_loggers()\n"
        'logging.getLogger("ray.serve").info("Started Serve in namespace serve")\n'
        'print("done")\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done" and "Started Serve" not in done.stderr, done.stderr
