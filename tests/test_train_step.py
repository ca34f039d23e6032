"""The worker loop without Ray (LocalSession): its step reads nothing back from the device
but once per logged window, regional compilation trains as eager does, masks reach the
model prepared, and batches reach a GPU from pinned memory without waiting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.common import counting_tensor_reads
from santa.config import ModelConfig
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.train.compiling import compile_for_training, repeated_blocks
from santa.train.epochs import EpochReader, pin_batch
from santa.train.loop import WorkerTrainer, read_means, run_worker
from santa.train.loop_config import LoopConfig, training_data
from santa.train.order import EpochPlan
from santa.train.rows import open_rows
from santa.train.session import LocalSession
from tests.training import stdlib_pair_rows, tiny_config, write_pairs


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> dict:
    """Pairs of real functions and a tiny T5 saved as the initial model."""
    work = tmp_path_factory.mktemp("local-run")
    rows = stdlib_pair_rows()[:64]
    config = tiny_config()
    data = write_pairs(work / "pairs", rows)
    texts = [row["query"] for row in rows] + [row["document"] for row in rows]
    tokenizer = train_tokenizer(texts, vocab_size=config.model.tiny_vocab_size)
    model = DualEncoder.build_tiny(config.model, tokenizer, seed=0)
    model.save_pretrained(str(work / "init"), santa_config=config)
    return {"init": str(work / "init"), "data": data, "work": work}


def loop_config(tiny_run, config, **fields) -> LoopConfig:
    """The loop over the run's pairs, its row files in the run's own cache folder."""
    return LoopConfig(
        santa=config,
        init_model=tiny_run["init"],
        data_uri=tiny_run["data"],
        row_cache=str(tiny_run["work"] / "rows"),
        **fields,
    )


def local_trainer(tiny_run, steps: int, **train) -> tuple[WorkerTrainer, LocalSession]:
    config = tiny_config(**train)
    session = LocalSession(device="cuda" if train.get("use_gpu") else "cpu")
    return WorkerTrainer(loop_config(tiny_run, config, stop_at_step=steps), session), session


def test_a_step_reads_nothing_back_and_a_window_reads_once(tiny_run) -> None:
    """The losses are summed where they are and read once per logged window: no read of a
    tensor inside a step, and at most one per step over the run (the target on a GPU,
    where each read stops the host until the device catches up)."""
    trainer, session = local_trainer(tiny_run, steps=12, log_every=4, max_steps=12)
    in_steps: list[int] = []
    step = trainer.train_step

    def counted_step(batch):
        before = sum(reads.values())
        values = step(batch)
        in_steps.append(sum(reads.values()) - before)
        return values

    trainer.train_step = counted_step
    with counting_tensor_reads() as reads:
        run_worker(trainer)
    assert len(in_steps) == 12
    assert in_steps == [0] * 12, f"reads inside steps: {in_steps} ({dict(reads)})"
    assert sum(reads.values()) <= 12, dict(reads)
    assert [report["step"] for report in session.reports] == [4, 8, 12]
    assert all(np.isfinite(report["loss"]) for report in session.reports)
    # the mean of the window is the mean of the steps' losses
    assert session.reports[-1]["loss"] == pytest.approx(
        session.reports[-1]["loss_sda"] + session.reports[-1]["loss_mep"], rel=1e-5
    )


def test_read_means_reads_each_device_once_and_averages() -> None:
    sums = {"loss": torch.tensor(6.0), "loss_sda": torch.tensor([4.0]), "accuracy": 1.5}
    with counting_tensor_reads() as reads:
        means = read_means(sums, 3)
    assert means == {"loss": 2.0, "loss_sda": pytest.approx(4 / 3), "accuracy": 0.5}
    assert sum(reads.values()) == 1


def test_regional_compilation_trains_as_eager(tiny_run) -> None:
    """Each T5 block compiled (aot_eager: Dynamo and AOTAutograd's graphs, no C++) gives the
    losses of eager steps; the graphs are compiled in the first window and never again."""
    eager, eager_session = local_trainer(tiny_run, steps=3, log_every=1)
    run_worker(eager)
    compiled, compiled_session = local_trainer(
        tiny_run,
        steps=3,
        log_every=1,
        compile="always",
        compile_backend="aot_eager",
        compile_scope="blocks",
    )
    assert compiled.forward_model is compiled.ddp_model  # the blocks, not the model
    run_worker(compiled)
    for plain, regional in zip(eager_session.reports, compiled_session.reports, strict=True):
        assert regional["loss"] == pytest.approx(plain["loss"], rel=1e-5)
        assert regional["loss_mep"] == pytest.approx(plain["loss_mep"], rel=1e-5)
    graphs = [report["compile_graphs"] for report in compiled_session.reports]
    assert graphs[0] > 0 and graphs == [graphs[0]] * 3


def test_repeated_blocks_are_t5s_blocks_and_a_model_without_them_compiles_whole() -> None:
    tokenizer = train_tokenizer(["def f(x): return x", "Open a file."] * 20, vocab_size=400)
    model = DualEncoder.build_tiny(ModelConfig(tiny_d_model=16, tiny_d_ff=32), tokenizer)
    blocks = repeated_blocks(model)
    stacks = [model.backbone.encoder.block, model.backbone.decoder.block]
    assert blocks == [block for stack in stacks for block in stack]
    plain = torch.nn.Linear(2, 2)
    compiled = compile_for_training(plain, plain, scope="blocks", backend="eager")
    assert compiled is not plain  # no blocks: the model itself is compiled
    with pytest.raises(ValueError, match="compile scope"):
        compile_for_training(plain, plain, scope="layers", backend="eager")


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_prepared_padding_masks_embed_as_the_2d_mask(implementation: str) -> None:
    """The 4D mask the model prepares (so that transformers need not read the 2D one)
    gives the embeddings and MEP loss of the 2D mask, padding included."""
    tokenizer = train_tokenizer(["def f(x): return x", "Open a file."] * 20, vocab_size=400)
    model = DualEncoder.build_tiny(ModelConfig(tiny_d_model=16, tiny_d_ff=32), tokenizer)
    model.backbone.config._attn_implementation = implementation
    model.eval()
    vocab = model.backbone.config.vocab_size
    ids = torch.randint(3, vocab, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, 6:] = 0
    mask[2, 3:] = 0
    labels = torch.randint(3, vocab, (3, 5))
    prepared = model.padding_mask(mask)
    assert prepared.dim() == 4
    with torch.no_grad():
        embedded, mep = model.encode_with_mep(ids, mask, labels)
        with_2d = model.padding_mask
        model.padding_mask = lambda mask: mask  # the 2D mask, read by transformers
        reference, reference_mep = model.encode_with_mep(ids, mask, labels)
        model.padding_mask = with_2d
    torch.testing.assert_close(embedded, reference)
    torch.testing.assert_close(mep, reference_mep)


def test_a_reader_asked_to_pin_without_cuda_hands_numpy_batches(tiny_run) -> None:
    config = tiny_config()
    data = training_data(loop_config(tiny_run, config))
    rows = open_rows(data.source, str(tiny_run["work"] / "rows"))
    plan = EpochPlan(rows=rows.num_rows, global_batch=8, seed=0)
    reader = EpochReader(rows, plan, data.collate, pin_memory=True)
    try:
        batch = next(iter(reader.epoch()))
    finally:
        reader.close()
    if torch.cuda.is_available():
        assert batch["query_input_ids"].is_pinned()
    else:
        assert isinstance(batch["query_input_ids"], np.ndarray)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_pinned_batches_keep_ids_and_pin_token_ids() -> None:
    batch = pin_batch(
        {"query_input_ids": np.ones((2, 3), np.int32), "doc_id": np.array(["a", "b"])}
    )
    assert batch["query_input_ids"].is_pinned() and batch["query_input_ids"].dtype == torch.long
    assert list(batch["doc_id"]) == ["a", "b"]


@cuda
def test_gpu_steps_after_the_first_never_wait_for_the_device(tiny_run) -> None:
    """Steps 2..k of the loop on a GPU under ``set_sync_debug_mode("error")``: any
    host-device sync inside a step raises."""
    trainer, session = local_trainer(
        tiny_run, steps=6, log_every=6, use_gpu=True, compile="never", grad_clip=1.0
    )
    assert trainer.device.type == "cuda"
    step = trainer.train_step
    calls = []

    def strict_step(batch):
        calls.append(1)
        if len(calls) == 1:
            return step(batch)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    trainer.train_step = strict_step
    run_worker(trainer)
    assert len(calls) == 6 and session.reports[-1]["step"] == 6


def test_local_session_keeps_checkpoints_under_its_root_and_resumes_from_them(
    tiny_run, tmp_path: Path
) -> None:
    """Stopped at step 4 and run again over the same root, the loop resumes from its newest
    checkpoint and repeats the uninterrupted run's losses exactly."""
    config = tiny_config(log_every=2, checkpoint_every=2, max_steps=8)
    whole = LocalSession(checkpoint_root=str(tmp_path / "whole"))
    run_worker(WorkerTrainer(loop_config(tiny_run, config), whole))
    session = LocalSession(checkpoint_root=str(tmp_path / "cut"))
    run_worker(WorkerTrainer(loop_config(tiny_run, config, stop_at_step=4), session))
    kept = sorted(path.name for path in (tmp_path / "cut").iterdir())
    assert kept == ["checkpoint_000002", "checkpoint_000004"]
    assert DualEncoder.from_pretrained(str(tmp_path / "cut" / kept[-1] / "model")) is not None
    resumed = LocalSession(checkpoint_root=str(tmp_path / "cut"))
    trainer = WorkerTrainer(loop_config(tiny_run, config), resumed)
    assert trainer.state["step"] == 4 and trainer.state["resumed_at"] == [4]
    run_worker(trainer)
    assert [r["loss"] for r in resumed.reports] == [r["loss"] for r in whole.reports[2:]]


def bench_args(steps: int):
    """``gpu_ray.py``'s arguments for a few tiny CPU steps in windows of 2."""
    import argparse

    return argparse.Namespace(
        device="cpu",
        steps=steps,
        window=2,
        threads=1,
        overrides=["train.global_batch_size=8", "train.max_document_length=96"],
    )


def test_the_benches_run_the_worker_loop_without_ray(tiny_run) -> None:
    """``gpu_ray.py``'s ``local`` system (what ``step_overhead.py`` compares with the plain
    step and Ray) trains the pairs through the real loop and reports its windows."""
    from bench.perf import gpu_ray, step_overhead

    row = gpu_ray.run_local(bench_args(6), tiny_run["init"], tiny_run["data"])
    assert row["system"] == "local" and len(row["windows_pairs_per_s"]) == 3
    assert row["phases_s"]["startup_first_step_s"] > 0 and row["steady_pairs_per_s"] > 0
    figures = step_overhead.step_ms([1.0, 100.0, 50.0, 200.0], batch=100)
    assert figures == {"ms_per_step_median": 1000.0, "ms_per_step_p90": 2000.0}


def test_the_plain_loop_with_a_gate_steps_only_after_it_and_leaves_the_wait_out(
    tiny_run, monkeypatch
) -> None:
    """``gpu_ray.py --overlap``: the plain loop's untimed first step (its compile) comes
    before the gate, every timed step after it, and the wait is not in its seconds."""
    import time

    import torch

    from bench.perf import gpu_ray

    seen: list[int] = []
    original = torch.optim.AdamW.step

    def counting(self, *a, **k):  # the optimizer steps taken so far, seen by the gate
        seen.append(1)
        return original(self, *a, **k)

    at_gate: list[int] = []

    def gate() -> None:
        at_gate.append(len(seen))
        time.sleep(3.0)

    monkeypatch.setattr(torch.optim.AdamW, "step", counting)
    started = time.perf_counter()
    row = gpu_ray.run_plain(bench_args(4), tiny_run["init"], tiny_run["data"], gate=gate)
    wall_s = time.perf_counter() - started
    assert at_gate == [1] and len(seen) == 5  # one untimed step, then the 4 timed ones
    assert row["waited_for_ray_s"] >= 3.0
    assert 0 < row["stage_s"] <= wall_s - row["waited_for_ray_s"]
    assert len(row["windows_pairs_per_s"]) == 2


def test_the_memory_bench_names_the_steps_working_set(tmp_path: Path) -> None:
    """``bench/perf/memory.py`` on the tiny recipe: the gradients are the parameters' size,
    AdamW's state twice that, the saved activations are counted and grouped by shape."""
    from bench.perf import memory

    result = memory.main(
        ["--recipe", "tiny", "--batch", "8", "--steps", "2", "--pairs", "64", "--threads", "1"]
        + ["--workdir", str(tmp_path), "--output", str(tmp_path / "memory.json")]
    )
    phases = {row["phase"]: row for row in result["phases"]}
    parameters_mb = phases["model, optimizer, row file"]["named_mb"]
    first = phases["first step"]
    assert parameters_mb == pytest.approx(result["parameters"] * 4 / memory.MB, rel=0.01)
    assert first["gradients_mb"] == pytest.approx(parameters_mb, rel=0.01)
    assert first["optimizer_state_mb"] == pytest.approx(2 * parameters_mb, rel=0.01)
    assert first["activations_saved_mb"] > 0
    by_shape = result["saved_by_shape"]
    assert by_shape and sum(row["mb"] for row in by_shape) <= first["activations_saved_mb"] + 1e-6
    assert first["peak_mb"] >= phases["model, optimizer, row file"]["peak_mb"]
    assert (tmp_path / "memory.json").exists()


def test_the_learning_rate_warms_up_and_decays_as_hugging_faces_schedule() -> None:
    """SANTA's released Trainer's schedule: 0 at the first step, the peak after the warm-up,
    then linearly to 0 at the last step."""
    from santa.train.state import linear_warmup_schedule

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = linear_warmup_schedule(optimizer, warmup_steps=4, total_steps=10)
    rates = []
    for _ in range(10):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
