"""The Ray Train adapter: build the initial model and a TorchTrainer, and run it.

The workers read their training rows themselves (:mod:`santa.train.epochs`): the driver
hands them where the data is, not a dataset, so nothing is read or tokenized before they
start, and a restarted worker group plans nothing again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from santa.cluster.placement import placement_retries, placement_wait_s
from santa.cluster.ray_utils import capacity_of, head_placement, ray_log_level
from santa.cluster.resources import (
    ResourcePlan,
    check_plan,
    trainer_gpus,
    training_plan,
)
from santa.config import SantaConfig
from santa.files import storage
from santa.files.layout import RUN_SNAPSHOT_FILE, CacheLayout, RunLayout
from santa.jobs import interrupts
from santa.jobs.interrupts import call_in_thread
from santa.models.checkpoints import resolve_model
from santa.train.entry import train_loop_per_worker
from santa.train.initial_model import build_tiny_model
from santa.train.kept import describe_local_run, describe_run
from santa.train.loop_config import LoopConfig, objective_entry, training_data
from santa.train.resume import registered_checkpoints, remove_unregistered_checkpoints
from santa.train.tracking import Tracking, finish_tracking

logger = logging.getLogger(__name__)

# How often Ray Train's controller polls its workers (their reports, their end, a failure),
# Ray's default 2 s: every run's start and end wait for polls, and a worker's report waits
# for the poll that takes its previous one (Ray Train's result queue holds one), so a log
# window shorter than the interval stalls training until the next poll: at 0.5 s and a
# window of one 0.23 s step, steps took 0.51 s (tiny recipe, CPU). Ray hands the driver's
# value to the controller; santa's default is 0.1 s (a few small RPCs a second per
# worker), unless set.
POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
POLL_INTERVAL_S = "0.1"
# What fit() imports first (torch, by Ray Train's torch side): for init_ray(preload=...).
FIT_IMPORTS = ("ray.train.torch",)


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Where and how a training run executes (the cluster side of the config).

    How many workers, and whether they use GPUs, is the config's (``train.num_workers``,
    ``train.use_gpu``): the global batch is split by the one and bf16 follows the other.
    """

    data: str
    """Preprocessed pairs (the ``--output`` of ray_jobs.preprocess): local or s3://."""
    layout: RunLayout
    """The run folder (checkpoints, metrics): Ray Train's ``storage_path`` is the folder
    holding it, its name the run's name; a rerun in the same folder resumes from its latest
    checkpoint. :meth:`of` makes one from a storage path and a name."""
    cpus_per_worker: float = 0.0
    """CPUs reserved per worker; 0 leaves one CPU of the cluster to Ray Data."""
    max_failures: int = 1
    num_to_keep: int = 2
    warm_start: str = ""
    """A model folder or checkpoint to start from (fine-tuning), instead of the backbone."""
    stop_at_step: int = 0
    """Stop (with a checkpoint) at this step though the schedule spans the whole run; 0: no."""
    eval_data: str = ""
    """A BEIR folder (the preprocess job's ``eval`` output) for dev metrics during training."""
    eval_split: str = "test"
    """Which qrels split of ``eval_data`` to evaluate."""
    miner_gpu: bool = False
    """``async`` hard negatives: give the miner actor (index build and search, faiss GPU when
    installed) a GPU of its own (with ``train.use_gpu``). Its encoder actors' GPUs are the
    config's ``negatives.encoder_gpus`` (``--miner-gpus``)."""
    miner_max_restarts: int = 3
    """How often Ray restarts a dead hard-negative miner."""
    start_retries: int | None = None
    """How often Ray Train retries a worker group that does not start (-1: forever; None:
    ``SANTA_PLACEMENT_RETRIES``, see :mod:`santa.cluster.placement`)."""
    objective: str = ""
    """What the loop trains: a name in ``santa.train.loop_config.OBJECTIVES``, whose entry
    says what data it trains on and where it starts from; empty: the config's
    ``train.objective`` (a name given here wins: SCodeR's algorithm names its stages')."""
    row_cache: str = ""
    """Where each node keeps its row files (:mod:`santa.train.rows`); empty:
    ``SANTA_ROW_CACHE`` on the node, else its ``<tmp>/santa-rows``."""

    discriminators: str = ""
    """``dual_encoder`` with online soft labels: the discriminators' folder."""
    cache: str = ""
    """The cache folder runs share (trained tokenizers, torch.compile's work); empty: the
    one beside the run (``RunLayout.cache``). Nested runs pass their parent's."""
    tracking: dict[str, Any] = field(default_factory=dict)
    """MLflow / W&B settings (``santa.train.tracking.Tracking.to_dict``); empty: none."""
    in_process: bool = False
    """Train in this process on one worker, without Ray Train
    (:func:`fit_in_process`): benchmarks and tests on one machine."""

    def __post_init__(self) -> None:
        # Relative local paths would be resolved by Ray's processes in their own folders
        # (and Train V2 rejects a relative storage_path outright).
        # (A RunLayout's root is absolute already.)
        for name in ("data", "eval_data", "cache"):
            object.__setattr__(self, name, storage.absolute(getattr(self, name)))
        if not isinstance(self.layout, RunLayout):
            raise TypeError(f"layout must be a RunLayout, got {self.layout!r}")
        if self.objective:
            objective_entry(self.objective)

    def for_config(self, config: SantaConfig) -> RunSpec:
        """This spec with its objective named: its own, else ``config``'s ``train.objective``
        (an unknown name: one line naming those there are)."""
        if self.objective:
            return self
        try:
            objective_entry(config.train.objective)
        except ValueError as error:  # "train.objective must be one of [...], got ..."
            raise ValueError(f"train.{error}") from None
        return dataclasses.replace(self, objective=config.train.objective)

    @classmethod
    def of(cls, *, storage: str, name: str, **fields: Any) -> RunSpec:
        """The run ``name`` under the storage path ``storage`` (a command line's
        ``--storage`` and ``--name``); the other fields as :class:`RunSpec` takes them."""
        return cls(layout=RunLayout.of(storage, name), **fields)

    @property
    def name(self) -> str:
        """The run's name (its folder's)."""
        return self.layout.name

    @property
    def cache_layout(self) -> CacheLayout:
        """The cache folder this run reads and fills."""
        return CacheLayout(self.cache) if self.cache else self.layout.cache


def initial_model(config: SantaConfig, spec: RunSpec) -> tuple[str, bool]:
    """The model every worker starts from (a warm start, the backbone, or the tiny recipe's
    new model saved once under the run folder, so every worker and every resume starts from
    the same weights), and whether that new model is still to be built
    (:func:`santa.train.initial_model.build_tiny_model`)."""
    spec = spec.for_config(config)
    if objective_entry(spec.objective).own_start:  # e.g. the discriminators' own folder
        if not spec.warm_start:
            raise ValueError(f"training {spec.objective} needs its starting folder (warm_start)")
        return spec.warm_start, False
    if spec.warm_start:
        return resolve_model(spec.warm_start).model_uri, False
    if not config.model.is_tiny:
        return config.model.backbone, False
    init_uri = spec.layout.init_model
    return init_uri, not storage.exists(storage.join(init_uri, "config.json"))


def prepare_initial_model(config: SantaConfig, spec: RunSpec) -> str:
    """The model every worker starts from (:func:`initial_model`), built here if it is the
    tiny recipe's and not built yet."""
    init_uri, missing = initial_model(config, spec)
    if missing:
        build_tiny_model(config, spec.data, spec.cache_layout, init_uri)
    return init_uri


RESIZE_INTERVAL_ENV = "SANTA_RESIZE_INTERVAL_S"


def resize_interval_s() -> float:
    """How often an elastic run looks for room to grow back (Ray Train's default 60 s)."""
    return float(os.environ.get(RESIZE_INTERVAL_ENV, "60"))


def set_poll_interval() -> str:
    """Ray Train's poll interval for this process's runs: the user's, else santa's 0.1 s."""
    return os.environ.setdefault(POLL_INTERVAL_ENV, POLL_INTERVAL_S)


def worker_cpus(cpus_per_worker: float, num_workers: int) -> float:
    """CPUs per training worker: as asked, or what leaves one CPU to Ray Data.

    Counted on what the cluster can grow to (an autoscaler's declared max), so that on a
    cluster whose workers start at 0 the trainers ask for real CPUs and the autoscaler
    adds nodes, rather than squeezing onto the head.
    """
    if cpus_per_worker:
        return cpus_per_worker
    # Train V2 takes the workers' CPUs out of Ray Data's budget: keep one for Data.
    free = max(0.0, capacity_of("CPU") - 1)
    return max(0.25, min(1.0, free / num_workers))


def worker_resources(config: SantaConfig, cpus: float) -> dict[str, float]:
    """One training worker's ``resources_per_worker``: its CPUs and, on GPUs, its share."""
    gpus = trainer_gpus(config)
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


def miner_placement(config: SantaConfig, miner_gpu: bool) -> tuple[float, dict[str, float] | None]:
    """The miner actor's GPUs and custom resources (``async`` hard negatives)."""
    on_gpu = config.train.use_gpu and miner_gpu
    # A long-lived actor: on the head node where the cluster has one (cluster.yaml), unless
    # it searches on a GPU itself (the head has none).
    return (1.0 if on_gpu else 0.0), (None if on_gpu else head_placement() or None)


def run_plan(
    config: SantaConfig, cpus_per_worker: float = 0.0, miner_gpu: bool = False
) -> ResourcePlan:
    """What :func:`fit` will ask the cluster for (``santa.cluster.resources``);
    ``cpus_per_worker`` as :class:`RunSpec` takes it (0: sized by :func:`worker_cpus`)."""
    cpus = worker_cpus(cpus_per_worker, config.train.num_workers)
    miner_gpus, miner_resources = miner_placement(config, miner_gpu)
    return training_plan(
        config, cpus_per_worker=cpus, miner_gpus=miner_gpus, miner_resources=miner_resources
    )


def last_logged_step(metrics_uri: str) -> int:
    """The last step in a run's ``metrics.jsonl`` (0: none yet)."""

    if not storage.exists(metrics_uri):
        return 0
    steps = [
        int(json.loads(line).get("step", 0))
        for line in storage.read_bytes(metrics_uri).decode().splitlines()
        if line.strip()
    ]
    return max(steps, default=0)


def loop_config(
    config: SantaConfig,
    spec: RunSpec,
    *,
    init_model: str,
    torch_threads: int,
    startup: dict[str, float],
    tracked: Tracking,
    miner_name: str = "",
    build_init_model: bool = False,
) -> LoopConfig:
    """What every worker of the run ``spec`` is handed: the recipe, the initial model, the
    run's files and what happened before the workers started."""
    layout = spec.layout
    return LoopConfig(
        santa=config,
        init_model=init_model,
        build_init_model=build_init_model,
        objective=spec.objective,
        discriminators=spec.discriminators,
        row_cache=spec.row_cache,
        torch_threads=torch_threads,
        tensorboard_dir=layout.tensorboard_dir,
        # On S3 the events are written on the rank-0 node and copied into the run at
        # every checkpoint: the autoscaler may remove that node once the run is done.
        tensorboard_uri=layout.tensorboard_copy,
        metrics_uri=layout.metrics,
        stop_at_step=spec.stop_at_step,
        data_uri=spec.data,
        miner_name=miner_name,
        eval_data=spec.eval_data,
        eval_split=spec.eval_split,
        registered_checkpoints=tuple(registered_checkpoints(layout.root)),
        cache_root=spec.cache_layout.root,
        startup=startup,
        submitted_at=time.time(),
        logged_before=last_logged_step(layout.metrics),
        tracking=tracked.to_dict(),
    )


def fit(config: SantaConfig, spec: RunSpec, callbacks: list | None = None):
    """Run (or resume) training on the current Ray cluster; returns the ``ray.train.Result``
    (``spec.in_process``: in this process, an :class:`InProcessResult`)."""
    if spec.in_process:
        return fit_in_process(config, spec)
    spec = spec.for_config(config)
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train import LoggingConfig as TrainLoggingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from santa.train.recovery import RecoveryReporter

    train = config.train
    layout = spec.layout
    set_poll_interval()
    if train.keep_best_by and train.keep_best_by.startswith("dev_") and not spec.eval_data:
        raise ValueError(
            f"train.keep_best_by={train.keep_best_by} needs a dev set to score every "
            "checkpoint with (--eval-data)"
        )
    # What the objective trains on must be there: one line naming it, before anything is
    # built and before Ray Train starts workers that would each fail on it.
    training_data(
        LoopConfig(santa=config, init_model="", objective=spec.objective, data_uri=spec.data)
    )
    cpus = worker_cpus(spec.cpus_per_worker, train.num_workers)
    # Before anything is built or submitted: a request the cluster can never hold fails
    # here in one line instead of waiting forever in Ray Train's retries.
    check_plan(
        run_plan(config, cpus, spec.miner_gpu), job=f"the {spec.objective} run {layout.name!r}"
    )
    # The fixed cost before the first step, phase by phase (the workers add theirs).
    startup: dict[str, float] = {}
    started = time.time()
    # The tiny recipe's new model is built by the rank-0 worker, which imports the model's
    # libraries anyway (here they cost seconds of every job's start), unless the miner
    # actor, started before the workers, needs it first.
    init_model, build_init_model = initial_model(config, spec)
    if build_init_model and config.negatives.source == "async":
        build_tiny_model(config, spec.data, spec.cache_layout, init_model)
        build_init_model = False
    startup["startup_initial_model_s"] = time.time() - started
    # Ray resumes from registered checkpoints only; folders of interrupted uploads go.
    remove_unregistered_checkpoints(layout.root)
    started = time.time()
    miner = None
    miner_name = f"santa-miner-{layout.name}"
    if config.negatives.source == "async":
        from santa.negatives.miner import start_miner

        miner_gpus, miner_resources = miner_placement(config, spec.miner_gpu)
        miner = start_miner(
            miner_name,
            data_uri=spec.data,
            model_uri=init_model,
            config=config,
            num_gpus=miner_gpus,
            max_restarts=spec.miner_max_restarts,
            resources=miner_resources,
            row_cache=spec.row_cache,
        )
        startup["startup_miner_s"] = time.time() - started
    # MLflow / W&B: the run is opened (or found again) here, rank 0 logs into it.
    tracked = Tracking.from_dict(spec.tracking).begin(
        run_uri=layout.root, name=layout.name, params=config.to_dict()
    )
    # On S3, Ray Train's checkpoint uploads and downloads get santa's timeouts.
    storage_path, storage_filesystem = storage.for_ray(layout.storage_path)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config(
            config,
            spec,
            init_model=init_model,
            torch_threads=max(1, int(cpus)),
            miner_name=miner_name,
            startup=startup,
            tracked=tracked,
            build_init_model=build_init_model,
        ).to_dict(),
        scaling_config=ScalingConfig(
            # Elastic (--num-workers MIN-MAX): Ray Train goes on with the workers that fit.
            num_workers=(train.min_workers, train.num_workers)
            if train.elastic
            else train.num_workers,
            **({"elastic_resize_monitor_interval_s": resize_interval_s()} if train.elastic else {}),
            use_gpu=train.use_gpu,
            # A worker whose GPU the miner's encoder actors share asks for the rest of it.
            resources_per_worker=worker_resources(config, cpus),
        ),
        # NCCL when the workers have GPUs (Ray's choice), unless the config names one.
        torch_config=TorchConfig(
            backend=None if train.distributed_backend == "auto" else train.distributed_backend
        ),
        run_config=RunConfig(
            name=layout.name,
            storage_path=storage_path,
            storage_filesystem=storage_filesystem,
            # The best by train.keep_best_by (and the latest, to resume from), or the
            # newest: santa.train.kept.kept_checkpoint picks the run's result from them.
            checkpoint_config=CheckpointConfig(
                num_to_keep=spec.num_to_keep,
                checkpoint_score_attribute=train.keep_best_by,
                checkpoint_score_order=train.keep_best_mode,
            ),
            # A wait for workers that never fit (a lost node, an autoscaler that does not
            # deliver) is retried a bounded number of times, not forever (Ray's default),
            # then the job ends in one line.
            failure_config=FailureConfig(
                max_failures=spec.max_failures,
                controller_failure_limit=placement_retries()
                if spec.start_retries is None
                else spec.start_retries,
            ),
            # One line per recovery (a dead worker, a lost node), not Ray's traceback.
            callbacks=[
                *(callbacks or []),
                *RecoveryReporter(layout.root, spec.max_failures, placement_wait_s()).callbacks(),
            ],
            # Ray Train's own INFO lines ("Reporting training result ...") only when verbose.
            logging_config=TrainLoggingConfig(log_level=ray_log_level()),
        ),
    )
    try:
        # In a helper thread: from the main thread, Ray Train takes SIGINT over (and ends
        # the process with status 1 and no message); santa's handler answers instead.
        try:
            with interrupts.keeping(lambda: describe_run(layout.root)):
                result = call_in_thread(trainer.fit, name="santa-fit")
        except BaseException as error:
            # Not left RUNNING in MLflow: the same command resumes it.
            tracked.end_early("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
            raise
        finish_tracking(tracked, result, config, layout)
        # A checkpoint upload cut short and retried leaves its folder behind: a finished
        # run holds registered checkpoints only.
        remove_unregistered_checkpoints(layout.root)
        if miner is not None:
            _warn_if_negatives_never_came(config, result, miner)
        return result
    finally:
        if miner is not None:
            import ray

            ray.kill(miner)


def _warn_if_negatives_never_came(config: SantaConfig, result, miner) -> None:
    """One line when an ``async`` stage ended without a table, or with a stale one."""
    import ray

    from santa.negatives.health import negatives_warning

    try:
        info = ray.get(miner.info.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - the line is still worth printing without it
        info = None
    line = negatives_warning(config, dict(result.metrics or {}), info)
    if line:
        print(line, file=sys.stderr, flush=True)


@dataclass
class InProcessResult:
    """What :func:`fit_in_process` returns: the fields of ``ray.train.Result`` that santa's
    callers read."""

    path: str
    """The run's folder."""
    checkpoint: Any
    """The newest checkpoint (a ``LocalCheckpoint``), or None when the run reported none."""
    metrics: dict[str, Any]
    """The last report's metrics."""
    error: BaseException | None = None
    """The error the run ended with (raised too: kept for the callers of ``fit``)."""
    best_checkpoints: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    """Every checkpoint with the metrics it was reported with, oldest first."""


def fit_in_process(
    config: SantaConfig,
    spec: RunSpec,
    *,
    device: str = "",
    on_report: Callable[[dict[str, float], str | None], None] | None = None,
) -> InProcessResult:
    """Train the run ``spec`` of ``config`` in this process (one worker; ``device``: the
    session's, by default ``cuda`` when ``train.use_gpu`` and ``cpu`` otherwise;
    ``on_report``: :class:`~santa.train.session.LocalSession`'s, each report with the
    folder its checkpoint was kept in, as a Tune trial training in process forwards them).

    The same worker loop (:class:`~santa.train.loop.WorkerTrainer`: the objective, the reader,
    the step, the optimizer and its schedule, the window metrics and checkpoints) on one worker
    through :class:`~santa.train.session.LocalSession`: what a benchmark, a notebook or a test
    on one machine needs when the cluster's part (a controller, worker actors, the async miner,
    recovery) is not what it is about. It computes the model a one-worker Ray run computes:
    same initial model, same global order, same steps.

    Checkpoints are folders ``checkpoint_<step>`` under the run's folder, every one kept; a
    second call on the same folder resumes from the newest, as a Ray run resumes from its
    storage. A folder holds runs of one kind: an in-process run does not resume a Ray run's
    checkpoints, nor the other way round.

    Raises ``ValueError`` for what only a Ray run does: several or elastic workers, the
    ``async`` miner (a Ray actor), a run folder on S3 or one a Ray run wrote."""
    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.session import LocalCheckpoint, LocalSession

    spec = spec.for_config(config)
    train = config.train
    layout = spec.layout
    where = f"the in-process run {layout.name!r}"
    if train.num_workers != 1 or train.elastic:
        raise ValueError(f"{where} trains on one worker; train.num_workers is {train.num_workers}")
    if config.negatives.source == "async":
        raise ValueError(f"{where}: negatives.source=async needs the miner actor, a Ray run")
    if storage.is_s3(layout.root):
        raise ValueError(f"{where} keeps its checkpoints on this machine, not {layout.root}")
    if Path(layout.root, RUN_SNAPSHOT_FILE).exists():
        raise ValueError(f"{layout.root} holds a Ray run: resume it with santa.train.fit")
    training_data(
        LoopConfig(santa=config, init_model="", objective=spec.objective, data_uri=spec.data)
    )
    started = time.time()
    init_model = prepare_initial_model(config, spec)
    startup = {"startup_initial_model_s": time.time() - started}
    tracked = Tracking.from_dict(spec.tracking).begin(
        run_uri=layout.root, name=layout.name, params=config.to_dict()
    )
    loop = loop_config(
        config,
        spec,
        init_model=init_model,
        # Threads as the spec's CPUs per worker; a share of one (a Ray worker's 0.5) or
        # none named: this process's CPUs.
        torch_threads=int(spec.cpus_per_worker)
        if spec.cpus_per_worker >= 1
        else len(os.sched_getaffinity(0)),
        startup=startup,
        tracked=tracked,
    )
    session = LocalSession(
        device=device or ("cuda" if train.use_gpu else "cpu"),
        checkpoint_root=layout.root,
        on_report=on_report,
    )
    try:
        with interrupts.keeping(lambda: describe_local_run(layout.root, session.checkpoints())):
            run_worker(WorkerTrainer(loop, session))
    except BaseException as error:
        tracked.end_early("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        raise
    result = InProcessResult(
        path=layout.root,
        checkpoint=session.checkpoint(),
        metrics=dict(session.reports[-1]) if session.reports else {},
        best_checkpoints=[(LocalCheckpoint(path), metrics) for path, metrics in session.saved],
    )
    finish_tracking(tracked, result, config, layout)
    return result
