"""Starting or joining Ray the same way from a laptop and under ``ray job submit``."""

from __future__ import annotations

import logging
import os

import ray

logger = logging.getLogger(__name__)

# Non-secret settings the workers need. AWS credentials are deliberately not forwarded:
# workers find them through the standard AWS chain of their own node.
FORWARDED_ENV = ("NLTK_DATA", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION")


def forwarded_env() -> dict[str, str]:
    """The environment variables santa forwards to every Ray worker."""
    return {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}


def init_ray(address: str | None = None, **kwargs) -> None:
    """Connect to the cluster named by ``address``/``RAY_ADDRESS``, or start a local one.

    Under ``ray job submit`` ``RAY_ADDRESS`` is set and the job joins its cluster; a plain
    ``python -m ray_jobs.X`` on a laptop starts a local Ray on demand.
    """
    if ray.is_initialized():
        return
    env_vars = forwarded_env()
    runtime_env = kwargs.pop("runtime_env", {}) or {}
    if env_vars:
        runtime_env = {**runtime_env, "env_vars": {**env_vars, **runtime_env.get("env_vars", {})}}
    ray.init(
        address=address or os.environ.get("RAY_ADDRESS"),
        runtime_env=runtime_env or None,
        log_to_driver=kwargs.pop("log_to_driver", True),
        **kwargs,
    )
    logger.info("Ray resources: %s", ray.cluster_resources())


def cluster_cpus() -> int:
    """CPUs in the cluster right now (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
