"""The training loop through Ray beside the plain loop it wraps: same shape, one run.

    python bench/perf/gpu_ray.py                   # GPU: the tiny recipe at T5-base shape
    python bench/perf/gpu_ray.py --device cpu      # CPU: the tiny recipe as it is (runs anywhere)

Two systems train the same config (the ``tiny`` recipe; on a GPU scaled to T5-base: d_model
768, 12 + 12 layers, 12 heads, d_ff 3072, vocabulary 32100, global batch 128, lengths
50/240/60, as issue 28 measured it) from the same initial weights:

- ``ray``: ``python -m ray_jobs.pretrain`` as a subprocess on a local Ray of its own, one
  Ray Train worker (``--gpu`` on a GPU), on standard-library pretraining pairs (a
  ``--pairs`` subset, so that a short run crosses several epochs); its ``metrics.jsonl``
  gives the windows, its ``startup_*`` metrics the phases before the first step;
- ``plain``: in this process, the Ray run's initial model and the loop's own step
  (``WorkerTrainer.train_step``: the objective, the loop's precision settings, optimizer and
  schedule, ``torch.compile`` where the config compiles) on random token ids of the same
  shapes: the step without the input pipeline or Ray's reports.
  With ``--overlap`` (the default on a GPU) it builds an initial model of the same config
  and compiles while the Ray run runs, then waits for the Ray run to end before its timed
  steps: the two cold compiles (minutes each at T5-base) share the time, the steps never
  do, and the whole bench fits a short GPU lease. The Ray run's compile seconds then count
  a machine that compiles twice.

Figures per system: **stage** seconds (``ray``: the whole subprocess, Ray's start and
checkpoints included; ``plain``: model load + every step), **whole-stage pairs/s**
(steps × batch / stage seconds), **loop pairs/s** (from the first step on: ``ray``'s
``run_pairs_per_s``), **steady pairs/s** (the median window after the first) and the
**worst window** after the first as a share of the median (an epoch-boundary stall shows
there), and their ratio to the plain loop. Prints tables; writes
``bench/results/gpu_ray.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402

ROOT = common.ROOT
RESULTS = common.RESULTS_DIR / "gpu_ray.json"

# The shape issue 28 ran on one H100: the tiny recipe scaled to T5-base.
GPU_SHAPE = (
    "model.tiny_d_model=768",
    "model.tiny_num_layers=12",
    "model.tiny_num_heads=12",
    "model.tiny_d_ff=3072",
    "model.tiny_vocab_size=32100",
    "train.global_batch_size=128",
    "train.max_query_length=50",
    "train.max_document_length=240",
    "train.max_target_length=60",
)
DEFAULTS = {
    # device: (steps, log window, pairs in the data)
    "cuda": (300, 10, 0),  # every stdlib pair (about 4,400): an epoch is ~35 steps
    "cpu": (60, 5, 640),  # tiny recipe, batch 16: an epoch is 40 steps
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (sets the OpenMP threads of this process before torch is imported)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--window", type=int, default=None, help="steps per logged window")
    parser.add_argument("--pairs", type=int, default=None, help="training pairs (0: all)")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU: torch (and OpenMP) threads of the plain loop"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override (both)"
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/santa-gpu-ray"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--skip-ray", action="store_true", help="no Ray run")
    parser.add_argument(
        "--skip-local", action="store_true", help="no run of the worker loop without Ray"
    )
    parser.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the plain loop compiles while the Ray run runs, and steps after it "
        "(default: on a GPU, where each compiles for minutes)",
    )
    args = parser.parse_args(argv)
    # As Ray does for its workers (OMP_NUM_THREADS = their CPUs): without it the plain
    # loop's OpenMP threads spin against each other on a busy machine (on the 2-core dev
    # VM, 40x slower than with one thread).
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.overlap is None:
        args.overlap = args.device == "cuda"
    steps, window, pairs = DEFAULTS[args.device]
    args.steps = args.steps or steps
    args.window = args.window or window
    args.pairs = pairs if args.pairs is None else args.pairs
    return args


def overrides(args: argparse.Namespace) -> list[str]:
    """The config changes both systems run with."""
    shape = list(GPU_SHAPE) if args.device == "cuda" else []
    return [*shape, f"train.log_every={args.window}", *args.overrides]


def build_pairs(work: Path, limit: int) -> str:
    """Standard-library pretraining pairs (the first ``limit``; 0: all), built once."""
    from bench.corpora import write_stdlib_pairs

    data = work / f"pairs-{limit or 'all'}"
    return write_stdlib_pairs(data, limit=limit or 10**9)


def window_figures(rates: list[float]) -> dict[str, float]:
    """Steady (median after the first window) and the worst window after the first."""
    after = rates[1:] or rates
    median = statistics.median(after)
    return {
        "steady_pairs_per_s": median,
        "worst_window_pairs_per_s": min(after),
        "worst_to_median": min(after) / median if median else 0.0,
    }


def run_ray(args: argparse.Namespace, data: str) -> dict[str, Any]:
    """``ray_jobs.pretrain`` as a subprocess; its figures from ``metrics.jsonl``."""
    return finish_ray(args, start_ray(args, data))


def start_ray(args: argparse.Namespace, data: str) -> dict[str, Any]:
    """Start ``ray_jobs.pretrain`` (its output to files in the work folder); returns what
    :func:`finish_ray` waits for."""
    name = f"bench-{int(time.time())}"
    storage = args.workdir / "runs"
    command = [
        sys.executable,
        "-m",
        "ray_jobs.pretrain",
        "--recipe",
        "tiny",
        "--data",
        data,
        "--storage",
        str(storage),
        "--name",
        name,
        "--num-workers",
        "1",
        "--max-steps",
        str(args.steps),
        *(["--gpu"] if args.device == "cuda" else []),
    ]
    for override in [*overrides(args), f"train.checkpoint_every={args.steps}"]:
        command += ["--set", override]
    env = {**os.environ, "RAY_ADDRESS": "local"}
    out, err = args.workdir / f"{name}.out", args.workdir / f"{name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        return {
            "name": name,
            "storage": storage,
            "out": out,
            "err": err,
            "load": os.getloadavg()[0],
            "started": time.perf_counter(),
            "process": subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True
            ),
        }


def finish_ray(args: argparse.Namespace, started: dict[str, Any]) -> dict[str, Any]:
    """Wait for the run :func:`start_ray` started; its figures from ``metrics.jsonl``."""
    returncode = started["process"].wait()
    stage_s = time.perf_counter() - started["started"]
    output = started["out"].read_text() + started["err"].read_text()
    if returncode:
        raise RuntimeError(f"ray_jobs.pretrain failed ({returncode}):\n{output[-3000:]}")
    storage, name, load = started["storage"], started["name"], started["load"]
    metrics = common.logged_windows(storage / name)
    from santa.config.recipes import get_recipe

    batch = get_recipe("tiny").with_overrides(overrides(args)).train.global_batch_size
    rates = [m["pairs_per_s"] for m in metrics]
    phases = {k: v for k, v in metrics[-1].items() if k.startswith(("startup_", "compile"))}
    first_lines = started["out"].read_text().splitlines()[:3]
    return {
        "system": "ray",
        "run": str(storage / name),
        "load_average_1m_before": load,
        "stage_s": stage_s,
        "whole_pairs_per_s": args.steps * batch / stage_s,
        "loop_pairs_per_s": metrics[-1]["run_pairs_per_s"],
        "windows_pairs_per_s": rates,
        **window_figures(rates),
        "phases_s": phases,
        "output_lines": len(output.splitlines()),
        "first_lines": first_lines,
    }


def run_plain(
    args: argparse.Namespace,
    init_model: str,
    data: str,
    gate: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The loop's own step (``WorkerTrainer.train_step``: the objective's forward and
    backward, clipping, the optimizer and schedule, the precision settings, ``torch.compile``
    where the config compiles) in this process, on one batch of random token ids of the
    run's shapes: the step without the input pipeline or Ray's reports.

    With ``gate``: one untimed step first (it compiles), then ``gate()`` (the overlap mode
    waits there for the Ray run to end, so that the two never step at once), then the timed
    steps; the wait is not in the stage's seconds.
    """
    import numpy as np
    import torch

    from santa.config.recipes import get_recipe
    from santa.train.data import tokenization_settings

    config = get_recipe("tiny").with_overrides(
        [*overrides(args), *(["train.use_gpu=true"] if args.device == "cuda" else [])]
    )
    if args.device != "cuda":
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    trainer, _ = local_trainer(
        config, init_model, data, steps=args.steps + 1, threads=args.threads, device=args.device
    )
    settings = tokenization_settings(config)
    batch = config.train.global_batch_size
    vocab = trainer.model.backbone.config.vocab_size
    generator = np.random.default_rng(config.train.seed)

    def ids(length: int) -> np.ndarray:
        return generator.integers(2, vocab, size=(batch, length), dtype=np.int64)

    arrays: dict[str, np.ndarray] = {
        "query_input_ids": ids(settings["max_query_length"]),
        "query_attention_mask": np.ones((batch, settings["max_query_length"]), np.int64),
        "doc_id": np.array([f"d{row}" for row in range(batch)], dtype=object),
        "query_id": np.array([f"q{row}" for row in range(batch)], dtype=object),
    }
    if settings["with_document"]:
        arrays["document_input_ids"] = ids(settings["max_document_length"])
        arrays["document_attention_mask"] = np.ones_like(arrays["document_input_ids"])
    if settings["with_mep"]:
        arrays["masked_input_ids"] = ids(settings["max_document_length"])
        arrays["masked_attention_mask"] = np.ones_like(arrays["masked_input_ids"])
        arrays["labels"] = ids(settings["max_target_length"])
    loaded_s = time.perf_counter() - started
    # What WorkerTrainer.train sets before its first step.
    trainer.run_started, trainer.run_first_step = time.perf_counter(), trainer.state["step"]
    trainer.loop_started_at = time.time()

    def step() -> dict[str, Any]:
        return trainer.train_step(arrays)

    waited_s = 0.0
    if gate is not None:
        float(step()["loss"])
        first_step_s = time.perf_counter() - started
        print(f"[bench] plain: untimed first step done {first_step_s:.1f} s in", flush=True)
        waited = time.perf_counter()
        gate()
        waited_s = time.perf_counter() - waited
    rates: list[float] = []
    window_started = loop_started = time.perf_counter()
    for step_number in range(1, args.steps + 1):
        losses = step()
        if step_number == 1 and gate is None:
            float(losses["loss"])
            first_step_s = time.perf_counter() - started
            print(f"[bench] plain: first step done {first_step_s:.1f} s in", flush=True)
        if step_number % args.window == 0:
            float(losses["loss"])  # waits for the device, as the loop's logging does
            now = time.perf_counter()
            rates.append(batch * args.window / (now - window_started))
            print(
                f"[bench] plain: step {step_number}, {rates[-1]:.1f} pairs/s "
                f"({now - started - waited_s:.1f} s in)",
                flush=True,
            )
            window_started = now
    stage_s = time.perf_counter() - started - waited_s
    trainer.close(publish=False)
    return {
        "system": "plain",
        "load_average_1m_before": load,
        "stage_s": stage_s,
        "whole_pairs_per_s": args.steps * batch / stage_s,
        "loop_pairs_per_s": args.steps * batch / (time.perf_counter() - loop_started),
        "windows_pairs_per_s": rates,
        **window_figures(rates),
        "phases_s": {"startup_model_s": loaded_s, "first_step_s": first_step_s},
        "waited_for_ray_s": waited_s,
    }


def local_trainer(config, init_model: str, data: str, *, steps: int, threads: int, device: str):
    """The worker loop over the pairs under ``data`` in this process, and its session."""
    from santa.train.loop import WorkerTrainer
    from santa.train.loop_config import LoopConfig
    from santa.train.session import LocalSession

    session = LocalSession(device=device)
    loop = LoopConfig(
        santa=config,
        init_model=init_model,
        data_uri=data,
        stop_at_step=steps,
        torch_threads=threads,
    )
    return WorkerTrainer(loop, session), session


def run_local(args: argparse.Namespace, init_model: str, data: str) -> dict[str, Any]:
    """The worker loop itself (``WorkerTrainer``: the objective, the reader thread, the
    window metrics) in this process through :class:`~santa.train.session.LocalSession`,
    on the same pairs as the Ray run: what the loop costs beyond the plain step, without
    Ray's reports."""
    import torch

    from santa.config.recipes import get_recipe
    from santa.train.loop import run_worker

    on_gpu = args.device == "cuda"
    config = get_recipe("tiny").with_overrides(
        [*overrides(args), *(["train.use_gpu=true"] if on_gpu else [])]
    )
    if not on_gpu:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    trainer, session = local_trainer(
        config, init_model, data, steps=args.steps, threads=args.threads, device=args.device
    )
    run_worker(trainer)
    stage_s = time.perf_counter() - started
    batch = config.train.global_batch_size
    rates = [report["pairs_per_s"] for report in session.reports]
    last = session.reports[-1]
    phases = {k: v for k, v in last.items() if k.startswith("startup_") or k.startswith("compile")}
    return {
        "system": "local",
        "load_average_1m_before": load,
        "stage_s": stage_s,
        "whole_pairs_per_s": args.steps * batch / stage_s,
        "loop_pairs_per_s": last["run_pairs_per_s"],
        "windows_pairs_per_s": rates,
        **window_figures(rates),
        "phases_s": phases,
    }


def print_tables(result: dict[str, Any]) -> None:
    """The systems side by side, then the Ray run's phases before its first step."""
    rows = result["systems"]
    plain = next(row for row in rows if row["system"] == "plain")
    print(
        f"\n{result['device']}: {result['steps']} steps of batch {result['batch']}, "
        f"windows of {result['window']} steps, {result['pairs'] or 'all'} pairs\n"
    )
    print(
        "| system | stage s | whole-stage pairs/s | loop pairs/s | steady pairs/s "
        "| worst window / median | whole vs plain | steady vs plain |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['system']} | {row['stage_s']:.1f} | {row['whole_pairs_per_s']:.1f} | "
            f"{row['loop_pairs_per_s']:.1f} | {row['steady_pairs_per_s']:.1f} | "
            f"{row['worst_to_median']:.2f} | "
            f"{row['whole_pairs_per_s'] / plain['whole_pairs_per_s']:.2f}x | "
            f"{row['steady_pairs_per_s'] / plain['steady_pairs_per_s']:.2f}x |"
        )
    for row in rows:
        if row["system"] != "plain" and row["phases_s"]:
            print(f"\n| before the first step ({row['system']}) | s |\n|---|---:|")
            for key, value in row["phases_s"].items():
                print(f"| {key.removeprefix('startup_').removesuffix('_s')} | {value:.2f} |")


def system_line(row: dict[str, Any]) -> str:
    """One system's figures, printed as soon as it has run."""
    return (
        f"[bench] {row['system']}: stage {row['stage_s']:.1f} s, steady "
        f"{row['steady_pairs_per_s']:.1f} pairs/s, worst window "
        f"{row['worst_to_median']:.2f} of the median; "
        + ", ".join(f"{key} {value:.1f}" for key, value in row["phases_s"].items())
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the systems; print and save the figures (the JSON is written again after each
    system, ``"complete": false`` until the last: a run cut short keeps what it measured)."""
    args = parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = build_pairs(args.workdir, args.pairs)
    import torch

    from santa.config.recipes import get_recipe

    config = get_recipe("tiny").with_overrides(overrides(args))
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "cpu_count": os.cpu_count(),
        "steps": args.steps,
        "window": args.window,
        "pairs": args.pairs,
        "batch": config.train.global_batch_size,
        "overrides": overrides(args),
        "systems": [],
        "complete": False,
    }

    def done(row: dict[str, Any]) -> None:
        result["systems"].append(row)
        print(system_line(row), flush=True)
        bench.write_json(args.output, result)

    def own_initial_model() -> str:
        from santa.train.trainer import RunSpec, prepare_initial_model

        spec = RunSpec.of(data=data, storage=str(args.workdir / "runs"), name="plain-init")
        return prepare_initial_model(config, spec)

    if args.skip_ray:
        init_model = own_initial_model()
        print(f"[bench] plain loop, {args.steps} steps ...", flush=True)
        done(run_plain(args, init_model, data))
    elif args.overlap:
        # The plain loop builds its model and compiles while the Ray run starts and
        # compiles; it steps only once the Ray run has ended (the gate).
        print(
            f"[bench] ray_jobs.pretrain, {args.steps} steps, and the plain loop compiling "
            "beside it ...",
            flush=True,
        )
        started = start_ray(args, data)
        try:
            init_model = own_initial_model()
            plain = run_plain(args, init_model, data, gate=lambda: done(finish_ray(args, started)))
        finally:
            if started["process"].poll() is None:  # the plain loop failed before its gate
                started["process"].terminate()
                started["process"].wait()
        done(plain)
    else:
        print(f"[bench] ray_jobs.pretrain, {args.steps} steps ...", flush=True)
        done(run_ray(args, data))
        init_model = str(Path(result["systems"][0]["run"]) / "init_model")
        print(f"[bench] plain loop, {args.steps} steps ...", flush=True)
        done(run_plain(args, init_model, data))
    if not args.skip_local:
        print(f"[bench] the worker loop without Ray, {args.steps} steps ...", flush=True)
        done(run_local(args, init_model, data))
    result["complete"] = True
    print_tables(result)
    bench.write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
