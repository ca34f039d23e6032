"""Benchmark on one GPU: SANTA training step (pairs/s, MFU), encoding, faiss GPU vs CPU.

    python bench/perf/gpu.py                      # CodeT5-base shape on CUDA
    python bench/perf/gpu.py --size tiny --device cpu --steps 3 --warmup 1   # smoke run

Model: a T5 built from ``transformers.T5Config`` with random weights (no download) in
santa's ``DualEncoder``. ``base`` is CodeT5-base's shape (d_model 768, 12 + 12 layers,
d_ff 3072, 12 heads of 64, vocab 32100, ReLU FFN); ``tiny`` is a small config for CPU.

Training step, as santa's loop runs it: the query (length ``q``) is encoded, the masked
document (length ``s``) goes through the encoder and a decoder of the MEP target (length
``t``) with its LM head, which gives both the MEP loss and the document embedding (one
pass, the reference); ``L = L_SDA + λ L_MEP`` (santa.method.losses), bf16 autocast on CUDA (fp32
on CPU), zero_grad, backward, grad-norm clip 1.0, AdamW. Random token ids, every position
real (masks all ones), so no FLOP is padding.

FLOP count (matmuls only: 2 FLOPs per multiply-add; layer norms, softmax, relative
position bias, dropout and the embedding lookup are left out). With ``d`` = d_model,
``a`` = heads × d_kv (768 for T5-base), ``f`` = d_ff, ``V`` = vocab, ``m`` = 2 FFN input
matrices for ReLU (3 for gated-GELU):

- encoder layer over ``n`` tokens: ``8 n d a`` (Q, K, V, O) ``+ 4 n² a`` (QKᵀ and AV)
  ``+ 2 m n d f`` (FFN)
- decoder layer, ``t`` positions over ``n`` encoder states: self-attention
  ``8 t d a + 4 t² a`` (the full t×t scores, as executed, causal mask or not),
  cross-attention ``4 t d a`` (Q, O) ``+ 4 n d a`` (K, V of the encoder states, recomputed
  in every decoder layer) ``+ 4 t n a``, FFN ``2 m t d f``
- LM head over ``t`` positions: ``2 t d V``

One pair, forward = encoder(q) + decoder(t=1 over q) [query]
+ encoder(s) + decoder(t over s) + LM head(t) [masked document with MEP].
Training FLOPs per pair = 3 × forward (backward = 2 × forward). For T5-base at
q/s/t = 50/240/60:

    query encoder   12 × (50·14,155,776 + 3,072·50²)               =  8,585,625,600
    query decoder   12 × (4,721,664 + 2,359,296 + 117,964,800 + 153,600 + 9,437,184)
                                                                    =  1,615,638,528
    doc encoder     12 × (240·14,155,776 + 3,072·240²)             = 42,892,001,280
    doc decoder     12 × (294,174,720 + 752,025,600 + 566,231,040)  = 19,349,176,320
    LM head         2·60·768·32,100                                 =  2,958,336,000
    forward per pair                                                = 75,400,777,728
    training per pair (×3)                                         ≈ 226.2 GFLOP

(14,155,776 = 8·768² + 4·768·3,072 per token per layer; 3,072 = 4·768.) The similarity
matmul of the loss (``2 B d`` per pair) is under 10⁻⁵ of this and left out. With gradient
checkpointing the GPU runs a second forward (≈ 4 × forward); MFU still counts 3 × forward
(model FLOPs, not hardware FLOPs).

MFU = (training FLOPs per pair × pairs/s) / peak dense bf16 FLOP/s of the device (a table
by ``torch.cuda.get_device_name``, or ``--peak-tflops``); null on CPU.

Encoding: ``DualEncoder.encode`` at length ``s`` under ``inference_mode`` (bf16 autocast on
CUDA): FLOPs per document = encoder(s) + decoder(t=1 over s) (≈ 49.9 GFLOP for T5-base at
240).

faiss: inner-product search (santa.index.faiss_index.EmbeddingIndex, what the hard-negative miner builds)
of ``--queries`` random queries, top ``--k``, over ``--index-size`` random ``--dim``-d (768)
documents (on a GPU 1,000,000 x 768 by default), exact (``flat``) and ``ivf`` (its recall of
the exact top k), on CPU and, when faiss has GPU support and torch sees CUDA, on GPU.

Precision switches (the training loop's, santa.train.precision; GPU): ``--bf16-weights``
(bf16 weights with an fp32 master copy), ``--fused-rms-norm``, ``--bf16-position-bias``.

Prints a table and writes JSON (``--output``, default bench/results/gpu.json) with the
harness's ``meta`` (date, commit, command, machine) beside the device and its peak.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import T5Config, T5ForConditionalGeneration

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402
from santa.config import ModelConfig, SantaConfig, TrainConfig  # noqa: E402
from santa.method.distributed import identity_gather  # noqa: E402
from santa.models.dual_encoder import DualEncoder  # noqa: E402
from santa.train.optim import build_optimizer  # noqa: E402
from santa.train.precision import (  # noqa: E402
    MasterWeights,
    use_bf16_position_bias,
    use_fused_rms_norm,
)
from santa.train.santa_objective import compute_losses  # noqa: E402

RESULTS = common.RESULTS_DIR / "gpu.json"

# Peak dense (no sparsity) bf16 tensor-core FLOP/s from the vendor data sheets. Matched in
# order against the upper-cased device name, each key as a whole word ("L4" is not "L40S");
# the first hit wins. None: a variant the table does not know (pass --peak-tflops).
PEAK_BF16_FLOPS: tuple[tuple[tuple[str, ...], str, float | None], ...] = (
    (("H200",), "H200", 989e12),
    (("H100", "PCIE"), "H100 PCIe", 756e12),
    (("H100", "NVL"), "H100 NVL", None),
    (("H100",), "H100 SXM", 989e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (("A100",), "A100", 312e12),
    (("A10G",), "A10G", 125e12),
    (("L4",), "L4", 121e12),
)

SIZES: dict[str, dict[str, Any]] = {
    # CodeT5-base (Salesforce/codet5-base config.json): the shape SANTA trains for code.
    "base": dict(
        vocab_size=32100,
        d_model=768,
        d_kv=64,
        d_ff=3072,
        num_layers=12,
        num_decoder_layers=12,
        num_heads=12,
        feed_forward_proj="relu",
    ),
    # CPU smoke runs: same structure, a few hundred thousand parameters.
    "tiny": dict(
        vocab_size=1000,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        feed_forward_proj="relu",
    ),
}


# --------------------------------------------------------------------------- FLOPs


def _ffn_matrices(config: T5Config) -> int:
    """Input-side FFN matrices: 1 for ReLU (wi), 2 for gated (wi_0, wi_1); plus wo."""
    return 3 if config.is_gated_act else 2


def encoder_flops(config: T5Config, length: int) -> int:
    """Forward matmul FLOPs of the whole T5 encoder over ``length`` tokens."""
    d, a, f = config.d_model, config.num_heads * config.d_kv, config.d_ff
    per_layer = 8 * length * d * a + 4 * length**2 * a + 2 * _ffn_matrices(config) * length * d * f
    return config.num_layers * per_layer


def decoder_flops(config: T5Config, length: int, source_length: int) -> int:
    """Forward matmul FLOPs of the T5 decoder: ``length`` positions over ``source_length``."""
    d, a, f = config.d_model, config.num_heads * config.d_kv, config.d_ff
    t, n = length, source_length
    self_attention = 8 * t * d * a + 4 * t**2 * a
    cross_attention = 4 * t * d * a + 4 * n * d * a + 4 * t * n * a
    ffn = 2 * _ffn_matrices(config) * t * d * f
    return config.num_decoder_layers * (self_attention + cross_attention + ffn)


def lm_head_flops(config: T5Config, length: int) -> int:
    """Forward FLOPs of the LM head over ``length`` decoder positions."""
    return 2 * length * config.d_model * config.vocab_size


def pair_flops(
    config: T5Config, query_length: int, document_length: int, target_length: int
) -> dict[str, int]:
    """Forward FLOPs of one training pair by part, their sum, and ×3 for training."""
    parts = {
        "query_encoder": encoder_flops(config, query_length),
        "query_decoder": decoder_flops(config, 1, query_length),
        "document_encoder": encoder_flops(config, document_length),
        "document_decoder": decoder_flops(config, target_length, document_length),
        "lm_head": lm_head_flops(config, target_length),
    }
    forward = sum(parts.values())
    return {**parts, "forward_per_pair": forward, "train_per_pair": 3 * forward}


def encode_flops(config: T5Config, length: int) -> int:
    """Forward FLOPs of ``DualEncoder.encode`` for one sequence of ``length`` tokens."""
    return encoder_flops(config, length) + decoder_flops(config, 1, length)


# --------------------------------------------------------------------------- device


def peak_flops(device: torch.device, override_tflops: float | None) -> tuple[float | None, str]:
    """Peak dense bf16 FLOP/s of ``device`` and where the figure comes from."""
    if override_tflops is not None:
        return override_tflops * 1e12, "--peak-tflops"
    if device.type != "cuda":
        return None, "none (not a CUDA device)"
    name = torch.cuda.get_device_name(device)
    label, flops = match_peak(name)
    if flops is None:
        return None, f"no peak known for {name!r} ({label}): pass --peak-tflops"
    return flops, f"table: {label}"


def match_peak(device_name: str) -> tuple[str, float | None]:
    """The table row for a CUDA device name: ``(label, peak FLOP/s or None)``."""
    words = re.split(r"[^A-Z0-9]+", device_name.upper())
    for keys, label, flops in PEAK_BF16_FLOPS:
        if all(key in words for key in keys):
            return label, flops
    return "not in the table", None


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work so wall-clock time covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(
    size: str, device: torch.device, gradient_checkpointing: bool, attention: str = "sdpa"
) -> DualEncoder:
    """A random-init T5 of ``size`` wrapped in santa's DualEncoder (seeded, no download)."""
    t5_config = T5Config(**SIZES[size], pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    t5_config._attn_implementation = attention
    torch.manual_seed(0)
    model_config = ModelConfig(
        backbone=f"random-t5-{size}", kind="t5", gradient_checkpointing=gradient_checkpointing
    )
    return DualEncoder(T5ForConditionalGeneration(t5_config), model_config).to(device)


def random_ids(rows: int, length: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Token ids ``(rows, length)`` that are neither pad (0) nor eos (1)."""
    return torch.randint(2, vocab, (rows, length), device=device)


# --------------------------------------------------------------------------- parts


def step_config(args, model: DualEncoder) -> SantaConfig:
    """The loop's config for this step: its lengths, λ and precision switches."""
    return SantaConfig(
        model=model.model_config,
        train=TrainConfig(
            global_batch_size=args.batch,
            max_query_length=args.query_length,
            max_document_length=args.document_length,
            max_target_length=args.target_length,
            mep_weight=args.mep_weight,
            bf16_weights=args.bf16_weights,
            fused_rms_norm=args.fused_rms_norm,
            bf16_position_bias=args.bf16_position_bias,
        ),
    )


def bench_train(model: DualEncoder, args, device: torch.device, autocast) -> dict[str, Any]:
    """Warm-up then timed SDA + MEP steps; seconds per step and pairs/s.

    The step is the training loop's (santa.train.loop): ``compute_losses`` on a batch
    keyed as the loop's batches are, the precision switches of ``santa.train.precision``
    (bf16 compute weights with an fp32 master, fused RMS norm, bf16 position bias), the
    loop's optimizer (``santa.train.optim.build_optimizer``) on the fp32 weights, grad-norm
    clip 1.0. Its math at any T5 size on random ids: the whole loop with its input pipeline
    and reports is ``bench/perf/gpu_ray.py``'s.
    """
    vocab = model.backbone.config.vocab_size
    batch = args.batch
    config = step_config(args, model)
    query_ids = random_ids(batch, args.query_length, vocab, device)  # (batch, q)
    document_ids = random_ids(batch, args.document_length, vocab, device)  # (batch, s)
    mep_labels = random_ids(batch, args.target_length, vocab, device)  # (batch, t)
    inputs = {
        "query_input_ids": query_ids,
        "query_attention_mask": torch.ones_like(query_ids),
        "masked_input_ids": document_ids,
        "masked_attention_mask": torch.ones_like(document_ids),
        "labels": mep_labels,
    }
    on_gpu = device.type == "cuda"
    if args.fused_rms_norm:
        use_fused_rms_norm(model)
    if on_gpu and args.bf16_position_bias:
        use_bf16_position_bias(model)
    master = MasterWeights(model) if on_gpu and args.bf16_weights else None
    compute = master.compute if master is not None else model
    # The loop's own optimizer (santa.train.optim: the config's AdamW, fused on request).
    optimizer = build_optimizer(model.parameters(), config.train, fused=args.fused_adamw)
    compute.train()
    forward = torch.compile(compute) if args.compile else compute

    def step() -> torch.Tensor:
        with autocast:
            losses = compute_losses(forward, inputs, config, identity_gather)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if master is not None:
            master.gradients_to_master()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if master is not None:
            master.weights_to_compute()
        return losses["loss"]

    for _ in range(args.warmup):
        step()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    synchronize(device)
    elapsed = time.perf_counter() - started
    result = {
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "step_s": elapsed / args.steps,
        "pairs_per_s": batch * args.steps / elapsed,
        "final_loss": float(loss.detach()),
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if args.profile:
        result["profile"] = profile_table(step, device, args.profile)
    return result


def profile_table(step, device: torch.device, steps: int, rows: int = 25) -> str:
    """torch.profiler's table of the ops that took the most device time over ``steps``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60)
    print(table)
    return table


def bench_encode(model: DualEncoder, args, device: torch.device, autocast) -> dict[str, Any]:
    """Documents/s of ``DualEncoder.encode`` at the document length."""
    vocab = model.backbone.config.vocab_size
    ids = random_ids(args.encode_batch, args.document_length, vocab, device)  # (batch, s)
    mask = torch.ones_like(ids)
    model.eval()
    encode = torch.compile(model.encode) if args.compile else model.encode
    with torch.inference_mode(), autocast:
        for _ in range(args.warmup):
            encode(ids, mask)
        synchronize(device)
        started = time.perf_counter()
        for _ in range(args.encode_batches):
            embeddings = encode(ids, mask)  # (batch, dim)
        synchronize(device)
        elapsed = time.perf_counter() - started
    return {
        "length": args.document_length,
        "batch": args.encode_batch,
        "batches": args.encode_batches,
        "documents_per_s": args.encode_batch * args.encode_batches / elapsed,
        "embedding_dim": int(embeddings.shape[1]),
    }


def time_index(
    kind: str, where: str, documents: np.ndarray, queries: np.ndarray, k: int
) -> tuple[dict[str, Any], np.ndarray]:
    """Build ``kind`` on ``where`` and search every query; the timings and the hit rows."""
    from santa.index.faiss_index import EmbeddingIndex

    ids = [str(i) for i in range(len(documents))]
    started = time.perf_counter()
    index = EmbeddingIndex.build(documents, ids, kind, use_gpu=where == "gpu")
    build_s = time.perf_counter() - started
    index.search_rows(queries[: min(100, len(queries))], k)  # warm-up
    started = time.perf_counter()
    rows, _ = index.search_rows(queries, k)  # (nq, k)
    search_s = time.perf_counter() - started
    timing = {
        "build_s": build_s,
        "search_s": search_s,
        "queries_per_s": len(queries) / search_s,
        "hits_per_query": int(rows.shape[1]),
    }
    if kind == "ivf":
        timing.update(nlist=index.nlist, nprobe=index.nprobe)
    return timing, rows


def recall_against(exact: np.ndarray, approximate: np.ndarray) -> float:
    """Share of the exact top-k rows an approximate search also returned."""
    found = [
        len(set(e.tolist()) & set(a.tolist())) for e, a in zip(exact, approximate, strict=True)
    ]
    return float(np.sum(found) / exact.size)


def bench_faiss(args, dim: int) -> dict[str, Any]:
    """Queries/s of inner-product top-k search via EmbeddingIndex (what the miner builds):
    exact (flat) and IVF, on CPU and, with faiss-gpu and CUDA, on GPU; IVF's recall of
    the exact top k."""
    import faiss

    from santa.index.faiss_index import faiss_has_gpu

    rng = np.random.default_rng(0)
    documents = rng.standard_normal((args.index_size, dim), dtype=np.float32)  # (n, dim)
    queries = rng.standard_normal((args.queries, dim), dtype=np.float32)  # (nq, dim)
    kinds = [kind.strip() for kind in args.faiss_kinds.split(",") if kind.strip()]
    result: dict[str, Any] = {
        "index": "EmbeddingIndex: " + ", ".join(kinds) + " (inner product)",
        "index_size": args.index_size,
        "dim": dim,
        "queries": args.queries,
        "k": args.k,
        "faiss_version": faiss.__version__,
        "faiss_threads": faiss.omp_get_max_threads(),
        "faiss_gpus": faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0,
    }
    gpu_possible = faiss_has_gpu() and torch.cuda.is_available()
    exact: dict[str, np.ndarray] = {}
    for kind in kinds:
        # flat keeps its place at the top (cpu, gpu); other kinds nest under their name.
        target = result if kind == "flat" else result.setdefault(kind, {})
        for where in ("cpu", "gpu"):
            if where == "gpu" and not gpu_possible:
                target["gpu"] = None
                result["gpu_note"] = "faiss has no GPU support here (or torch sees no CUDA)"
                continue
            target[where], rows = time_index(kind, where, documents, queries, args.k)
            if kind == "flat":
                exact[where] = rows
            elif where in exact:
                target[where]["recall_at_k"] = recall_against(exact[where], rows)
        if target.get("gpu") and target.get("cpu"):
            target["gpu_speedup"] = target["gpu"]["queries_per_s"] / target["cpu"]["queries_per_s"]
    return result


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; sizes default by device (GPU: full, CPU: small)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--batch", type=int, default=128, help="pairs per step (one GPU)")
    parser.add_argument("--query-length", type=int, default=50)
    parser.add_argument("--document-length", type=int, default=240)
    parser.add_argument("--target-length", type=int, default=60, help="MEP target length")
    parser.add_argument("--mep-weight", type=float, default=1.0)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--encode-batch", type=int, default=None, help="GPU 512, CPU 32")
    parser.add_argument("--encode-batches", type=int, default=10)
    parser.add_argument("--index-size", type=int, default=None, help="GPU 1e6, CPU 20000")
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--dim", type=int, default=768, help="faiss vector size (CodeT5-base)")
    parser.add_argument("--skip-faiss", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True)")
    parser.add_argument(
        "--bf16-weights", action="store_true", help="GPU: bf16 weights, fp32 master copy"
    )
    parser.add_argument("--fused-rms-norm", action="store_true", help="F.rms_norm for T5's norms")
    parser.add_argument(
        "--bf16-position-bias", action="store_true", help="GPU: T5's position bias in bf16"
    )
    parser.add_argument(
        "--faiss-kinds", default="flat,ivf", help="faiss indexes to compare (flat, ivf)"
    )
    parser.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--tf32", action="store_true", help="TF32 for float32 matmuls")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS", help="print torch.profiler's top ops"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 TFLOP/s")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.encode_batches < 1 or args.warmup < 0:
        parser.error("--steps and --encode-batches must be >= 1, --warmup >= 0")
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = args.device.startswith("cuda")
    if args.encode_batch is None:
        args.encode_batch = 512 if on_gpu else 32
    if args.index_size is None:
        args.index_size = 1_000_000 if on_gpu else 20_000
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run training, encoding and faiss benchmarks; print a table; write JSON."""
    args = parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    load_at_start = os.getloadavg()[0]
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else nullcontext()
    peak, peak_source = peak_flops(device, args.peak_tflops)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    model = build_model(args.size, device, args.gradient_checkpointing, args.attention)
    config = model.backbone.config

    flops = pair_flops(config, args.query_length, args.document_length, args.target_length)
    flops["encode_per_document"] = encode_flops(config, args.document_length)
    flops["train_per_step"] = flops["train_per_pair"] * args.batch
    flops["formula"] = {
        "encoder_layer(n)": "8 n d a + 4 n^2 a + 2 m n d f",
        "decoder_layer(t, n)": "8 t d a + 4 t^2 a + 4 t d a + 4 n d a + 4 t n a + 2 m t d f",
        "lm_head(t)": "2 t d V",
        "forward_per_pair": "L_enc (enc(q) + enc(s)) + L_dec (dec(1, q) + dec(t, s)) + lm_head(t)",
        "train_per_pair": "3 x forward_per_pair",
        "encode_per_document": "L_enc enc(s) + L_dec dec(1, s)",
        "symbols": {
            "d": config.d_model,
            "a": config.num_heads * config.d_kv,
            "f": config.d_ff,
            "m": _ffn_matrices(config),
            "V": config.vocab_size,
            "L_enc": config.num_layers,
            "L_dec": config.num_decoder_layers,
            "q": args.query_length,
            "s": args.document_length,
            "t": args.target_length,
        },
        "left_out": "layer norms, softmax, relative position bias, dropout, embedding "
        "lookup, the loss's similarity matmul (2 B d per pair)",
    }

    train = bench_train(model, args, device, autocast)
    train["achieved_flops_per_s"] = train["pairs_per_s"] * flops["train_per_pair"]
    train["mfu"] = train["achieved_flops_per_s"] / peak if peak else None
    encode = bench_encode(model, args, device, autocast)
    encode["achieved_flops_per_s"] = encode["documents_per_s"] * flops["encode_per_document"]
    encode["mfu"] = encode["achieved_flops_per_s"] / peak if peak else None
    parameters = sum(p.numel() for p in model.parameters())
    model_attention = model.backbone.config._attn_implementation
    del model
    if on_gpu:
        torch.cuda.empty_cache()  # leave the memory to faiss
    search = None if args.skip_faiss else bench_faiss(args, dim=args.dim)

    result = {
        "device": {
            "type": device.type,
            "name": torch.cuda.get_device_name(device) if on_gpu else common.cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            # Shared machines: a load above cpu_count means the CPU rates are depressed.
            "load_average_1m": {"start": load_at_start, "end": os.getloadavg()[0]},
            "torch": torch.__version__,
            "peak_bf16_flops": peak,
            "peak_source": peak_source,
        },
        "config": {
            "size": args.size,
            "parameters": parameters,
            "t5": {key: getattr(config, key) for key in SIZES[args.size]},
            "batch": args.batch,
            "query_length": args.query_length,
            "document_length": args.document_length,
            "target_length": args.target_length,
            "mep_weight": args.mep_weight,
            "precision": "bf16 autocast" if on_gpu else "fp32",
            "gradient_checkpointing": args.gradient_checkpointing,
            "compile": args.compile,
            "fused_adamw": args.fused_adamw,
            "bf16_weights": args.bf16_weights and on_gpu,
            "fused_rms_norm": args.fused_rms_norm,
            "bf16_position_bias": args.bf16_position_bias and on_gpu,
            "attention": model_attention,
            "tf32": args.tf32,
        },
        "flops": flops,
        "train": train,
        "encode": encode,
        "faiss": search,
    }
    print_table(result)
    bench.write_json(args.output, result)
    print(f"wrote {args.output}")
    return result


def print_table(result: dict[str, Any]) -> None:
    """A markdown table of the measured rates."""

    def mfu(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    def rate(value: float) -> str:
        return f"{value:.1f}" if value >= 10 else f"{value:.3g}"

    device, config, flops = result["device"], result["config"], result["flops"]
    train, encode = result["train"], result["encode"]
    print(
        f"\n{config['size']} T5 ({config['parameters'] / 1e6:.1f} M parameters) on "
        f"{device['type']} ({device['name']}), {config['precision']}, peak "
        f"{device['peak_bf16_flops'] or 'n/a'} ({device['peak_source']})"
    )
    print(
        f"FLOPs per pair (train, 3 x forward): {flops['train_per_pair']:,} "
        f"(forward {flops['forward_per_pair']:,}); per encoded document: "
        f"{flops['encode_per_document']:,}\n"
    )
    rows = [
        [
            f"train step (batch {config['batch']}, q/s/t {config['query_length']}/"
            f"{config['document_length']}/{config['target_length']})",
            f"{rate(train['pairs_per_s'])} pairs/s",
            f"{train['achieved_flops_per_s'] / 1e12:.4g}",
            mfu(train["mfu"]),
        ],
        [
            f"encode (length {encode['length']}, batch {encode['batch']})",
            f"{rate(encode['documents_per_s'])} docs/s",
            f"{encode['achieved_flops_per_s'] / 1e12:.4g}",
            mfu(encode["mfu"]),
        ],
    ]
    search = result["faiss"]
    if search:
        shape = f"{search['index_size']:,} x {search['dim']}, {search['queries']:,} queries"
        for kind in ("flat", "ivf"):
            timings = search if kind == "flat" else search.get(kind)
            if timings is None:
                continue
            for where in ("cpu", "gpu"):
                timing = timings.get(where)
                if not timing:
                    continue
                recall = (
                    f", recall@{search['k']} {timing['recall_at_k']:.3f}"
                    if "recall_at_k" in timing
                    else ""
                )
                rows.append(
                    [
                        f"faiss {kind} IP {where} ({shape}, top {search['k']}; build "
                        f"{timing['build_s']:.1f}s{recall})",
                        f"{timing['queries_per_s']:.0f} queries/s",
                        "",
                        "",
                    ]
                )
        if search.get("gpu") is None:
            rows.append(["faiss gpu", search["gpu_note"], "", ""])
    print(
        common.format_table(["measurement", "rate", "achieved TFLOP/s", "MFU"], rows, align="llrr")
    )


if __name__ == "__main__":
    main()
