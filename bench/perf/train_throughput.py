"""Benchmark: pairs/s of the Ray Train loop (2 workers) vs a plain single-process loop.

    python bench/perf/train_throughput.py [--steps 30] [--workdir /tmp/santa-train-bench]

Same `tiny` model and initial weights, same lengths, global batch 128, same total thread
count (plain loop: 2 torch threads; Ray: 2 workers x 1 thread), pretraining (SDA + MEP).
The plain loop is santa's own worker loop (``WorkerTrainer``) in this process without Ray
(``LocalSession``): the same step, optimizer and schedule. Throughput is steady state: the
first window of steps (warm-up) is left out; Ray's fixed start-up is reported separately.
Also each loop's wait per step beyond the step's own work (the data, the metrics' report:
in Ray Train a worker's report waits for its controller's poll), and peak RSS per worker,
tiny and minilm. The Ray run checkpoints once, at its end, so that no window holds a
checkpoint's write: its windows are read from the run's ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.corpora import write_stdlib_pairs
from santa.config.recipes import get_recipe
from santa.train.trainer import RunSpec, fit, prepare_initial_model


def plain_loop(config, init_model: str, data: str, steps: int, warmup: int) -> dict:
    """The worker loop in one process (no Ray), every step reported: its steady windows."""
    from bench.perf.gpu_ray import local_trainer
    from santa.train.loop import run_worker

    config = config.with_overrides(
        [f"train.max_steps={steps}", "train.log_every=1", "train.num_workers=1"]
    )
    trainer, session = local_trainer(config, init_model, data, steps=steps, threads=2, device="cpu")
    run_worker(trainer)
    windows = session.reports[warmup:]
    steady = [report["step_time_s"] for report in windows]
    batch_size = config.train.global_batch_size
    return {
        "mode": "plain PyTorch, 1 process x 2 threads",
        "pairs_per_s": batch_size * len(steady) / sum(steady),
        "step_wait_s": step_wait_s(windows),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def step_wait_s(windows: list[dict]) -> float:
    """The median over ``windows`` (santa's logged metrics) of a step's wall time beyond its
    own host time: waiting for data, and for the last window's report to be taken."""
    return statistics.median(m["step_time_s"] - m["step_host_s"] for m in windows)


def ray_loop(config, data: str, workdir: Path, name: str, steps: int, window: int) -> dict:
    """The Ray Train loop on 2 workers (0.5 CPU each), a report every ``window`` steps."""
    from santa.cluster.ray_utils import init_ray

    # Ray as santa's jobs start it (its one line, workers at the driver's priority, a dead
    # worker's recovery said in one santa line), not a bare ray.init.
    print(init_ray("local", num_cpus=2, include_dashboard=False), flush=True)
    config = config.with_overrides(
        [
            f"train.max_steps={steps}",
            f"train.log_every={window}",
            f"train.checkpoint_every={steps}",
        ]
    )
    spec = RunSpec.of(data=data, storage=str(workdir / "runs"), name=name, cpus_per_worker=0.5)
    started = time.perf_counter()
    result = fit(config, spec)
    wall = time.perf_counter() - started
    if result.error is not None:
        raise RuntimeError(result.error)
    windows = common.logged_windows(workdir / "runs" / name)[1:]  # the warm-up one left out
    train_time = sum(window * config.train.global_batch_size / m["pairs_per_s"] for m in windows)
    pairs = window * config.train.global_batch_size * len(windows)
    first_window = wall - train_time
    return {
        "mode": "Ray Train, 2 workers x 1 thread",
        "pairs_per_s": pairs / train_time,
        "step_wait_s": step_wait_s(windows),
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
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--pairs", type=int, default=8000, help="standard-library pairs")
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    data = write_stdlib_pairs(args.workdir, limit=args.pairs)
    config = get_recipe("tiny").with_overrides(
        [f"train.global_batch_size={args.batch}", "train.num_workers=2"]
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
            f"{1000 * r['step_wait_s']:.0f}",
            f"{r['max_rss_mb']:.0f}",
        ]
        for r in results
    ]
    header = ["loop", "pairs/s", "vs plain", "wait per step (ms)", "peak RSS per process (MB)"]
    print("\n" + common.format_table(header, rows))
    print(f"\nRay start-up + first window: {results[1]['startup_and_first_window_s']:.1f} s")
    print("peak RSS per Ray worker (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    bench.write_json(args.output, {"results": results, "worker_rss_mb": memory})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    from santa.jobs.errors import exit_with, run_job

    exit_with(run_job(main))  # Ctrl-C: one santa line, exit 130; errors: one line
