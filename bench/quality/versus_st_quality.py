"""Retrieval quality at equal budget: santa against sentence-transformers and zero-shot.

all-MiniLM-L6-v2 fine-tuned for the same steps, batch, learning rate, warm-up and
temperature (cosine, τ = 0.05 = scale 20) on the same standard-library docstring → code
pairs, once with santa (``python -m ray_jobs.finetune``, 2 Ray Train workers, global
in-batch negatives) and once with sentence-transformers' trainer and
MultipleNegativesRankingLoss (the runs of ``bench/perf/versus_st.py``), then scored with
santa's evaluator beside the zero-shot model on:

- the CoSQA dev set (``--cosqa``): real web queries, its label-1 pairs as queries over
  all its distinct functions;
- the CodeSearchNet Ruby valid sample (``--csn``, a folder of ``valid.jsonl.gz``):
  docstring → function, preprocessed by santa's pipeline.

MRR@100 per query from ranx; a 95 % bootstrap confidence interval (queries resampled,
``--bootstrap`` times) for each system and, paired on the same resamples, for the
differences santa − sentence-transformers and each fine-tuned model − zero-shot.

    python bench/quality/versus_st_quality.py --cosqa ../shared/fixtures/cosqa/cosqa-dev.json \\
        --csn ../shared/fixtures/csn/ruby [--steps 100] [--batch 32]

Prints tables and writes ``bench/results/versus_st_quality.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.quality.scoring import bootstrap, format_interval, per_query_rr

RESULTS = common.RESULTS_DIR / "versus_st_quality.json"
VERSUS_ST = common.ROOT / "bench" / "perf" / "versus_st.py"
PAIRS = (("santa", "sentence-transformers"), ("santa", "zero-shot"))
PAIRS += (("sentence-transformers", "zero-shot"),)


IN_PROCESS_HELP = (
    "train santa in this process on one worker (bench/perf/versus_st.py's santa-local: the "
    "same loop and model as a one-worker Ray run, without Ray Train's start-up nor a "
    "Python of its own)"
)


def santa_system(args: argparse.Namespace) -> str:
    """bench/perf/versus_st.py's child that trains santa: on Ray Train (2 workers, as
    users run it) or, with ``--in-process``, the worker loop in this process."""
    return "santa-local" if getattr(args, "in_process", False) else "santa-ray"


def train(system: str, args: argparse.Namespace, data: str, work: Path) -> tuple[str, float]:
    """Fine-tune with bench/perf/versus_st.py's child for ``system``; the model and seconds.

    ``santa-local`` runs in this process (its torch threads restored after), the others in
    a process of their own."""
    arguments = [
        *("--child", system, "--data", data, "--work", str(work)),
        *("--result", str(work / "result.json")),
        *(f"--steps={args.steps}", f"--batch={args.batch}", "--window=1"),
        *(f"--query-length={args.query_length}", f"--doc-length={args.doc_length}"),
        f"--seed={args.seed}",
        f"--learning-rate={getattr(args, 'learning_rate', 0.0)}",
    ]
    work.mkdir(parents=True)
    if system == "santa-local":
        import torch

        from bench.perf import versus_st

        threads = torch.get_num_threads()
        started = time.perf_counter()
        try:
            versus_st.run_child(versus_st.build_parser().parse_args(arguments))
        finally:
            torch.set_num_threads(threads)
        return str(work / "model"), time.perf_counter() - started
    import ray

    env = dict(os.environ)
    if ray.is_initialized():  # the job joins this benchmark's cluster, as on a user's cluster
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    command = [sys.executable, str(VERSUS_ST), *arguments]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=common.ROOT, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"training {system} failed (exit {done.returncode}):\n{tail}")
    model = work / "runs" / "run" if system == "santa-ray" else work / "model"
    return str(model), seconds


def build_eval_sets(args: argparse.Namespace, work: Path) -> dict[str, tuple[str, str]]:
    """name → (BEIR folder, qrels split) for CoSQA and, if given, CodeSearchNet Ruby."""
    from santa.data.cosqa import write_cosqa_beir
    from santa.data.plan import PreprocessConfig, run_preprocess

    sets = {}
    write_cosqa_beir(args.cosqa, str(work / "cosqa"))
    sets["CoSQA dev"] = (str(work / "cosqa"), "test")
    if args.csn:
        output = str(work / "csn")
        run_preprocess(
            PreprocessConfig(
                dataset="codesearchnet", input=args.csn, output=output, stage="eval", split="valid"
            )
        )
        sets["CSN Ruby valid"] = (output, "valid")
    return sets


def format_tables(results: dict[str, dict]) -> str:
    """Markdown: MRR@100 [95 % CI] per system and set, then the paired differences."""
    sets = list(results)
    systems = list(results[sets[0]]["systems"])
    header = ["system", *(f"{name} MRR@100 [95% CI]" for name in sets)]
    rows = [
        [system, *(format_interval(results[name]["systems"][system]) for name in sets)]
        for system in systems
    ]
    differences = [
        [pair, *(format_interval(results[name]["differences"][pair], signed=True) for name in sets)]
        for pair in results[sets[0]]["differences"]
    ]
    return "\n\n".join(
        [
            common.format_table(header, rows),
            common.format_table(["paired difference", *sets], differences),
        ]
    )


def plot(results: dict[str, dict], path: Path, title: str) -> None:
    """Grouped bars of MRR@100 per evaluation set with the 95 % intervals."""
    groups = {name: results[name]["systems"] for name in results}
    common.plot_intervals(groups, path, title, ylabel="MRR@100 (95% bootstrap CI)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cosqa", required=True, help="cosqa-dev.json")
    parser.add_argument("--csn", default="", help="CodeSearchNet folder (valid.jsonl.gz)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--query-length", type=int, default=50)
    parser.add_argument("--doc-length", type=int, default=240)
    parser.add_argument("--bootstrap", type=int, default=10_000, help="resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-process", action="store_true", help=IN_PROCESS_HELP)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from bench.corpora import stdlib_pair_rows, write_pairs
    from santa.cluster.ray_utils import init_ray
    from santa.config.recipes import minilm_path
    from santa.eval import EvalConfig, evaluate

    bench = common.BenchRun(__file__, argv)
    work = Path(tempfile.mkdtemp(prefix="santa-versus-quality-"))
    rows = stdlib_pair_rows()
    data = write_pairs(work / "pairs", rows)
    if not args.in_process:  # the santa-ray child joins this cluster, as on a user's
        print(init_ray(), flush=True)
    sets = build_eval_sets(args, work)
    models = {"zero-shot": minilm_path()}
    seconds = {"zero-shot": 0.0}
    for name, system in (("santa", santa_system(args)), ("sentence-transformers", "st-mnrl")):
        print(f"training {name}: {args.steps} steps x {args.batch} pairs", flush=True)
        models[name], seconds[name] = train(system, args, data, work / system)
        print(f"  {seconds[name]:.0f} s", flush=True)
    results = {}
    for set_name, (beir, split) in sets.items():
        scores = {}
        for name, model in models.items():
            folder = work / "eval" / set_name.replace(" ", "-") / name
            evaluate(
                model,
                beir,
                EvalConfig(split=split, baseline=None, progress=False, output=str(folder)),
            )
            scores[name] = per_query_rr(beir, str(folder / "run.model.trec"), split)
        per_system, differences = bootstrap(scores, args.bootstrap, args.seed, PAIRS)
        results[set_name] = {
            "queries": len(scores["zero-shot"]),
            "systems": per_system,
            "differences": differences,
        }
        print(
            f"{set_name}: " + ", ".join(f"{s} {r['mean']:.4f}" for s, r in per_system.items()),
            flush=True,
        )
    print("\n" + format_tables(results))
    payload = {
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "train_pairs": len(rows),
        "train_seconds": seconds,
        "results": results,
    }
    output = Path(args.output)
    bench.write_json(output, payload)
    title = f"all-MiniLM-L6-v2 fine-tuned {args.steps} steps x {args.batch} on stdlib pairs"
    plot(results, output.with_suffix(".png"), title)
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
