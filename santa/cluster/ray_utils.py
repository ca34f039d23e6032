"""Starting or joining Ray the same way from a laptop and under ``ray job submit``.

Which Ray a job uses is never a guess: ``--address`` (or ``RAY_ADDRESS``, which
``ray job submit`` sets) joins that cluster, ``auto`` joins a cluster already started on
this machine with ``ray start``, and nothing starts a local Ray of the job's own — even
when another Ray runs on the machine (Ray's own default would silently join it). The
job's first line says which it was.

A local Ray that does not come up in time (Ray waits 30 s for its raylet, a busy machine
can take longer) is stopped, started once more with a longer wait, and then ends the job in
one line that says what to do (:func:`_start_or_join`).

Quiet by default: Ray's INFO logs, its C++ warnings and Ray Data's progress dumps stay in
Ray's session log folder (named on that first line); ``verbose=True`` shows them.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import sys
import threading
import time

import ray

from santa.jobs.quiet import SETUP_HOOK, progress_bars_off, quiet_driver

logger = logging.getLogger(__name__)

# ray._private.ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR (Ray 2.60): a worker runs the
# function this names (module.function) before anything else.
WORKER_SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"

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


WORKER_NICENESS_ENV = "RAY_worker_niceness"


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """``os.environ`` with ``variables`` set (not overriding the user's), restored after."""
    added = {name: value for name, value in variables.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def import_in_background(modules: tuple[str, ...]) -> threading.Thread:
    """Import ``modules`` in a daemon thread (a failure is left to the job's own import)."""

    def work() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - raised again, with context, where it is used
                logger.debug("background import of %s failed", name, exc_info=True)

    thread = threading.Thread(target=work, name="santa-preload", daemon=True)
    thread.start()
    return thread


def init_ray(
    address: str | None = None,
    *,
    verbose: bool = False,
    progress: bool = False,
    preload: tuple[str, ...] = (),
    **kwargs,
) -> str:
    """Join the cluster ``address``/``RAY_ADDRESS`` names, or start a local Ray of our own.

    Returns the one line that says which (also logged at INFO and, for jobs, printed by the
    caller). ``address="local"`` or no address at all starts a new local Ray; ``"auto"``
    joins one already started on this machine. ``preload``: modules the job imports next
    (Ray Train's torch side: seconds), imported while Ray starts, which is mostly waiting.
    ``progress``: Ray Data's progress bars (a job's ``--progress``); off by default, on
    with ``verbose``.
    """
    if ray.is_initialized():
        return describe_cluster(joined=True)
    if preload:
        import_in_background(preload)
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    env_vars = forwarded_env()
    if not verbose:
        env_vars = {**_QUIET_WORKER_ENV, **env_vars}
        if not progress:
            # Progress bars (Ray Data's, transformers' weight loading) are most of what a job
            # prints, on a terminal and as redrawn lines in a log file; --progress shows them.
            env_vars.update(progress_bars_off())
        # Ray Data's per-operator progress dumps are INFO logs of "ray.data" (driver side);
        # faiss announces which of its builds it loaded.
        for name in ("ray.data", "faiss", "faiss.loader"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # Third-party warnings (Ray's token-auth notice, ranx, faiss, Inductor) go to a log
        # file, here and in every worker process of the job (santa.jobs.quiet).
        warnings_file = quiet_driver()
        from santa.jobs import console

        console.divert_native_stderr(warnings_file)  # the core worker's own log lines
    runtime_env = kwargs.pop("runtime_env", {}) or {}
    if not verbose and "worker_process_setup_hook" not in runtime_env:
        if address == "local" and not runtime_env:
            # How Ray hands a module-named hook to its workers, here through the raylet's
            # environment (a runtime_env would cost the prestarted workers; see below).
            env_vars = {**env_vars, WORKER_SETUP_HOOK_ENV: SETUP_HOOK}
        else:
            runtime_env = {**runtime_env, "worker_process_setup_hook": SETUP_HOOK}
    raylet_env: dict[str, str] = {}
    if address == "local" and not runtime_env:
        # A Ray of our own inherits the driver's environment: workers get these settings
        # from the raylet, and the job needs no runtime_env. With one, Ray could not hand
        # the job the workers it prestarts (they have none), and every task and actor of
        # the start-up (the parquet sampling, Train's controller, ...) waited for a fresh
        # Python process: seconds of a short run on a small machine.
        raylet_env = env_vars
    elif env_vars:
        runtime_env = {**runtime_env, "env_vars": {**env_vars, **runtime_env.get("env_vars", {})}}
    if address == "local":
        # Ray runs workers at nice 15 so the raylet stays responsive on a busy node; on a
        # workstation that hands the trainers' CPU to any ordinary process. The Ray santa
        # starts is the job's own: its workers run at the driver's priority (Ray's job
        # supervisor does the same). RAY_worker_niceness set by the user still wins;
        # clusters set it in `ray start`'s environment.
        os.environ.setdefault(WORKER_NICENESS_ENV, "0")
    global _log_level
    level = _log_level = "INFO" if verbose else "WARNING"
    log_to_driver = kwargs.pop("log_to_driver", True)
    from santa.jobs import console

    if not verbose:
        console.quiet_driver_loggers()
    with environment(raylet_env):
        _start_or_join(
            address=address,
            runtime_env=runtime_env or None,
            log_to_driver=log_to_driver,
            logging_level=getattr(logging, level),
            # The root logger of every worker of the job (Ray Train's and Ray Data's INFO).
            logging_config=kwargs.pop("logging_config", None)
            or (
                ray.LoggingConfig(log_level=level)
                if verbose
                else console.quiet_logging_config(level)
            ),
            **kwargs,
        )
    from santa.jobs import interrupts

    interrupts.reinstall()  # ray.init turned SIGTERM into sys.exit(15)
    if address == "local":
        # The Ray of the job's own ends with it, even when the job is killed outright.
        from santa.cluster.reaper import start_reaper

        node = getattr(ray._private.worker, "_global_node", None)
        if node is not None:
            start_reaper(node.get_session_dir_path())
    if not verbose and log_to_driver:
        console.keep_ray_logs_off_the_terminal(session_log_dir())
    line = describe_cluster(joined=address != "local")
    if not verbose:
        line = line[:-1] + f"; warnings in {warnings_file})"
    logger.info(line)
    return line


RAY_NODE_START_WAIT_S = 30.0
"""How long Ray 2.60 waits for a new local node's raylet to register with its GCS
(``raylet_start_wait_time_s = 30`` in ``ray/_private/node.py``: a constant, no setting) and
for its GCS to publish its port (``RAY_gcs_server_port_wait_time_s``, default 30)."""
START_WAIT_ENV = "SANTA_RAY_START_WAIT_S"
"""The first start's wait for the raylet in seconds (default Ray's 30); the one retry waits
:data:`RETRY_WAIT_FACTOR` times as long, for the raylet and the GCS (whose wait is never made
shorter than Ray's own)."""
RETRY_WAIT_FACTOR = 3.0
_GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
# Ray's words for a local start that did not come up in time, and what they mean.
_START_FAILURES = (
    ("The current node timed out during startup", "its raylet did not register"),
    ("gcs_server_port", "its GCS did not publish its port"),  # "Timed out waiting for file"
    ("Failed to start GCS", "its GCS did not answer"),
)


def _start_or_join(address: str, **init_kwargs) -> None:
    """``ray.init``; a local Ray that does not come up in time is stopped and started once
    more with a longer wait, then ends in one line (:class:`RayStartError`).

    Joining a cluster is never retried: its failure is the cluster's, not this machine's.
    """
    if address != "local":
        ray.init(address=address, **init_kwargs)
        return
    wait = _start_wait_s()
    # The line says how long the user waited: Ray's wait for the raylet starts only once
    # the node's other processes are up (a first attempt of "30 s" took 153 s at load 24-60).
    started = time.monotonic()
    try:
        with _node_start_wait(wait):
            ray.init(address=address, **init_kwargs)
        return
    except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception for this
        what = _start_failure(error)
        if what is None:
            raise
        _clean_up_failed_start(error)
    first_s = time.monotonic() - started
    longer = wait * RETRY_WAIT_FACTOR
    from santa.jobs import console

    console.say(
        f"local Ray did not start in {first_s:.0f} s ({what} within Ray's {wait:g} s wait; "
        f"{_load_seen()}); retrying once with a {longer:g} s wait"
    )
    started = time.monotonic()
    try:
        with _node_start_wait(longer):
            ray.init(address=address, **init_kwargs)
    except Exception as error:  # noqa: BLE001 - as above
        what = _start_failure(error)
        if what is None:
            raise
        logs = _clean_up_failed_start(error)
        second_s = time.monotonic() - started
        from santa.jobs.errors import RayStartError

        raise RayStartError(
            f"local Ray did not start, twice (in {first_s:.0f} s, then {second_s:.0f} s: "
            f"{what} within Ray's {wait:g} s, then {longer:g} s wait; {_load_seen()}): set "
            "RAY_ADDRESS to a running cluster (ray start --head) or retry when the machine "
            "is less busy" + (f"; Ray's logs in {logs}" if logs else "")
        ) from error


def _start_wait_s() -> float:
    value = os.environ.get(START_WAIT_ENV, "")
    try:
        wait = float(value) if value else RAY_NODE_START_WAIT_S
    except ValueError:
        raise ValueError(f"{START_WAIT_ENV} must be a number of seconds, not {value!r}") from None
    if not wait > 0:
        raise ValueError(f"{START_WAIT_ENV} must be more than 0 seconds, not {value!r}")
    return wait


def _start_failure(error: BaseException) -> str | None:
    """What did not come up, when ``error`` is Ray's word for a local start out of time."""
    text = str(error)
    for words, what in _START_FAILURES:
        if words in text:
            return what
    return None


def _load_seen() -> str:
    """``load 22.1 on 2 CPUs``: the 1-minute load average and the CPUs Ray counts."""
    try:
        load = f"load {os.getloadavg()[0]:.1f}"
    except OSError:
        load = "load unknown"
    try:
        from ray._private.utils import get_num_cpus

        cpus = int(get_num_cpus())
    except Exception:  # noqa: BLE001 - another Ray layout
        cpus = os.cpu_count() or 0
    return f"{load} on {cpus} CPU{'s' if cpus != 1 else ''}"


class _StretchedClock:
    """``ray._private.node``'s view of the ``time`` module with ``monotonic`` scaled, so
    that its fixed 30 s wait for the raylet lasts ``seconds`` (the module uses
    ``time.monotonic`` for nothing else while a node starts)."""

    def __init__(self, seconds: float) -> None:
        self._scale = RAY_NODE_START_WAIT_S / seconds

    def monotonic(self) -> float:
        return time.monotonic() * self._scale

    def __getattr__(self, name: str):
        return getattr(time, name)


@contextlib.contextmanager
def _node_start_wait(seconds: float):
    """Ray's wait for a new local node, ``seconds`` long instead of its 30 s: the raylet's
    registration (:class:`_StretchedClock`) and, when longer, the GCS's port file and first
    answer (Ray's own setting, unless the user set it)."""
    node_module = importlib.import_module("ray._private.node")
    if seconds == RAY_NODE_START_WAIT_S or getattr(node_module, "time", None) is not time:
        yield  # Ray's own wait, or a Ray whose node module this does not know
        return
    node_module.time = _StretchedClock(seconds)
    try:
        with environment({_GCS_WAIT_ENV: str(math.ceil(max(seconds, RAY_NODE_START_WAIT_S)))}):
            yield
    finally:
        node_module.time = time


def _half_started_node(error: BaseException):
    """The ``ray._private.node.Node`` whose ``__init__`` raised ``error`` (its processes
    run on: ``ray.shutdown`` knows only a node that started)."""
    node_class = getattr(importlib.import_module("ray._private.node"), "Node", None)
    found = None
    trace = error.__traceback__
    while trace is not None:
        candidate = trace.tb_frame.f_locals.get("self")
        if node_class is not None and isinstance(candidate, node_class):
            found = candidate
        trace = trace.tb_next
    return found


def _clean_up_failed_start(error: BaseException) -> str | None:
    """Stop what a failed local start left running (its GCS, raylet, agents, prestarted
    workers) and Ray's driver state; returns the attempt's log folder, if known."""
    import psutil

    node = _half_started_node(error)
    session = getattr(node, "session_name", None) if node is not None else None
    marker = session or os.path.dirname(ray.__file__)
    try:
        leftovers = [
            process
            for process in psutil.Process().children(recursive=True)
            if any(marker in part for part in _cmdline(process))
        ]
    except psutil.Error:
        leftovers = []
    if node is not None:
        try:
            node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        except Exception:  # noqa: BLE001 - what is left is killed below
            logger.debug("could not stop the half-started Ray node", exc_info=True)
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(leftovers, timeout=10)
    with contextlib.suppress(Exception):
        ray.shutdown()
    logs = getattr(node, "_logs_dir", None) if node is not None else None
    return logs if isinstance(logs, str) else None


def _cmdline(process) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:
        return []


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


HEAD_RESOURCE = "head"
"""The custom resource of the head node in ``cluster.yaml``: long-lived drivers (Tune trial
drivers, the hard-negative miner) ask for a sliver of it so that the autoscaler never has
to keep a GPU node alive for them."""


def head_placement(amount: float = 0.001) -> dict[str, float]:
    """``{"head": amount}`` where the cluster has a ``head`` resource, else ``{}``."""
    return {HEAD_RESOURCE: amount} if ray.cluster_resources().get(HEAD_RESOURCE) else {}


def merge_capacity(
    present: dict[str, float], declared: dict[str, float] | None
) -> dict[str, float]:
    """The most of each resource the cluster can have: the larger of what is present and
    what the autoscaler's config declares (``inf`` where a node type has no max)."""
    if not declared:
        return dict(present)
    merged = {}
    for key in set(present) | set(declared):
        limit = declared.get(key, 0)
        limit = math.inf if limit >= sys.maxsize else float(limit)
        merged[key] = max(float(present.get(key, 0)), limit)
    return merged


AUTOSCALING_CONFIG_ENV = "SANTA_AUTOSCALING_CONFIG"
BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
"""Where the cluster launcher (``ray up``) leaves the autoscaler's config on the head."""


def declared_max_resources(autoscaling_config: dict) -> dict[str, float]:
    """The most of each resource an autoscaler config allows: the head node type's
    resources plus every worker type's at its ``max_workers`` (capped by the cluster's
    ``max_workers`` times the largest node, when that is smaller)."""
    types = autoscaling_config.get("available_node_types") or {}
    head_type = autoscaling_config.get("head_node_type")
    total: dict[str, float] = {}
    largest: dict[str, float] = {}
    for name, node_type in types.items():
        resources = node_type.get("resources") or {}
        count = 1 if name == head_type else int(node_type.get("max_workers", 0))
        for key, value in resources.items():
            if name != head_type:
                largest[key] = max(largest.get(key, 0.0), float(value))
            total[key] = total.get(key, 0.0) + count * float(value)
    cluster_max = autoscaling_config.get("max_workers")
    if cluster_max is not None:
        head = (types.get(head_type) or {}).get("resources") or {}
        for key, value in largest.items():
            cap = float(head.get(key, 0)) + int(cluster_max) * value
            total[key] = min(total[key], cap)
    return total


def autoscaling_config_path() -> str | None:
    """The autoscaler config of the cluster this process is connected to, if it can be
    read here: ``SANTA_AUTOSCALING_CONFIG``, the ``--autoscaling-config`` of this cluster's
    monitor process (drivers run on the head under ``ray job submit``), or the cluster
    launcher's bootstrap config on the head."""
    explicit = os.environ.get(AUTOSCALING_CONFIG_ENV)
    if explicit:
        return explicit
    try:
        gcs_flag = f"--gcs-address={ray.get_runtime_context().gcs_address}".encode()
    except Exception:
        gcs_flag = None
    proc = "/proc"
    if gcs_flag and os.path.isdir(proc):
        for pid in os.listdir(proc):
            try:
                with open(os.path.join(proc, pid, "cmdline"), "rb") as handle:
                    args = handle.read().split(b"\0")
            except OSError:
                continue
            if gcs_flag in args:
                for arg in args:
                    if arg.startswith(b"--autoscaling-config="):
                        return os.path.expanduser(arg.split(b"=", 1)[1].decode())
    bootstrap = os.path.expanduser(BOOTSTRAP_CONFIG)
    return bootstrap if os.path.isfile(bootstrap) else None


def _declared_from_autoscaling_config() -> dict[str, float] | None:
    path = autoscaling_config_path()
    if not path:
        return None
    try:
        import yaml  # JSON is YAML too

        with open(path) as handle:
            return declared_max_resources(yaml.safe_load(handle) or {})
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError) as error:
        logger.warning("could not read the autoscaler config %s: %s", path, error)
        return None


def cluster_capacity() -> dict[str, float]:
    """What the cluster can grow to: on an autoscaling cluster its declared max, else the
    resources present now.

    The declared max is what the GCS holds (clusters that report their config, as Ray
    Train reads it), else the autoscaler config itself (:func:`autoscaling_config_path`).
    Pools and sweeps sized from this ask for what they can use and let the autoscaler add
    the nodes; sized from ``ray.cluster_resources()`` at launch, they would stay on the
    head of a cluster whose workers start at 0.
    """
    present = ray.cluster_resources()
    try:
        declared = ray._private.state.state.get_max_resources_from_cluster_config()
    except Exception:  # an older GCS or no autoscaler state
        logger.debug("no autoscaler cluster config in the GCS", exc_info=True)
        declared = None
    return merge_capacity(present, declared or _declared_from_autoscaling_config())


POOL_LIMIT = 1024
"""Pool sizes and trial counts are capped here when a node type has no declared max."""


def capacity_of(resource: str, capacity: dict[str, float] | None = None) -> float:
    """How much of ``resource`` the cluster can grow to (capped at :data:`POOL_LIMIT`)."""
    capacity = cluster_capacity() if capacity is None else capacity
    return min(float(capacity.get(resource, 0)), float(POOL_LIMIT))
