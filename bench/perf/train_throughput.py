"""Benchmark: pairs/s of the Ray Train loop (2 workers) vs a plain single-process loop.

    python bench/perf/train_throughput.py [--steps 30] [--workdir /tmp/santa-train-bench]

Same `tiny` model and initial weights, same lengths, global batch 128, same total thread
count (plain loop: 2 torch threads; Ray: 2 workers x 1 thread), pretraining (SDA + MEP).
Throughput is steady state: the first window of steps (warm-up, Ray Data start) is left
out; Ray's fixed start-up is reported separately. Also peak RSS per worker, tiny and minilm.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.corpora import write_stdlib_pairs
from santa.data.published import read_pairs
from santa.method.distributed import identity_gather
from santa.models.dual_encoder import DualEncoder
from santa.recipes import get_recipe
from santa.train.data import tokenization_settings, tokenize_pairs
from santa.train.objectives import compute_losses, to_tensors
from santa.train.trainer import RunSpec, fit, prepare_initial_model


def plain_loop(config, init_model: str, data: str, steps: int, warmup: int) -> dict:
    """The same step in one process: tokenize, forward, loss, backward, AdamW."""
    torch.set_num_threads(2)
    torch.manual_seed(config.train.seed)
    model = DualEncoder.from_pretrained(init_model, config.model)
    model.train()  # as in the Ray loop (from_pretrained returns eval mode)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.learning_rate)
    table = read_pairs(data)
    batch_size = config.train.global_batch_size
    settings = tokenization_settings(config)
    timings = []
    for step in range(steps):
        start = (step * batch_size) % (table.num_rows - batch_size)
        started = time.perf_counter()
        arrays = tokenize_pairs(
            table.slice(start, batch_size), tokenizer_path=init_model, **settings
        )
        batch = to_tensors(arrays, "cpu")
        losses = compute_losses(model, batch, config, identity_gather)
        optimizer.zero_grad()
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        timings.append(time.perf_counter() - started)
    steady = timings[warmup:]
    return {
        "mode": "plain PyTorch, 1 process x 2 threads",
        "pairs_per_s": batch_size * len(steady) / sum(steady),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def ray_loop(config, data: str, workdir: Path, name: str, steps: int, window: int) -> dict:
    """The Ray Train loop on 2 workers (0.5 CPU each, one CPU left to Ray Data)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = config.with_overrides(
        [
            f"train.max_steps={steps}",
            f"train.log_every={window}",
            f"train.checkpoint_every={window}",
        ]
    )
    spec = RunSpec.of(
        data=data,
        storage=str(workdir / "runs"),
        name=name,
        cpus_per_worker=0.5,
        num_to_keep=steps // window + 1,
    )
    started = time.perf_counter()
    result = fit(config, spec)
    wall = time.perf_counter() - started
    if result.error is not None:
        raise RuntimeError(result.error)
    windows = [metrics for _, metrics in result.best_checkpoints][1:]  # drop the warm-up window
    train_time = sum(window * config.train.global_batch_size / m["pairs_per_s"] for m in windows)
    pairs = window * config.train.global_batch_size * len(windows)
    first_window = wall - train_time
    return {
        "mode": "Ray Train, 2 workers x 1 thread",
        "pairs_per_s": pairs / train_time,
        "max_rss_mb": max(m["max_rss_mb"] for m in windows),
        "wall_s": wall,
        "startup_and_first_window_s": first_window,
    }


def main(argv: list[str] | None = None) -> None:
    """Run both loops, print a table, save JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/santa-train-bench"))
    parser.add_argument("--output", type=Path, default=common.RESULTS_DIR / "train_throughput.json")
    parser.add_argument("--skip-minilm", action="store_true")
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    data = write_stdlib_pairs(args.workdir)
    config = get_recipe("tiny").with_overrides(
        ["train.global_batch_size=128", "train.num_workers=2"]
    )
    # A new initial model each time: a cached one may come from an older recipe.
    init_model = prepare_initial_model(
        config,
        RunSpec.of(data=data, storage=str(args.workdir / "runs"), name=f"init-{int(time.time())}"),
    )
    results = [plain_loop(config, init_model, data, args.steps, args.window)]
    print(f"plain: {results[0]['pairs_per_s']:.1f} pairs/s", flush=True)
    config = config.with_overrides([f"model.backbone={init_model}"])
    results.append(
        ray_loop(config, data, args.workdir, f"tiny-{int(time.time())}", args.steps, args.window)
    )
    print(f"ray: {results[1]['pairs_per_s']:.1f} pairs/s", flush=True)
    memory = {"tiny": results[1]["max_rss_mb"]}
    if not args.skip_minilm:
        minilm = get_recipe("minilm").with_overrides(
            [
                "train.global_batch_size=32",
                "train.max_query_length=32",
                "train.max_document_length=128",
                "train.num_workers=2",
            ]
        )
        memory["minilm"] = ray_loop(
            minilm, data, args.workdir, f"minilm-{int(time.time())}", steps=6, window=3
        )["max_rss_mb"]
    base = results[0]["pairs_per_s"]
    rows = [
        [
            r["mode"],
            f"{r['pairs_per_s']:.1f}",
            f"{r['pairs_per_s'] / base:.2f}x",
            f"{r['max_rss_mb']:.0f}",
        ]
        for r in results
    ]
    header = ["loop", "pairs/s", "vs plain", "peak RSS per process (MB)"]
    print("\n" + common.format_table(header, rows))
    print(f"\nRay start-up + first window: {results[1]['startup_and_first_window_s']:.1f} s")
    print("peak RSS per Ray worker (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    bench.write_json(args.output, {"results": results, "worker_rss_mb": memory})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
