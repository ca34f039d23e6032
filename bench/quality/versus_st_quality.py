"""Retrieval quality at equal budget: santa against sentence-transformers and zero-shot.

all-MiniLM-L6-v2 fine-tuned for the same steps, batch, learning rate, warm-up and
temperature (cosine, τ = 0.05 = scale 20) on the same standard-library docstring → code
pairs, once with santa (``python -m ray_jobs.finetune``, 2 Ray Train workers, global
in-batch negatives) and once with sentence-transformers' trainer and
MultipleNegativesRankingLoss (the runs of ``bench/versus_st.py``), then scored with
santa's evaluator beside the zero-shot model on:

- the CoSQA dev set (``--cosqa``): real web queries, its label-1 pairs as queries over
  all its distinct functions;
- the CodeSearchNet Ruby valid sample (``--csn``, a folder of ``valid.jsonl.gz``):
  docstring → function, preprocessed by santa's pipeline.

MRR@100 per query from ranx; a 95 % bootstrap confidence interval (queries resampled,
``--bootstrap`` times) for each system and, paired on the same resamples, for the
differences santa − sentence-transformers and each fine-tuned model − zero-shot.

    python bench/versus_st_quality.py --cosqa ../shared/fixtures/cosqa/cosqa-dev.json \\
        --csn ../shared/fixtures/csn/ruby [--steps 100] [--batch 32]

Prints tables and writes ``bench/results/versus_st_quality.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "versus_st_quality.json"
PAIRS = (("santa", "sentence-transformers"), ("santa", "zero-shot"))
PAIRS += (("sentence-transformers", "zero-shot"),)


def per_query_rr(beir: str, trec: str, split: str) -> dict[str, float]:
    """RR@100 of every judged query (ranx), 0 for a query the run does not rank."""
    from ranx import Qrels, Run
    from ranx import evaluate as ranx_evaluate

    from santa.data.beir import load_beir

    data = load_beir(beir, split)
    qrels = Qrels({q: {d: int(r) for d, r in docs.items()} for q, docs in data.qrels.items()})
    run = Run.from_file(trec, kind="trec")
    values = ranx_evaluate(qrels, run, "mrr@100", return_mean=False, make_comparable=True)
    return dict(zip(qrels.keys(), np.asarray(values, dtype=float).tolist(), strict=True))


def bootstrap(
    scores: dict[str, dict[str, float]],
    resamples: int,
    seed: int,
    pairs: tuple[tuple[str, str], ...] = PAIRS,
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Means with 95 % CIs per system, and paired CIs of the differences ``a - b`` of
    ``pairs`` (on the same resampled queries)."""
    systems = list(scores)
    queries = sorted(scores[systems[0]])
    for system in systems:
        if sorted(scores[system]) != queries:
            raise ValueError(f"{system} was scored on other queries than {systems[0]}")
    matrix = np.array([[scores[s][q] for q in queries] for s in systems])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(queries), size=(resamples, len(queries)))
    means = matrix[:, picks].mean(axis=2)  # systems × resamples

    def interval(row: np.ndarray, point: float) -> dict[str, float]:
        low, high = np.percentile(row, [2.5, 97.5])
        return {"mean": point, "ci_low": float(low), "ci_high": float(high)}

    per_system = {s: interval(means[i], float(matrix[i].mean())) for i, s in enumerate(systems)}
    differences = {}
    for a, b in pairs:
        if a in systems and b in systems:
            i, j = systems.index(a), systems.index(b)
            row = interval(means[i] - means[j], float(matrix[i].mean() - matrix[j].mean()))
            row["p_below_zero"] = float((means[i] - means[j] < 0).mean())
            differences[f"{a} - {b}"] = row
    return per_system, differences


def train(system: str, args: argparse.Namespace, data: str, work: Path) -> tuple[str, float]:
    """Fine-tune with bench/versus_st.py's child for ``system``; the model and seconds."""
    command = [
        sys.executable,
        str(ROOT / "bench" / "versus_st.py"),
        *("--child", system, "--data", data, "--work", str(work)),
        *("--result", str(work / "result.json")),
        *(f"--steps={args.steps}", f"--batch={args.batch}", "--window=1"),
        *(f"--query-length={args.query_length}", f"--doc-length={args.doc_length}"),
        f"--seed={args.seed}",
        f"--learning-rate={getattr(args, 'learning_rate', 0.0)}",
    ]
    work.mkdir(parents=True)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"training {system} failed (exit {done.returncode}):\n{tail}")
    model = work / "runs" / "run" if system == "santa-ray" else work / "model"
    return str(model), seconds


def build_eval_sets(args: argparse.Namespace, work: Path) -> dict[str, tuple[str, str]]:
    """name → (BEIR folder, qrels split) for CoSQA and, if given, CodeSearchNet Ruby."""
    from santa.data.cosqa import write_cosqa_beir
    from santa.data.pipeline import PreprocessConfig, run_preprocess

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
    lines = ["| system | " + " | ".join(f"{s} MRR@100 [95% CI]" for s in sets) + " |"]
    lines.append("|---|" + "---:|" * len(sets))
    for system in systems:
        cells = []
        for name in sets:
            row = results[name]["systems"][system]
            cells.append(f"{row['mean']:.4f} [{row['ci_low']:.4f}, {row['ci_high']:.4f}]")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += ["", "| paired difference | " + " | ".join(sets) + " |"]
    lines.append("|---|" + "---:|" * len(sets))
    for pair in results[sets[0]]["differences"]:
        cells = []
        for name in sets:
            row = results[name]["differences"][pair]
            cells.append(f"{row['mean']:+.4f} [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]")
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    """Write a benchmark's JSON whole or not at all (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)


def save_figure(figure, path: Path) -> None:
    """Write a matplotlib figure whole or not at all (a temporary file renamed)."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    figure.savefig(tmp, dpi=120)
    plt.close(figure)
    tmp.replace(path)


def plot(results: dict[str, dict], path: Path, title: str) -> None:
    """Grouped bars of MRR@100 per evaluation set with the 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(results)
    systems = list(results[sets[0]]["systems"])
    width = 0.8 / len(systems)
    figure, axis = plt.subplots(figsize=(7, 4))
    for k, system in enumerate(systems):
        rows = [results[name]["systems"][system] for name in sets]
        means = np.array([r["mean"] for r in rows])
        errors = np.array(
            [[r["mean"] - r["ci_low"] for r in rows], [r["ci_high"] - r["mean"] for r in rows]]
        )
        axis.bar(
            np.arange(len(sets)) + k * width, means, width, yerr=errors, capsize=3, label=system
        )
    axis.set_xticks(np.arange(len(sets)) + width * (len(systems) - 1) / 2, sets)
    axis.set_ylabel("MRR@100 (95% bootstrap CI)")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    save_figure(figure, path)


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
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from santa.eval import EvalConfig, evaluate
    from santa.ray_utils import init_ray
    from santa.recipes import minilm_path
    from tests.training import stdlib_pair_rows, write_pairs

    work = Path(tempfile.mkdtemp(prefix="santa-versus-quality-"))
    rows = stdlib_pair_rows()
    data = write_pairs(work / "pairs", rows)
    print(init_ray(), flush=True)
    sets = build_eval_sets(args, work)
    models = {"zero-shot": minilm_path()}
    seconds = {"zero-shot": 0.0}
    for name, system in (("santa", "santa-ray"), ("sentence-transformers", "st-mnrl")):
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
        per_system, differences = bootstrap(scores, args.bootstrap, args.seed)
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
        "date": time.ctime(),
        "load_after": list(os.getloadavg()),
    }
    output = Path(args.output)
    write_json(output, payload)
    title = f"all-MiniLM-L6-v2 fine-tuned {args.steps} steps x {args.batch} on stdlib pairs"
    plot(results, output.with_suffix(".png"), title)
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
