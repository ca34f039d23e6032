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

import contextlib
import logging
import os
import sys
import tempfile
import time

__all__ = [
    "NOISY_LOGGERS",
    "PROGRESS_HELP",
    "SETUP_HOOK",
    "THIRD_PARTY_LOGGERS",
    "WORKER_NOISY_LOGGERS",
    "log_file",
    "progress_bars_off",
    "quiet_driver",
    "quiet_job_logging",
    "quiet_ray_data_console",
    "quiet_worker",
]

SETUP_HOOK = "santa.jobs.quiet.quiet_worker"
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
THIRD_PARTY_LOGGERS = (
    "bm25s",  # sets itself to DEBUG on import: "Building index from tokens"
    "faiss",
    "faiss.loader",
    "transformers",
    "huggingface_hub",
    "sentence_transformers",
    "tokenizers",
    "urllib3",
    "botocore",
    "boto3",
    "s3fs",
    "fsspec",
    "filelock",
    "mlflow",
    "wandb",
)
"""Libraries whose records below WARNING a quiet job drops (the rest go to its log file)."""
OWN_HANDLER_LOGGERS = ("mlflow", "alembic", "sqlalchemy.engine", "huey")
"""Loggers MLflow gives a terminal handler of its own when imported (``INFO
mlflow.store.db.utils: Creating initial MLflow database tables...`` on a new ``sqlite:``
store): in a quiet job their records go to its log file like the others'."""
PROGRESS_HELP = "show Ray Data's progress bars (off by default: the terminal shows santa's lines)"
"""``--progress``'s help, the same in every job that has it."""
PROGRESS_BAR_ENV = {"RAY_DATA_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
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


def progress_bars_off() -> dict[str, str]:
    """No progress bars but santa's own: Ray Data's (``Parquet dataset sampling``,
    ``Running Dataset``) and transformers' / the Hub's (``Loading weights``), in this
    process and — through the variables returned, for the workers' environment — in Ray's.

    A variable the user set wins. Libraries read theirs when imported, so those already
    imported are told directly."""
    for name, value in PROGRESS_BAR_ENV.items():
        os.environ.setdefault(name, value)
    if os.environ["RAY_DATA_DISABLE_PROGRESS_BARS"] not in ("", "0") and "ray.data" in sys.modules:
        with contextlib.suppress(AttributeError):  # another Ray layout: the variable counts
            sys.modules["ray.data"].DataContext.get_current().enable_progress_bars = False
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] not in ("", "0"):
        if "huggingface_hub" in sys.modules:
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        if "transformers" in sys.modules:
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
    return {name: os.environ[name] for name in PROGRESS_BAR_ENV}


class _AtLeast(logging.Filter):
    """Lets through records at ``level`` or above, whatever the logger's own level."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


class _SantaWarnings(logging.Handler):
    """santa's own logged warnings (and errors) as one ``santa: warning: ...`` line each on
    the terminal (the stream looked up when printing: the job may move file descriptor 2)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.addFilter(lambda record: record.name == "santa" or record.name.startswith("santa."))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            # Never "santa: error:": that line is the job's last, and says why it ended.
            text = record.getMessage().strip().splitlines()
            print(f"santa: warning: {text[0] if text else ''}", file=sys.__stderr__, flush=True)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def quiet_job_logging(path: str | None = None) -> str:
    """A job run from the command line without ``--verbose``: its log records go to its
    log file (``path``, else :func:`log_file`), not the terminal.

    A job's own ``logging.basicConfig`` (INFO on stderr) is undone here or, called later,
    does nothing (the root logger has a handler); third-party loggers
    (:data:`THIRD_PARTY_LOGGERS`) keep only their warnings; santa's own warnings still
    show, as ``santa: warning: ...`` lines. Returns the log file."""
    path = path or _installed.get("path") or log_file()
    root = logging.getLogger()
    if _installed.get("job_logging") == path:
        return path
    for handler in list(root.handlers):
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and stream in (
            sys.stderr,
            sys.stdout,
            sys.__stderr__,
            sys.__stdout__,
        ):
            root.removeHandler(handler)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    to_file = logging.FileHandler(path, delay=True)
    to_file.setFormatter(logging.Formatter(_FORMAT))
    root.addHandler(to_file)
    root.addHandler(_SantaWarnings())
    if root.level > logging.INFO:
        root.setLevel(logging.INFO)
    for name in THIRD_PARTY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _AtLeast) for f in logger.filters):
            logger.addFilter(_AtLeast(logging.WARNING))  # bm25s resets its level on import
    # MLflow reads this when imported; one imported already is undone below.
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    for name in OWN_HANDLER_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if not isinstance(handler, logging.FileHandler):
                logger.removeHandler(handler)
        logger.propagate = True
    _installed["job_logging"] = path
    return path
