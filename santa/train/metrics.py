"""What a run keeps of its steps, composed by the loop (:class:`~santa.train.loop.WorkerTrainer`):
the metrics' record (:class:`MetricsRecord`: ``metrics.jsonl``, TensorBoard, MLflow / W&B,
progress lines) and the dev evaluation (:class:`DevEvaluation`). Neither needs Ray: a plain
process (benchmarks, tests) keeps the same record.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from santa.config import SantaConfig
from santa.files import storage
from santa.train.loop_config import LoopConfig

logger = logging.getLogger(__name__)


class MetricsRecord:
    """Rank 0's record of the logged windows; on the other ranks it keeps nothing."""

    def __init__(self, loop: LoopConfig, rank: int) -> None:
        self.loop = loop
        self.keeps = rank == 0
        self.writer = _tensorboard_writer(loop.tensorboard_dir) if self.keeps else None
        self.tracker = _worker_tracker(loop, loop.santa) if self.keeps else None
        self.history: list[dict[str, Any]] = []
        if self.keeps and loop.metrics_uri and storage.exists(loop.metrics_uri):
            text = storage.read_bytes(loop.metrics_uri).decode()
            self.history = [json.loads(line) for line in text.splitlines() if line.strip()]
        # Steps this job printed already (a worker group Ray Train restarted repeats them
        # from the checkpoint): repeated quietly, not shown as new.
        logged = max((int(h["step"]) for h in self.history), default=0)
        self.printed_through = logged if logged > loop.logged_before else 0

    def keep(self, metrics: dict[str, float], step: int, line: str, publish: bool) -> None:
        """The JSON-lines history, then the window's progress line (unless printed before),
        TensorBoard scalars, the tracker; the events copied to storage when ``publish``."""
        if not self.keeps:
            return
        if self.loop.metrics_uri:
            # First: a worker group that Ray Train restarts reads this history to know which
            # progress lines were shown, so a line is never shown before its step is in it
            # (a worker killed between the two would have its group show the step again).
            # A resumed run drops the lines of steps it repeats.
            self.history = [h for h in self.history if h["step"] < step] + [dict(metrics)]
            lines = "".join(json.dumps(h, sort_keys=True) + "\n" for h in self.history)
            storage.write_bytes(self.loop.metrics_uri, lines.encode())
        if step > self.printed_through:
            # Ray Train patches print() to log *and* tee it (two lines per call); the
            # process's own stdout is printed once and still reaches the driver.
            print(line, file=sys.__stdout__, flush=True)
        if self.writer is not None:
            for key, value in metrics.items():
                # TensorBoard names allow no "@" (recall@10 → recall_10).
                self.writer.add_scalar(f"train/{key.replace('@', '_')}", value, step)
            self.writer.flush()
        if self.tracker is not None:
            self.tracker.log(metrics, step)
        if publish:
            self._publish_tensorboard()

    def close(self, publish: bool = True) -> None:
        """Close the tracker and the TensorBoard writer, publishing its last events unless
        ``publish`` is false (the storage just did not answer)."""
        if self.tracker is not None:
            self.tracker.close()
        if self.writer is not None:
            self.writer.close()
            if publish:
                self._publish_tensorboard()

    def _publish_tensorboard(self) -> None:
        if self.loop.tensorboard_uri and self.loop.tensorboard_dir:
            storage.upload_dir(self.loop.tensorboard_dir, self.loop.tensorboard_uri)


class DevEvaluation:
    """Dev retrieval metrics for Tune's scheduler and the run's record: rank 0 encodes the
    held-out BEIR split every ``eval_every`` steps and at the end (the other ranks wait at
    the report's barrier)."""

    def __init__(self, loop: LoopConfig, rank: int, evaluates: bool, steps: int) -> None:
        train = loop.santa.train
        self.config = loop.santa
        self.dev = _dev_set(loop) if rank == 0 and evaluates else None
        self.every = train.eval_every or train.checkpoint_every or steps

    def metrics(self, model: Any, step: int, last: bool) -> dict[str, float]:
        """The dev metrics when this step calls for them, else none."""
        if self.dev is None or not (last or step % self.every == 0):
            return {}
        return dev_metrics(model, self.dev, self.config)


def _dev_set(loop: LoopConfig):
    """The held-out BEIR split to evaluate on, or None."""
    if not loop.eval_data:
        return None
    from santa.data.beir import load_beir

    return load_beir(loop.eval_data, loop.eval_split or "test")


def dev_metrics(model, dev, config: SantaConfig) -> dict[str, float]:
    """``dev_mrr`` (MRR@100), ``dev_ndcg`` (NDCG@100), ``dev_recall@10`` on the dev split."""
    from santa.eval import evaluate_model

    was_training = model.training
    started = time.perf_counter()
    result = evaluate_model(
        model,
        dev,
        max_query_length=config.train.max_query_length,
        max_document_length=config.train.max_document_length,
    )
    model.train(was_training)
    return {
        "dev_mrr": float(result["mrr@100"]),
        "dev_ndcg": float(result["ndcg@100"]),
        "dev_recall@10": float(result["recall@10"]),
        "dev_eval_s": time.perf_counter() - started,
    }


def _tensorboard_writer(directory: str):
    """A TensorBoard writer on rank 0 (Train V2 writes none itself)."""
    if not directory:
        return None
    from tensorboardX import SummaryWriter

    os.makedirs(directory, exist_ok=True)
    return SummaryWriter(directory)


def _worker_tracker(loop: LoopConfig, config: SantaConfig):
    """Rank 0's MLflow / W&B logger when the job tracks its runs (else None)."""
    from santa.train.tracking import Tracking, WorkerTracker, tracking_warning

    tracking = Tracking.from_dict(loop.tracking)
    if not (tracking.mlflow_run_id or tracking.wandb_run_id):
        return None
    try:
        return WorkerTracker(tracking, config=config.to_dict())
    except Exception as error:  # noqa: BLE001 - tracking must never stop training
        tracking_warning("experiment tracking is off for this run", error)
        return None
