"""Training speed side by side: santa against sentence-transformers and a plain loop.

Four ways to fine-tune all-MiniLM-L6-v2 (the ``minilm-finetune`` recipe: mean pooling,
cosine similarity, temperature 0.05 = sentence-transformers' scale 20) on the same
standard-library docstring → code pairs, at the same global batch, learning rate and
number of steps, with two CPU threads each:

- ``santa-ray``: ``python -m ray_jobs.finetune`` on a local Ray, 2 Ray Train workers of
  one thread (DDP, global in-batch negatives), final checkpoint included;
- ``santa-local``: santa's step (tokenizer, model, DR loss) in one process without Ray;
- ``st-mnrl``: sentence-transformers' ``SentenceTransformerTrainer`` with
  ``MultipleNegativesRankingLoss``;
- ``st-cached``: the same with ``CachedMultipleNegativesRankingLoss`` (mini-batches of
  ``--mini-batch``), its answer to large batches on small memory;
- ``santa-cached``: ``santa-local`` with santa's GradCache (``train.grad_cache_chunk_size``
  = ``--mini-batch``), to set beside ``st-cached`` at the same batch and chunk size.

Every run is its own subprocess, started in turn (A B C D A B C D …) so that slow drift of
a shared machine hits every system alike; the 1-minute load average before each run is
recorded. Two figures per run:

- **loop pairs/s**: pairs per second of the training steps after the first ``--window``
  (tokenization and data loading included, start-up and saving excluded);
- **end to end**: wall seconds of the whole subprocess (interpreter and library imports,
  Ray start, data loading, model loading, training, writing the final model).

From the two follows each system's **fixed cost**: end to end less the steps at the loop's
rate (start-up, the slower first steps, saving). With it the table says for which run
lengths a system finishes no later than the reference: ``from N`` steps on for a faster
loop with more fixed cost (``N = (fixed - fixed_ref) / (s_ref - s)``, ``s`` seconds per
step in the loop), ``up to N`` for the reverse, ``always`` or ``never``.

santa pads every batch to the full lengths (``--query-length``/``--doc-length``);
sentence-transformers pads each batch to its longest text (one ``max_seq_length`` =
``--doc-length`` for both sides).

    python bench/perf/versus_st.py [--steps 20] [--batch 32] [--repeats 2]
    python bench/perf/versus_st.py --systems santa-local,st-mnrl --steps 4 --batch 8 --repeats 1

Prints a table and writes ``bench/results/versus_st.json`` and ``versus_st.png`` (medians
and every run). Needs the ``bench`` extra (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/perf/versus_st.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common

SYSTEMS = ("santa-ray", "santa-local", "st-mnrl", "st-cached", "santa-cached")
LABELS = {
    "santa-ray": "santa, Ray Train 2 workers x 1 thread",
    "santa-local": "santa's loop, 1 process x 2 threads, no Ray",
    "st-mnrl": "sentence-transformers, MNRL, 2 threads",
    "st-cached": "sentence-transformers, CachedMNRL, 2 threads",
    "santa-cached": "santa's loop with GradCache, 1 process x 2 threads, no Ray",
}
RECIPE = "minilm-finetune"
RESULTS = common.RESULTS_DIR / "versus_st.json"


def recipe_overrides(args: argparse.Namespace) -> list[str]:
    """The recipe changes every santa system runs with."""
    overrides = [
        *args.overrides,
        f"train.global_batch_size={args.batch}",
        f"train.max_query_length={args.query_length}",
        f"train.max_document_length={args.doc_length}",
        f"train.seed={args.seed}",
    ]
    if args.learning_rate:
        overrides.append(f"train.learning_rate={args.learning_rate}")
    return overrides


def loop_pairs_per_s(step_ends: list[float], started: float, batch: int, window: int) -> float:
    """Pairs/s over the steps after the first ``window``, from each step's end time."""
    if len(step_ends) <= window:
        raise ValueError(f"need more than {window} steps to time, got {len(step_ends)}")
    first = step_ends[window - 1] if window else started
    seconds = step_ends[-1] - first
    return batch * (len(step_ends) - window) / seconds


# --- children: one system, one run ------------------------------------------------------


def child_santa_local(args: argparse.Namespace, cached: bool = False) -> dict:
    """santa's own worker loop in this process (``WorkerTrainer`` without Ray: its reader,
    step, optimizer and schedule): DR loss on the pairs; with ``cached``, GradCache in chunks
    of ``--mini-batch`` pairs."""
    import torch

    from bench.perf.gpu_ray import local_trainer
    from santa.config.recipes import get_recipe
    from santa.train.loop import run_worker

    torch.set_num_threads(args.threads)
    config = get_recipe(RECIPE).with_overrides(
        [
            *recipe_overrides(args),
            f"train.max_steps={args.steps}",
            "train.log_every=1",
            "train.num_workers=1",
            f"train.grad_cache_chunk_size={args.mini_batch if cached else 0}",
        ]
    )
    trainer, _ = local_trainer(
        config,
        config.model.backbone,
        args.data,
        steps=args.steps,
        threads=args.threads,
        device="cpu",
    )
    step, ends = trainer.train_step, []

    def timed(batch):
        values = step(batch)
        ends.append(time.perf_counter())
        return values

    trainer.train_step = timed
    started = time.perf_counter()
    run_worker(trainer)
    trainer.model.save_pretrained(str(Path(args.work) / "model"), config)
    return {"loop_pairs_per_s": loop_pairs_per_s(ends, started, args.batch, args.window)}


def child_sentence_transformers(args: argparse.Namespace, cached: bool) -> dict:
    """``SentenceTransformerTrainer`` with (Cached)MultipleNegativesRankingLoss."""
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer import losses
    from transformers import TrainerCallback

    from santa.config.recipes import get_recipe
    from santa.data.published import read_pairs

    torch.set_num_threads(args.threads)
    config = get_recipe(RECIPE).with_overrides(recipe_overrides(args))
    model = SentenceTransformer(config.model.backbone, device="cpu")
    model.max_seq_length = args.doc_length
    table = read_pairs(args.data, columns=["query", "document"])
    dataset = Dataset.from_dict(
        {"anchor": table["query"].to_pylist(), "positive": table["document"].to_pylist()}
    )
    scale = 1.0 / config.model.temperature
    if cached:
        loss = losses.CachedMultipleNegativesRankingLoss(
            model, scale=scale, mini_batch_size=args.mini_batch
        )
    else:
        loss = losses.MultipleNegativesRankingLoss(model, scale=scale)

    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *_args, **_kwargs):
            ends.append(time.perf_counter())

    training = SentenceTransformerTrainingArguments(
        output_dir=str(Path(args.work) / "trainer"),
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=config.train.learning_rate,
        # As santa's schedule: linear warm-up over this share of the steps, then linear decay.
        warmup_steps=math.ceil(args.steps * config.train.warmup_ratio),
        weight_decay=config.train.weight_decay,
        lr_scheduler_type="linear",
        max_grad_norm=config.train.grad_clip or 1.0,
        seed=args.seed,
        save_strategy="no",
        report_to="none",
        logging_steps=max(1, args.steps),
        dataloader_drop_last=True,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=training, train_dataset=dataset, loss=loss, callbacks=[StepClock()]
    )
    started = time.perf_counter()
    trainer.train()
    model.save(str(Path(args.work) / "model"))
    return {"loop_pairs_per_s": loop_pairs_per_s(ends, started, args.batch, args.window)}


def santa_ray_argv(args: argparse.Namespace, storage: str) -> list[str]:
    """The finetune job's command line for ``santa-ray``: 2 workers of half a CPU, a
    window logged every ``--window`` steps, one checkpoint at the end."""
    argv = ["--recipe", RECIPE, "--data", args.data, "--storage", storage, "--name", "run"]
    argv += ["--num-workers", "2", "--cpus-per-worker", "0.5", "--max-steps", str(args.steps)]
    argv += ["--set", f"train.log_every={args.window}"]
    argv += ["--set", f"train.checkpoint_every={args.steps}"]
    for override in recipe_overrides(args):
        argv += ["--set", override]
    return argv


def child_santa_ray(args: argparse.Namespace) -> dict:
    """The finetune job's CLI in this process; loop pairs/s from its metrics.jsonl."""
    from ray_jobs import finetune

    storage = str(Path(args.work) / "runs")
    os.environ.setdefault("RAY_ADDRESS", "local")
    code = finetune.main(santa_ray_argv(args, storage))
    if code:
        raise RuntimeError(f"ray_jobs.finetune exited with {code}")
    windows = common.logged_windows(Path(storage) / "run")
    return {"loop_pairs_per_s": windows_pairs_per_s(windows, args.batch, args.window)}


def windows_pairs_per_s(windows: list[dict], batch: int, window: int) -> float:
    """Pairs/s of the logged windows after step ``window`` (santa's metrics.jsonl, in step
    order: :func:`bench.common.logged_windows`)."""
    pairs = seconds = 0.0
    previous = 0
    for metrics in windows:
        steps, previous = metrics["step"] - previous, metrics["step"]
        if metrics["step"] > window:
            pairs += steps * batch
            seconds += steps * batch / metrics["pairs_per_s"]
    if not seconds:
        raise ValueError(f"no logged window after step {window}")
    return pairs / seconds


def run_child(args: argparse.Namespace) -> int:
    """Run one system once and write its JSON line to ``--result``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child in ("santa-local", "santa-cached"):
        result = child_santa_local(args, cached=args.child == "santa-cached")
    elif args.child in ("st-mnrl", "st-cached"):
        result = child_sentence_transformers(args, cached=args.child == "st-cached")
    elif args.child == "santa-ray":
        result = child_santa_ray(args)
    else:
        raise SystemExit(f"unknown system {args.child!r}")
    Path(args.result).write_text(json.dumps(result))
    return 0


# --- the parent: data, interleaved runs, table, plot --------------------------------------


def build_pairs(work: Path) -> str:
    """Standard-library docstring → code pairs, as the preprocess job writes them."""
    from bench.corpora import stdlib_pair_rows, write_pairs

    return write_pairs(work / "pairs", stdlib_pair_rows())


def pq_rows(data: str) -> int:
    """Pairs in a preprocessed folder (its published ``data/*.parquet``)."""
    import pyarrow.parquet as pq

    from santa.data.published import pair_files

    return sum(pq.read_metadata(path).num_rows for path in pair_files(data))


def run_once(system: str, args: argparse.Namespace, data: str, work: Path) -> dict:
    """One subprocess run of ``system``: its own figures plus wall time and load."""
    work.mkdir(parents=True)
    result = work / "result.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        system,
        "--data",
        data,
        "--work",
        str(work),
        "--result",
        str(result),
        *passthrough(args),
    ]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=common.ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0 or not result.exists():
        # A system that cannot run this setting (out of memory at a large batch) is a
        # result, not the end of the benchmark: recorded with its reason and left out.
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        return {
            "system": system,
            "end_to_end_s": wall,
            "load_before": load,
            "failed": failure_reason(done.returncode, done.stdout + done.stderr),
            "output_tail": tail,
        }
    figures = json.loads(result.read_text())
    return {"system": system, "end_to_end_s": wall, "load_before": load, **figures}


def failure_reason(code: int, output: str) -> str:
    """``out of memory`` (Ray's OOM killer, torch, the kernel's SIGKILL) or ``exit N``."""
    lowered = output.lower()
    if "out of memory" in lowered or "outofmemory" in lowered or code in (-9, 137):
        return "out of memory"
    return f"exit {code}"


def passthrough(args: argparse.Namespace) -> list[str]:
    """The settings every child gets."""
    return [
        f"--steps={args.steps}",
        f"--batch={args.batch}",
        f"--window={args.window}",
        f"--query-length={args.query_length}",
        f"--doc-length={args.doc_length}",
        f"--mini-batch={args.mini_batch}",
        f"--threads={args.threads}",
        f"--seed={args.seed}",
        f"--learning-rate={args.learning_rate}",
        *(f"--set={override}" for override in args.overrides),
    ]


def fixed_seconds(end_to_end_s: float, steps: int, batch: int, loop_pairs_per_s: float) -> float:
    """A run's wall time that is not its steps at the loop's rate (start-up, first steps,
    saving): what it costs whatever the number of steps."""
    return end_to_end_s - steps * batch / loop_pairs_per_s


def crossover(row: dict, base: dict, batch: int) -> str:
    """Against ``base``, by run length: ``always``, ``never``, ``from N`` (a faster loop
    repays more fixed cost from step N on) or ``up to N`` (less fixed cost, slower loop).
    "Ahead" means finishing no later, end to end."""
    step, base_step = batch / row["loop_pairs_per_s"], batch / base["loop_pairs_per_s"]
    extra = row["fixed_s"] - base["fixed_s"]
    if extra <= 0 and step <= base_step:
        return "always"
    if extra >= 0 and step >= base_step:
        return "never"
    steps = abs(extra) / abs(base_step - step)  # where the two end-to-end times cross
    return f"from {math.ceil(steps)}" if extra > 0 else f"up to {math.floor(steps)}"


def summarize(
    runs: list[dict], systems: list[str], reference: str, *, steps: int = 0, batch: int = 0
) -> dict[str, dict]:
    """Medians per system and ratios against ``reference`` (pairs/s: higher is better).

    With ``steps`` and ``batch``: each system's median fixed cost, and from or up to which
    step count it finishes ahead of ``reference`` (``crossover``).
    """
    summary = {}
    for system in systems:
        mine = [r for r in runs if r["system"] == system and "failed" not in r]
        if not mine:
            reasons = sorted({r["failed"] for r in runs if r["system"] == system})
            summary[system] = {"label": LABELS[system], "runs": 0, "failed": ", ".join(reasons)}
            continue
        summary[system] = {
            "label": LABELS[system],
            "runs": len(mine),
            "loop_pairs_per_s": statistics.median(r["loop_pairs_per_s"] for r in mine),
            "end_to_end_s": statistics.median(r["end_to_end_s"] for r in mine),
        }
        if steps and batch:
            summary[system]["fixed_s"] = statistics.median(
                fixed_seconds(r["end_to_end_s"], steps, batch, r["loop_pairs_per_s"]) for r in mine
            )
    if reference in summary and "failed" not in summary[reference]:
        base = summary[reference]
        for row in summary.values():
            if "failed" in row:
                continue
            row["loop_vs_reference"] = row["loop_pairs_per_s"] / base["loop_pairs_per_s"]
            row["end_to_end_vs_reference"] = base["end_to_end_s"] / row["end_to_end_s"]
            if steps and batch:
                row["ahead"] = crossover(row, base, batch)
    return summary


def format_table(summary: dict[str, dict], reference: str) -> str:
    """A markdown table of the medians."""
    header = [
        "system",
        "runs",
        "loop pairs/s",
        f"vs {reference}",
        "end to end s",
        f"speed vs {reference}",
        "fixed s",
        f"ahead of {reference} end to end, in steps",
    ]
    rows = []
    for row in summary.values():
        if "failed" in row:
            rows.append([row["label"], 0, row["failed"], "", "", "", "", ""])
            continue
        fixed = row.get("fixed_s")
        rows.append(
            [
                row["label"],
                row["runs"],
                f"{row['loop_pairs_per_s']:.2f}",
                f"{row.get('loop_vs_reference', float('nan')):.2f}x",
                f"{row['end_to_end_s']:.1f}",
                f"{row.get('end_to_end_vs_reference', float('nan')):.2f}x",
                None if fixed is None else f"{fixed:.1f}",
                row.get("ahead"),
            ]
        )
    return common.format_table(header, rows)


def plot(runs: list[dict], summary: dict[str, dict], path: Path, title: str) -> None:
    """Two panels (loop pairs/s, end-to-end seconds): median bars and every run as a dot."""
    systems = [s for s in summary if "failed" not in summary[s]]
    runs = [r for r in runs if "failed" not in r]
    figure, axes = common.new_figure(1, 2, figsize=(11, 4))
    for axis, key, label in (
        (axes[0], "loop_pairs_per_s", "training loop, pairs/s (higher is better)"),
        (axes[1], "end_to_end_s", "end to end, seconds (lower is better)"),
    ):
        axis.bar(range(len(systems)), [summary[s][key] for s in systems], color="#8fb3d9")
        for i, system in enumerate(systems):
            values = [r[key] for r in runs if r["system"] == system]
            axis.scatter([i] * len(values), values, color="black", s=12, zorder=3)
        axis.set_xticks(range(len(systems)), systems, rotation=15)
        axis.set_title(label, fontsize=10)
    figure.suptitle(title, fontsize=10)
    common.save_figure(figure, path)


def run_parent(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Interleave the systems' runs, print the table, write JSON and the plot."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"santa: error: unknown systems {unknown} (choose from {SYSTEMS})")
    work = Path(tempfile.mkdtemp(prefix="santa-versus-st-"))
    data = args.data or build_pairs(work)
    rows = pq_rows(data)
    if rows < args.batch:
        raise SystemExit(f"santa: error: {data} has {rows} pairs, fewer than --batch {args.batch}")
    # Each system has 2 threads of a 2-core machine: any other load skews the comparison.
    bench = common.BenchRun(__file__, argv, busy_above=1.0)
    print(
        f"{len(systems)} systems x {args.repeats} runs, {args.steps} steps at batch "
        f"{args.batch}, lengths {args.query_length}/{args.doc_length}",
        flush=True,
    )
    runs = []
    for repeat in range(args.repeats):
        for system in systems:
            run = run_once(system, args, data, work / f"{system}-{repeat}")
            runs.append(run)
            if "failed" in run:
                print(
                    f"  run {repeat + 1}/{args.repeats} {system}: failed ({run['failed']}) "
                    f"after {run['end_to_end_s']:.1f} s",
                    flush=True,
                )
                continue
            print(
                f"  run {repeat + 1}/{args.repeats} {system}: "
                f"{run['loop_pairs_per_s']:.2f} pairs/s in the loop, "
                f"{run['end_to_end_s']:.1f} s end to end (load {run['load_before']:.2f})",
                flush=True,
            )
    succeeded = [s for s in systems if any(r["system"] == s and "failed" not in r for r in runs)]
    if not succeeded:
        first = runs[0]
        raise SystemExit(
            f"santa: error: every run failed; {first['system']}: {first['failed']}\n"
            + first["output_tail"]
        )
    reference = "st-mnrl" if "st-mnrl" in succeeded else succeeded[0]
    summary = summarize(runs, systems, reference, steps=args.steps, batch=args.batch)
    print("\n" + format_table(summary, reference))
    payload = {
        "recipe": RECIPE,
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "output")},
        "pairs": rows,
        "summary": summary,
        "runs": runs,
    }
    output = Path(args.output)
    bench.write_json(output, payload)
    title = (
        f"all-MiniLM-L6-v2, batch {args.batch}, {args.steps} steps, "
        f"lengths {args.query_length}/{args.doc_length}, 2 CPU threads each"
    )
    plot(runs, summary, output.with_suffix(".png"), title)
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of the parent and of its children (``--child``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="global batch (pairs per step)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--window", type=int, default=5, help="first steps left out of loop")
    parser.add_argument("--query-length", type=int, default=50)
    parser.add_argument("--doc-length", type=int, default=240)
    parser.add_argument(
        "--mini-batch", type=int, default=8, help="CachedMNRL mini-batch and santa's chunk"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (one process)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--learning-rate", type=float, default=0.0, help="peak learning rate (0: the recipe's)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for every system (santa reads all of them; "
        "sentence-transformers its learning rate, warm-up, weight decay, clipping, "
        "temperature), e.g. model.gradient_checkpointing=true",
    )
    parser.add_argument("--output", default=str(RESULTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--data",
        default="",
        help="preprocessed pairs (ray_jobs.preprocess --output, local); default: the 105 "
        "standard-library pairs of the tests",
    )
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps <= args.window:
        parser.error(f"--steps ({args.steps}) must exceed --window ({args.window})")
    return run_child(args) if args.child else run_parent(args, argv)


if __name__ == "__main__":
    from santa.jobs.errors import exit_with, run_job

    exit_with(run_job(main))  # Ctrl-C: one santa line, exit 130; errors: one line
