"""How far two processes scale on this machine, with no Ray at all: the yardstick for the
actor-scaling figures (index encoding, the sharded mining refresh).

    python bench/perf/cpu_scaling.py [--iterations 400] [--rounds 2]

Each process runs the same loop of 1-thread torch matmuls (a transformer layer's shapes:
64 × 128 × 256); 1 process, then 2 at once, ``--rounds`` times. The speed-up is the two
processes' throughput over one's, taken when the slower of the two ends. Results: a table
and ``bench/results/cpu_scaling.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402


def _loop(iterations: int, results) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(64, 128, 256)
    w = torch.randn(256, 256)
    started = time.perf_counter()
    for _ in range(iterations):
        torch.relu(x @ w) @ w.T
    results.put(time.perf_counter() - started)


def measure(processes: int, iterations: int) -> dict:
    """``processes`` loops at once: each one's seconds, and their throughput together."""
    context = mp.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=_loop, args=(iterations, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    seconds = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return {
        "processes": processes,
        "seconds": [round(s, 2) for s in seconds],
        "iterations_per_s": round(processes * iterations / max(seconds), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    rounds = []
    for _ in range(args.rounds):
        one, two = measure(1, args.iterations), measure(2, args.iterations)
        rounds.append(
            {
                "one": one,
                "two": two,
                "speedup": round(two["iterations_per_s"] / one["iterations_per_s"], 2),
            }
        )
    rows = [
        [i + 1, r["one"]["iterations_per_s"], r["two"]["iterations_per_s"], f"{r['speedup']}×"]
        for i, r in enumerate(rounds)
    ]
    print(common.format_table(["round", "1 process it/s", "2 processes it/s", "speed-up"], rows))
    target = args.output or common.RESULTS_DIR / "cpu_scaling.json"
    print(f"wrote {bench.write_json(target, {'iterations': args.iterations, 'rounds': rounds})}")


if __name__ == "__main__":
    main()
