"""Fine-tuning all-MiniLM-L6-v2 with the similarity it was trained for, or without it.

The ``minilm`` recipe used to train with raw dot products at temperature 1 although the
model was trained (and is evaluated) with cosine similarity. This script fine-tunes it the
same number of steps on the same standard-library docstring → code pairs both ways and
scores each on the CoSQA dev set (real web queries) with santa's evaluator, beside the
zero-shot model:

    python bench/minilm_similarity.py --cosqa ../shared/fixtures/cosqa/cosqa-dev.json

Prints a table and writes ``bench/results/minilm_similarity.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from santa import storage  # noqa: E402
from santa.data.cosqa import write_cosqa_beir  # noqa: E402
from santa.eval import EvalConfig, evaluate  # noqa: E402
from santa.ray_utils import init_ray  # noqa: E402
from santa.recipes import get_recipe, minilm_path  # noqa: E402
from santa.train.trainer import RunSpec, fit  # noqa: E402
from tests.training import stdlib_pair_rows, write_pairs  # noqa: E402

VARIANTS = {
    "dot, τ=1 (before)": ["model.similarity=dot", "model.temperature=1.0"],
    "cosine, τ=0.05 (now)": [],
}


def main() -> int:
    """Fine-tune both ways, evaluate on CoSQA, print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cosqa", required=True, help="cosqa-dev.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--output", default="bench/results/minilm_similarity.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
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
        spec = RunSpec(
            data=pairs, storage=str(work / "runs"), name=name.split(",")[0], cpus_per_worker=0.5
        )
        started = time.time()
        result = fit(config, spec)
        train_s = time.time() - started
        model = storage.join(result.checkpoint.path, "model")
        metrics = evaluate(model, beir, EvalConfig(baseline=None, progress=False))["model"]
        results[name] = {"mrr@100": metrics["mrr@100"], "train_s": round(train_s, 1)}
        print(f"{name}: MRR@100 {metrics['mrr@100']:.4f} ({train_s:.0f} s training)", flush=True)
    print(f"\n| minilm on CoSQA dev ({args.steps} steps × {args.batch}) | MRR@100 |")
    print("|---|---:|")
    for name, row in results.items():
        print(f"| {name} | {row['mrr@100']:.4f} |")
    payload = {"steps": args.steps, "batch": args.batch, "results": results, "date": time.ctime()}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
