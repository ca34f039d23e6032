"""Fine-tuning all-MiniLM-L6-v2 with the similarity it was trained for, or without it.

The ``minilm`` recipe used to train with raw dot products at temperature 1 although the
model was trained (and is evaluated) with cosine similarity. This script fine-tunes it the
same number of steps on the same standard-library docstring → code pairs both ways and
scores each on the CoSQA dev set (real web queries) with santa's evaluator, beside the
zero-shot model:

    python bench/quality/minilm_similarity.py --cosqa ../shared/fixtures/cosqa/cosqa-dev.json

Prints a table and writes ``bench/results/minilm_similarity.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.corpora import stdlib_pair_rows, write_pairs
from santa.cluster.ray_utils import init_ray
from santa.config.recipes import get_recipe, minilm_path
from santa.data.cosqa import write_cosqa_beir
from santa.eval import EvalConfig, evaluate
from santa.files import storage
from santa.train.trainer import RunSpec, fit

RESULTS = common.RESULTS_DIR / "minilm_similarity.json"

VARIANTS = {
    "dot, τ=1 (before)": ["model.similarity=dot", "model.temperature=1.0"],
    "cosine, τ=0.05 (now)": [],
}


def main(argv: list[str] | None = None) -> int:
    """Fine-tune both ways, evaluate on CoSQA, print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cosqa", required=True, help="cosqa-dev.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bench = common.BenchRun(__file__, argv)
    work = Path(tempfile.mkdtemp(prefix="santa-minilm-"))
    pairs = write_pairs(work / "pairs", stdlib_pair_rows())
    beir = str(work / "cosqa")
    write_cosqa_beir(args.cosqa, beir)
    print(init_ray(), flush=True)
    results = {}
    zero = evaluate(minilm_path(), beir, EvalConfig(baseline=None, progress=False))["model"]
    results["zero-shot"] = {"mrr@100": zero["mrr@100"], "train_s": 0.0}
    for name, overrides in VARIANTS.items():
        config = get_recipe("minilm-finetune").with_overrides(
            [
                f"train.max_steps={args.steps}",
                f"train.global_batch_size={args.batch}",
                "train.num_workers=2",
                "train.log_every=5",
                "train.max_query_length=50",
                "train.max_document_length=240",
                *overrides,
            ]
        )
        spec = RunSpec.of(
            data=pairs, storage=str(work / "runs"), name=name.split(",")[0], cpus_per_worker=0.5
        )
        started = time.time()
        result = fit(config, spec)
        train_s = time.time() - started
        model = storage.join(result.checkpoint.path, "model")
        metrics = evaluate(model, beir, EvalConfig(baseline=None, progress=False))["model"]
        results[name] = {"mrr@100": metrics["mrr@100"], "train_s": round(train_s, 1)}
        print(f"{name}: MRR@100 {metrics['mrr@100']:.4f} ({train_s:.0f} s training)", flush=True)
    header = [f"minilm on CoSQA dev ({args.steps} steps × {args.batch})", "MRR@100"]
    rows = [[name, f"{row['mrr@100']:.4f}"] for name, row in results.items()]
    print("\n" + common.format_table(header, rows))
    payload = {"steps": args.steps, "batch": args.batch, "results": results}
    bench.write_json(args.output, payload)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
