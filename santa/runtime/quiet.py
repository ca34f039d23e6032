"""Third-party chatter out of a job's output and into a log file.

A GPU run printed, besides santa's own lines: Ray's token-authentication WARNING as its
first line, Ray Train's ``placement_group_cleaner`` WARNING once a second for the whole
run (its actor polls the State API, which a cluster without Ray's dashboard does not
serve), ranx's SyntaxWarnings (Python 3.12), faiss's loader lines and Inductor's
warnings. None of them is something the user can act on in the job; all are kept:

- in the driver, :func:`quiet_driver` sends Python warnings and those loggers to a log file
  (:func:`log_file`, named on the job's first line) instead of the console;
- in every Ray worker process of the job, :func:`quiet_worker` (a Ray
  ``worker_process_setup_hook``) does the same into a file in Ray's session log folder.

``--verbose`` leaves everything as Ray and the libraries print it.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time

__all__ = [
    "NOISY_LOGGERS",
    "SETUP_HOOK",
    "WORKER_NOISY_LOGGERS",
    "log_file",
    "quiet_driver",
    "quiet_ray_data_console",
    "quiet_worker",
]

SETUP_HOOK = "santa.runtime.quiet.quiet_worker"
"""What Ray runs first in every worker process of a quiet job."""
LOG_FILE_ENV = "SANTA_LOG_FILE"

NOISY_LOGGERS = (
    "py.warnings",  # Python warnings (ranx's SyntaxWarnings, Inductor's, transformers')
    "ray._private.authentication",  # "Token authentication is disabled ..." (ray.init)
    "faiss",
    "faiss.loader",  # "Loading faiss with AVX512 support" / "Could not load library ..."
    "torch._inductor",
    "torch._dynamo",
)
WORKER_NOISY_LOGGERS = (
    *NOISY_LOGGERS,
    # A WARNING a second while the State API is unavailable (no dashboard on the cluster).
    "ray.train.v2._internal.execution.controller.placement_group_cleaner",
)
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_installed: dict[str, str] = {}


def log_file(job: str = "") -> str:
    """Where this process keeps third-party warnings (``SANTA_LOG_FILE`` if set)."""
    explicit = os.environ.get(LOG_FILE_ENV)
    if explicit:
        return explicit
    name = job or os.path.basename(sys.argv[0] or "python").removesuffix(".py") or "santa"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = os.path.join(tempfile.gettempdir(), "santa", "logs")
    return os.path.join(folder, f"{name}-{stamp}-{os.getpid()}.log")


def _route(loggers: tuple[str, ...], path: str) -> str:
    """Send ``loggers`` (and Python warnings) to ``path`` only; idempotent per process."""
    if "path" in _installed:
        return _installed["path"]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    handler = logging.FileHandler(path, delay=True)  # no file until something is written
    handler.setFormatter(logging.Formatter(_FORMAT))
    logging.captureWarnings(True)
    for name in loggers:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False
    _installed["path"] = path
    return path


def quiet_driver(job: str = "") -> str:
    """Keep third-party warnings out of the driver's output; returns the log file."""
    return _route(NOISY_LOGGERS, log_file(job))


def quiet_worker() -> None:
    """Ray's ``worker_process_setup_hook`` of a quiet job: the same, per worker process,
    into a file of Ray's session log folder."""
    folder = tempfile.gettempdir()
    try:
        import ray

        node = getattr(ray._private.worker, "_global_node", None)
        if node is not None:
            folder = node.get_logs_dir_path()
    except Exception:  # noqa: BLE001, S110 - the temp folder will do
        pass
    _route(WORKER_NOISY_LOGGERS, os.path.join(folder, f"santa-warnings-{os.getpid()}.log"))


def quiet_ray_data_console() -> None:
    """Ray Data's INFO lines ("Starting execution of Dataset ...", once per epoch and
    worker) to its own log file only: its console handler at WARNING."""
    import ray.data  # noqa: F401 - importing it configures the "ray.data" logger

    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            handler.setLevel(logging.WARNING)
