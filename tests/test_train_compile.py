"""torch.compile in the training step: hard negatives arriving mid-stage compile nothing new,
the compile count is reported, and what one process compiled another loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from santa.config import ModelConfig
from santa.method.distributed import identity_gather
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.train.santa_objective import (
    compute_losses,
    hard_negative_batch,
    placeholder_negatives,
    to_tensors,
)
from tests.training import stdlib_pair_rows, tiny_config

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "def add_one(value):\n    return value + 1\n",
    "Return the number of items in the container.",
    "class HttpClient:\n    def get(self, key):\n        return self.cache[key]\n",
    "Open a file and read its lines.",
]


class CountingBackend:
    """A torch.compile backend that counts the graphs Dynamo hands it (runs them as is)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


def test_hard_negatives_arriving_mid_stage_compile_no_new_graph() -> None:
    """Before the miner's first table the step encodes stand-ins of the same shape, so the
    table's arrival changes values, not the compiled graph (the old step recompiled)."""
    config = tiny_config(
        {"source": "async", "per_query": 1}, max_query_length=12, max_document_length=24
    )
    tokenizer = train_tokenizer(TEXTS * 40, vocab_size=400)
    # One layer a stack: Dynamo's time grows with the graph, and the graphs' count is what
    # this counts.
    model_config = ModelConfig(tiny_d_model=32, tiny_d_ff=64, tiny_num_layers=1)
    model = DualEncoder.build_tiny(model_config, tokenizer)
    rows = 4
    queries = model.tokenize(TEXTS, 12, padding="max_length")
    documents = model.tokenize(TEXTS[::-1], 24, padding="max_length")
    arrays = {
        "query_input_ids": queries["input_ids"].numpy(),
        "query_attention_mask": queries["attention_mask"].numpy(),
        "document_input_ids": documents["input_ids"].numpy(),
        "document_attention_mask": documents["attention_mask"].numpy(),
    }

    def run(steps_without_table: int, steps_with_table: int, stand_ins: bool) -> list[int]:
        """Graphs compiled so far, after each step."""
        torch._dynamo.reset()
        backend = CountingBackend()
        forward = torch.compile(model, backend=backend)
        counts = []
        for step in range(steps_without_table + steps_with_table):
            tensors = to_tensors(arrays, "cpu")
            table = step >= steps_without_table
            if table:  # the mined negatives, tokenized as the objective does
                tensors.update(hard_negative_batch(model, TEXTS[1:] + TEXTS[:1], 24, "cpu"))
            elif stand_ins:
                tensors.update(placeholder_negatives(tensors, 1))
            losses = compute_losses(
                forward, tensors, config, identity_gather, use_hard_negatives=table
            )
            losses["loss"].backward()
            model.zero_grad(set_to_none=True)
            counts.append(backend.graphs)
        return counts

    assert rows == len(TEXTS)
    counts = run(2, 2, stand_ins=True)
    assert counts[0] >= 1 and len(set(counts)) == 1, counts  # the table arrives: nothing new
    old = run(1, 1, stand_ins=False)
    assert old[1] > old[0], old  # the old step (no stand-ins): a recompile


def test_stand_in_negatives_leave_the_loss_of_in_batch_negatives() -> None:
    config = tiny_config({"source": "async", "per_query": 2})
    tokenizer = train_tokenizer(TEXTS * 40, vocab_size=400)
    model = DualEncoder.build_tiny(ModelConfig(tiny_d_model=32, tiny_d_ff=64), tokenizer)
    queries = model.tokenize(TEXTS, 12, padding="max_length")
    documents = model.tokenize(TEXTS[::-1], 24, padding="max_length")
    tensors = {
        "query_input_ids": queries["input_ids"],
        "query_attention_mask": queries["attention_mask"],
        "document_input_ids": documents["input_ids"],
        "document_attention_mask": documents["attention_mask"],
    }
    stand_ins = placeholder_negatives(tensors, 2)
    assert stand_ins["hard_negative_input_ids"].shape == (8, 24)
    # Query 0's stand-ins are the last row's document, twice (never its own).
    assert torch.equal(stand_ins["hard_negative_input_ids"][0], documents["input_ids"][-1])
    with torch.no_grad():
        plain = compute_losses(model, tensors, config, identity_gather)
        padded = compute_losses(
            model, {**tensors, **stand_ins}, config, identity_gather, use_hard_negatives=False
        )
    torch.testing.assert_close(padded["loss"], plain["loss"])


@pytest.mark.slow
def test_the_compile_count_stays_constant_when_the_miners_table_arrives(
    ray_cluster, tmp_path
) -> None:
    """The loop with ``train.compile=always`` (no Ray Train: a local session beside a real
    miner actor on the test cluster): the first table reaches the loop mid-stage and
    ``compile_graphs`` stays what the first step compiled."""
    import ray

    from santa.negatives.miner import start_miner
    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.session import LocalSession
    from tests.training import local_loop, tiny_start

    config = tiny_config(
        {"source": "async", "per_query": 1, "refresh_every": 10},
        compile="always",
        compile_backend="aot_eager",  # Dynamo's graphs without a C++ compiler
        max_steps=8,
        log_every=1,
        checkpoint_every=8,
    ).with_overrides(["model.tiny_num_layers=1"])  # Dynamo's time grows with the graph
    start = tiny_start(tmp_path, stdlib_pair_rows()[:300], config)
    name = "santa-miner-compile-test"
    miner = start_miner(name, data_uri=start["data"], model_uri=start["init"], config=config)
    session = LocalSession()
    try:
        trainer = WorkerTrainer(local_loop(start, config, miner_name=name), session)
        negatives = trainer.objective.negatives
        poll = negatives.poll

        def poll_from_step_6() -> bool:
            # Steps 1-5 train before the first table, 6-8 with it, whatever the speeds:
            # the table is taken at step 6, waited for there.
            if trainer.state["step"] < 5:
                return False
            deadline = time.monotonic() + 300
            while negatives.newest_step() < 0 and time.monotonic() < deadline:
                poll()
                time.sleep(0.1)
            return poll()

        negatives.poll = poll_from_step_6
        run_worker(trainer)
    finally:
        ray.kill(miner)
    history = session.reports
    arrived = [h["step"] for h in history if h["negatives_step"] >= 0]
    assert arrived == list(range(6, 9)), arrived
    counts = {h["compile_graphs"] for h in history}
    assert len(counts) == 1 and counts.pop() >= 1, [h["compile_graphs"] for h in history]
    assert history[0]["startup_first_step_s"] > 0


@pytest.mark.slow
def test_what_one_process_compiled_another_loads_from_storage(tmp_path) -> None:
    """Inductor's work saved under the storage (``save_compile_cache``) fills the caches
    of a fresh process (its own empty Inductor cache folder): the compile hits them."""
    script = (
        "import json, sys, torch\n"
        "from torch._dynamo.utils import counters\n"
        "from santa.train.compile_cache import load_compile_cache, save_compile_cache\n"
        "folder, mode = sys.argv[1], sys.argv[2]\n"
        "loaded = load_compile_cache(folder) if mode == 'load' else 0\n"
        "torch.manual_seed(0)\n"
        # Matrix products only (extern kernels, forward and backward): no C++ for Inductor to
        # build, nor its CPU checks to compile, in a fresh cache; the graphs are cached alike.
        "model = torch.nn.Linear(8, 8, bias=False)\n"
        "torch.compile(model)(torch.randn(4, 8)).sum().backward()\n"
        "saved = save_compile_cache(folder + '/stage.bin') if mode == 'save' else False\n"
        "print(json.dumps({'loaded': loaded, 'saved': saved,"
        " 'hits': counters['inductor']['fxgraph_cache_hit']}))\n"
    )
    folder = str(tmp_path / "cache" / "compile" / "key")
    results = {}
    for mode in ("save", "load"):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{mode}")}
        done = subprocess.run(
            [sys.executable, "-c", script, folder, mode],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=800,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["save"]["saved"] and (Path(folder) / "stage.bin").stat().st_size > 0
    assert results["load"]["loaded"] == 1 and results["load"]["hits"] >= 1
