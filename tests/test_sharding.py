"""``train.strategy=fsdp`` on the plain loop over gloo processes (no Ray): two FSDP workers
train the tiny decoder (activation checkpointing on, Matryoshka prefixes) to DDP's losses
and weights step by step, and the sharded checkpoint they wrote at step 3 resumes on one
worker to the same losses and weights at step 5."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from santa.config.recipes import get_recipe
from santa.models.dual_encoder import DualEncoder
from santa.models.sharded import SHARDED_DIR
from santa.models.tokenizer import train_tokenizer
from santa.train.loop_config import LoopConfig
from santa.train.sharding import OPTIMIZER_DIR, transformer_blocks
from tests.training import stdlib_pair_rows, train_on_ranks, train_runs_on_ranks, write_pairs

STEPS = 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """DDP on 2 workers, FSDP on 2 workers (checkpoints at 3 and 5), and FSDP on 1 worker
    resumed from the 2 workers' step-3 checkpoint."""
    work = tmp_path_factory.mktemp("fsdp")
    rows = stdlib_pair_rows()[:48]
    config = get_recipe("tiny-ci-decoder").with_overrides(
        [
            f"train.max_steps={STEPS}",
            "train.log_every=1",
            "train.checkpoint_every=3",
            "train.matryoshka_dims=64,16",
        ]
    )
    tokenizer = train_tokenizer(
        [r["query"] for r in rows] + [r["document"] for r in rows],
        vocab_size=config.model.tiny_vocab_size,
    )
    DualEncoder.build_tiny(config.model, tokenizer, seed=0).save_pretrained(
        str(work / "init"), santa_config=config
    )
    data = write_pairs(work / "pairs", rows)

    def loop(*overrides: str) -> LoopConfig:
        return LoopConfig(
            santa=config.with_overrides(list(overrides)),
            init_model=str(work / "init"),
            data_uri=data,
            row_cache=str(work / "rows"),
        )

    fsdp = ("train.strategy=fsdp", "model.gradient_checkpointing=true")
    # DDP then FSDP on the same two spawned processes (a spawn's start-up is seconds).
    ddp, sharded = train_runs_on_ranks(
        2,
        [
            (loop(), str(work / "ddp"), str(work / "o1")),
            (loop(*fsdp), str(work / "fsdp"), str(work / "o2")),
        ],
    )
    # One worker, from the two workers' step-3 checkpoint only.
    (work / "one").mkdir()
    shutil.copytree(work / "fsdp" / "checkpoint_000003", work / "one" / "checkpoint_000003")
    one = train_on_ranks(1, loop(*fsdp), str(work / "one"), str(work / "o3"))
    return {"work": work, "ddp": ddp, "fsdp": sharded, "one": one[0]}


def losses(result: dict) -> list[float]:
    """Each logged step and its loss, flat (step, loss, step, ...)."""
    return [value for r in result["reports"] for value in (r["step"], r["loss"])]


def final_weights(root: Path) -> dict[str, torch.Tensor]:
    """The model of a run's last checkpoint, loaded in this (single) process."""
    return DualEncoder.from_pretrained(str(root / f"checkpoint_{STEPS:06d}" / "model")).state_dict()


def test_fsdp_on_two_workers_trains_as_ddp(runs) -> None:
    work = runs["work"]
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    assert [len(r["reports"]) for r in fsdp] == [STEPS, STEPS]
    assert losses(fsdp[0]) == pytest.approx(losses(ddp[0]), rel=1e-5)
    assert losses(fsdp[1]) == pytest.approx(losses(fsdp[0]), rel=1e-6)  # the global batch's
    # A sharded checkpoint: each worker's shard of the weights and of the optimizer.
    checkpoint = work / "fsdp" / f"checkpoint_{STEPS:06d}"
    shards = sorted(p.name for p in (checkpoint / "model" / SHARDED_DIR).glob("*.distcp"))
    assert len(shards) == 2 and len(list((checkpoint / OPTIMIZER_DIR).glob("*.distcp"))) == 2
    assert not (checkpoint / "model" / "model.safetensors").exists()
    trained, reference = final_weights(work / "fsdp"), final_weights(work / "ddp")
    initial = DualEncoder.from_pretrained(str(work / "init")).state_dict()
    for name, value in reference.items():
        torch.testing.assert_close(trained[name], value, atol=5e-5, rtol=1e-4)
    # The comparison can fail: five steps moved the weights far beyond its tolerance.
    moved = max((reference[n] - initial[n]).abs().max().item() for n in reference)
    assert moved > 20 * 5e-5


def test_a_sharded_checkpoint_of_two_workers_resumes_on_one(runs) -> None:
    work, one = runs["work"], runs["one"]
    assert [r["step"] for r in one["reports"]] == [4, 5]
    assert losses(one) == pytest.approx(losses(runs["fsdp"][0])[6:], rel=1e-5)
    assert (
        one["rows"] == [a + b for a, b in zip(*(r["rows"] for r in runs["fsdp"]), strict=True)][3:]
    )
    resumed, reference = final_weights(work / "one"), final_weights(work / "fsdp")
    for name, value in reference.items():
        torch.testing.assert_close(resumed[name], value, atol=5e-5, rtol=1e-4)


def test_transformer_blocks_are_the_backbones_repeated_layers() -> None:
    config = get_recipe("tiny-ci-decoder").model
    tokenizer = train_tokenizer(["def f(x): return x"] * 4, vocab_size=400)
    decoder = DualEncoder.build_tiny(config, tokenizer)
    assert [type(b).__name__ for b in transformer_blocks(decoder)] == ["Qwen2DecoderLayer"] * 2
    t5 = DualEncoder.build_tiny(get_recipe("tiny-ci").model, tokenizer)
    assert {type(b).__name__ for b in transformer_blocks(t5)} == {"T5Block"}


@pytest.mark.slow  # one Ray Train run: ~60 s on this 2-core machine
@pytest.mark.usefixtures("ray_cluster")
def test_fsdp_with_lora_through_ray_train_checkpoints_every_workers_shard_and_exports(
    tmp_path,
) -> None:
    """The one Ray Train run: ``train.strategy=fsdp`` reaches two Ray Train workers (tiny
    decoder with LoRA), each worker's shard lands in the one checkpoint Ray registers, and
    ``ray_jobs.export`` turns it into a sentence-transformers folder (adapters merged, the
    shards gathered) that encodes as santa encodes the checkpoint."""
    from sentence_transformers import SentenceTransformer

    from ray_jobs import export
    from santa.models import checkpoints
    from santa.models.encoding import encode_texts
    from santa.train.trainer import RunSpec, fit

    config = get_recipe("tiny-ci-decoder").with_overrides(
        [
            "model.lora_rank=4",
            "train.strategy=fsdp",
            "train.num_workers=2",
            "train.max_steps=2",  # the checkpoint of every shard and its export need no more
            "train.log_every=2",
            "train.checkpoint_every=2",
        ]
    )
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:48])
    spec = RunSpec.of(data=data, storage=str(tmp_path / "runs"), name="fsdp", cpus_per_worker=0.5)
    result = fit(config, spec)
    assert result.error is None and result.metrics["step"] == 2
    with result.checkpoint.as_directory() as directory:
        checkpoint = Path(directory)
        model = checkpoint / "model"
        assert len(list((model / SHARDED_DIR).glob("*.distcp"))) == 2  # one per worker
        assert len(list((checkpoint / OPTIMIZER_DIR).glob("*.distcp"))) == 2
        assert (model / "adapter_config.json").is_file()
        santa_model = checkpoints.load(str(checkpoint))
    assert santa_model.is_lora
    target = tmp_path / "exported"
    argv = ["--latest", str(tmp_path / "runs" / "fsdp"), "--to", str(target)]
    assert export.main([*argv, "--format", "sentence-transformers"]) == 0
    assert not (target / "adapter_config.json").exists() and (target / "model.safetensors").exists()
    st_model = SentenceTransformer(str(target), device="cpu")
    texts = ["read a file line by line", "sort a list in place"]
    ours = encode_texts(santa_model, texts, max_length=st_model.max_seq_length, role="query")
    theirs = st_model.encode_query(texts, convert_to_tensor=True)
    torch.testing.assert_close(
        theirs, torch.nn.functional.normalize(torch.from_numpy(ours), dim=1), atol=1e-5, rtol=1e-4
    )
