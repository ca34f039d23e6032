"""Third-party chatter goes to a log file, in the driver and in every Ray worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLEANER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"

WORKER_PROBE = f"""
import logging, warnings
from santa.runtime import quiet
quiet.quiet_worker()
for _ in range(3):
    logging.getLogger("{CLEANER}").warning("Failed to query Ray Train Controller actor state.")
warnings.warn("invalid escape sequence '\\\\d'", SyntaxWarning)
logging.getLogger("faiss.loader").warning("Could not load library with AVX512 support")
logging.getLogger("santa.train").warning("santa's own warning")
print(quiet._installed["path"])
"""

DRIVER_PROBE = f"""
import logging, ray
from santa.runtime.ray_utils import init_ray
print(init_ray())
hooked = ray.get(ray.remote(num_cpus=0)(
    lambda: logging.getLogger("{CLEANER}").propagate is False).remote())
print("worker quiet:", hooked)
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


def test_a_jobs_first_line_is_santas_and_its_workers_are_quiet(tmp_path) -> None:
    """On a local Ray (whose token-auth notice Ray logs at WARNING from ray.init)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(ROOT), SANTA_LOG_FILE=str(tmp_path / "job.log"))
    done = subprocess.run(
        [sys.executable, "-c", DRIVER_PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Ray: started a local cluster (")
    assert lines[0].endswith(f"; warnings in {tmp_path / 'job.log'})")
    assert "worker quiet: True" in lines
    assert "WARNING" not in done.stderr, done.stderr[-2000:]


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
