"""Seconds to the first compiled step by compile scope (the model, its blocks), cold and warm.

    python bench/perf/compile_time.py                  # CPU, a small T5 (runs anywhere)
    python bench/perf/compile_time.py --device cuda    # the T5-base shape of gpu_ray.py

Each row is ``bench/perf/gpu_ray.py``'s plain step in a fresh process (``--skip-ray
--skip-local``) with ``train.compile=always`` and one ``train.compile_scope``: **cold** with
an empty Inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new folder), then **warm** in a second
process over the same folder (what a later stage or run of the same shape finds once santa's
compile cache has put the saved graphs back, ``santa/train/compile_cache.py``). The figure is
the plain loop's stage seconds (model load + compile + the steps) minus those of an
uncompiled run of the same steps; the steady pairs/s of each scope is given beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402

RESULTS = common.RESULTS_DIR / "compile_time.json"
CPU_SHAPE = (
    "model.tiny_d_model=64",
    "model.tiny_num_layers=4",
    "model.tiny_num_heads=4",
    "model.tiny_d_ff=128",
    "train.global_batch_size=16",
    "train.max_query_length=24",
    "train.max_document_length=64",
    "train.max_target_length=16",
)


def plain_run(args: argparse.Namespace, settings: list[str], cache_dir: str) -> dict[str, Any]:
    """One plain-loop run in a fresh process; its figures."""
    with tempfile.TemporaryDirectory(prefix="santa-compile-") as out:
        output = Path(out) / "run.json"
        command = [
            sys.executable,
            str(common.ROOT / "bench" / "perf" / "gpu_ray.py"),
            "--device",
            args.device,
            "--skip-ray",
            "--skip-local",
            "--steps",
            str(args.steps),
            "--window",
            str(max(1, args.steps // 3)),
            "--workdir",
            str(args.workdir),
            "--output",
            str(output),
        ]
        shape = list(CPU_SHAPE) if args.device == "cpu" else []
        if args.layers:
            shape.append(f"model.tiny_num_layers={args.layers}")
        for override in [*shape, *settings]:
            command += ["--set", override]
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
        process = subprocess.run(command, env=env, capture_output=True, text=True)
        if process.returncode:
            raise RuntimeError(f"gpu_ray.py failed:\n{(process.stdout + process.stderr)[-2000:]}")
        result = json.loads(output.read_text())
    plain = result["systems"][0]
    return {"stage_s": plain["stage_s"], "steady_pairs_per_s": plain["steady_pairs_per_s"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=12, help="in three windows")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument(
        "--layers", type=int, default=0, help="layers of each stack (default: the shape's)"
    )
    parser.add_argument("--scopes", nargs="+", default=["model", "blocks"], help="compile scopes")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/santa-compile-time"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="santa-inductor-") as unused:
        eager = plain_run(args, ["train.compile=never"], unused)
    rows = []
    for scope in args.scopes:
        settings = [
            "train.compile=always",
            f"train.compile_backend={args.backend}",
            f"train.compile_scope={scope}",
        ]
        with tempfile.TemporaryDirectory(prefix="santa-inductor-") as cache:
            for state in ("cold", "warm"):
                print(f"[bench] {scope}, {state} ...", flush=True)
                run = plain_run(args, settings, cache)
                rows.append(
                    {
                        "scope": scope,
                        "cache": state,
                        "compile_s": run["stage_s"] - eager["stage_s"],
                        **run,
                    }
                )
    print(f"\n{args.device}, {args.backend}: {args.steps} steps; eager {eager['stage_s']:.1f} s\n")
    print("| compile scope | Inductor cache | compile s | steady pairs/s |")
    print("|---|---|---:|---:|")
    for row in rows:
        print(
            f"| {row['scope']} | {row['cache']} | {row['compile_s']:.1f} | "
            f"{row['steady_pairs_per_s']:.1f} |"
        )
    result = {
        "device": args.device,
        "steps": args.steps,
        "layers": args.layers or None,
        "eager": eager,
        "rows": rows,
    }
    bench.write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
