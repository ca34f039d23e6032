"""Where a training worker's memory goes: the worker loop (without Ray) phase by phase.

    python bench/perf/memory.py                      # all-MiniLM-L6-v2 at batch 64 (issue 37)
    python bench/perf/memory.py --recipe tiny --batch 16

The loop is the one Ray Train runs (``WorkerTrainer`` through
:class:`~santa.train.session.LocalSession`), on standard-library pairs. After each phase the
bench reads the process's resident memory (RSS) and its peak so far (``ru_maxrss``, what the
loop reports as ``max_rss_mb``), and it counts what it can name: the tokenized set's arrays,
the parameters, their gradients and the optimizer's state, and the activations the first
step keeps for its backward pass (every tensor autograd saves, through
``torch.autograd.graph.saved_tensors_hooks``, each storage once). What is left of the peak
is the step's transient tensors (attention scores and softmax before they are saved or
freed, the loss's similarity matrix) and the allocator's slack. A Ray Train worker adds
Ray's own core worker and Ray Data's read-ahead to this (``bench/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402
from bench.perf import gpu_ray  # noqa: E402

RESULTS = common.RESULTS_DIR / "memory.json"
MB = 2**20


def rss_mb() -> float:
    """Resident memory now."""
    import psutil

    return psutil.Process().memory_info().rss / MB


def peak_mb() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class SavedTensors:
    """Bytes autograd saves for backward while active (each storage counted once)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}
        self.shapes: dict[int, str] = {}

    def pack(self, tensor):
        import torch

        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
            dtype = str(tensor.dtype).removeprefix("torch.")
            self.shapes[storage.data_ptr()] = f"{tuple(tensor.shape)} {dtype}"
        return tensor

    def largest(self, count: int = 8) -> list[dict[str, Any]]:
        """The shapes that hold the most saved bytes: how many tensors, how many MB."""
        by_shape: dict[str, list[int]] = {}
        for pointer, size in self.storages.items():
            by_shape.setdefault(self.shapes[pointer], []).append(size)
        rows = [
            {"shape": shape, "tensors": len(sizes), "mb": sum(sizes) / MB}
            for shape, sizes in by_shape.items()
        ]
        return sorted(rows, key=lambda row: row["mb"], reverse=True)[:count]

    @staticmethod
    def unpack(tensor):
        return tensor

    @property
    def mb(self) -> float:
        return sum(self.storages.values()) / MB


def tensors_mb(tensors) -> float:
    """Bytes of distinct storages among ``tensors``."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()) / MB


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The phases of one worker loop, with what each adds."""
    phases: list[dict[str, Any]] = []

    def phase(name: str, **named: float) -> None:
        phases.append({"phase": name, "rss_mb": rss_mb(), "peak_mb": peak_mb(), **named})
        print(f"[bench] {name}: rss {phases[-1]['rss_mb']:,.0f} MB", flush=True)

    phase("python")
    import torch

    from bench.corpora import write_stdlib_pairs
    from santa.config.recipes import get_recipe

    torch.set_num_threads(args.threads)
    phase("imports (torch, transformers, santa's loop)")
    data = write_stdlib_pairs(args.workdir, limit=args.pairs)
    config = get_recipe(args.recipe).with_overrides(
        [f"train.global_batch_size={args.batch}", "train.compile=never", *args.overrides]
    )
    if config.model.is_tiny:
        from santa.train.trainer import RunSpec, prepare_initial_model

        spec = RunSpec.of(data=data, storage=str(args.workdir / "runs"), name="memory")
        init_model = prepare_initial_model(config, spec)
    else:
        init_model = config.model.backbone
    trainer, _ = gpu_ray.local_trainer(
        config, init_model, data, steps=args.steps, threads=args.threads, device="cpu"
    )
    parameters = list(trainer.model.parameters())
    phase("model, optimizer, row file", named_mb=tensors_mb(parameters))
    # What train() sets before its first step.
    trainer.run_started, trainer.run_first_step = time.perf_counter(), trainer.state["step"]
    trainer.loop_started_at = time.time()
    batches = trainer._batches()
    saved = SavedTensors()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        trainer.train_step(next(batches))
    gradients = [p.grad for p in parameters if p.grad is not None]
    state = [
        value
        for per_parameter in trainer.optimizer.state.values()
        for value in per_parameter.values()
        if isinstance(value, torch.Tensor) and value.numel() > 1
    ]
    phase(
        "first step",
        activations_saved_mb=saved.mb,
        gradients_mb=tensors_mb(gradients),
        optimizer_state_mb=tensors_mb(state),
    )
    for _ in range(args.steps - 1):
        trainer.train_step(next(batches))
    phase(f"{args.steps} steps")
    trainer.close(publish=False)
    return {
        "attention": getattr(trainer.model.backbone.config, "_attn_implementation", None),
        "saved_by_shape": saved.largest(),
        "recipe": args.recipe,
        "batch": args.batch,
        "lengths": [
            config.train.max_query_length,
            config.train.max_document_length,
            config.train.max_target_length,
        ],
        "parameters": sum(p.numel() for p in parameters),
        "rows": trainer.row_file.num_rows,
        "phases": phases,
    }


def print_table(result: dict[str, Any]) -> None:
    """Each phase with what it added to the peak and what the bench can name in it."""
    print(
        f"\n{result['recipe']}: batch {result['batch']}, lengths {result['lengths']}, "
        f"{result['parameters'] / 1e6:.1f} M parameters, {result['rows']:,} pairs\n"
    )
    print("| phase | RSS MB | peak MB | peak added MB | named in it |")
    print("|---|---:|---:|---:|---|")
    previous = 0.0
    for row in result["phases"]:
        named = ", ".join(
            f"{key.removesuffix('_mb').replace('_', ' ')} {value:,.0f}"
            for key, value in row.items()
            if key.endswith("_mb") and key not in ("rss_mb", "peak_mb")
        )
        print(
            f"| {row['phase']} | {row['rss_mb']:,.0f} | {row['peak_mb']:,.0f} | "
            f"{row['peak_mb'] - previous:+,.0f} | {named or '-'} |"
        )
        previous = row["peak_mb"]
    print(f"\nactivations saved for backward, by shape (attention: {result['attention']})\n")
    print("| shape | tensors | MB |")
    print("|---|---:|---:|")
    for row in result["saved_by_shape"]:
        print(f"| {row['shape']} | {row['tensors']} | {row['mb']:,.0f} |")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="minilm")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/santa-memory"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = measure(args)
    print_table(result)
    bench.write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
