"""SCodeR (Algorithm 2) against its own warm-up, on the same pairs and the same steps.

    python bench/quality/scoder.py --cosqa ../shared/fixtures/cosqa/cosqa-dev.json
    python bench/quality/scoder.py --cosqa ... --recipe tiny-scoder --warmup-steps 4 --steps 4 \\
        --max-files 40                                  # a smoke run

The corpus is this Python's standard library preprocessed by santa's pipeline (docstring →
code pairs plus ASST code–code pairs, split by file), so the held-out test split is whole
files no model trained on. Three dual encoders are scored on the CoSQA dev set (real web
queries) and on the held-out standard-library functions (MRR@100):

- ``warm-up``: the in-batch-negative warm-up of the SCodeR run (``--warmup-steps``);
- ``in-batch, same steps``: the warm-up continued with in-batch negatives for as many
  dual-encoder steps as SCodeR's iterations take (``--iterations × --steps``);
- ``scoder``: the warm-up, then ``--iterations`` of mine → discriminators → soft labels →
  dual encoder (``--steps`` steps per stage).

Also the discriminators' held-out accuracy per iteration and where an iteration's time
goes (mining, examples, discriminators, soft labels, dual encoder). Prints tables and
writes ``bench/results/scoder.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from santa.cluster.ray_utils import init_ray
from santa.config.recipes import get_recipe
from santa.data.cosqa import write_cosqa_beir
from santa.data.plan import PreprocessConfig, run_preprocess
from santa.data.source import default_source_root
from santa.eval import EvalConfig, evaluate
from santa.files import storage
from santa.files.layout import RunLayout
from santa.scoder.algorithm import format_table, run_algorithm
from santa.train.trainer import RunSpec, fit

RESULTS = common.RESULTS_DIR / "scoder.json"

PHASES = ("mine_s", "examples_s", "discriminators_s", "soft_labels_s", "dual_encoder_s")


def build_corpus(work: Path, max_files: int) -> tuple[str, str, dict[str, int]]:
    """Standard-library pairs (train split, with ASST), the test split as BEIR, and sizes."""
    tree = work / "stdlib"
    tree.mkdir()
    files = sorted(Path(default_source_root()).glob("*.py"))
    for path in files[:max_files] if max_files else files:
        shutil.copy(path, tree)
    options = {"dataset": "source", "input": str(tree), "languages": ("python",)}
    pairs, test = str(work / "pairs"), str(work / "test")
    report = run_preprocess(
        PreprocessConfig(output=pairs, stage="finetune", split="train", asst=True, **options)
    )
    print(f"pairs: {report['rows_written']:,} code, {report['asst']['written']:,} ASST", flush=True)
    heldout = run_preprocess(PreprocessConfig(output=test, stage="eval", split="test", **options))
    sizes = {
        "code_pairs": report["rows_written"],
        "asst_pairs": report["asst"]["written"],
        "stdlib_test_queries": heldout["rows_written"],
    }
    print(f"held-out test functions: {sizes['stdlib_test_queries']:,}", flush=True)
    return pairs, test, sizes


def mrr(model: str, beir: str, split: str) -> float:
    """MRR@100 of ``model`` on a BEIR folder."""
    config = EvalConfig(split=split, baseline=None, progress=False)
    return float(evaluate(model, beir, config)["model"]["mrr@100"])


def main(argv: list[str] | None = None) -> int:
    """Build the corpus, train the three systems, evaluate, print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cosqa", required=True, help="cosqa-dev.json")
    parser.add_argument("--recipe", default="minilm-scoder")
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--steps", type=int, default=50, help="per stage and iteration")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-files", type=int, default=0, help="stdlib files (0: all)")
    parser.add_argument("--soft-labels", choices=("offline", "online"), default="offline")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="train every stage in this process on one worker (RunSpec.in_process: the same "
        "loop as a one-worker Ray run, without Ray Train's start-up)",
    )
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bench = common.BenchRun(__file__, argv)
    work = Path(tempfile.mkdtemp(prefix="santa-scoder-bench-"))
    print(init_ray(), flush=True)
    started = time.time()
    pairs, test, sizes = build_corpus(work, args.max_files)
    cosqa = str(work / "cosqa")
    write_cosqa_beir(args.cosqa, cosqa)
    corpus_s = time.time() - started
    config = get_recipe(args.recipe).with_overrides(
        [
            f"train.num_workers={1 if args.in_process else 2}",
            f"train.global_batch_size={args.batch}",
            "train.log_every=10",
            f"scoder.iterations={args.iterations}",
            f"scoder.warmup_steps={args.warmup_steps}",
            f"scoder.discriminator_steps={args.steps}",
            f"scoder.dual_encoder_steps={args.steps}",
            f"scoder.soft_labels={args.soft_labels}",
            *args.overrides,
        ]
    )
    layout = RunLayout(str(work / "runs" / "scoder"))
    report = run_algorithm(
        config,
        data=pairs,
        layout=layout,
        recipe=args.recipe,
        cpus_per_worker=0.5,
        in_process=args.in_process,
    )
    scoder_s = report["total_s"]

    # The in-batch baseline: the warm-up's weights, as many more dual-encoder steps.
    extra = args.iterations * args.steps
    clock = time.time()
    baseline = fit(
        config.with_overrides([f"train.max_steps={extra}", f"train.checkpoint_every={extra}"]),
        RunSpec.of(
            data=pairs,
            storage=str(work / "runs"),
            name="in-batch",
            cpus_per_worker=0.5,
            warm_start=report["warmup"]["model"],
            in_process=args.in_process,
        ),
    )
    baseline_s = time.time() - clock
    systems = {
        "warm-up": report["warmup"]["model"],
        "in-batch, same steps": storage.join(baseline.checkpoint.path, "model"),
        "scoder": report["dual_encoder"],
    }
    results = {
        name: {
            "cosqa_mrr@100": mrr(model, cosqa, "test"),
            "stdlib_mrr@100": mrr(model, test, "test"),
        }
        for name, model in systems.items()
    }
    steps = {
        "warm-up": args.warmup_steps,
        "in-batch, same steps": args.warmup_steps + extra,
        "scoder": args.warmup_steps + extra,
    }
    header = [args.recipe, "dual-encoder steps", "CoSQA dev MRR@100", "stdlib test MRR@100"]
    rows = [
        [name, steps[name], f"{row['cosqa_mrr@100']:.4f}", f"{row['stdlib_mrr@100']:.4f}"]
        for name, row in results.items()
    ]
    print("\n" + common.format_table(header, rows))
    print("\nper iteration:\n" + format_table(report["iterations"]))
    print("\nseconds per iteration: " + ", ".join(PHASES))
    for metrics in report["iterations"]:
        print(f"  {metrics['iteration']}: " + ", ".join(f"{metrics[p]:.0f}" for p in PHASES))
    payload = {
        "recipe": args.recipe,
        "batch": args.batch,
        "warmup_steps": args.warmup_steps,
        "steps_per_stage": args.steps,
        "iterations": args.iterations,
        "soft_labels": args.soft_labels,
        "corpus": sizes,
        "results": results,
        "per_iteration": report["iterations"],
        "seconds": {
            "corpus": corpus_s,
            "warmup": report["warmup"]["seconds"],
            "scoder_total": scoder_s,
            "in_batch_baseline": baseline_s,
        },
    }
    bench.write_json(args.output, payload)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
