"""Starting or joining Ray the same way from a laptop and under ``ray job submit``.

Which Ray a job uses is never a guess: ``--address`` (or ``RAY_ADDRESS``, which
``ray job submit`` sets) joins that cluster, ``auto`` joins a cluster already started on
this machine with ``ray start``, and nothing starts a local Ray of the job's own — even
when another Ray runs on the machine (Ray's own default would silently join it). The
job's first line says which it was.

Quiet by default: Ray's INFO logs, its C++ warnings and Ray Data's progress dumps stay in
Ray's session log folder (named on that first line); ``verbose=True`` shows them.
"""

from __future__ import annotations

import logging
import os
import sys

import ray

logger = logging.getLogger(__name__)

# Non-secret settings the workers need. AWS credentials are deliberately not forwarded:
# workers find them through the standard AWS chain of their own node.
FORWARDED_ENV = ("NLTK_DATA", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION")
# Quiet mode in every worker: no transformers/hub progress bars or advisory warnings.
_QUIET_WORKER_ENV = {
    "SANTA_QUIET": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}


_log_level = "WARNING"


def ray_log_level() -> str:
    """``INFO`` after ``init_ray(verbose=True)``, else ``WARNING`` (for Ray's own loggers)."""
    return _log_level


def forwarded_env() -> dict[str, str]:
    """The environment variables santa forwards to every Ray worker."""
    return {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}


def init_ray(address: str | None = None, *, verbose: bool = False, **kwargs) -> str:
    """Join the cluster ``address``/``RAY_ADDRESS`` names, or start a local Ray of our own.

    Returns the one line that says which (also logged at INFO and, for jobs, printed by the
    caller). ``address="local"`` or no address at all starts a new local Ray; ``"auto"``
    joins one already started on this machine.
    """
    if ray.is_initialized():
        return describe_cluster(joined=True)
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    env_vars = forwarded_env()
    if not verbose:
        env_vars = {**_QUIET_WORKER_ENV, **env_vars}
        if not sys.stderr.isatty():
            # Progress bars redrawn as lines in a log file or a pipe are most of what a job
            # prints (Ray Data's, transformers' weight loading); on a terminal they stay.
            for name in ("RAY_DATA_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS"):
                os.environ.setdefault(name, "1")
                env_vars[name] = "1"
        # Ray Data's per-operator progress dumps are INFO logs of "ray.data" (driver side);
        # faiss announces which of its builds it loaded.
        for name in ("ray.data", "faiss", "faiss.loader"):
            logging.getLogger(name).setLevel(logging.WARNING)
    runtime_env = kwargs.pop("runtime_env", {}) or {}
    if env_vars:
        runtime_env = {**runtime_env, "env_vars": {**env_vars, **runtime_env.get("env_vars", {})}}
    global _log_level
    level = _log_level = "INFO" if verbose else "WARNING"
    ray.init(
        address=address,
        runtime_env=runtime_env or None,
        log_to_driver=kwargs.pop("log_to_driver", True),
        logging_level=getattr(logging, level),
        # The root logger of every worker of the job (Ray Train's and Ray Data's INFO).
        logging_config=kwargs.pop("logging_config", None) or ray.LoggingConfig(log_level=level),
        **kwargs,
    )
    line = describe_cluster(joined=address != "local")
    logger.info(line)
    return line


def describe_cluster(*, joined: bool) -> str:
    """``Ray: started a local cluster (2 CPUs, 0 GPUs, 1 node; logs in DIR)`` or joined."""
    resources = ray.cluster_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    context = ray.get_runtime_context()
    how = f"joined the cluster at {context.gcs_address}" if joined else "started a local cluster"
    return (
        f"Ray: {how} ({int(resources.get('CPU', 0))} CPUs, {int(resources.get('GPU', 0))} GPUs, "
        f"{nodes} node{'s' if nodes != 1 else ''}; logs in {session_log_dir()})"
    )


def session_log_dir() -> str:
    """The log folder of the Ray session this process is connected to."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is not None:
        return os.path.join(node.get_session_dir_path(), "logs")
    return "/tmp/ray/session_latest/logs"


def cluster_cpus() -> int:
    """CPUs in the cluster right now (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
