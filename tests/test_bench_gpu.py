"""bench/perf/gpu.py runs at tiny size on CPU and its FLOP count is the analytic T5 formula.

The formula is written out again here (not imported) so a change to the script's count
has to be made twice on purpose; torch's own FLOP counter checks both against what the
model actually executes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import REPO

# The script's `tiny` T5 (bench/perf/gpu.py SIZES["tiny"]).
D, HEADS, D_KV, D_FF, LAYERS, VOCAB = 64, 4, 16, 128, 2, 1000
Q, S, T, BATCH = 16, 48, 12, 8


def forward_flops_per_pair(q: int, s: int, t: int) -> int:
    """Matmul FLOPs of one pair's forward: query encode + masked document with MEP."""
    a = HEADS * D_KV

    def encoder(n: int) -> int:
        return LAYERS * (8 * n * D * a + 4 * n * n * a + 4 * n * D * D_FF)

    def decoder(length: int, n: int) -> int:
        self_attention = 8 * length * D * a + 4 * length * length * a
        cross_attention = 4 * length * D * a + 4 * n * D * a + 4 * length * n * a
        return LAYERS * (self_attention + cross_attention + 4 * length * D * D_FF)

    lm_head = 2 * t * D * VOCAB
    return encoder(q) + decoder(1, q) + encoder(s) + decoder(t, s) + lm_head


@pytest.mark.slow
def test_tiny_cpu_run_writes_consistent_results(tmp_path: Path) -> None:
    output = tmp_path / "gpu.json"
    args = [
        "--size=tiny",
        "--device=cpu",
        f"--batch={BATCH}",
        f"--query-length={Q}",
        f"--document-length={S}",
        f"--target-length={T}",
        "--warmup=1",
        "--steps=2",
        "--encode-batch=8",
        "--encode-batches=2",
        "--index-size=1000",
        "--queries=50",
        "--k=10",
        "--fused-rms-norm",
        f"--output={output}",
    ]
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "perf" / "gpu.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "| train step" in proc.stdout
    result = json.loads(output.read_text())

    flops = result["flops"]
    forward = forward_flops_per_pair(Q, S, T)
    assert flops["forward_per_pair"] == forward
    assert flops["train_per_pair"] == 3 * forward
    assert flops["train_per_step"] == 3 * forward * BATCH
    parts = ("query_encoder", "query_decoder", "document_encoder", "document_decoder", "lm_head")
    assert sum(flops[part] for part in parts) == forward

    train, encode = result["train"], result["encode"]
    assert train["pairs_per_s"] > 0 and train["steps"] == 2
    assert train["achieved_flops_per_s"] == pytest.approx(train["pairs_per_s"] * 3 * forward)
    assert train["mfu"] is None and encode["mfu"] is None  # no peak for a CPU
    assert result["device"]["peak_bf16_flops"] is None
    assert encode["documents_per_s"] > 0 and encode["length"] == S
    assert encode["embedding_dim"] == D
    assert result["config"]["precision"] == "fp32"

    assert result["config"]["fused_rms_norm"] and not result["config"]["bf16_weights"]

    search = result["faiss"]
    assert search["cpu"]["queries_per_s"] > 0 and search["cpu"]["hits_per_query"] == 10
    assert search["index_size"] == 1000 and search["dim"] == 768
    ivf = search["ivf"]["cpu"]  # IVF beside exact search, and how much of it it finds
    assert ivf["queries_per_s"] > 0 and 0 < ivf["recall_at_k"] <= 1
    assert "| faiss ivf IP cpu" in proc.stdout

    meta = result["meta"]  # the harness's record of the run
    assert meta["command"] == "python bench/perf/gpu.py " + " ".join(args)
    assert meta["machine"]["gpus"] == [] and meta["machine"]["cpu_count"] > 0


def test_flop_formula_matches_torch_flop_counter() -> None:
    """The analytic count is exactly what the model runs: forward, and backward = 2x."""
    from bench.perf.gpu import build_model, encode_flops, pair_flops, random_ids
    from santa.method.losses import contrastive_loss, total_loss

    model = build_model("tiny", torch.device("cpu"), gradient_checkpointing=False)
    config = model.backbone.config
    assert (config.d_model, config.num_heads, config.d_kv, config.d_ff) == (D, HEADS, D_KV, D_FF)
    assert (config.num_layers, config.num_decoder_layers, config.vocab_size) == (
        LAYERS,
        LAYERS,
        VOCAB,
    )
    batch = 2
    query = random_ids(batch, Q, VOCAB, torch.device("cpu"))  # (batch, q)
    document = random_ids(batch, S, VOCAB, torch.device("cpu"))  # (batch, s)
    labels = random_ids(batch, T, VOCAB, torch.device("cpu"))  # (batch, t)
    with FlopCounterMode(display=False) as forward_counter:
        output = model(
            query,
            torch.ones_like(query),
            masked_document_input_ids=document,
            masked_document_attention_mask=torch.ones_like(document),
            mep_labels=labels,
        )
        sda = contrastive_loss(output.query_embeddings, output.doc_embeddings)
    loss = total_loss(sda, output.mep_loss, 1.0)
    with FlopCounterMode(display=False) as backward_counter:
        loss.backward()
    # The only matmul outside the model is the (batch, batch) similarity: 2 B^2 d.
    similarity = 2 * batch * batch * D
    counted_forward = forward_counter.get_total_flops() - similarity
    counted_backward = backward_counter.get_total_flops() - 2 * similarity
    expected = pair_flops(config, Q, S, T)
    assert expected["forward_per_pair"] == forward_flops_per_pair(Q, S, T)
    assert counted_forward == batch * expected["forward_per_pair"]
    assert counted_backward == 2 * batch * expected["forward_per_pair"]

    with FlopCounterMode(display=False) as encode_counter, torch.inference_mode():
        model.encode(document, torch.ones_like(document))
    assert encode_counter.get_total_flops() == batch * encode_flops(config, S)


@pytest.mark.parametrize(
    ("device_name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A10G", 125e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", None),  # not the L4
        ("NVIDIA H100 NVL", None),  # an H100 the table does not know: not SXM's peak
    ],
)
def test_peak_flops_table_matches_whole_words(device_name: str, peak: float | None) -> None:
    from bench.perf.gpu import match_peak

    assert match_peak(device_name)[1] == peak


def test_the_gpu_session_compiles_the_carried_site_before_it_measures(tmp_path: Path) -> None:
    """gpu_session.sh first compiles the bytecode of what is on PYTHONPATH (the unpacked
    .gpu-site comes without any, and under PYTHONDONTWRITEBYTECODE each process would compile
    Ray's modules again), then runs each step in what is left of its budget (none here)."""
    import os

    site = tmp_path / "site"
    (site / "carried").mkdir(parents=True)
    (site / "carried" / "__init__.py").write_text("")
    (site / "carried" / "module.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        ["bash", "bench/perf/gpu_session.sh", str(tmp_path / "out"), "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[gpu] bytecode compiled in" in proc.stdout, proc.stdout
    assert "PYTHONDONTWRITEBYTECODE=1" in proc.stdout
    tag = sys.implementation.cache_tag
    assert (site / "carried" / "__pycache__" / f"module.{tag}.pyc").is_file()
    for name in ("gpu_ray", "step_overhead", "cuda_tests", "cuda_grad_cache"):
        assert f"[gpu] {name} skipped" in proc.stdout, proc.stdout
