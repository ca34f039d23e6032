"""What a job shows on the terminal: santa's own lines; everything else in a log file.

Ray forwards every line its workers and actors print to the driver (``log_to_driver``):
Ray Train's and Ray Data's INFO lines, a worker's traceback (twice: the worker's and the
controller's), ``core_worker.cc`` warnings, the raylet's colored notes. Ray's own loggers
in the driver add the token-auth warning and Ray Data's plans. Without ``--verbose`` a
santa job shows only santa's lines — ``santa: ...`` and tagged progress lines such as
``[train] step 5/40 ...`` — and writes the rest, with the driver's tracebacks, to
``santa-driver-<pid>.log`` in the Ray session's log folder (named on the job's first
line: ``Ray: ... logs in DIR``).

Workers that have something to tell the user print it with :func:`say` (one
``santa: ...`` line on their stderr, which Ray forwards and the filter lets through).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
import threading
from typing import Any

__all__ = [
    "DRIVER_LOG_PREFIX",
    "driver_log_path",
    "is_santa_line",
    "keep_ray_logs_off_the_terminal",
    "divert_native_stderr",
    "log_exception",
    "mark_command_line",
    "say",
]

DRIVER_LOG_PREFIX = "santa-driver-"
# "santa: error: ...", "santa: warning: ...", and progress lines tagged "[train] ...",
# "[dual_encoder] ...", "[iter 2] ..." (a lower-case word, maybe a number, in brackets).
_SANTA_LINE = re.compile(r"^(santa: |\[[a-z][a-z_\-]*( \d+)?\] )")
# Ray's own loggers in the driver, and the libraries that log at INFO when they load.
_QUIETED_LOGGERS = ("ray", "faiss", "faiss.loader", "bm25s")

_state: dict[str, Any] = {"path": None, "handler": None, "command_line": False, "native": None}
_lock = threading.Lock()


def is_santa_line(line: str) -> bool:
    """Whether a forwarded line is one of santa's (shown) or Ray's/a library's (logged)."""
    return bool(_SANTA_LINE.match(line))


def say(message: str) -> None:
    """Print one ``santa: ...`` line from anywhere (a worker, an actor, the driver)."""
    text = message if message.startswith("santa: ") else f"santa: {message}"
    print(text, file=sys.__stderr__, flush=True)


def driver_log_path() -> str | None:
    """The job's log file, once Ray has started (else None)."""
    return _state["path"]


class _Buffer(logging.handlers.MemoryHandler):
    """Holds Ray's driver-side records until the log file exists (its folder is Ray's)."""

    def __init__(self) -> None:
        super().__init__(capacity=10_000, flushLevel=logging.CRITICAL + 1)

    def shouldFlush(self, record: logging.LogRecord) -> bool:  # noqa: N802 - logging's name
        return self.target is not None or len(self.buffer) >= self.capacity


def quiet_driver_loggers(root: bool = False) -> None:
    """Ray's driver-side log records go to a buffer, then the log file, not the terminal
    (the token-auth warning, Ray Data's plans). Called before ``ray.init`` and again after
    Ray Data configured its loggers (it adds a console handler of its own)."""
    with _lock:
        buffer = _state["handler"]
        if buffer is None:
            buffer = _state["handler"] = _Buffer()
            buffer.setFormatter(
                logging.Formatter(
                    "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d -- %(message)s"
                )
            )
        names = (*_QUIETED_LOGGERS, "ray.data", "ray.train", "ray.tune", "ray.serve")
        if root:  # Ray's LoggingConfig puts a stream handler on the driver's root logger
            names = ("", *names)
        for name in names:
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if _prints_to_terminal(handler) and (name or _installed_by_ray(handler)):
                    logger.removeHandler(handler)
            if name in ("", *_QUIETED_LOGGERS) and buffer not in logger.handlers:
                logger.addHandler(buffer)
                logger.propagate = not name
            if name == "ray.serve":  # Serve's own handler gone: to "ray"'s buffer, the file
                logger.propagate = True


def _prints_to_terminal(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler
    )


def _installed_by_ray(handler: logging.Handler) -> bool:
    """A root-logger handler that prints on the terminal: Ray's LoggingConfig's, or the job's
    own ``logging.basicConfig`` (santa's log records go to the file too); others, e.g. a
    test runner's capture, stay."""
    if any(type(f).__name__ == "CoreContextFilter" for f in handler.filters):
        return True
    stream = getattr(handler, "stream", None)
    return stream is not None and stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


def quiet_logging_config(log_level: str):
    """A ``ray.LoggingConfig`` for ``ray.init``: the workers get Ray's (at ``log_level``);
    in this driver, right after Ray has installed its handlers on the root and ``ray``
    loggers, their records are sent to the log file instead (``ray.init`` itself warns —
    token authentication — before it returns)."""
    import ray

    class _QuietDriverLoggingConfig(ray.LoggingConfig):
        def _configure_logging(self) -> None:
            super()._configure_logging()
            quiet_driver_loggers(root=True)

    return _QuietDriverLoggingConfig(log_level=log_level)


def keep_ray_logs_off_the_terminal(log_dir: str) -> str:
    """After ``ray.init``: forwarded worker lines other than santa's, and Ray's driver-side
    records, go to ``log_dir/santa-driver-<pid>.log``; returns that path."""
    # Ray Data configures its loggers when first imported (often in the job's preload thread,
    # during ray.init): import it now, then quiet them too.
    import ray.data  # noqa: F401

    quiet_driver_loggers()
    path = os.path.join(log_dir, f"{DRIVER_LOG_PREFIX}{os.getpid()}.log")
    with _lock:
        if _state["path"] == path:
            return path
        os.makedirs(log_dir, exist_ok=True)
        file_handler = logging.FileHandler(path, encoding="utf-8", delay=True)
        file_handler.setFormatter(_state["handler"].formatter)
        _state["handler"].setTarget(file_handler)
        _state["handler"].flush()
        _state["path"] = path
    _filter_forwarded_lines(path)
    return path


def _filter_forwarded_lines(path: str) -> None:
    """Replace Ray's printer of forwarded worker output with one that shows santa's lines
    and appends the others to ``path``."""
    from ray._private import worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    def forward(data: dict[str, Any]) -> None:
        shown = [line for line in data.get("lines", []) if is_santa_line(line)]
        hidden = [line for line in data.get("lines", []) if not is_santa_line(line)]
        if shown:
            sink = sys.stderr if data.get("is_err") else sys.stdout
            for line in shown:
                print(line, file=sink, flush=True)
        if hidden:
            who = data.get("actor_name") or data.get("task_name") or ""
            prefix = f"({who} pid={data.get('pid')}) " if who else f"(pid={data.get('pid')}) "
            try:
                with open(path, "a", encoding="utf-8") as log:
                    log.writelines(prefix + line + "\n" for line in hidden)
            except OSError:
                pass  # the log folder went away (Ray shutting down): nothing to keep

    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", forward)
    # The driver's error listener prints the errors Ray pushes to the job ("A worker died or
    # was killed while executing a task ...", a paragraph on stdout) without the dispatcher.
    ray_worker.print_to_stdstream = lambda data, ignore_prefix=False: forward(data)
    # Ray prints its own "(raylet)" and autoscaler notes through the same dispatcher.
    ray_worker.autoscaler_log_fyi_printed = True


def mark_command_line() -> None:
    """This process is a job run from the command line (its ``__main__``), not a library
    call: it owns the process's file descriptors (see :func:`divert_native_stderr`)."""
    _state["command_line"] = True


def divert_native_stderr(path: str) -> bool:
    """In a job run from the command line, what C and C++ code writes to file descriptor 2
    goes to ``path``; Python's ``sys.stderr`` (santa's lines, a ``--debug`` traceback) keeps
    the terminal. Ray's core worker in the driver logs there directly: a ``core_worker.cc``
    line at start, more when Ctrl-C stops the job. Returns whether it diverted."""
    with _lock:
        if not _state["command_line"] or _state["native"] is not None:
            return False
        try:
            sys.stderr.flush()
            terminal = os.fdopen(
                os.dup(2),
                "w",
                buffering=1,
                encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                errors="backslashreplace",
            )
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except (OSError, ValueError):
            return False  # no terminal or no log folder: leave the descriptors as they are
        os.dup2(log_fd, 2)
        os.close(log_fd)
        _state["native"] = path
        if sys.stderr is sys.__stderr__:
            sys.stderr = terminal
        sys.__stderr__ = terminal
        return True


def log_exception(error: BaseException) -> str | None:
    """Write ``error``'s traceback to the job's log file (once); returns the file or None."""
    path = driver_log_path()
    if path is None:
        return None
    import traceback

    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write("santa: the job failed:\n")
            log.writelines(traceback.format_exception(error))
            for rank, failure in _worker_failures(error):
                log.write(f"santa: worker rank {rank} failed with:\n")
                log.writelines(traceback.format_exception(failure))
    except OSError:
        return None
    return path


def _worker_failures(error: BaseException) -> list[tuple[int, BaseException]]:
    failures = getattr(error, "worker_failures", None)
    if isinstance(failures, dict):
        return sorted(failures.items())
    return []
