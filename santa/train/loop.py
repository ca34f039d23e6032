"""The one per-worker training loop run by Ray Train's ``TorchTrainer`` (Train V2).

Plain PyTorch: where it runs is a *session* (:mod:`santa.train.session`): under Ray Train,
``prepare_model``, the dataset shard, the checkpoint API and ``ray.train.report``; in a
plain process (benchmarks, tests), the same loop without Ray. What is trained is an
*objective* (:class:`~santa.train.objective.Objective`): SANTA's SDA/DR + MEP
(:mod:`santa.train.santa_objective`) or SCodeR's discriminators and soft-labeled dual encoder
(:mod:`santa.scoder.objectives`). An objective builds its model, turns a batch into losses, and saves and loads its model;
everything else is the loop's, and so every objective's: the optimizer (fused AdamW on CUDA)
and the warm-up schedule, DDP, ``torch.compile`` (the whole model, or each transformer
block), bf16 autocast, exact resume with fallback past a broken checkpoint, metrics
(``metrics.jsonl``, TensorBoard, progress lines; read from the device once per logged
window, never inside a step), dev evaluation and checkpoints.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import torch

from santa.files import storage
from santa.files.layout import CacheLayout
from santa.jobs.errors import root_cause
from santa.method.distributed import (
    all_gather_with_grad,
    identity_gather,
    mean_over_ranks,
    share_of_global_mean,
)
from santa.train.compile_cache import (
    cache_key,
    compile_stats,
    load_compile_cache,
    save_compile_cache,
    shape_key,
)
from santa.train.compiling import compile_for_training
from santa.train.epochs import BackgroundRows, EpochReader
from santa.train.loop_config import LoopConfig, training_data
from santa.train.metrics import DevEvaluation, MetricsRecord
from santa.train.objective import Objective, StepContext, objective_class
from santa.train.optim import build_optimizer
from santa.train.order import EpochPlan
from santa.train.precision import MasterWeights, use_bf16_position_bias, use_fused_rms_norm
from santa.train.resume import load_newest_loadable
from santa.train.session import Session
from santa.train.sharding import load_sharded_checkpoint, save_sharded_checkpoint, shard_model
from santa.train.state import (
    linear_warmup_schedule,
    load_loop_state,
    local_checkpoint,
    save_loop_state,
    seed_everything,
    total_steps,
)
from santa.train.tokens import open_token_cache

logger = logging.getLogger(__name__)


def train_loop_per_worker(
    loop_config: dict[str, Any],
    rows: BackgroundRows | None = None,
    entered_at: float | None = None,
) -> None:
    """Ray Train entry point: build, resume, train, report, checkpoint.

    ``rows``: the node's row file, already being opened (``santa.train.entry``);
    ``entered_at``: ``time.time()`` when the worker's entry started.
    """
    from santa.train.session import RaySession

    run_worker(
        WorkerTrainer(
            LoopConfig.from_dict(loop_config), RaySession(), rows=rows, entered_at=entered_at
        )
    )


def run_worker(trainer: WorkerTrainer) -> None:
    """Train to the stop step, then close; on a failure close too, keeping its error."""
    try:
        trainer.train()
    except BaseException as error:
        # The first error is the one to report: closing (the TensorBoard upload to an S3
        # endpoint that just went silent) must not replace it, nor delay it: after an
        # endpoint that did not answer, nothing more is uploaded (each try would wait the
        # whole timeouts again before the error reaches Ray Train).
        try:
            trainer.close(publish=storage.unreachable(root_cause(error)) is None)
        except Exception:  # noqa: BLE001 - cleanup after another error
            logger.warning("closing after a failure failed too", exc_info=True)
        raise
    trainer.close()


def build_initial_model(loop: LoopConfig, session: Session) -> None:
    """The tiny recipe's new model (``loop.build_init_model``): built by rank 0 unless a
    worker group before this one built it, while the other ranks wait for it."""
    if session.rank == 0 and not storage.exists(storage.join(loop.init_model, "config.json")):
        from santa.train.initial_model import build_tiny_model

        build_tiny_model(loop.santa, loop.data_uri, CacheLayout(loop.cache_root), loop.init_model)
    session.barrier()


class WorkerTrainer:
    """One worker's part of a run: setup and resume, steps, reports with checkpoints."""

    def __init__(
        self,
        loop: LoopConfig,
        session: Session,
        rows: BackgroundRows | None = None,
        entered_at: float | None = None,
    ) -> None:
        config = self.config = loop.santa
        self.loop = loop
        self.session = session
        # What happened before the first step, in seconds (the run's fixed cost): the
        # driver's phases, then this worker's, reported with every window.
        self.startup = dict(loop.startup)
        imported_at = time.time()
        self.entered_at = entered_at
        if entered_at is not None and loop.submitted_at:
            self.startup["startup_worker_start_s"] = max(0.0, entered_at - loop.submitted_at)
            self.startup["startup_imports_s"] = imported_at - entered_at
        if loop.build_init_model:
            build_initial_model(loop, session)
            built = time.time() - imported_at
            self.startup["startup_initial_model_s"] = (
                self.startup.get("startup_initial_model_s", 0) + built
            )
            imported_at = time.time()
        # The training rows: opened (built once per node) in the background from here on,
        # unless the entry point started that already.
        self.data = training_data(loop)
        self.rows = rows or BackgroundRows(self.data.source, loop.row_cache)
        self.objective = objective_class(loop.objective)(loop)
        if os.environ.get("SANTA_QUIET"):
            _quiet_train_reports()
        self.rank, self.world_size = session.rank, session.world_size
        seed_everything(config.train.seed)  # same init everywhere; DDP also broadcasts it
        torch.set_num_threads(loop.torch_threads)

        model = self.model = self.objective.build_model()
        self.use_gpu = config.train.use_gpu and torch.cuda.is_available()
        # The precision leads (santa.train.precision): bf16 compute weights with an fp32
        # master (the optimizer's and the checkpoints'), fused RMS norms, bf16 position bias.
        self.bf16 = self.use_gpu and config.train.bf16
        if config.train.fused_rms_norm:
            use_fused_rms_norm(model)
        if self.bf16 and config.train.bf16_position_bias:
            use_bf16_position_bias(model)
        self.master = None
        compute_model = model
        if self.bf16 and config.train.bf16_weights:
            model.to(session.device())
            self.master = MasterWeights(model)
            compute_model = self.master.compute
        # FSDP shards the model before the optimizer sees its parameters (santa.train.sharding).
        self.sharded = config.train.strategy == "fsdp"
        if self.sharded:
            device = session.device() if self.use_gpu else torch.device("cpu")
            shard_model(model, device, bf16=self.bf16)
        self.startup["startup_model_s"] = time.time() - imported_at
        self.optimizer = build_optimizer(
            [p for p in model.parameters() if p.requires_grad],  # LoRA: the adapters
            config.train,
            fused=self.use_gpu,  # one kernel for all parameters on CUDA
            learning_rate=self.objective.learning_rate(),
        )
        self.plan = self._epoch_plan()  # waits for the row file
        # The node's token cache beside it: rows tokenized before are read, not tokenized.
        self.tokens = (
            open_token_cache(self.row_file, self.data.collate, loop.row_cache)
            if config.train.token_cache
            else None
        )
        self.steps = total_steps(config, self.plan.batches_per_epoch)
        warmup = int(math.ceil(config.train.warmup_ratio * self.steps))
        self.scheduler = linear_warmup_schedule(self.optimizer, warmup, self.steps)
        resumed_at = time.time()
        self.state = self._resume()
        if self.master is not None:
            self.master.weights_to_compute()  # the resumed master, rounded
        self.startup["startup_resume_s"] = time.time() - resumed_at
        self._announce_world_size()
        # An interruption on purpose (a preemptible run's budget, or a test of resuming):
        # train up to this step, checkpoint, and return; the schedule still spans `steps`.
        self.stop_at = min(self.steps, loop.stop_at_step or self.steps)

        wrapped_at = time.time()
        self.ddp_model = (
            model  # sharded already, and on its device
            if self.sharded
            else session.prepare_model(
                compute_model,
                use_gpu=self.use_gpu,
                find_unused_parameters=self.objective.find_unused_parameters(model),
            )
        )
        self.device = next(self.ddp_model.parameters()).device
        self.startup["startup_ddp_s"] = time.time() - wrapped_at
        # The forward the steps run: compiled (kernels fused, fewer launches), or DDP's own.
        # Checkpoints save `self.model`, whose state_dict keys stay those of the backbone.
        self.forward_model = self.ddp_model
        compile_mode = config.train.compile
        self.compiles = compile_mode == "always" or (compile_mode == "gpu" and self.use_gpu)
        self.compile_cache_uri = ""
        if self.compiles:
            if config.train.compile_cache and loop.cache_root:
                folder = CacheLayout(loop.cache_root).compile(
                    cache_key(config, device=self.device.type)
                )
                self.compile_cache_uri = storage.join(
                    folder, shape_key(config, objective=loop.objective)
                )
                self.startup["compile_cache_loaded"] = float(load_compile_cache(folder))
            self.forward_model = compile_for_training(
                compute_model,
                self.ddp_model,
                scope=config.train.compile_scope,
                backend=config.train.compile_backend,
            )
        self.compile_cache_saved = False
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else nullcontext()
        self.gather = all_gather_with_grad if self.world_size > 1 else identity_gather
        # A mean over a number of items that varies by rank (MEP's target tokens) weighs
        # each rank's part so that DDP's average is the global batch's mean.
        self.global_share = share_of_global_mean
        # From the checkpoint's epoch and global batch on (a fresh run: the first), this
        # worker's slice of each global batch of the epoch's global order.
        self.reader = EpochReader(
            self.row_file,
            self.plan,
            self.data.collate,
            rank=self.rank,
            world_size=self.world_size,
            start_epoch=self.state["epoch"],
            skip=self.state["batches_in_epoch"],
            threads=config.train.input_threads,
            pin_memory=self.use_gpu,
            tokens=self.tokens,
        )
        # The parts the loop composes (santa.train.metrics): the metrics' record and the
        # dev evaluation.
        self.record = MetricsRecord(loop, self.rank)
        # Under FSDP no rank holds the whole model to evaluate: the stage's checkpoints are
        # evaluated after training (ray_jobs.evaluate, the pipeline).
        evaluates = self.objective.evaluates() and not self.sharded
        if self.sharded and loop.eval_data and self.rank == 0:
            logger.warning("train.strategy=fsdp: no dev metrics during training")
        self.dev = DevEvaluation(loop, self.rank, evaluates, self.steps)
        # What the objective's step reads of the loop (santa.train.objective.StepContext).
        self.context = StepContext(
            model=self.model,
            forward_model=self.forward_model,
            ddp_model=self.ddp_model,
            device=self.device,
            gather=self.gather,
            global_share=self.global_share,
            autocast=self.autocast,
            state=self.state,
            rank=self.rank,
            world_size=self.world_size,
        )
        self.objective.setup(self.context)
        self._reset_window()

    def _epoch_plan(self) -> EpochPlan:
        """The epochs' global order over the node's row file (waited for here: the model
        was built meanwhile)."""
        waited = time.time()
        self.row_file = self.rows.result()
        self.startup["startup_rows_wait_s"] = time.time() - waited
        self.startup["startup_rows_build_s"] = self.row_file.build_s
        train = self.config.train
        groups = self.row_file.groups if self.data.units == "groups" else None
        return EpochPlan(
            rows=self.row_file.num_rows if groups is None else len(groups[0]) - 1,
            global_batch=train.global_batch_size,
            seed=train.seed,
            shuffle=train.shuffle,
            buffer=train.shuffle_buffer,
            drop_last=train.drop_last,
            groups=groups,
        )

    def _resume(self) -> dict[str, Any]:
        """The loop state: fresh, or restored with the weights from Ray's checkpoint."""
        state: dict[str, Any] = {"step": 0, "epoch": 0, "batches_in_epoch": 0, "resumed_at": []}
        checkpoint = self.session.checkpoint()
        if checkpoint is not None:

            def load(candidate) -> dict[str, Any]:
                with local_checkpoint(candidate) as directory:
                    if self.sharded:
                        return load_sharded_checkpoint(directory, self)
                    self.objective.load_model(directory, self.model)
                    return load_loop_state(directory, self.optimizer, self.scheduler)

            candidates = self.session.resume_candidates(list(self.loop.registered_checkpoints))
            state, _ = load_newest_loadable(candidates, load, announce=self.rank == 0)
            state["resumed_at"] = [*state.get("resumed_at", []), state["step"]]
            logger.info("rank %d resumed at step %d", self.rank, state["step"])
        return state

    def _announce_world_size(self) -> None:
        """An elastic run that resumes with another number of workers logs its batch split
        (rank 0; the resize's ``santa:`` line is Ray Train's controller's, which knows why:
        ``santa.train.recovery``)."""
        before = self.state.get("world_size")
        self.state["world_size"] = self.world_size
        if self.rank != 0 or before is None or before == self.world_size:
            return
        train = self.config.train
        logger.info(
            "%d worker(s) from step %d (was %d); the global batch stays %d: %d pairs per worker",
            self.world_size,
            self.state["step"],
            before,
            train.global_batch_size,
            train.per_worker_batch_size(self.world_size),
        )

    def _reset_window(self) -> None:
        # Sums of each step's values since the last report: tensors stay on their device.
        self.window_sums: dict[str, torch.Tensor | float] = {}
        self.window_steps = 0
        self.window_host_s = 0.0
        self.window_started = time.perf_counter()

    def _batches(self) -> Iterator[Any]:
        """This epoch's batches of the shard, past those trained before a resume (read
        ahead by :class:`~santa.train.epochs.EpochReader`, across epoch boundaries)."""
        return self.reader.epoch()

    def train(self) -> None:
        """Step through the shard, epoch after epoch, up to the stop step."""
        # Whole-run throughput: every second from here on counts (data, evaluation,
        # checkpoints), unlike the per-window `pairs_per_s`.
        self.run_started, self.run_first_step = time.perf_counter(), self.state["step"]
        self.loop_started_at = time.time()
        while self.state["step"] < self.stop_at:
            for batch in self._batches():
                self.train_step(batch)
                if self.report():
                    return
            self.state["epoch"] += 1
            self.state["batches_in_epoch"] = 0

    def train_step(self, batch: Any) -> dict[str, torch.Tensor | float]:
        """One optimizer step on a batch; returns its losses and metrics, detached.

        Nothing here waits for the device: the losses are added up where they are (on the
        GPU) and read once per logged window (:meth:`_window_metrics`), so the host queues
        the next step while the device runs this one.
        """
        train = self.config.train
        started = time.perf_counter()
        first = self.state["step"] == self.run_first_step
        if first:
            self._note_first_batch()
        self.model.train()
        self.ddp_model.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses = self.objective.forward_backward(self.context, batch)
        if self.master is not None:
            self.master.gradients_to_master()
        if train.grad_clip:
            parameters = self.model if self.master is not None else self.ddp_model
            torch.nn.utils.clip_grad_norm_(parameters.parameters(), train.grad_clip)
        self.optimizer.step()
        if self.master is not None:
            self.master.weights_to_compute()
        self.scheduler.step()
        self.state["step"] += 1
        self.state["batches_in_epoch"] += 1
        self.objective.after_step(self.context)
        values = {
            key: value.detach() if isinstance(value, torch.Tensor) else float(value)
            for key, value in losses.items()
        }
        for key, value in values.items():
            self.window_sums[key] = self.window_sums.get(key, 0.0) + value
        self.window_steps += 1
        self.window_host_s += time.perf_counter() - started
        if first:
            self._after_first_step(time.perf_counter() - started)
        return values

    def _note_first_batch(self) -> None:
        """The data's share of the start (the first batch ready, and how long the loop
        waited for it after the model was built) and the whole start-up."""
        now, ready = time.time(), self.reader.first_batch_at
        if ready is not None:
            # The data's wait before step 1: for the row file (after the model was built),
            # then for the first batch (after the loop started).
            self.startup["startup_first_batch_wait_s"] = self.startup["startup_rows_wait_s"] + max(
                0.0, ready - self.loop_started_at
            )
            self.startup["startup_rows_read_at_first_step"] = float(self.reader.rows_read)
            if self.entered_at is not None:
                self.startup["startup_data_ready_s"] = max(0.0, ready - self.entered_at)
        if self.loop.submitted_at:
            driver = sum(v for k, v in self.loop.startup.items() if k.startswith("startup_"))
            self.startup["startup_total_s"] = driver + max(0.0, now - self.loop.submitted_at)

    def _after_first_step(self, seconds: float) -> None:
        """Record the first step (compile included) and keep what the compile made."""
        self.startup["startup_first_step_s"] = seconds
        if self.compiles:
            self.startup.update(
                {f"startup_{k}" if k == "compile_s" else k: v for k, v in compile_stats().items()}
            )
            self._save_compile_cache()

    def _save_compile_cache(self) -> None:
        """Rank 0: keep this run's compiled graphs for the next stage or run of its shape."""
        if self.rank == 0 and self.compile_cache_uri and not self.compile_cache_saved:
            self.compile_cache_saved = save_compile_cache(self.compile_cache_uri)

    def report(self) -> bool:
        """Log, evaluate, report and checkpoint when the step calls for it; True at the end."""
        train, step = self.config.train, self.state["step"]
        last = step >= self.stop_at
        checkpoint_now = last or bool(train.checkpoint_every and step % train.checkpoint_every == 0)
        if not (last or checkpoint_now or step % train.log_every == 0):
            return False
        metrics = self._window_metrics()
        metrics.update(self.startup)
        if self.compiles:
            metrics["compile_graphs"] = compile_stats()["compile_graphs"]
        metrics.update(self.objective.report_metrics(self.context))
        run_s = time.perf_counter() - self.run_started
        pairs = train.global_batch_size * (step - self.run_first_step)
        metrics["run_pairs_per_s"] = pairs / run_s if run_s > 0 else 0.0
        metrics.update(self.dev.metrics(self.model, step, last))
        self._reset_window()
        if self.record.keeps:
            line = self.objective.progress_line(metrics, self.steps)
            self.record.keep(metrics, step, line, publish=bool(checkpoint_now))
        self._report(metrics, checkpoint_now)
        return last

    def _window_metrics(self) -> dict[str, float]:
        """Means over the steps since the last report (the window's one read of the device);
        throughput includes waiting for data."""
        import resource

        steps = max(1, self.window_steps)
        # The global batch's means (every rank reports at the same steps), read once.
        over_ranks = mean_over_ranks if self.world_size > 1 else None
        means = read_means(self.window_sums, steps, over_ranks)  # waits for the last step
        elapsed = time.perf_counter() - self.window_started
        metrics: dict[str, float] = {"step": self.state["step"], "epoch": self.state["epoch"]}
        metrics.update(means)
        metrics["learning_rate"] = float(self.scheduler.get_last_lr()[0])
        # A step's wall time in the window (waits for data and the device included), and
        # the host's share of it: what queueing the step's work took (on a GPU the device
        # runs behind the host; on a CPU that is the step itself).
        metrics["step_time_s"] = elapsed / steps
        metrics["step_host_s"] = self.window_host_s / steps
        batch = self.config.train.global_batch_size
        metrics["pairs_per_s"] = batch * steps / elapsed if elapsed else 0.0
        metrics["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if self.tokens is not None:  # this worker's rows so far: tokenized, or read cached
            metrics["token_cache_misses"] = float(self.tokens.rows_collated)
            metrics["token_cache_hits"] = float(self.tokens.rows_cached)
        return metrics

    def _report(self, metrics: dict[str, float], with_checkpoint: bool) -> None:
        """The session's report on every rank (a barrier); rank 0 attaches the checkpoint."""
        if not with_checkpoint:
            self.session.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="santa-ckpt-") as directory:
            checkpoint_dir = None
            if self.sharded:  # every rank writes its shards; the folders merged are the checkpoint
                save_sharded_checkpoint(directory, self)
                checkpoint_dir = directory
            elif self.rank == 0:
                self.objective.save_model(directory, self.model)
                save_loop_state(directory, self.optimizer, self.scheduler, self.state)
                checkpoint_dir = directory
            self.session.report(metrics, checkpoint_dir)

    def close(self, publish: bool = True) -> None:
        """Close the reader, the metrics' record (publishing its last TensorBoard events
        unless ``publish`` is false: the storage just did not answer), then the objective."""
        self.reader.close()
        if self.tokens is not None:
            self.tokens.close()
        try:
            self.record.close(publish)
        finally:
            self.objective.close()


def read_means(
    sums: dict[str, torch.Tensor | float], steps: int, over_ranks=None
) -> dict[str, float]:
    """``sums`` divided by ``steps``, as floats: the tensors of one device are read in one
    transfer (one host-device sync a window, not one per value and step), averaged over the
    ranks first by ``over_ranks`` (:func:`santa.method.distributed.mean_over_ranks`) when
    given."""
    means = {
        key: value / steps for key, value in sums.items() if not isinstance(value, torch.Tensor)
    }
    by_device: dict[torch.device, list[str]] = {}
    for key, value in sums.items():
        if isinstance(value, torch.Tensor):
            by_device.setdefault(value.device, []).append(key)
    for keys in by_device.values():
        stacked = torch.stack([sums[key].float().reshape(()) for key in keys])  # (keys,)
        if over_ranks is not None:
            stacked = over_ranks(stacked)
        for key, value in zip(keys, (stacked / steps).tolist(), strict=True):
            means[key] = float(value)
    return means


def _quiet_train_reports() -> None:
    """Ray Train logs each report at INFO under a logger named after its file (so its own
    log-level setting misses it): in quiet mode it stays in Ray's log files."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


__all__ = [
    "Objective",
    "WorkerTrainer",
    "objective_class",
    "read_means",
    "run_worker",
    "train_loop_per_worker",
]
