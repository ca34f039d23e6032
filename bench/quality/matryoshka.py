"""Matryoshka on the tiny decoder: held-out MRR@100 of the first ``d`` dimensions of one
model trained on nested prefixes, against a model trained at ``d`` alone, and the index
size at each ``d``.

    python bench/quality/matryoshka.py [--dims 128,64,32,16] [--epochs 8] [--seeds 0]

Data: the CodeSearchNet Ruby valid sample split by repository (every 5th repository held
out), through ``ray_jobs.preprocess``'s pipeline, as ``bench/quality/shuffle_mrr.py``
builds it: docstring → code training pairs, and a held-out BEIR folder whose queries never
share a repository with a training pair.

Model: the ``tiny-decoder`` recipe (a random-init Qwen2-shaped decoder, 2 layers, 128
wide; last-token pooling, "query: "/"passage: " prefixes, cosine at τ 0.1), its tokenizer
trained on the training pairs, the same initial weights for every run, trained on the plain
worker loop without Ray (:class:`~santa.train.session.LocalSession`, one process) with the
DR loss and in-batch negatives, batch 32, lr 5e-4, ``--epochs`` passes. Systems:

- ``matryoshka``: ``train.matryoshka_dims`` = every ``--dims`` (weights 1): the sum of the
  losses of the nested prefixes (:func:`santa.method.losses.matryoshka_contrastive_loss`);
- ``only d``: ``train.matryoshka_dims=d``, the loss on the first ``d`` dimensions alone
  (a ``d``-dimensional model; ``only 128`` is plain training);
- ``untrained``: the initial weights.

``only 128`` (plain training at the full width) is also scored cut to every ``d``: what
truncating a model trained without Matryoshka gives.

Each model is scored by santa's evaluator at ``--dim d`` (``EvalConfig.dim``: queries and
documents cut to ``d``, then cosine) on the held-out queries; per query RR@100, with 95 %
bootstrap intervals over queries and the paired differences ``matryoshka − only d`` and
``matryoshka − only 128 cut to d``. Index
size: a flat faiss index of the held-out documents' vectors cut to ``d`` (what
``ray_jobs.index --dim d`` writes), its serialised bytes. Prints tables; writes
``bench/results/matryoshka.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python bench/quality/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common  # noqa: E402
from bench.quality.scoring import bootstrap, format_interval, per_query_rr  # noqa: E402
from bench.quality.shuffle_mrr import DATA, build_data  # noqa: E402

RESULTS = common.RESULTS_DIR / "matryoshka.json"


def train(config, init: str, data: str, root: Path) -> tuple[str, float]:
    """The plain worker loop in this process; the last checkpoint's model and seconds."""
    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.loop_config import LoopConfig
    from santa.train.session import LocalSession

    started = time.perf_counter()
    session = LocalSession(checkpoint_root=str(root))
    loop = LoopConfig(santa=config, init_model=init, data_uri=data, row_cache=str(root / "rows"))
    run_worker(WorkerTrainer(loop, session))
    return str(max(root.glob("checkpoint_*")) / "model"), time.perf_counter() - started


def score(model: str, test: str, dim: int, output: Path) -> dict[str, float]:
    """Per-query RR@100 of ``model`` on the held-out queries at ``dim`` dimensions."""
    from santa.eval import EvalConfig, evaluate

    evaluate(model, test, EvalConfig(output=str(output), baseline=None, dim=dim, progress=False))
    return per_query_rr(test, str(output / "run.model.trec"), "test")


def index_bytes(model: str, test: str, dims: list[int]) -> dict[int, int]:
    """Serialised bytes of a flat index of the held-out documents, cut to each ``d``."""
    from santa.data.beir import load_beir
    from santa.eval.retrieval import prepare_embeddings
    from santa.index.faiss_index import EmbeddingIndex
    from santa.models.checkpoints import load
    from santa.models.encoding import encode_texts

    beir = load_beir(test, "test")
    vectors = encode_texts(
        load(model), beir.document_texts(), max_length=128, role="document", progress=False
    )  # (documents, 128)
    sizes = {}
    for dim in dims:
        cut = prepare_embeddings(vectors[:, :dim].copy(), "cosine")
        sizes[dim] = len(EmbeddingIndex.build(cut, beir.doc_ids).to_bytes())
    return sizes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", default="128,64,32,16")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", default="0", help="train.seed of each run (batch order)")
    parser.add_argument("--data", default=str(DATA), help="CodeSearchNet .jsonl.gz split file")
    parser.add_argument("--test-every", type=int, default=5, help="hold out every N-th repo")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    dims = [int(d) for d in args.dims.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]

    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from santa.train.initial_model import read_texts

    recipe = get_recipe("tiny-decoder-finetune").with_overrides(
        ["train.learning_rate=5e-4", "train.global_batch_size=32", "train.log_every=50"]
    )
    with tempfile.TemporaryDirectory(prefix="santa-bench-matryoshka-") as scratch:
        work = Path(scratch)
        import ray

        from santa.cluster.ray_utils import init_ray

        print(init_ray(), flush=True)  # the preprocess pipeline is Ray Data's
        pairs, test, sizes = build_data(work / "data", Path(args.data), args.test_every)
        ray.shutdown()  # training runs in this process: the CPUs are its own
        recipe = recipe.with_overrides([f"train.epochs={args.epochs}"])
        tokenizer = train_tokenizer(read_texts(pairs), vocab_size=recipe.model.tiny_vocab_size)
        base = dataclasses.replace(recipe.model, lora_rank=0)
        init = str(work / "init")
        DualEncoder.build_tiny(base, tokenizer, seed=0).save_pretrained(init, santa_config=recipe)

        scores: dict[str, dict[str, float]] = {}
        runs: dict[str, dict[str, Any]] = {}
        for d in dims:
            scores[f"untrained @{d}"] = score(init, test, d, work / "eval" / f"untrained-{d}")
        for seed in seeds:
            systems = {"matryoshka": dims, **{f"only {d}": [d] for d in dims}}
            for system, trained_dims in systems.items():
                name = f"{system} (seed {seed})"
                print(f"[bench] training {name}", flush=True)
                config = recipe.with_overrides(
                    [
                        f"train.seed={seed}",
                        "train.matryoshka_dims=" + ",".join(map(str, trained_dims)),
                    ]
                )
                root = work / "runs" / name.replace(" ", "_")
                model, seconds = train(config, init, pairs, root)
                runs[name] = {"train_s": seconds, "dims": trained_dims}
                # The model trained at the full width alone is also cut to every dimension
                # (what truncating a model trained without Matryoshka gives).
                cuts = dims if trained_dims == [max(dims)] else trained_dims
                for d in cuts:
                    key = f"{system} @{d} (seed {seed})"
                    scores[key] = score(model, test, d, work / "eval" / key.replace(" ", "_"))
                if system == "matryoshka" and seed == seeds[0]:
                    index_sizes = index_bytes(model, test, dims)
    full = max(dims)
    pairs_compared = tuple(
        (f"matryoshka @{d} (seed {s})", f"only {other} @{d} (seed {s})")
        for d in dims
        for s in seeds
        for other in dict.fromkeys((d, full))  # at d alone, and the full-width model cut
    )
    per_system, differences = bootstrap(scores, args.resamples, seed=0, pairs=pairs_compared)
    payload = {
        "model": "tiny-decoder (Qwen2-shaped, 2 layers, 128 wide), random init",
        "data": sizes,
        "dims": dims,
        "seeds": seeds,
        "epochs": args.epochs,
        "batch": recipe.train.global_batch_size,
        "runs": runs,
        "mrr@100": per_system,
        "differences": differences,
        "index_bytes": {str(d): size for d, size in index_sizes.items()},
        "documents": sizes["test_queries"],
    }
    print(format_tables(payload))
    bench.write_json(args.output, payload)
    return payload


def format_tables(payload: dict[str, Any]) -> str:
    """MRR@100 per dimension (the Matryoshka model, a model trained at that dimension
    alone, untrained), their paired difference, and the index size."""
    mrr, rows = payload["mrr@100"], []
    largest = max(int(size) for size in payload["index_bytes"].values())
    full = max(payload["dims"])
    for d in payload["dims"]:
        for seed in payload["seeds"]:
            difference = payload["differences"][
                f"matryoshka @{d} (seed {seed}) - only {d} @{d} (seed {seed})"
            ]
            size = payload["index_bytes"][str(d)]
            rows.append(
                [
                    str(d),
                    str(seed),
                    format_interval(mrr[f"matryoshka @{d} (seed {seed})"]),
                    format_interval(mrr[f"only {d} @{d} (seed {seed})"]),
                    format_interval(difference, signed=True),
                    format_interval(mrr[f"only {full} @{d} (seed {seed})"]),
                    format_interval(
                        payload["differences"][
                            f"matryoshka @{d} (seed {seed}) - only {full} @{d} (seed {seed})"
                        ],
                        signed=True,
                    ),
                    f"{mrr[f'untrained @{d}']['mean']:.4f}",
                    f"{size / 1024:.1f} KiB ({size / largest:.0%})",
                ]
            )
    header = [
        "dim",
        "seed",
        "matryoshka",
        "trained at dim alone",
        "matryoshka − alone",
        "full-width model cut to dim",
        "matryoshka − cut",
        "untrained",
        "flat index",
    ]
    return common.format_table(header, rows)


if __name__ == "__main__":
    main()
