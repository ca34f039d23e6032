"""Local Rays that santa starts, each started once for the tests that read it (issue 57).

``own_local_ray``: one driver starts a Ray of its own with ``init_ray()``, as a job on a
laptop does, reports what its driver and a worker see, and is then killed outright: what
tests/test_ray_utils.py (the workers' priority and settings), tests/test_quiet.py (the
first line, quiet workers) and tests/test_reaper.py (nothing left after ``kill -9``) read.
Four Ray starts of ~15 s where there was one each.

``ray_start_attempts``: the two local starts made to time out (tests/test_ray_start.py), run
at once: both wait on a registration that is held, which costs no CPU. The retry that comes
up runs with ``RAY_worker_niceness=15``, the user's setting tests/test_ray_utils.py checks is
kept (a Ray start less).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from santa.cluster.reaper import session_processes

ROOT = Path(__file__).resolve().parents[1]
CLEANER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"

OWN_RAY_PROBE = f"""
import json, logging, os, time, ray
from santa.cluster.ray_utils import init_ray

def seen():
    return {{
        "nice": os.nice(0),
        "SANTA_QUIET": os.environ.get("SANTA_QUIET"),
        "NLTK_DATA": os.environ.get("NLTK_DATA"),
        "quiet": logging.getLogger("{CLEANER}").propagate is False,
    }}

print(init_ray(), flush=True)
worker = ray.get(ray.remote(num_cpus=0)(seen).remote())
print(json.dumps({{
    "worker": worker,
    "driver_nice": os.nice(0),
    "job_runtime_env": sorted(ray.get_runtime_context().runtime_env),
    "driver_keeps_santa_quiet": "SANTA_QUIET" in os.environ,
}}), flush=True)
busy = ray.remote(num_cpus=0)(lambda: time.sleep(600)).remote()  # a worker mid-task, killed
time.sleep(600)  # until the test kills this driver outright
"""


def kill_an_own_local_ray(root: Path) -> dict[str, Any]:
    """``OWN_RAY_PROBE`` in a process of its own (the environment of a user's shell: no
    ``RAY_*`` or ``SANTA_*``), then ``kill -9`` of its driver: its lines, its stderr up to
    then, and the session's processes before the kill and 60 s after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SANTA_"))}
    nltk_data, log_file = root / "nltk_data", root / "job.log"
    nltk_data.mkdir(parents=True, exist_ok=True)
    env.update(PYTHONPATH=str(ROOT), NLTK_DATA=str(nltk_data), SANTA_LOG_FILE=str(log_file))
    stderr_path = root / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        driver = subprocess.Popen(
            [sys.executable, "-c", OWN_RAY_PROBE],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=ROOT,
        )
    watchdog = threading.Timer(300, driver.kill)  # a driver that never reports: EOF below
    watchdog.start()
    try:
        first_line, facts_line = driver.stdout.readline(), driver.stdout.readline()
    finally:
        watchdog.cancel()
    found = re.search(r"logs in (\S+)/logs[;)]", first_line)
    session = found.group(1) if found else None
    alive = session_processes(session) if session else []
    driver.kill()  # kill -9: no shutdown of its own
    driver.wait()
    deadline = time.time() + 60
    left = session_processes(session) if session else []
    while left and time.time() < deadline:
        time.sleep(1)
        left = session_processes(session)
    return {
        "first_line": first_line.rstrip("\n"),
        "facts": json.loads(facts_line) if facts_line.startswith("{") else None,
        "stderr": stderr_path.read_text(),
        "session": session,
        "alive_before_kill": alive,
        "left_after_kill": left,
        "nltk_data": str(nltk_data),
        "log_file": str(log_file),
    }


HOLD_REGISTRATION = "NodeInfoGcsService.grpc_server.RegisterNode=600000000:600000000"
USERS_NICENESS = 15  # the retry that comes up: a user's RAY_worker_niceness, kept

START_PROBE = """
import os, subprocess, sys
from santa.cluster import ray_utils
from santa.jobs.errors import exit_with, run_job

TEMP = sys.argv[1]
if sys.argv[2] == "let-the-retry-start":
    clean_up = ray_utils._clean_up_failed_start

    def clean_up_then_let_it_register(error):
        os.environ.pop("RAY_testing_asio_delay_us")  # the retry's GCS registers the raylet
        return clean_up(error)

    ray_utils._clean_up_failed_start = clean_up_then_let_it_register


def main():
    try:
        print(ray_utils.init_ray(_temp_dir=TEMP), flush=True)
        import ray
        print("answer:", ray.get(ray.remote(num_cpus=0)(lambda: 42).remote()), flush=True)
        worker = ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote())
        print("nice", worker, os.nice(0), flush=True)
    finally:
        # Every process of both attempts, while this driver still lives (its children
        # would die with it anyway: Ray ties them to the driver).
        table = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True)
        left = [line for line in table.stdout.splitlines() if TEMP + "/session" in line]
        print(f"ray processes: {len(left)}", *left, sep="\\n", flush=True)


exit_with(run_job(main))
"""

# mode -> santa's first wait (SANTA_RAY_START_WAIT_S): the retry waits 3 times as long.
START_MODES = {"hold-every-start": "1", "let-the-retry-start": "10"}


def start_local_rays_that_time_out() -> dict[str, Any]:
    """``START_PROBE`` in both modes at once, each with a short folder of its own for Ray's
    sessions (socket paths stay within 107 characters): ``{mode: CompletedProcess}`` and
    ``"temp": {mode: folder}``; remove the folders with :func:`remove_temps`."""
    temps = {mode: tempfile.mkdtemp(prefix="santa-rs-", dir="/tmp") for mode in START_MODES}
    running = {}
    for mode, first_wait in START_MODES.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            PYTHONPATH=str(ROOT),
            SANTA_RAY_START_WAIT_S=first_wait,
            RAY_testing_asio_delay_us=HOLD_REGISTRATION,
            # Each of the driver's asks for the node waits 1 s (Ray's default: 30 s).
            RAY_raylet_start_wait_time_s="1",
            SANTA_LOG_FILE=os.path.join(temps[mode], "job.log"),
        )
        if mode == "let-the-retry-start":
            env["RAY_worker_niceness"] = str(USERS_NICENESS)
        running[mode] = subprocess.Popen(
            [sys.executable, "-c", START_PROBE, temps[mode], mode],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
    done: dict[str, Any] = {"temp": temps}
    try:
        for mode, proc in running.items():
            stdout, stderr = proc.communicate(timeout=400)
            done[mode] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    finally:
        for proc in running.values():
            if proc.poll() is None:
                proc.kill()
    return done


def remove_temps(done: dict[str, Any]) -> None:
    """Remove the session folders of :func:`start_local_rays_that_time_out`."""
    for folder in done["temp"].values():
        shutil.rmtree(folder, ignore_errors=True)
