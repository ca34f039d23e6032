"""GradCache gives the gradients of the whole batch (santa.train.grad_cache).

Every test compares the parameter gradients of a GradCache step with those of the plain
step (one forward over the batch, then backward) on the same batch, in fp32 on CPU: the
tiny T5 with SDA + MEP, the MiniLM encoder, a decoder with LoRA and Matryoshka prefixes, with
and without hard negatives, on one process
and on two gloo processes under DDP (where the chunks but the last run under ``no_sync``).
Dropout is replayed per chunk (a control without the replay fails), and SCodeR's soft-label
objective, bf16 autocast and ``torch.compile`` go through the same step.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import T5Config, T5ForConditionalGeneration

from santa.config import ModelConfig, NegativesConfig, SantaConfig, TrainConfig
from santa.config.recipes import minilm_path
from santa.method.distributed import all_gather_with_grad, identity_gather
from santa.method.duplicates import document_keys
from santa.models.dual_encoder import DualEncoder
from santa.train import grad_cache
from santa.train.grad_cache import chunk_slices
from santa.train.santa_objective import compute_losses, santa_grad_cache_step
from tests.conftest import free_port

TOLERANCE = 1e-5  # relative error of the parameter gradients, fp32 on CPU
# The losses too (rel=1e-5): chunked sums run in another order, and fp32 rounding then
# differs by about 1e-6 on CPUs without AVX-512 (1.2e-6 measured on 2026-11-26).
VOCAB = 96
QUERY_LENGTH, DOC_LENGTH, TARGET_LENGTH = 7, 11, 5
WORLD_SIZE = 2
GLOBAL_BATCH = 8
HARD_PER_QUERY = 2
CHUNK = 3  # uneven on purpose: a worker's 4 rows are chunks of 3 and 1, 8 rows of 3, 3, 2


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: these steps are milliseconds, and two OpenMP threads on a busy
    2-core machine wait for each other far longer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_t5(dropout: float = 0.0, seed: int = 0, layers: int = 2) -> DualEncoder:
    """A random T5 small enough for exact comparisons in a second (``layers`` each of
    encoder and decoder: one where it is compiled, whose time grows with the graph)."""
    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=4,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        dropout_rate=dropout,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        backbone = T5ForConditionalGeneration(config)
    return DualEncoder(backbone, ModelConfig(kind="t5"))


def minilm() -> DualEncoder:
    """all-MiniLM-L6-v2 as its folder declares it (mean pooling, cosine), dropout off: the
    plain step's masks of the whole batch cannot be those of its chunks (dropout is
    tested on the T5, against chunks run with their graphs)."""
    return DualEncoder.from_pretrained(minilm_path()).eval()


def santa_config(model: DualEncoder, **train) -> SantaConfig:
    """A config whose model section is ``model``'s (its similarity and temperature)."""
    config = model.model_config
    if not model.is_t5:  # as the minilm recipe: cosine at sentence-transformers' scale 20
        config = ModelConfig.from_dict({**config.to_dict(), "temperature": 0.05})
    return SantaConfig(
        model=config,
        train=TrainConfig(stage="pretrain" if model.is_t5 else "finetune", **train),
        negatives=NegativesConfig(),
    )


def ids(generator: torch.Generator, rows: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    """Random token ids with ragged padding (id 0), as tokenized text looks."""
    input_ids = torch.randint(5, vocab, (rows, length), generator=generator)
    lengths = torch.randint(2, length + 1, (rows,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()  # (rows, length)
    return {"input_ids": input_ids * mask, "attention_mask": mask}


def make_batch(
    model: DualEncoder, *, hard: bool, mep: bool, rows: int = GLOBAL_BATCH, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A global batch; row 5's document repeats row 1's (masked as a duplicate), and with
    hard negatives one of them is row 2's document."""
    generator = torch.Generator().manual_seed(seed)
    vocab = VOCAB if model.is_t5 else 1000
    batch: dict[str, torch.Tensor] = {}
    query = ids(generator, rows, QUERY_LENGTH, vocab)
    document = ids(generator, rows, DOC_LENGTH, vocab)
    for key in ("input_ids", "attention_mask"):
        document[key][5] = document[key][1]
    batch["query_input_ids"], batch["query_attention_mask"] = query.values()
    batch["document_input_ids"], batch["document_attention_mask"] = document.values()
    doc_ids = [f"d{i}" for i in range(rows)]
    doc_ids[5] = "d1"
    if mep:
        batch["masked_input_ids"] = document["input_ids"]
        batch["masked_attention_mask"] = document["attention_mask"]
        labels = torch.randint(2, vocab, (rows, TARGET_LENGTH), generator=generator)
        labels[:, -1] = -100  # padding
        labels[3, 2:] = 0  # pad id: ignored too
        labels[6] = -100  # a pair with no entity
        batch["labels"] = labels
    if hard:
        negatives = ids(generator, rows * HARD_PER_QUERY, DOC_LENGTH, vocab)
        for key in ("input_ids", "attention_mask"):
            negatives[key][7] = document[key][2]
        batch["hard_negative_input_ids"], batch["hard_negative_attention_mask"] = negatives.values()
        hard_ids = [f"h{i}" for i in range(rows * HARD_PER_QUERY)]
        hard_ids[7] = "d2"
        batch["hard_negative_keys"] = document_keys(hard_ids, negatives["input_ids"])
    embedded = batch["masked_input_ids" if mep else "document_input_ids"]
    batch["doc_keys"] = document_keys(doc_ids, embedded)
    return batch


def local_part(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s rows of a global batch (hard negatives: its block of them)."""
    rows = batch["query_input_ids"].shape[0] // world
    local = {}
    for key, value in batch.items():
        share = value.shape[0] // world
        local[key] = value[rank * share : (rank + 1) * share]
        assert share in (rows, rows * HARD_PER_QUERY)
    return local


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: parameter.grad.detach().clone()
        for name, parameter in model.named_parameters()
        if parameter.grad is not None
    }


def plain_step(forward_model, batch, config, gather=identity_gather) -> dict:
    losses = compute_losses(forward_model, batch, config, gather)
    losses["loss"].backward()
    return {key: value.detach() for key, value in losses.items()}


def cached_step(
    forward_model, model, batch, config, gather=identity_gather, chunk_size=CHUNK, **kwargs
) -> dict:
    return santa_grad_cache_step(
        forward_model, model, batch, config, gather, chunk_size=chunk_size, **kwargs
    )


def relative_error(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """``|got - expected| / |expected|`` over every parameter's gradient at once."""
    assert got.keys() == expected.keys()
    difference = torch.cat([(got[k] - expected[k]).flatten() for k in expected])
    reference = torch.cat([expected[k].flatten() for k in expected])
    return float(difference.norm() / reference.norm())


def compare_on_one_process(model, config, batch) -> None:
    expected_losses = plain_step(model, batch, config)
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    got_losses = cached_step(model, model, batch, config)
    got = gradients(model)
    assert relative_error(got, expected) <= TOLERANCE
    assert len(got) == len(list(model.parameters()))  # every parameter got its gradient
    for key in ("loss", "loss_sda", "loss_mep"):
        assert float(got_losses[key]) == pytest.approx(float(expected_losses[key]), rel=1e-5)


@pytest.mark.parametrize("hard", [False, True], ids=["in-batch", "hard-negatives"])
def test_tiny_t5_with_sda_and_mep_gets_the_full_batch_gradients(hard) -> None:
    model = tiny_t5()
    config = santa_config(model)
    batch = make_batch(model, hard=hard, mep=True)
    compare_on_one_process(model, config, batch)
    assert float(cached_step(model, model, batch, config)["loss_mep"]) > 0


@pytest.mark.parametrize("hard", [False, True], ids=["in-batch", "hard-negatives"])
def test_minilm_gets_the_full_batch_gradients(hard) -> None:
    model = minilm()
    config = santa_config(model, mep_weight=0.0)
    compare_on_one_process(model, config, make_batch(model, hard=hard, mep=False))


def tiny_decoder() -> DualEncoder:
    """A random Qwen2 decoder (last-token pooling) with LoRA adapters on q_proj and v_proj,
    their B drawn at random (peft starts B at zero, which leaves A without gradient)."""
    from transformers import Qwen2Config, Qwen2Model

    config = Qwen2Config(
        vocab_size=1000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )
    model_config = ModelConfig(
        kind="decoder", lora_rank=4, lora_alpha=8.0, lora_target_modules=("q_proj", "v_proj")
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DualEncoder(Qwen2Model(config), model_config)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(std=0.5)
    return model


@pytest.mark.parametrize("hard", [False, True], ids=["in-batch", "hard-negatives"])
def test_decoder_with_lora_and_matryoshka_gets_the_full_batch_gradients(hard) -> None:
    """A decoder backbone with LoRA, trained on Matryoshka prefixes: the adapters (and
    nothing else) get the plain step's gradients."""
    model = tiny_decoder()
    config = santa_config(
        model, mep_weight=0.0, matryoshka_dims=(32, 8), matryoshka_weights=(1.0, 0.5)
    )
    batch = make_batch(model, hard=hard, mep=False)
    expected_losses = plain_step(model, batch, config)
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    got_losses = cached_step(model, model, batch, config)
    got = gradients(model)
    assert relative_error(got, expected) <= TOLERANCE
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert set(got) == trainable and all("lora_" in name for name in trainable)
    assert float(got_losses["loss"]) == pytest.approx(float(expected_losses["loss"]), rel=1e-5)


def test_two_pass_mep_and_weighted_losses() -> None:
    """The unmasked document embedded apart, with λ and the SDA weight both not 1."""
    model = tiny_t5()
    model.model_config = ModelConfig(kind="t5", embed_unmasked_document=True)
    config = santa_config(model, mep_weight=0.3, sda_weight=2.0)
    batch = make_batch(model, hard=True, mep=True)
    batch["doc_keys"] = document_keys(["x"] * GLOBAL_BATCH, batch["document_input_ids"])
    compare_on_one_process(model, config, batch)


def chunked_with_graphs(
    model: DualEncoder, forward, batch: dict[str, torch.Tensor], autocast=None
) -> dict[str, torch.Tensor]:
    """GradCache's reference with dropout: each chunk's forward (through ``forward``) with
    its graph kept, then the batch's loss and one backward; ``model``'s gradients."""
    from santa.method.losses import contrastive_loss
    from santa.train.santa_objective import BATCH_KEYS

    queries, docs, hards, meps = [], [], [], []
    tokens = model.mep_token_count(batch["labels"])
    for part in chunk_slices(GLOBAL_BATCH, CHUNK):
        chunk = {
            key: value[part.start * HARD_PER_QUERY : part.stop * HARD_PER_QUERY]
            if key.startswith("hard_negative")
            else value[part]
            for key, value in batch.items()
            if key not in ("doc_keys", "hard_negative_keys")
        }
        with autocast or contextlib.nullcontext():
            output = forward(**{BATCH_KEYS[k]: v for k, v in chunk.items()})
        queries.append(output.query_embeddings)
        docs.append(output.doc_embeddings)
        hards.append(output.hard_negative_embeddings)
        meps.append(output.mep_loss * model.mep_token_count(chunk["labels"]) / tokens)
    sda = contrastive_loss(
        torch.cat(queries),
        torch.cat(docs),
        torch.cat(hards),
        doc_keys=batch["doc_keys"],
        hard_negative_keys=batch["hard_negative_keys"],
    )
    (sda + sum(meps)).backward()
    return gradients(model)


def test_dropout_is_replayed_per_chunk() -> None:
    """With dropout, the re-run chunk must draw its first run's masks: GradCache then equals
    running the same chunks with their graphs kept; without the replay it does not."""
    model = tiny_t5(dropout=0.3).train()
    config = santa_config(model)
    batch = make_batch(model, hard=True, mep=True)

    torch.manual_seed(11)
    expected = chunked_with_graphs(model, model, batch)
    after_reference = torch.get_rng_state()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(11)
    cached_step(model, model, batch, config)
    assert relative_error(gradients(model), expected) <= TOLERANCE
    # The replay leaves the RNG where one pass over the chunks leaves it (the next step's).
    assert torch.equal(torch.get_rng_state(), after_reference)

    # The control: a second pass that draws fresh masks gets other gradients.
    model.zero_grad(set_to_none=True)
    torch.manual_seed(11)
    original = grad_cache.RngState.replayed
    grad_cache.RngState.replayed = lambda self: contextlib.nullcontext()
    try:
        cached_step(model, model, batch, config)
    finally:
        grad_cache.RngState.replayed = original
    assert relative_error(gradients(model), expected) > 1e-3


def test_bf16_autocast_stays_close_to_the_plain_bf16_step() -> None:
    model = tiny_t5()
    config = santa_config(model)
    batch = make_batch(model, hard=True, mep=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = compute_losses(model, batch, config, identity_gather)
    plain["loss"].backward()
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    losses = cached_step(
        model, model, batch, config, autocast=torch.autocast("cpu", torch.bfloat16)
    )
    assert relative_error(gradients(model), expected) < 0.05
    assert float(losses["loss"]) == pytest.approx(float(plain["loss"]), rel=0.02)


@pytest.mark.slow
def test_compiled_model_gets_the_full_batch_gradients() -> None:
    """``train.compile``: the chunks run through ``torch.compile`` (``aot_eager``: no C++
    compiler), without and with gradients (two graphs: chunks of one size, as a run's
    per-worker batch in chunks that divide it; an uneven last chunk would add a
    dynamic-shape recompile), and give the eager gradients."""
    model = tiny_t5(layers=1)
    config = santa_config(model)
    batch = make_batch(model, hard=False, mep=True)
    plain_step(model, batch, config)
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, backend="aot_eager")
    cached_step(compiled, model, batch, config, chunk_size=GLOBAL_BATCH // 2)
    assert relative_error(gradients(model), expected) <= TOLERANCE


def test_scoder_soft_labeled_dual_encoder() -> None:
    from santa.scoder.objectives import soft_label_grad_cache_step, soft_label_losses

    model = tiny_t5()
    generator = torch.Generator().manual_seed(3)
    rows, width = 6, 4
    query = ids(generator, rows, QUERY_LENGTH, VOCAB)
    candidates = ids(generator, rows * width, DOC_LENGTH, VOCAB)
    inputs = {
        "query_input_ids": query["input_ids"],
        "query_attention_mask": query["attention_mask"],
        "document_input_ids": candidates["input_ids"],
        "document_attention_mask": candidates["attention_mask"],
    }
    teacher = torch.randn(rows, width, generator=generator)
    output = model(**inputs)
    expected_losses = soft_label_losses(
        model, output.query_embeddings, output.doc_embeddings, teacher, 0.2
    )
    expected_losses["loss"].backward()
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    got = soft_label_grad_cache_step(model, model, inputs, teacher, 0.2, chunk_size=4)
    assert relative_error(gradients(model), expected) <= TOLERANCE
    for key in ("loss_adv", "loss_distill", "accuracy", "soft_label_entropy"):
        assert float(got[key]) == pytest.approx(float(expected_losses[key]), rel=1e-5)
    assert float(got["loss"]) == pytest.approx(float(expected_losses["loss"]), rel=1e-5)


def test_chunk_slices() -> None:
    assert chunk_slices(7, 3) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert chunk_slices(4, 8) == [slice(0, 4)]
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_slices(4, 0)


# --------------------------------------------------------------------------- two processes

CASES = {
    "t5-sda-mep": ("t5", False),
    "t5-sda-mep-hard": ("t5", True),
    "minilm-hard": ("minilm", True),
    "t5-compiled": ("t5", True),  # the DDP module under torch.compile (aot_eager)
}
# The compiled case's chunks: a rank's 4 rows in 2 and 2, one shape, so two graphs (without
# and with gradients); chunks of 3 and 1 add a dynamic-shape graph and a size-1 one of each.
COMPILED_CHUNK = 2


def two_worker_steps(rank: int, world: int, port: int, out_dir: str, cases: list[str]) -> None:
    """One gloo rank: per case, the plain DDP step and the GradCache DDP step on this rank's
    rows, counting the buckets DDP all-reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        torch.set_num_threads(1)
        for case in cases:
            kind, hard = CASES[case]
            model = tiny_t5(layers=1 if case == "t5-compiled" else 2) if kind == "t5" else minilm()
            config = santa_config(model) if kind == "t5" else santa_config(model, mep_weight=0.0)
            batch = local_part(make_batch(model, hard=hard, mep=kind == "t5"), rank, world)
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            compiled = case == "t5-compiled"
            forward_model = torch.compile(ddp, backend="aot_eager") if compiled else ddp
            buckets = []

            def counting_hook(state, bucket, buckets=buckets):  # DDP's all-reduce, counted
                buckets.append(bucket.index())
                return default_hooks.allreduce_hook(state, bucket)

            ddp.register_comm_hook(None, counting_hook)
            # DDP rebuilds its buckets after the first backward: count from the second on.
            # The plain step is eager DDP's, also for the compiled case (its reference).
            plain_step(ddp, batch, config, all_gather_with_grad)
            model.zero_grad(set_to_none=True)
            buckets.clear()
            plain = plain_step(ddp, batch, config, all_gather_with_grad)
            results = {"plain": gradients(model), "plain_loss": plain["loss"]}
            results["plain_buckets"] = len(buckets)
            model.zero_grad(set_to_none=True)
            buckets.clear()
            cached = cached_step(
                forward_model,
                model,
                batch,
                config,
                all_gather_with_grad,
                chunk_size=COMPILED_CHUNK if compiled else CHUNK,
                no_sync=ddp.no_sync,
            )
            results.update(
                cached=gradients(model), cached_loss=cached["loss"], cached_buckets=len(buckets)
            )
            torch.save(results, Path(out_dir) / f"{case}-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_two_workers(out_dir: Path, cases: list[str]) -> dict[str, list[dict]]:
    """Every case on two spawned gloo ranks; each rank's results per case."""
    mp.spawn(
        two_worker_steps,
        args=(WORLD_SIZE, free_port(), str(out_dir), cases),
        nprocs=WORLD_SIZE,
        join=True,
    )
    return {
        case: [torch.load(out_dir / f"{case}-rank{rank}.pt") for rank in range(WORLD_SIZE)]
        for case in cases
    }


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> dict[str, list[dict]]:
    """The eager cases, run once on two processes (they start in seconds, not per case)."""
    cases = [case for case in CASES if case != "t5-compiled"]
    return run_two_workers(tmp_path_factory.mktemp("two-workers"), cases)


def check_two_workers(ranks: list[dict]) -> None:
    for result in ranks:
        assert relative_error(result["cached"], result["plain"]) <= TOLERANCE
        assert float(result["cached_loss"]) == pytest.approx(float(result["plain_loss"]), rel=1e-5)
        # no_sync: one all-reduce of every bucket, with the last chunk, as the plain step
        assert result["cached_buckets"] == result["plain_buckets"] > 0
    assert relative_error(ranks[1]["cached"], ranks[0]["cached"]) == 0.0  # all-reduced


@pytest.mark.parametrize("case", [case for case in CASES if case != "t5-compiled"])
def test_two_workers_get_the_gradients_of_the_plain_ddp_step(case, two_workers) -> None:
    """Two gloo workers under DDP: the GradCache step equals the plain step (whose
    equality with one process on the whole batch tests/test_losses.py proves), every chunk
    but the last under ``no_sync``."""
    ranks = two_workers[case]
    check_two_workers(ranks)
    if CASES[case][0] == "minilm":  # SDA only: also the single process's global gradients
        model = minilm()
        config = santa_config(model, mep_weight=0.0)
        plain_step(model, make_batch(model, hard=True, mep=False), config)
        assert relative_error(ranks[0]["cached"], gradients(model)) <= TOLERANCE


@pytest.mark.long(seconds=70)
def test_two_workers_under_torch_compile(tmp_path) -> None:
    """The compiled DDP module (``train.compile``) honours ``no_sync`` and gives the eager
    DDP step's gradients."""
    check_two_workers(run_two_workers(tmp_path, ["t5-compiled"])["t5-compiled"])


# --------------------------------------------------------------------------- the loop's part


def test_the_santa_objective_dispatches_to_grad_cache() -> None:
    """``train.grad_cache_chunk_size`` turns the objective's forward/backward into the
    GradCache step (the duplicate keys built from the batch's ids), with the plain step's
    gradients and losses."""
    from types import SimpleNamespace

    from santa.train.loop_config import LoopConfig
    from santa.train.santa_objective import SantaObjective

    model = tiny_t5()
    batch = make_batch(model, hard=False, mep=True)
    arrays = {k: v.numpy() for k, v in batch.items() if k != "doc_keys"}
    arrays["doc_id"] = np.array([f"d{i}" for i in range(GLOBAL_BATCH)], dtype=object)
    arrays["doc_id"][5] = "d1"
    arrays["query_id"] = np.array([f"q{i}" for i in range(GLOBAL_BATCH)], dtype=object)
    results = {}
    for chunk in (0, CHUNK):
        config = santa_config(model, grad_cache_chunk_size=chunk)
        objective = SantaObjective(LoopConfig(santa=config, init_model="unused"))
        trainer = SimpleNamespace(
            model=model,
            forward_model=model,
            ddp_model=model,
            autocast=contextlib.nullcontext(),
            gather=identity_gather,
            device=torch.device("cpu"),
            state={"step": 0},
            rank=0,
            world_size=1,
        )
        objective.setup(trainer)
        model.zero_grad(set_to_none=True)
        losses = objective.forward_backward(trainer, arrays)
        results[chunk] = (gradients(model), {k: float(v.detach()) for k, v in losses.items()})
    assert relative_error(results[CHUNK][0], results[0][0]) <= TOLERANCE
    assert results[CHUNK][1] == pytest.approx(results[0][1], rel=1e-5)
    # The keys reached the loss: without the duplicate mask the loss is another.
    unmasked = {k: v for k, v in batch.items() if k != "doc_keys"}
    unmasked_sda = float(compute_losses(model, unmasked, config, identity_gather)["loss_sda"])
    assert abs(unmasked_sda - results[0][1]["loss_sda"]) > 1e-3


def test_the_soft_label_objective_dispatches_to_grad_cache() -> None:
    """SCodeR's dual-encoder objective: rows of text (tokenized in the worker) with offline
    soft labels; the GradCache step gives the plain step's gradients and figures."""
    from types import SimpleNamespace

    from santa.models.tokenizer import train_tokenizer
    from santa.scoder.objectives import SoftLabelObjective
    from santa.train.loop_config import LoopConfig

    texts = [f"def read_{i}(path): return open(path).read() # item {i}" for i in range(12)]
    tokenizer = train_tokenizer(texts * 20, vocab_size=500)
    model = DualEncoder.build_tiny(ModelConfig(tiny_d_model=32, tiny_d_ff=64), tokenizer)
    generator = torch.Generator().manual_seed(5)
    rows = {
        "query": [f"read item {i}" for i in range(5)],
        "candidates": [[texts[(i + j) % 12] for j in range(3)] for i in range(5)],
        "kind": ["code_pair"] * 5,
        "scores": torch.randn(5, 3, generator=generator).tolist(),
    }
    results = {}
    for chunk in (0, 2):
        config = SantaConfig(
            model=model.model_config,
            train=TrainConfig(
                stage="finetune",
                max_query_length=8,
                max_document_length=16,
                grad_cache_chunk_size=chunk,
            ),
        )
        objective = SoftLabelObjective(LoopConfig(santa=config, init_model="unused"))
        trainer = SimpleNamespace(
            model=model,
            forward_model=model,
            ddp_model=model,
            autocast=contextlib.nullcontext(),
            device=torch.device("cpu"),
        )
        objective.setup(trainer)
        model.zero_grad(set_to_none=True)
        losses = objective.forward_backward(trainer, rows)
        figures = {k: float(v.detach() if torch.is_tensor(v) else v) for k, v in losses.items()}
        results[chunk] = (gradients(model), figures)
    assert relative_error(results[2][0], results[0][0]) <= TOLERANCE
    assert results[2][1] == pytest.approx(results[0][1], rel=1e-5)
    assert set(results[0][1]) >= {"loss", "loss_adv", "loss_distill", "accuracy"}
