"""A run of :func:`santa.train.trainer.fit` trained in this process, without Ray.

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
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from santa.config import SantaConfig
from santa.files import storage
from santa.files.layout import RUN_SNAPSHOT_FILE
from santa.train.session import LocalCheckpoint, LocalSession
from santa.train.tracking import Tracking, finish_tracking

__all__ = ["InProcessResult", "fit_in_process"]


@dataclass
class InProcessResult:
    """What :func:`fit_in_process` returns: the fields of ``ray.train.Result`` that santa's
    callers read."""

    path: str
    """The run's folder."""
    checkpoint: LocalCheckpoint | None
    """The newest checkpoint, or None when the run reported none."""
    metrics: dict[str, Any]
    """The last report's metrics."""
    error: BaseException | None = None
    """The error the run ended with (raised too: kept for the callers of ``fit``)."""
    best_checkpoints: list[tuple[LocalCheckpoint, dict[str, Any]]] = field(default_factory=list)
    """Every checkpoint with the metrics it was reported with, oldest first."""


def fit_in_process(config: SantaConfig, spec, *, device: str = "") -> InProcessResult:
    """Train the run ``spec`` of ``config`` in this process (one worker; ``device``: the
    session's, by default ``cuda`` when ``train.use_gpu`` and ``cpu`` otherwise).

    Raises ``ValueError`` for what only a Ray run does: several or elastic workers, the
    ``async`` miner (a Ray actor), a run folder on S3 or one a Ray run wrote."""
    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.loop_config import LoopConfig, training_data
    from santa.train.trainer import loop_config, prepare_initial_model

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
        device=device or ("cuda" if train.use_gpu else "cpu"), checkpoint_root=layout.root
    )
    try:
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
