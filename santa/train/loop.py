"""The per-worker training loop run by Ray Train's ``TorchTrainer`` (Train V2).

Plain PyTorch: Ray is touched only through ``prepare_model``, the dataset shard, the
checkpoint API and ``ray.train.report``. One forward per step through the DDP-wrapped
:class:`~santa.model.DualEncoder`; the contrastive loss sees the global batch through
``all_gather_with_grad``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from santa import storage
from santa.config import SantaConfig
from santa.distributed import all_gather_with_grad, identity_gather
from santa.losses import contrastive_loss, total_loss
from santa.model import DualEncoder
from santa.negatives.miner import NegativesClient
from santa.negatives.mining import NegativesTable
from santa.train.entry import FirstEpoch, LoopConfig, epoch_batches
from santa.train.optim import build_optimizer
from santa.train.resume import load_newest_loadable
from santa.train.state import (
    linear_warmup_schedule,
    load_training_state,
    local_checkpoint,
    save_training_checkpoint,
    seed_everything,
    total_steps,
)

logger = logging.getLogger(__name__)

BATCH_KEYS = {
    "hard_negative_input_ids": "hard_negative_input_ids",
    "hard_negative_attention_mask": "hard_negative_attention_mask",
    "query_input_ids": "query_input_ids",
    "query_attention_mask": "query_attention_mask",
    "document_input_ids": "document_input_ids",
    "document_attention_mask": "document_attention_mask",
    "masked_input_ids": "masked_document_input_ids",
    "masked_attention_mask": "masked_document_attention_mask",
    "labels": "mep_labels",
}


def to_tensors(arrays: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    """The model inputs of a numpy batch as long tensors on ``device`` (id strings stay)."""
    return {
        key: torch.as_tensor(value, dtype=torch.long).to(device)
        for key, value in arrays.items()
        if key in BATCH_KEYS
    }


def hard_negative_batch(model: DualEncoder, texts: list[str], max_length: int, device):
    """Tokenize hard-negative documents (``batch * n`` texts, query-major) for the model,
    as the training input tokenizes documents (fixed length, the backbone's own rules)."""
    encoded = model.tokenize(texts, max_length, padding="max_length")
    return {
        "hard_negative_input_ids": encoded["input_ids"].to(device),
        "hard_negative_attention_mask": encoded["attention_mask"].to(device),
    }


def _dev_set(loop: LoopConfig):
    """The held-out BEIR split to evaluate on, or None."""
    if not loop.eval_data:
        return None
    from santa.data.beir import load_beir

    return load_beir(loop.eval_data, loop.eval_split or "test")


def dev_metrics(model: DualEncoder, dev, config: SantaConfig) -> dict[str, float]:
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


def _negatives_client(loop: LoopConfig, config: SantaConfig, rank: int, world: int):
    """The worker's hard-negatives client, or None when training with in-batch negatives."""
    source = config.train.hard_negatives
    if source == "none":
        return None
    return NegativesClient(
        source,
        data_uri=loop.data_uri,
        n=config.train.hard_negatives_per_query,
        seed=config.train.seed,
        rank=rank,
        world_size=world,
        miner_name=loop.miner_name,
        refresh_every=config.train.negatives_refresh_every,
    )


def compute_losses(
    ddp_model: torch.nn.Module, batch: dict[str, torch.Tensor], config: SantaConfig, gather
) -> dict[str, torch.Tensor]:
    """One forward through the (DDP-wrapped) model and the SDA/DR + MEP losses."""
    inputs = {BATCH_KEYS[key]: value for key, value in batch.items() if key in BATCH_KEYS}
    output = ddp_model(**inputs, mep_reduction=config.train.mep_reduction)
    sda = contrastive_loss(
        output.query_embeddings,
        output.doc_embeddings,
        output.hard_negative_embeddings,
        gather=gather,
        similarity=config.model.similarity,
        temperature=config.model.temperature,
    )
    loss = total_loss(sda, output.mep_loss, config.train.mep_weight, config.train.sda_weight)
    mep = output.mep_loss if output.mep_loss is not None else torch.zeros(())
    return {"loss": loss, "loss_sda": sda, "loss_mep": mep}


def train_loop_per_worker(
    loop_config: dict[str, Any], first_epoch: FirstEpoch | None = None
) -> None:
    """Ray Train entry point: build, resume, train, report, checkpoint.

    ``first_epoch``: epoch 0 already being read (``santa.train.entry``), for a fresh run.
    """
    trainer = WorkerTrainer(LoopConfig.from_dict(loop_config), first_epoch=first_epoch)
    try:
        trainer.train()
    finally:
        trainer.close()


class WorkerTrainer:
    """One worker's part of a run: setup and resume, steps, reports with checkpoints."""

    def __init__(self, loop: LoopConfig, first_epoch: FirstEpoch | None = None) -> None:
        import ray.train
        import ray.train.torch

        config = self.config = loop.santa
        self.loop = loop
        if os.environ.get("SANTA_QUIET"):
            _quiet_train_reports()
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        seed_everything(config.train.seed)  # same init everywhere; DDP also broadcasts it
        torch.set_num_threads(loop.torch_threads)

        model = self.model = DualEncoder.from_pretrained(loop.init_model, config.model)
        if config.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        use_gpu = config.train.use_gpu and torch.cuda.is_available()
        self.optimizer = build_optimizer(model.parameters(), config.train, fused=use_gpu)
        self.steps = total_steps(config, loop.train_rows)
        warmup = int(math.ceil(config.train.warmup_ratio * self.steps))
        self.scheduler = linear_warmup_schedule(self.optimizer, warmup, self.steps)
        self.state = self._resume()
        self.first_epoch = first_epoch if self.state["step"] == 0 else None
        # An interruption on purpose (a preemptible run's budget, or a test of resuming):
        # train up to this step, checkpoint, and return; the schedule still spans `steps`.
        self.stop_at = min(self.steps, loop.stop_at_step or self.steps)

        # A T5 trained without MEP leaves an untied LM head (T5 v1.1) without gradient: DDP
        # must be told, or it waits for it. A tied head is the input embedding, and
        # encoder-only models use every parameter (their pooler is removed); the search
        # for unused parameters costs a pass over the graph every step.
        tied = getattr(model.backbone.config, "tie_word_embeddings", True)
        unused = model.is_t5 and not config.train.uses_mep and not tied
        self.ddp_model = ray.train.torch.prepare_model(
            model, parallel_strategy_kwargs={"find_unused_parameters": unused}
        )
        self.device = next(self.ddp_model.parameters()).device
        # The forward the steps run: compiled (kernels fused, fewer launches), or DDP's own.
        # Checkpoints save `self.model`, whose state_dict keys stay those of the backbone.
        self.forward_model = self.ddp_model
        if config.train.compile == "always" or (config.train.compile == "gpu" and use_gpu):
            self.forward_model = torch.compile(self.ddp_model, backend=config.train.compile_backend)
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if use_gpu and config.train.bf16
            else nullcontext()
        )
        self.gather = all_gather_with_grad if self.world_size > 1 else identity_gather
        self.shard = ray.train.get_dataset_shard("train")
        self.writer = _tensorboard_writer(loop.tensorboard_dir) if self.rank == 0 else None
        self.history: list[dict[str, Any]] = []
        if self.rank == 0 and loop.metrics_uri and storage.exists(loop.metrics_uri):
            text = storage.read_bytes(loop.metrics_uri).decode()
            self.history = [json.loads(line) for line in text.splitlines() if line.strip()]
        self.negatives = _negatives_client(loop, config, self.rank, self.world_size)
        # Dev retrieval metrics (for Tune's scheduler and the run's record): rank 0 encodes
        # the held-out BEIR split at every eval step; the other ranks wait at the report
        # barrier.
        self.dev = _dev_set(loop) if self.rank == 0 else None
        self.eval_every = config.train.eval_every or config.train.checkpoint_every or self.steps
        if self.negatives is not None and self.negatives.is_async:
            self.negatives.maybe_send_weights(self.state["step"], model, force=True)
            if config.train.negatives_wait_for_first:
                self.negatives.wait_for_first()
        self._reset_window()

    def _resume(self) -> dict[str, Any]:
        """The loop state: fresh, or restored with the weights from Ray's checkpoint."""
        import ray.train

        state: dict[str, Any] = {"step": 0, "epoch": 0, "batches_in_epoch": 0, "resumed_at": []}
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:

            def load(candidate) -> dict[str, Any]:
                with local_checkpoint(candidate) as directory:
                    return load_training_state(
                        directory, self.model, self.optimizer, self.scheduler
                    )

            state, _ = load_newest_loadable(
                checkpoint, list(self.loop.registered_checkpoints), load, announce=self.rank == 0
            )
            state["resumed_at"] = [*state.get("resumed_at", []), state["step"]]
            logger.info("rank %d resumed at step %d", self.rank, state["step"])
        return state

    def _reset_window(self) -> None:
        self.window: dict[str, list[float]] = {
            "loss": [],
            "loss_sda": [],
            "loss_mep": [],
            "time": [],
        }
        self.window_started = time.perf_counter()

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        """This epoch's batches of the shard, past those trained before a resume."""
        if self.first_epoch is not None and self.state["epoch"] == 0:
            batches, self.first_epoch = self.first_epoch.batches(), None
        else:
            batches = epoch_batches(self.shard, self.config.train, self.rank, self.state["epoch"])
        skip = self.state["batches_in_epoch"]
        for arrays in batches:
            if skip:
                skip -= 1
                continue
            yield arrays

    def train(self) -> None:
        """Step through the shard, epoch after epoch, up to the stop step."""
        # Whole-run throughput: every second from here on counts (data, evaluation,
        # checkpoints), unlike the per-window `pairs_per_s`.
        self.run_started, self.run_first_step = time.perf_counter(), self.state["step"]
        while self.state["step"] < self.stop_at:
            for arrays in self._batches():
                table = self.train_step(arrays)
                if self.report(table):
                    return
            self.state["epoch"] += 1
            self.state["batches_in_epoch"] = 0

    def train_step(self, arrays: dict[str, np.ndarray]) -> NegativesTable | None:
        """One optimizer step on a batch; returns the hard-negatives table it used."""
        config, negatives = self.config, self.negatives
        started = time.perf_counter()
        batch = to_tensors(arrays, self.device)
        table = None
        if negatives is not None:
            negatives.poll()  # non-blocking: swaps in a newer table if the miner has one
            table = negatives.agreed_table(self.device)
            if table is not None:
                texts = negatives.negatives_for(
                    table, arrays["query_id"], arrays["doc_id"], self.state["step"]
                )
                batch.update(
                    hard_negative_batch(
                        self.model, texts, config.train.max_document_length, self.device
                    )
                )
        self.model.train()
        with self.autocast:
            losses = compute_losses(self.forward_model, batch, config, self.gather)
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if config.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.ddp_model.parameters(), config.train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.state["step"] += 1
        if negatives is not None:
            negatives.maybe_send_weights(self.state["step"], self.model)
        self.state["batches_in_epoch"] += 1
        for key in ("loss", "loss_sda", "loss_mep"):
            self.window[key].append(float(losses[key].detach()))
        self.window["time"].append(time.perf_counter() - started)
        return table

    def report(self, table: NegativesTable | None) -> bool:
        """Log, evaluate, report and checkpoint when the step calls for it; True at the end."""
        train, step = self.config.train, self.state["step"]
        last = step >= self.stop_at
        checkpoint_now = last or (train.checkpoint_every and step % train.checkpoint_every == 0)
        if not (last or checkpoint_now or step % train.log_every == 0):
            return False
        metrics = _window_metrics(
            self.window, self.window_started, self.state, self.scheduler, self.config
        )
        if self.negatives is not None:
            metrics.update(self.negatives.metrics(step, table))
        run_s = time.perf_counter() - self.run_started
        pairs = train.global_batch_size * (step - self.run_first_step)
        metrics["run_pairs_per_s"] = pairs / run_s if run_s > 0 else 0.0
        if self.dev is not None and (last or step % self.eval_every == 0):
            metrics.update(dev_metrics(self.model, self.dev, self.config))
        self._reset_window()
        if self.rank == 0:
            # Ray Train patches print() to log *and* tee it (two lines per call); the
            # process's own stdout is printed once and still reaches the driver.
            print(_progress_line(metrics, self.steps), file=sys.__stdout__, flush=True)
            self._keep_history(metrics, publish_tensorboard=bool(checkpoint_now))
        _report(
            metrics,
            self.state,
            self.model,
            self.optimizer,
            self.scheduler,
            self.config,
            self.rank,
            checkpoint_now,
        )
        return last

    def _keep_history(self, metrics: dict[str, float], publish_tensorboard: bool) -> None:
        """Rank 0: TensorBoard scalars, the JSON-lines history, the storage copy of events."""
        step = self.state["step"]
        if self.writer is not None:
            for key, value in metrics.items():
                # TensorBoard names allow no "@" (recall@10 → recall_10).
                self.writer.add_scalar(f"train/{key.replace('@', '_')}", value, step)
            self.writer.flush()
        if self.loop.metrics_uri:
            # A resumed run drops the lines of steps it repeats.
            self.history = [h for h in self.history if h["step"] < step] + [dict(metrics)]
            lines = "".join(json.dumps(h, sort_keys=True) + "\n" for h in self.history)
            storage.write_bytes(self.loop.metrics_uri, lines.encode())
        if publish_tensorboard and self.loop.tensorboard_uri and self.loop.tensorboard_dir:
            storage.upload_dir(self.loop.tensorboard_dir, self.loop.tensorboard_uri)

    def close(self) -> None:
        """Close the TensorBoard writer (and publish its last events)."""
        if self.writer is not None:
            self.writer.close()
            if self.loop.tensorboard_uri and self.loop.tensorboard_dir:
                storage.upload_dir(self.loop.tensorboard_dir, self.loop.tensorboard_uri)


def _window_metrics(window, started, state, scheduler, config: SantaConfig) -> dict[str, float]:
    """Means over the steps since the last report; throughput includes waiting for data."""
    import resource

    steps = max(1, len(window["time"]))
    step_time = sum(window["time"]) / steps
    elapsed = time.perf_counter() - started
    return {
        "step": state["step"],
        "epoch": state["epoch"],
        "loss": float(np.mean(window["loss"])),
        "loss_sda": float(np.mean(window["loss_sda"])),
        "loss_mep": float(np.mean(window["loss_mep"])),
        "learning_rate": float(scheduler.get_last_lr()[0]),
        "step_time_s": step_time,
        "pairs_per_s": config.train.global_batch_size * steps / elapsed if elapsed else 0.0,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _progress_line(metrics: dict[str, float], steps: int) -> str:
    """One line of progress for the job's log (rank 0, every report)."""
    line = (
        f"[train] step {int(metrics['step'])}/{steps} loss {metrics['loss']:.4f} "
        f"(sda {metrics['loss_sda']:.4f}, mep {metrics['loss_mep']:.4f}) "
        f"{metrics['pairs_per_s']:.1f} pairs/s lr {metrics['learning_rate']:.2e}"
    )
    if "dev_mrr" in metrics:
        line += f" dev_mrr {metrics['dev_mrr']:.4f}"
    if "negatives_step" in metrics:
        line += f" negatives@{int(metrics['negatives_step'])}"
    return line


def _report(metrics, state, model, optimizer, scheduler, config, rank, with_checkpoint) -> None:
    """``ray.train.report`` on every rank (it is a barrier); rank 0 attaches the checkpoint."""
    import ray.train

    if not with_checkpoint:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="santa-ckpt-") as directory:
        checkpoint = None
        if rank == 0:
            save_training_checkpoint(directory, model, optimizer, scheduler, state, config)
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report(metrics, checkpoint=checkpoint)


def _tensorboard_writer(directory: str):
    """A TensorBoard writer on rank 0 (Train V2 writes none itself)."""
    if not directory:
        return None
    from tensorboardX import SummaryWriter

    os.makedirs(directory, exist_ok=True)
    return SummaryWriter(directory)


def _quiet_train_reports() -> None:
    """Ray Train logs each report at INFO under a logger named after its file (so its own
    log-level setting misses it): in quiet mode it stays in Ray's log files."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)
