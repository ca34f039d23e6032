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
