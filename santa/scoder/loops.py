"""The Ray Train stages of SCodeR: discriminators (Eq. 6-7) and the dual encoder (Eq. 8-10).

Each stage is its own ``TorchTrainer`` run, laid out like santa's trainer (checkpoints in
``RunConfig(storage_path=..., name=...)``, resumed from the latest one on a rerun, rank 0
writing ``metrics.jsonl``). Both read listwise examples (:mod:`santa.scoder.examples`)
streamed from Parquet with Ray Data and tokenize them in the worker: a discriminator reads
each ``[x; y]`` pair, the dual encoder the query and every candidate apart.

The dual-encoder stage takes the discriminators' scores over ``{x⁺} ∪ X⁻`` as soft labels,
either from a ``scores`` column precomputed offline (:mod:`santa.scoder.soft_labels`) or by
running the discriminators in the worker without gradient (``online``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from santa.config import SantaConfig
from santa.method.losses import (
    adversarial_loss,
    discriminator_loss,
    distillation_loss,
    soft_labeled_loss,
)
from santa.models.dual_encoder import DualEncoder
from santa.runtime import storage
from santa.scoder.discriminator import DiscriminatorPair
from santa.train.optim import build_optimizer
from santa.train.state import (
    OPTIMIZER_FILE,
    RNG_FILE,
    SCHEDULER_FILE,
    linear_warmup_schedule,
    load_training_state,
    local_checkpoint,
    save_training_checkpoint,
    seed_everything,
)

__all__ = [
    "STAGES",
    "StageSpec",
    "fit_stage",
    "listwise_entropy",
    "own_candidate_scores",
    "stage_loop_per_worker",
]

DISCRIMINATORS = "discriminators"
DUAL_ENCODER = "dual_encoder"
STAGES = (DISCRIMINATORS, DUAL_ENCODER)
DISCRIMINATORS_DIR = "discriminators"  # inside a discriminator-stage checkpoint
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    """What the driver hands every worker of one stage (a plain dict through Ray)."""

    stage: str
    santa: dict[str, Any]
    init: str
    """Starting weights: the dual encoder's model folder, or the discriminators' folder
    (``DiscriminatorPair.save_pretrained``)."""
    steps: int
    discriminators: str = ""
    """Dual encoder, ``online`` soft labels: the discriminators' folder."""
    threads: int = 1
    metrics_uri: str = ""
    eval_data: str = ""
    eval_split: str = "test"

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        if self.steps < 1:
            raise ValueError(f"a stage needs at least one step, got {self.steps}")

    @property
    def config(self) -> SantaConfig:
        """The run's config."""
        return SantaConfig.from_dict(self.santa)


def listwise_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over each row's candidates: ``(batch,)`` (nats)."""
    log_p = torch.log_softmax(scores.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def stage_loop_per_worker(payload: dict[str, Any]) -> None:
    """Ray Train entry point of both stages."""
    spec = StageSpec(**payload)
    worker = _DiscriminatorWorker(spec) if spec.stage == DISCRIMINATORS else _DualWorker(spec)
    worker.run()


class _Worker:
    """Setup, batches, resume and reports shared by the two stages."""

    def __init__(self, spec: StageSpec) -> None:
        import ray.train
        import ray.train.torch

        self.spec = spec
        self.config = config = spec.config
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        seed_everything(config.train.seed)
        torch.set_num_threads(spec.threads)
        self.model = self.build_model()
        self.optimizer = build_optimizer(
            self.model.parameters(), config.train, learning_rate=self.learning_rate
        )
        warmup = int(math.ceil(config.train.warmup_ratio * spec.steps))
        self.scheduler = linear_warmup_schedule(self.optimizer, warmup, spec.steps)
        self.state = {"step": 0, "epoch": 0, "batches_in_epoch": 0, "resumed_at": []}
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            with local_checkpoint(checkpoint) as directory:
                self.state = self.load(directory)
            self.state["resumed_at"] = [*self.state.get("resumed_at", []), self.state["step"]]
        self.ddp_model = ray.train.torch.prepare_model(
            self.model, parallel_strategy_kwargs={"find_unused_parameters": self.unused}
        )
        self.device = next(self.ddp_model.parameters()).device
        self.shard = ray.train.get_dataset_shard("train")
        self.window: dict[str, list[float]] = {}
        self.history: list[dict[str, Any]] = []
        if self.rank == 0 and spec.metrics_uri and storage.exists(spec.metrics_uri):
            text = storage.read_bytes(spec.metrics_uri).decode()
            self.history = [json.loads(line) for line in text.splitlines() if line.strip()]

    # The stage's own parts.
    learning_rate: float
    unused = False

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def step(self, rows: dict[str, list]) -> dict[str, float]:
        raise NotImplementedError

    def save(self, directory: str) -> None:
        raise NotImplementedError

    def load(self, directory: str) -> dict[str, Any]:
        raise NotImplementedError

    def final_metrics(self) -> dict[str, float]:
        return {}

    # The loop.
    def batches(self):
        train = self.config.train
        skip = self.state["batches_in_epoch"]
        for batch in self.shard.iter_batches(
            batch_size=train.per_worker_batch_size(),
            drop_last=True,
            batch_format="pyarrow",
            local_shuffle_buffer_size=train.shuffle_buffer or None,
            local_shuffle_seed=(
                train.seed + 1000 * self.rank + self.state["epoch"]
                if train.shuffle_buffer
                else None
            ),
        ):
            if skip:
                skip -= 1
                continue
            yield batch.to_pydict()

    def run(self) -> None:
        """Step through the shard, epoch after epoch, up to ``spec.steps``."""
        while self.state["step"] < self.spec.steps:
            trained = False
            for rows in self.batches():
                trained = True
                started = time.perf_counter()
                self.model.train()
                metrics = self.step(rows)
                metrics["step_time_s"] = time.perf_counter() - started
                self.state["step"] += 1
                self.state["batches_in_epoch"] += 1
                for key, value in metrics.items():
                    self.window.setdefault(key, []).append(value)
                if self.report():
                    return
            if not trained:
                raise ValueError("a worker's shard has less than one batch of examples")
            self.state["epoch"] += 1
            self.state["batches_in_epoch"] = 0

    def report(self) -> bool:
        """Report (a barrier) at log steps; checkpoint at checkpoint steps and the end."""
        import ray.train
        import ray.train.torch

        train, step = self.config.train, self.state["step"]
        last = step >= self.spec.steps
        checkpoint_now = last or bool(train.checkpoint_every and step % train.checkpoint_every == 0)
        if not (last or checkpoint_now or step % train.log_every == 0):
            return False
        metrics: dict[str, float] = {"step": step, "epoch": self.state["epoch"]}
        metrics.update({key: float(np.mean(values)) for key, values in self.window.items()})
        metrics["learning_rate"] = float(self.scheduler.get_last_lr()[0])
        self.window = {}
        if last:
            metrics.update(self.final_metrics())
        if self.rank == 0:
            line = f"[{self.spec.stage}] step {step}/{self.spec.steps} loss {metrics['loss']:.4f}"
            for key in ("accuracy", "soft_label_entropy", "dev_mrr"):
                if key in metrics:
                    line += f" {key} {metrics[key]:.4f}"
            print(line, file=sys.__stdout__, flush=True)
            if self.spec.metrics_uri:
                self.history = [h for h in self.history if h["step"] < step] + [metrics]
                lines = "".join(json.dumps(h, sort_keys=True) + "\n" for h in self.history)
                storage.write_bytes(self.spec.metrics_uri, lines.encode())
        if not checkpoint_now:
            ray.train.report(metrics)
            return last
        with tempfile.TemporaryDirectory(prefix="santa-scoder-ckpt-") as directory:
            checkpoint = None
            if self.rank == 0:
                self.save(directory)
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=checkpoint)
        return last


class _DiscriminatorWorker(_Worker):
    """Eq. 6-7 for D_φ (text–code rows) and D_ψ (code–code rows) in one DDP module."""

    unused = True  # a batch may hold rows of one kind only: the other model gets no grad

    @property
    def learning_rate(self) -> float:
        return self.config.scoder.discriminator_learning_rate

    def build_model(self) -> DiscriminatorPair:
        pair = DiscriminatorPair.from_pretrained(self.spec.init)
        config = self.config
        if (
            config.scoder.discriminator_gradient_checkpointing
            or config.model.gradient_checkpointing
        ):
            pair.gradient_checkpointing_enable()
        return pair

    def step(self, rows: dict[str, list]) -> dict[str, float]:
        pair = self.model
        train = self.config.train
        inputs: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        for kind, model in pair.by_kind.items():
            index = [i for i, k in enumerate(rows["kind"]) if k == kind]
            if not index:
                continue
            width = len(rows["candidates"][index[0]])
            encoded = model.tokenize_pairs(
                [rows["query"][i] for i in index for _ in range(width)],
                [text for i in index for text in rows["candidates"][i]],
                max_first=train.max_query_length,
                max_length=pair_length(self.config),
            )
            for key in ("input_ids", "attention_mask"):
                value = encoded[key].to(self.device)
                inputs[f"{kind}_{key}"] = value.reshape(len(index), width, -1)
            counts[kind] = len(index)
        unknown = set(rows["kind"]) - set(pair.by_kind)
        if unknown:
            raise ValueError(f"examples of kind {sorted(unknown)} but no discriminator for it")
        scores = self.ddp_model(**inputs)  # {kind: (rows of kind, 1 + n)}
        total = sum(counts.values())
        loss = sum(discriminator_loss(s) * (counts[k] / total) for k, s in scores.items())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.ddp_model.parameters(), train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        correct = sum(int((s.argmax(dim=1) == 0).sum()) for s in scores.values())
        return {"loss": float(loss.detach()), "accuracy": correct / total}

    def save(self, directory: str) -> None:
        self.model.save_pretrained(os.path.join(directory, DISCRIMINATORS_DIR))
        _save_optimizer_state(directory, self.optimizer, self.scheduler, self.state)

    def load(self, directory: str) -> dict[str, Any]:
        restored = DiscriminatorPair.from_pretrained(os.path.join(directory, DISCRIMINATORS_DIR))
        self.model.load_state_dict(restored.state_dict())
        return _load_optimizer_state(directory, self.optimizer, self.scheduler)


class _DualWorker(_Worker):
    """Eq. 8-10: ``λ·L_adv + (1 − λ)·L_distill`` against the discriminators' soft labels."""

    @property
    def learning_rate(self) -> float:
        return self.config.train.learning_rate

    def build_model(self) -> DualEncoder:
        model = DualEncoder.from_pretrained(self.spec.init, self.config.model)
        # A T5 trained without MEP leaves an untied LM head without gradient (see train.loop).
        tied = getattr(model.backbone.config, "tie_word_embeddings", True)
        self.unused = model.is_t5 and not tied
        self.teacher = None
        if self.config.scoder.soft_labels == "online":
            self.teacher = DiscriminatorPair.from_pretrained(self.spec.discriminators).eval()
            self.teacher.requires_grad_(False)
        return model

    def soft_labels(self, rows: dict[str, list]) -> torch.Tensor:
        """The discriminators' scores ``(batch, 1 + n)``: read, or computed without grad."""
        if self.teacher is None:
            if "scores" not in rows:
                raise ValueError("offline soft labels need a 'scores' column (soft_labels.py)")
            return torch.tensor(rows["scores"], dtype=torch.float32, device=self.device)
        self.teacher.to(self.device)
        width = len(rows["candidates"][0])
        scores = torch.empty(len(rows["query"]), width, device=self.device)
        with torch.no_grad():  # a constant for G_θ (no_grad: the result enters the loss)
            for kind, model in self.teacher.by_kind.items():
                index = [i for i, k in enumerate(rows["kind"]) if k == kind]
                if index:
                    scores[index] = model.score_lists(
                        [rows["query"][i] for i in index],
                        [rows["candidates"][i] for i in index],
                        max_first=self.config.train.max_query_length,
                        max_length=pair_length(self.config),
                    ).float()
        return scores

    def step(self, rows: dict[str, list]) -> dict[str, float]:
        train = self.config.train
        queries, candidates = rows["query"], rows["candidates"]
        width = len(candidates[0])
        encoded_queries = self.model.tokenize(queries, train.max_query_length, "max_length")
        encoded_documents = self.model.tokenize(
            [text for row in candidates for text in row], train.max_document_length, "max_length"
        )
        teacher = self.soft_labels(rows)  # (batch, 1 + n)
        output = self.ddp_model(
            query_input_ids=encoded_queries["input_ids"].to(self.device),
            query_attention_mask=encoded_queries["attention_mask"].to(self.device),
            document_input_ids=encoded_documents["input_ids"].to(self.device),
            document_attention_mask=encoded_documents["attention_mask"].to(self.device),
        )
        every = self.model.similarity(output.query_embeddings, output.doc_embeddings)
        scores = own_candidate_scores(every, width)  # (batch, 1 + n)
        weight = self.config.scoder.adversarial_weight
        loss = soft_labeled_loss(scores, teacher, adversarial_weight=weight)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.ddp_model.parameters(), train.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        with torch.no_grad():
            return {
                "loss": float(loss.detach()),
                "loss_adv": float(adversarial_loss(scores, teacher)),
                "loss_distill": float(distillation_loss(scores, teacher)),
                "soft_label_entropy": float(listwise_entropy(teacher).mean()),
                "accuracy": float((scores.argmax(dim=1) == 0).float().mean()),
            }

    def final_metrics(self) -> dict[str, float]:
        if self.rank != 0 or not self.spec.eval_data:
            return {}
        from santa.data.beir import load_beir
        from santa.train.loop import dev_metrics

        dev = load_beir(self.spec.eval_data, self.spec.eval_split or "test")
        return dev_metrics(self.model, dev, self.config)

    def save(self, directory: str) -> None:
        save_training_checkpoint(
            directory, self.model, self.optimizer, self.scheduler, self.state, self.config
        )

    def load(self, directory: str) -> dict[str, Any]:
        return load_training_state(directory, self.model, self.optimizer, self.scheduler)


def own_candidate_scores(every: torch.Tensor, width: int) -> torch.Tensor:
    """Each query's scores against its own candidates: ``(batch, batch * width)`` scores of
    every query against all candidates (query-major, ``width`` each) → ``(batch, width)``."""
    batch = every.shape[0]
    if every.shape[1] != batch * width:
        raise ValueError(f"expected {batch} × {width} candidates, got {every.shape[1]}")
    rows = torch.arange(batch, device=every.device)
    return every.reshape(batch, batch, width)[rows, rows]


def pair_length(config: SantaConfig) -> int:
    """Tokens of a discriminator's ``[x; y]`` input."""
    return config.scoder.max_pair_length or (
        config.train.max_query_length + config.train.max_document_length
    )


def _save_optimizer_state(directory: str, optimizer, scheduler, state: dict[str, Any]) -> None:
    torch.save(optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))
    torch.save(scheduler.state_dict(), os.path.join(directory, SCHEDULER_FILE))
    torch.save({"torch": torch.get_rng_state()}, os.path.join(directory, RNG_FILE))
    with open(os.path.join(directory, STATE_FILE), "w") as handle:
        json.dump(state, handle)


def _load_optimizer_state(directory: str, optimizer, scheduler) -> dict[str, Any]:
    optimizer.load_state_dict(torch.load(os.path.join(directory, OPTIMIZER_FILE)))
    scheduler.load_state_dict(torch.load(os.path.join(directory, SCHEDULER_FILE)))
    torch.set_rng_state(torch.load(os.path.join(directory, RNG_FILE))["torch"])
    with open(os.path.join(directory, STATE_FILE)) as handle:
        return json.load(handle)


def read_listwise_dataset(uri: str):
    """The listwise Parquet rows under ``uri/data`` as a Ray Dataset (the training input)."""
    import ray.data

    from santa.train.data import DATA_TASK_CPUS

    root = storage.join(uri, "data")
    if not storage.list_files(root, suffixes=(".parquet",)):
        raise FileNotFoundError(f"no listwise examples under {root}")
    context = ray.data.DataContext.get_current()
    use_v2, context.use_datasource_v2 = context.use_datasource_v2, False
    try:  # see santa.train.data: the V2 reader's listing task asks a whole CPU
        return ray.data.read_parquet(root, num_cpus=DATA_TASK_CPUS)
    finally:
        context.use_datasource_v2 = use_v2


def fit_stage(
    spec: StageSpec,
    *,
    data: str,
    storage_path: str,
    name: str,
    cpus_per_worker: float = 0.0,
    max_failures: int = 1,
):
    """Run (or resume) one stage on the current Ray cluster; returns the ``Result``."""
    import ray.data
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train import LoggingConfig as TrainLoggingConfig
    from ray.train.torch import TorchTrainer

    from santa.runtime.ray_utils import ray_log_level
    from santa.train.trainer import worker_cpus

    train = spec.config.train
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    cpus = worker_cpus(cpus_per_worker, train.num_workers)
    payload = asdict(spec) | {"threads": max(1, int(cpus))}
    trainer = TorchTrainer(
        stage_loop_per_worker,
        train_loop_config=payload,
        scaling_config=ScalingConfig(
            num_workers=train.num_workers,
            use_gpu=train.use_gpu,
            resources_per_worker={"CPU": cpus, **({"GPU": 1} if train.use_gpu else {})},
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage.absolute(storage_path),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            failure_config=FailureConfig(max_failures=max_failures),
            logging_config=TrainLoggingConfig(log_level=ray_log_level()),
        ),
        datasets={"train": read_listwise_dataset(data)},
    )
    return trainer.fit()
