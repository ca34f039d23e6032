"""The same model on 1 or 2 workers (the loop on gloo processes, without Ray): the same
rows in every global batch for two epochs, the same losses step by step (MEP the global
batch's token mean), and a run resized from 2 workers to 1 mid-epoch that goes on with the
next global batch, training no row twice and skipping none."""

from __future__ import annotations

from pathlib import Path

import pytest

from santa.config.recipes import get_recipe
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.train.loop_config import LoopConfig
from tests.training import stdlib_pair_rows, train_on_ranks, train_runs_on_ranks, write_pairs

STEPS = 16  # two epochs of 64 pairs at a global batch of 8


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("ranks")
    rows = stdlib_pair_rows()[:64]
    config = get_recipe("tiny-ci").with_overrides(
        [
            "model.tiny_dropout=0",
            f"train.max_steps={STEPS}",
            "train.log_every=1",
            "train.checkpoint_every=5",
            "train.global_batch_size=8",
        ]
    )
    data = write_pairs(work / "pairs", rows)
    tokenizer = train_tokenizer(
        [r["query"] for r in rows] + [r["document"] for r in rows],
        vocab_size=config.model.tiny_vocab_size,
    )
    DualEncoder.build_tiny(config.model, tokenizer, seed=0).save_pretrained(
        str(work / "init"), santa_config=config
    )
    return {"config": config, "data": data, "init": str(work / "init"), "work": work}


def loop_of(run_inputs: dict, stop_at_step: int = 0, *overrides: str) -> LoopConfig:
    return LoopConfig(
        santa=run_inputs["config"].with_overrides(list(overrides)),
        init_model=run_inputs["init"],
        data_uri=run_inputs["data"],
        stop_at_step=stop_at_step,
        row_cache=str(run_inputs["work"] / "rows"),
    )


def losses(result: dict) -> list[float]:
    """Each logged step's SDA and MEP losses, flat (step, sda, mep, step, ...)."""
    return [value for r in result["reports"] for value in (r["step"], r["loss_sda"], r["loss_mep"])]


@pytest.fixture(scope="module")
def one_worker(run_inputs: dict, tmp_path_factory) -> list[dict]:
    """The uninterrupted run on one worker (the reference)."""
    work = tmp_path_factory.mktemp("one")
    return train_on_ranks(1, loop_of(run_inputs), str(work / "c"), str(work / "o"))


@pytest.fixture(scope="module")
def two_workers(run_inputs: dict, tmp_path_factory) -> dict[str, dict]:
    """The runs on two workers, one after the other on the same two spawned processes
    (each spawn's start-up, the ranks' imports, is seconds): the plain step and GradCache
    in chunks of 2 from scratch, the first part of the resized run (to step 5), and the
    compiled one last (Dynamo's caches then touch no eager run)."""
    work = tmp_path_factory.mktemp("two")
    compiled = (
        "train.compile=always",
        "train.compile_backend=aot_eager",
        "train.checkpoint_every=3",
    )
    loops = {
        "plain": loop_of(run_inputs, 0, "train.grad_cache_chunk_size=0"),
        "grad_cache": loop_of(run_inputs, 0, "train.grad_cache_chunk_size=2"),
        "resized": loop_of(run_inputs, 5),
        "compiled": loop_of(run_inputs, 3, *compiled),
    }
    runs = [(loop, str(work / name / "c"), str(work / name / "o")) for name, loop in loops.items()]
    results = train_runs_on_ranks(2, runs)
    return {
        name: {"ranks": ranks, "root": run[1]}
        for name, run, ranks in zip(loops, runs, results, strict=True)
    }


@pytest.mark.parametrize("chunk", ["plain", "grad_cache"])
def test_one_and_two_workers_train_the_same_batches_to_the_same_losses(
    one_worker: list[dict], two_workers: dict, chunk: str
) -> None:
    """Two workers, with the plain step or GradCache in chunks of 2, against one."""
    one = one_worker
    two = two_workers[chunk]["ranks"]
    # Every global batch holds the same rows: rank 0's slice, then rank 1's.
    assert len(one[0]["rows"]) == STEPS
    assert [a + b for a, b in zip(two[0]["rows"], two[1]["rows"], strict=True)] == one[0]["rows"]
    # Each epoch trains every row once.
    for epoch in range(2):
        seen = sum(one[0]["rows"][epoch * 8 : (epoch + 1) * 8], [])
        assert len(set(seen)) == len(seen) == 64
    # The same losses, logged as the global batch's on every rank.
    assert losses(two[0]) == pytest.approx(losses(one[0]), rel=1e-4)
    assert losses(two[1]) == pytest.approx(losses(two[0]), rel=1e-6)


def test_a_run_resized_from_two_workers_to_one_goes_on_with_the_next_global_batch(
    run_inputs: dict, one_worker: list[dict], two_workers: dict, tmp_path: Path
) -> None:
    whole = one_worker
    first, root = two_workers["resized"]["ranks"], two_workers["resized"]["root"]
    rest = train_on_ranks(1, loop_of(run_inputs), root, str(tmp_path / "o2"))
    trained = [a + b for a, b in zip(first[0]["rows"], first[1]["rows"], strict=True)]
    trained += rest[0]["rows"]
    assert trained == whole[0]["rows"]  # no global batch twice, none skipped
    assert losses(rest[0]) == pytest.approx(losses(whole[0])[15:], rel=1e-4)


def test_a_compiled_ddp_model_trains_as_the_eager_one_and_saves_plain_keys(
    one_worker: list[dict], two_workers: dict
) -> None:
    """``train.compile=always`` (torch.compile of the DDP-wrapped model; ``aot_eager``: no C++
    compiler) on two gloo processes: the eager run's losses, and a checkpoint whose keys are
    the plain model's (no ``_orig_mod.``, no ``module.``)."""
    from safetensors import safe_open

    compiled, root = two_workers["compiled"]["ranks"], Path(two_workers["compiled"]["root"])
    assert losses(compiled[0]) == pytest.approx(losses(one_worker[0])[:9], rel=1e-4)
    files = list((root / "checkpoint_000003" / "model").glob("*.safetensors"))
    keys = [key for file in files for key in safe_open(str(file), "pt").keys()]  # noqa: SIM118
    assert keys and not any("_orig_mod" in key or "module." in key for key in keys)
