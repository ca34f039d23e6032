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
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

from santa.checkpoints import MODEL_DIR, STATE_FILE
from santa.config import SantaConfig
from santa.distributed import all_gather_with_grad, identity_gather
from santa.losses import contrastive_loss, total_loss
from santa.model import DualEncoder

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng_state.pt"
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


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def linear_warmup_schedule(optimizer, warmup_steps: int, total_steps: int):
    """Linear warm-up to the peak learning rate, then linear decay to zero."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        remaining = max(1, total_steps - warmup_steps)
        return max(0.0, (total_steps - step) / remaining)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def save_training_checkpoint(
    directory: str,
    model: DualEncoder,
    optimizer: torch.optim.Optimizer,
    scheduler,
    state: dict[str, Any],
    config: SantaConfig,
) -> None:
    """Write model (HF folder), optimizer, scheduler and loop state into ``directory``."""
    model.save_pretrained(os.path.join(directory, MODEL_DIR), santa_config=config)
    torch.save(optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))
    torch.save(scheduler.state_dict(), os.path.join(directory, SCHEDULER_FILE))
    # Dropout draws from these: a resumed run repeats the uninterrupted one only with them.
    rng = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, os.path.join(directory, RNG_FILE))
    with open(os.path.join(directory, STATE_FILE), "w") as handle:
        json.dump(state, handle)


def load_training_state(
    directory: str, model: DualEncoder, optimizer: torch.optim.Optimizer, scheduler
) -> dict[str, Any]:
    """Restore what :func:`save_training_checkpoint` wrote; returns the loop state."""
    restored = DualEncoder.from_pretrained(os.path.join(directory, MODEL_DIR))
    model.load_state_dict(restored.state_dict())
    optimizer.load_state_dict(
        torch.load(os.path.join(directory, OPTIMIZER_FILE), weights_only=False)
    )
    scheduler.load_state_dict(
        torch.load(os.path.join(directory, SCHEDULER_FILE), weights_only=False)
    )
    rng = torch.load(os.path.join(directory, RNG_FILE), weights_only=False)
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    with open(os.path.join(directory, STATE_FILE)) as handle:
        return json.load(handle)


def to_tensors(arrays: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    """The model inputs of a numpy batch as long tensors on ``device`` (id strings stay)."""
    return {
        key: torch.as_tensor(value, dtype=torch.long).to(device)
        for key, value in arrays.items()
        if key in BATCH_KEYS
    }


def hard_negative_batch(tokenizer, texts: list[str], max_length: int, device):
    """Tokenize hard-negative documents (``batch * n`` texts, query-major) for the model."""
    encoded = tokenizer(
        texts, max_length=max_length, truncation=True, padding="max_length", return_tensors="pt"
    )
    return {
        "hard_negative_input_ids": encoded["input_ids"].to(device),
        "hard_negative_attention_mask": encoded["attention_mask"].to(device),
    }


def _dev_set(loop_config: dict[str, Any]):
    """The held-out BEIR split to evaluate on, or None."""
    uri = loop_config.get("eval_data")
    if not uri:
        return None
    from santa.data.beir import load_beir

    return load_beir(uri, loop_config.get("eval_split") or "test")


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


def _negatives_client(loop_config: dict[str, Any], config: SantaConfig, rank: int, world: int):
    """The worker's hard-negatives client, or None when training with in-batch negatives."""
    source = config.train.hard_negatives
    if source == "none":
        return None
    from santa.negatives.miner import NegativesClient

    return NegativesClient(
        source,
        data_uri=loop_config["data_uri"],
        n=config.train.hard_negatives_per_query,
        seed=config.train.seed,
        rank=rank,
        world_size=world,
        miner_name=loop_config.get("miner_name", ""),
        refresh_every=config.train.negatives_refresh_every,
    )


def compute_losses(
    ddp_model: torch.nn.Module, batch: dict[str, torch.Tensor], config: SantaConfig, gather
) -> dict[str, torch.Tensor]:
    """One forward through the (DDP-wrapped) model and the SDA/DR + MEP losses."""
    inputs = {BATCH_KEYS[key]: value for key, value in batch.items() if key in BATCH_KEYS}
    output = ddp_model(**inputs)
    sda = contrastive_loss(
        output.query_embeddings,
        output.doc_embeddings,
        output.hard_negative_embeddings,
        gather=gather,
        similarity=config.model.similarity,
        temperature=config.model.temperature,
    )
    loss = total_loss(sda, output.mep_loss, config.train.mep_weight)
    mep = output.mep_loss if output.mep_loss is not None else torch.zeros(())
    return {"loss": loss, "loss_sda": sda, "loss_mep": mep}


def total_steps(config: SantaConfig, rows: int | None) -> int:
    """Steps to run: ``max_steps``, else epochs × the global batches per epoch."""
    if config.train.max_steps:
        return config.train.max_steps
    if not rows:
        raise ValueError("set train.max_steps, or give a dataset whose size is known")
    return max(1, config.train.epochs * (rows // config.train.global_batch_size))


@contextmanager
def local_checkpoint(checkpoint: Any) -> Iterator[str]:
    """A local directory with the checkpoint's files, private to this process.

    ``Checkpoint.as_directory`` shares one download directory among the processes of a
    node, and a process that finds it unlocked downloads into it again (Ray 2.60,
    ``Checkpoint.to_directory``), rewriting files that another rank is still reading:
    ranks of one node resuming from S3 read truncated files. A checkpoint on a local
    filesystem is read in place.
    """
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield checkpoint.path
        return
    with tempfile.TemporaryDirectory(prefix="santa-resume-") as directory:
        yield checkpoint.to_directory(directory)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: build, resume, train, report, checkpoint."""
    import ray.train
    import ray.train.torch

    config = SantaConfig.from_dict(loop_config["santa"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    seed_everything(config.train.seed)  # same init everywhere; DDP also broadcasts it
    torch.set_num_threads(max(1, int(loop_config.get("torch_threads", 1))))

    model = DualEncoder.from_pretrained(loop_config["init_model"], config.model)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.train.learning_rate, weight_decay=config.train.weight_decay
    )
    steps = total_steps(config, loop_config.get("train_rows"))
    warmup = int(math.ceil(config.train.warmup_ratio * steps))
    scheduler = linear_warmup_schedule(optimizer, warmup, steps)
    state: dict[str, Any] = {"step": 0, "epoch": 0, "batches_in_epoch": 0, "resumed_at": []}

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with local_checkpoint(checkpoint) as directory:
            state = load_training_state(directory, model, optimizer, scheduler)
        state["resumed_at"] = [*state.get("resumed_at", []), state["step"]]
        logger.info("rank %d resumed at step %d", rank, state["step"])
    # An interruption on purpose (a preemptible run's budget, or a test of resuming):
    # train up to this step, checkpoint, and return; the schedule still spans `steps`.
    stop_at = int(loop_config.get("stop_at_step") or steps)

    use_gpu = config.train.use_gpu and torch.cuda.is_available()
    # Without MEP the LM head gets no gradient; DDP must be told, or it waits for it.
    ddp_model = ray.train.torch.prepare_model(
        model,
        parallel_strategy_kwargs={"find_unused_parameters": not config.train.uses_mep},
    )
    device = next(ddp_model.parameters()).device
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if use_gpu and config.train.bf16
        else nullcontext()
    )
    gather = all_gather_with_grad if world_size > 1 else identity_gather
    shard = ray.train.get_dataset_shard("train")
    writer = _tensorboard_writer(loop_config) if rank == 0 else None
    per_worker = config.train.per_worker_batch_size()
    negatives = _negatives_client(loop_config, config, rank, world_size)
    # Dev retrieval metrics (for Tune's scheduler and the run's record): rank 0 encodes the
    # held-out BEIR split at every eval step; the other ranks wait at the report barrier.
    dev = _dev_set(loop_config) if rank == 0 else None
    eval_every = config.train.eval_every or config.train.checkpoint_every or steps
    if negatives is not None and negatives.is_async:
        negatives.maybe_send_weights(state["step"], model, force=True)  # the first refresh
        if config.train.negatives_wait_for_first:
            negatives.wait_for_first()
    window: dict[str, list[float]] = {"loss": [], "loss_sda": [], "loss_mep": [], "time": []}
    window_started = time.perf_counter()

    while state["step"] < min(steps, stop_at):
        skip = state["batches_in_epoch"]  # batches this epoch already trained before a resume
        for arrays in shard.iter_batches(
            batch_size=per_worker,
            drop_last=True,
            batch_format="numpy",
            # Pairs arrive in corpus order (all functions of a file together); a seeded
            # local shuffle makes in-batch negatives come from across the corpus and keeps
            # the order reproducible (so a resumed run repeats the uninterrupted one).
            local_shuffle_buffer_size=config.train.shuffle_buffer or None,
            local_shuffle_seed=(
                config.train.seed + 1000 * rank + state["epoch"]
                if config.train.shuffle_buffer
                else None
            ),
        ):
            if skip:
                skip -= 1
                continue
            started = time.perf_counter()
            batch = to_tensors(arrays, device)
            table = None
            if negatives is not None:
                negatives.poll()  # non-blocking: swaps in a newer table if the miner has one
                table = negatives.agreed_table(device)
                if table is not None:
                    batch.update(
                        hard_negative_batch(
                            model.tokenizer,
                            negatives.negatives_for(
                                table, arrays["query_id"], arrays["doc_id"], state["step"]
                            ),
                            config.train.max_document_length,
                            device,
                        )
                    )
            model.train()
            with autocast:
                losses = compute_losses(ddp_model, batch, config, gather)
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            if config.train.grad_clip:
                torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), config.train.grad_clip)
            optimizer.step()
            scheduler.step()
            state["step"] += 1
            if negatives is not None:
                negatives.maybe_send_weights(state["step"], model)
            state["batches_in_epoch"] += 1
            for key in ("loss", "loss_sda", "loss_mep"):
                window[key].append(float(losses[key].detach()))
            window["time"].append(time.perf_counter() - started)

            last = state["step"] >= min(steps, stop_at)
            checkpoint_now = last or (
                config.train.checkpoint_every and state["step"] % config.train.checkpoint_every == 0
            )
            if last or checkpoint_now or state["step"] % config.train.log_every == 0:
                metrics = _window_metrics(window, window_started, state, scheduler, config)
                if negatives is not None:
                    metrics.update(negatives.metrics(state["step"], table))
                if dev is not None and (last or state["step"] % eval_every == 0):
                    metrics.update(dev_metrics(model, dev, config))
                window = {key: [] for key in window}
                window_started = time.perf_counter()
                if rank == 0:
                    print(_progress_line(metrics, steps), flush=True)
                if writer is not None:
                    for key, value in metrics.items():
                        writer.add_scalar(f"train/{key}", value, state["step"])
                    writer.flush()
                _report(metrics, state, model, optimizer, scheduler, config, rank, checkpoint_now)
            if last:
                break
        else:
            state["epoch"] += 1
            state["batches_in_epoch"] = 0
            continue
        break
    if writer is not None:
        writer.close()


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


def _tensorboard_writer(loop_config: dict[str, Any]):
    """A TensorBoard writer on rank 0 (Train V2 writes none itself)."""
    directory = loop_config.get("tensorboard_dir")
    if not directory:
        return None
    from tensorboardX import SummaryWriter

    os.makedirs(directory, exist_ok=True)
    return SummaryWriter(directory)
