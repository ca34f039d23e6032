"""What the training loop costs per step beyond the step itself: a near-zero model at the
real batch through Ray, through the worker loop without Ray, and through the plain loop.

    python bench/perf/step_overhead.py                 # the device there is (GPU, else CPU)
    python bench/perf/step_overhead.py --profile       # + the top host ops of 5 loop steps

The model is a T5 of one layer, ``d_model`` 8, 400 tokens (the ``tiny`` recipe shrunk), at global
batch 128 and the lengths of the paper's code runs (50/240/60), so that a step's own work
is next to nothing and what is left is the loop's: reading and copying batches, the
objective's host work, the window metrics, Ray's data ingest and reports. Three systems
run the same steps (``bench/perf/gpu_ray.py`` runs them): ``ray`` (``ray_jobs.pretrain``),
``local`` (the same worker loop in this process, :class:`~santa.train.session.LocalSession`)
and ``plain`` (the step alone on random ids). Figures: milliseconds per step (median and
p90 over the logged windows after the first), the overhead beyond ``plain``, and the
tensor reads per step of the worker loop (each one a host-device sync on a GPU), counted
over a short local run. ``--profile``: a ``torch.profiler`` table of the worker loop's top
host ops over 5 steps, and its trace in the work folder.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402
from bench.perf import gpu_ray  # noqa: E402

RESULTS = common.RESULTS_DIR / "step_overhead.json"
NEAR_ZERO = (
    "model.tiny_d_model=8",
    "model.tiny_num_layers=1",
    "model.tiny_num_heads=1",
    "model.tiny_d_ff=8",
    "model.tiny_vocab_size=400",
    "train.global_batch_size=128",
    "train.max_query_length=50",
    "train.max_document_length=240",
    "train.max_target_length=60",
    "train.compile=never",
)


def step_ms(rates: list[float], batch: int) -> dict[str, float]:
    """Per-step milliseconds of the windows after the first: median and 90th percentile."""
    after = rates[1:] or rates
    per_step = sorted(1000.0 * batch / rate for rate in after if rate > 0)
    p90 = per_step[min(len(per_step) - 1, int(round(0.9 * (len(per_step) - 1))))]
    return {"ms_per_step_median": statistics.median(per_step), "ms_per_step_p90": p90}


def reads_per_step(args: argparse.Namespace, init_model: str, data: str, steps: int) -> float:
    """Tensor reads per step of the worker loop (without Ray) over ``steps`` steps."""
    probe = argparse.Namespace(**{**vars(args), "steps": steps})
    with common.counting_tensor_reads() as reads:
        gpu_ray.run_local(probe, init_model, data)
    return sum(reads.values()) / steps


def profile_local(args: argparse.Namespace, init_model: str, data: str) -> list[dict[str, Any]]:
    """The worker loop's top-10 host ops over 5 steps (after 3 unprofiled ones)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    gpu_ray.run_local(argparse.Namespace(**{**vars(args), "steps": 3}), init_model, data)
    with profile(activities=activities) as profiler:
        gpu_ray.run_local(argparse.Namespace(**{**vars(args), "steps": 5}), init_model, data)
    trace = args.workdir / "step_overhead_trace.json"
    profiler.export_chrome_trace(str(trace))
    events = sorted(
        profiler.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True
    )
    print(f"[bench] trace: {trace}")
    rows = [
        {
            "op": event.key,
            "calls": event.count,
            "self_cpu_ms": event.self_cpu_time_total / 1000.0,
            "device_ms": getattr(event, "self_device_time_total", 0.0) / 1000.0,
        }
        for event in events[:10]
    ]
    del torch
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    own, rest = parser.parse_known_args(argv)
    shape = [part for override in NEAR_ZERO for part in ("--set", override)]
    bench_argv = [
        "--steps",
        str(own.steps),
        "--window",
        str(own.window),
        "--pairs",
        "0",
        "--output",
        str(common.RESULTS_DIR / "step_overhead_systems.json.tmp"),
        "--no-overlap",  # nothing compiles here; the local system reuses the Ray run's model
        *shape,
        *rest,
    ]
    args = gpu_ray.parse_args(bench_argv)
    bench = common.BenchRun(__file__, argv)
    result = gpu_ray.main(bench_argv)
    batch = result["batch"]
    plain = next(row for row in result["systems"] if row["system"] == "plain")
    plain_ms = step_ms(plain["windows_pairs_per_s"], batch)
    rows = []
    for system in result["systems"]:
        figures = step_ms(system["windows_pairs_per_s"], batch)
        rows.append(
            {
                "system": system["system"],
                **figures,
                "overhead_ms_median": figures["ms_per_step_median"]
                - plain_ms["ms_per_step_median"],
            }
        )
    init_model = (
        str(Path(result["systems"][0]["run"]) / "init_model")
        if "run" in result["systems"][0]
        else None
    )
    data = gpu_ray.build_pairs(args.workdir, args.pairs)
    out: dict[str, Any] = {"device": result["device"], "batch": batch, "steps": own.steps}
    if init_model and any(row["system"] == "local" for row in rows):
        out["tensor_reads_per_step"] = reads_per_step(args, init_model, data, steps=20)
        if own.profile:
            out["top_host_ops"] = profile_local(args, init_model, data)
    out["systems"] = rows
    print(f"\n{out['device']}: near-zero T5 (1 layer, d_model 8), batch {batch}\n")
    print("| system | ms/step median | ms/step p90 | overhead vs plain, ms |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['system']} | {row['ms_per_step_median']:.1f} | "
            f"{row['ms_per_step_p90']:.1f} | {row['overhead_ms_median']:+.1f} |"
        )
    if "tensor_reads_per_step" in out:
        print(f"\ntensor reads per step (worker loop): {out['tensor_reads_per_step']:.2f}")
    for op in out.get("top_host_ops", []):
        print(f"  {op['op'][:60]:60s} {op['calls']:6d} calls {op['self_cpu_ms']:9.1f} ms")
    bench.write_json(own.output, out)
    return out


if __name__ == "__main__":
    main()
