"""The tiny decoder's training speed on CPU: full weights or LoRA, one worker, or two gloo
workers with DDP or FSDP.

    python bench/perf/decoder.py [--steps 40] [--window 5] [--pairs 640]

Every system trains the ``tiny-decoder`` recipe (a random-init Qwen2-shaped decoder, 2
layers, 128 wide; batch 16, lengths 32/128, last-token pooling) from the same initial
weights on the same standard-library pairs, through the real worker loop without Ray
(:class:`~santa.train.session.LocalSession`; two workers are two processes of one gloo
group, one torch thread each):

- ``full``: every weight trains, one worker;
- ``lora``: LoRA adapters (rank 8 on every projection) train, one worker;
- ``ddp x2`` / ``fsdp x2`` / ``fsdp+lora x2``: the same global batch on two workers,
  ``train.strategy=ddp`` or ``fsdp`` (FSDP2, each Qwen2 block sharded).

Figures per system: **steps/s** and pairs/s (the median logged window after the first: the
loop's own ``step_time_s``, data and reports included), the trainable parameters, and the
size of its last checkpoint (model and optimizer state). On a machine other work shares,
one run's speed says more about its neighbours than about itself: the systems run in
``--rounds`` interleaved rounds, and the table gives each system's fastest round (the
least disturbed) beside the slowest; every round is in the JSON with the load average.
Prints a table; writes ``bench/results/decoder.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402

RESULTS = common.RESULTS_DIR / "decoder.json"
LORA = ("model.lora_rank=8", "model.lora_alpha=16", "model.lora_target_modules=all-linear")
SYSTEMS = {
    "full": (1, ()),
    "lora": (1, LORA),
    "ddp x2": (2, ("train.strategy=ddp",)),
    "fsdp x2": (2, ("train.strategy=fsdp",)),
    "fsdp+lora x2": (2, ("train.strategy=fsdp", *LORA)),
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def train_rank(rank: int, world: int, port: int, loop: dict, root: str, out: str) -> None:
    """One worker of a run: the loop on a :class:`LocalSession` of a gloo group of
    ``world`` (a spawned process; none for one worker); rank 0 writes its reports."""
    import torch.distributed as dist

    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.loop_config import LoopConfig
    from santa.train.session import LocalSession

    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    try:
        session = LocalSession(checkpoint_root=root, rank=rank, world_size=world)
        trainer = WorkerTrainer(LoopConfig.from_dict(loop), session)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        run_worker(trainer)
        if rank == 0:
            payload = {"reports": session.reports, "trainable": trainable}
            Path(out).write_text(json.dumps(payload))
    finally:
        if world > 1:
            dist.destroy_process_group()


def run_system(name: str, config, init: str, data: str, work: Path) -> dict[str, Any]:
    """One system's run; its windows, trainable parameters and checkpoint size."""
    import torch.multiprocessing as mp

    from santa.train.loop_config import LoopConfig

    world, overrides = SYSTEMS[name]
    loop = LoopConfig(
        santa=config.with_overrides(list(overrides)),
        init_model=init,
        data_uri=data,
        row_cache=str(work / "rows"),
    ).to_dict()
    root, out = work / name.replace(" ", "_"), work / f"{name.replace(' ', '_')}.json"
    if world == 1:
        train_rank(0, 1, 0, loop, str(root), str(out))
    else:
        mp.spawn(train_rank, args=(world, _free_port(), loop, str(root), str(out)), nprocs=world)
    result = json.loads(out.read_text())
    step_times = [r["step_time_s"] for r in result["reports"][1:]] or [
        r["step_time_s"] for r in result["reports"]
    ]
    step_s = statistics.median(step_times)
    last = max(root.glob("checkpoint_*"))
    size = sum(p.stat().st_size for p in last.rglob("*") if p.is_file())
    shutil.rmtree(root)  # the next round starts afresh (no resume)
    return {
        "system": name,
        "workers": world,
        "steps_per_s": 1.0 / step_s,
        "trainable_parameters": result["trainable"],
        "checkpoint_mb": size / 2**20,
        "load_average_1m": os.getloadavg()[0],
        "windows_step_time_s": [r["step_time_s"] for r in result["reports"]],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=640, help="training pairs (0: all)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each system")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)

    import dataclasses

    from bench.corpora import stdlib_pair_rows, write_pairs
    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer

    config = get_recipe("tiny-decoder").with_overrides(
        [
            f"train.max_steps={args.steps}",
            f"train.log_every={args.window}",
            f"train.checkpoint_every={args.steps}",
        ]
    )
    rows = stdlib_pair_rows()
    rows = rows[: args.pairs] if args.pairs else rows
    systems = []
    with tempfile.TemporaryDirectory(prefix="santa-bench-decoder-") as scratch:
        work = Path(scratch)
        data = write_pairs(work / "pairs", rows)
        tokenizer = train_tokenizer(
            [r["query"] for r in rows] + [r["document"] for r in rows],
            vocab_size=config.model.tiny_vocab_size,
        )
        base = dataclasses.replace(config.model, lora_rank=0)
        model = DualEncoder.build_tiny(base, tokenizer, seed=config.train.seed)
        model.save_pretrained(str(work / "init"), santa_config=config)
        parameters = sum(p.numel() for p in model.parameters())
        names = args.systems.split(",")
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for round_number in range(args.rounds):
            for name in names:
                print(f"[bench] round {round_number + 1}: {name}", flush=True)
                rounds[name].append(run_system(name, config, str(work / "init"), data, work))
        for name in names:
            runs = rounds[name]
            best = max(runs, key=lambda run: run["steps_per_s"])
            systems.append(
                {
                    **{k: v for k, v in best.items() if k != "windows_step_time_s"},
                    "pairs_per_s": best["steps_per_s"] * config.train.global_batch_size,
                    "slowest_steps_per_s": min(run["steps_per_s"] for run in runs),
                    "rounds": runs,
                }
            )
    payload = {
        "model": "tiny-decoder (Qwen2-shaped, 2 layers, 128 wide)",
        "parameters": parameters,
        "batch": config.train.global_batch_size,
        "lengths": [config.train.max_query_length, config.train.max_document_length],
        "steps": args.steps,
        "rounds": args.rounds,
        "pairs": len(rows),
        "systems": systems,
    }
    print(format_table(payload))
    bench.write_json(args.output, payload)
    return payload


def format_table(payload: dict[str, Any]) -> str:
    """The systems side by side."""
    rows = [
        [
            s["system"],
            str(s["workers"]),
            f"{s['steps_per_s']:.2f}",
            f"{s['slowest_steps_per_s']:.2f}",
            f"{s['pairs_per_s']:.1f}",
            f"{s['trainable_parameters']:,}",
            f"{s['checkpoint_mb']:.2f}",
        ]
        for s in payload["systems"]
    ]
    header = [
        "system",
        "workers",
        "steps/s (fastest round)",
        "slowest round",
        "pairs/s",
        "trainable params",
        "checkpoint MB",
    ]
    return common.format_table(header, rows)


if __name__ == "__main__":
    main()
