"""Benchmark of the sharded hard-negative refresh (issue 16): 1 vs 2 encoder actors.

1. Refresh time (encode documents + queries with an EncoderPool, build the faiss index,
   mine) on the 2,000-pair stdlib corpus (as bench/perf/negatives.py builds it) and on a
   synthetic corpus of ``--docs`` documents (50,000 by default) with ``--queries`` training
   queries, with 1 and 2 CPU encoder actors of 1 CPU and 1 torch thread each.
2. A trainer's step time while a refresh runs: a training step of the same tiny model in
   this process (1 torch thread), timed idle and while the pool refreshes in a background
   thread. The loop only polls (as NegativesClient does): any slowdown is CPU contention,
   never waiting.

    python bench/perf/refresh.py [--pairs 2000] [--docs 50000] [--queries 5000] [--actors 1,2]
    python bench/perf/refresh.py --encoder-only --gpus 1 --docs 50000   # no Ray, no faiss

``--encoder-only`` times one :class:`~santa.models.encoding.TextEncoder` (what each
encoder actor runs; on CUDA under bf16 autocast with ``--gpus`` > 0) on the synthetic
documents in this process: documents/s, no Ray or faiss needed.

Prints tables and writes bench/results/refresh.json (with the machine's load average
before and after: on a shared machine the figures are only as good as the load allows).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from bench.corpora import write_stdlib_pairs
from santa.config import SantaConfig
from santa.config.recipes import get_recipe
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.negatives.corpus import MiningCorpus, load_mining_corpus
from santa.negatives.encoders import EncoderPool
from santa.negatives.miner import refresh_table
from santa.train.optim import build_optimizer

RESULTS = common.RESULTS_DIR / "refresh.json"
WORDS = [
    "read",
    "write",
    "file",
    "line",
    "buffer",
    "parse",
    "token",
    "value",
    "index",
    "count",
    "list",
    "dict",
    "key",
    "item",
    "path",
    "name",
    "size",
    "offset",
    "encode",
    "decode",
    "stream",
    "socket",
    "request",
    "response",
    "header",
    "cache",
    "lock",
    "thread",
    "queue",
    "event",
    "timer",
    "config",
    "option",
    "default",
    "error",
    "retry",
    "close",
    "open",
    "flush",
    "seek",
]


def synthetic_corpus(docs: int, queries: int, work: Path, seed: int = 0) -> MiningCorpus:
    """``docs`` code-like documents; the first ``queries`` have a docstring-like query (the
    others are pairs' rows that do not train: judged-only documents, as ESCI's)."""
    from bench.corpora import write_pairs

    rng = random.Random(seed)
    rows = []
    for i in range(docs):
        name = "_".join(rng.choices(WORDS, k=2))
        args = ", ".join(rng.sample(WORDS, 2))
        body = " ".join(
            f"{rng.choice(WORDS)} = {rng.choice(WORDS)}({rng.choice(WORDS)})"
            for _ in range(rng.randint(3, 12))
        )
        query = f"{name.replace('_', ' ')} the {' '.join(rng.sample(WORDS, 3))}"
        trains = i < queries
        rows.append(
            {
                "id": f"p{i}",
                "dataset": "synthetic",
                "kind": "code_pair" if trains else "product_judgment",
                "query_id": f"q{i}" if trains else "unjudged",
                "query": query,
                "doc_id": f"d{i}",
                "title": "",
                "document": f"def {name}({args}): {body} return {rng.choice(WORDS)}",
                "label": 1 if trains else 0,
                "mep_target": "",
            }
        )
    return load_mining_corpus(write_pairs(work / f"synthetic-{docs}", rows))


def stdlib_corpus(work: Path, pairs: int) -> MiningCorpus:
    """The 2,000-pair corpus of bench/perf/negatives.py (stdlib functions, as preprocessed)."""
    return load_mining_corpus(write_stdlib_pairs(work, limit=pairs))


def tiny_model(work: Path, corpus: MiningCorpus) -> str:
    """The tiny recipe's T5 (random weights) with a tokenizer trained on ``corpus``."""
    texts = [
        *corpus.doc_texts(range(min(5000, corpus.num_docs))),
        *corpus.query_texts(range(min(5000, corpus.num_queries))),
    ]
    config = get_recipe("tiny")
    tokenizer = train_tokenizer(texts, vocab_size=config.model.tiny_vocab_size)
    folder = str(work / "model")
    DualEncoder.build_tiny(config.model, tokenizer, seed=0).save_pretrained(folder, config)
    return folder


def time_refreshes(
    model_dir: str, corpus: MiningCorpus, settings: SantaConfig, actors: int, repeats: int
) -> dict:
    """Refresh ``repeats`` times with a pool of ``actors`` (started and loaded beforehand)."""
    import ray

    pool = EncoderPool(
        model_dir, None, actors=actors, num_cpus=1, batch_size=settings.negatives.batch_size
    )
    try:
        started = pool.wait_ready()
        state = DualEncoder.from_pretrained(model_dir).state_dict()
        pool.set_weights(ray.put(state), step=1)  # one put; each actor fetches it once
        runs = []
        for _ in range(repeats):
            table = refresh_table(None, corpus, settings, step=1, encoder=pool)
            runs.append({"refresh_s": table.build_s, "encode_s": table.encode_s})
        return {
            "actors": actors,
            "actors_started": started,
            "actors_used": pool.stats["actors_used"],
            "refresh_s": min(r["refresh_s"] for r in runs),
            "encode_s": min(r["encode_s"] for r in runs),
            "runs": runs,
            "negatives": table.negatives,
        }
    finally:
        pool.shutdown()


def step_times_during_refresh(
    model_dir: str, corpus: MiningCorpus, settings: SantaConfig, actors: int, steps: int
) -> dict:
    """Mean training-step time in this process: idle, then while a refresh runs."""
    import ray

    torch.set_num_threads(1)
    model = DualEncoder.from_pretrained(model_dir)
    optimizer = build_optimizer(model.parameters(), settings.train, learning_rate=1e-4)
    queries = corpus.query_texts(range(32))
    documents = corpus.doc_texts([int(corpus.positives(q)[0]) for q in range(32)])
    query_batch = model.tokenize(queries, settings.train.max_query_length)
    doc_batch = model.tokenize(documents, settings.train.max_document_length)

    def step() -> float:
        started = time.perf_counter()
        model.train()
        q = model.encode(query_batch["input_ids"], query_batch["attention_mask"])  # (32, dim)
        d = model.encode(doc_batch["input_ids"], doc_batch["attention_mask"])  # (32, dim)
        loss = torch.nn.functional.cross_entropy(q @ d.T, torch.arange(len(q)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return time.perf_counter() - started

    step()  # warm-up
    idle = [step() for _ in range(steps)]
    pool = EncoderPool(
        model_dir, None, actors=actors, num_cpus=1, batch_size=settings.negatives.batch_size
    )
    try:
        pool.wait_ready()
        pool.set_weights(ray.put(model.state_dict()), step=1)
        done: list = []
        refresher = threading.Thread(
            target=lambda: done.append(refresh_table(None, corpus, settings, encoder=pool))
        )
        refresher.start()
        during = []
        while refresher.is_alive():
            during.append(step())
        refresher.join()
    finally:
        pool.shutdown()
    return {
        "actors": actors,
        "step_s_idle": float(np.mean(idle)),
        "step_s_during_refresh": float(np.mean(during)) if during else None,
        "steps_during_refresh": len(during),
        "refresh_s": done[0].build_s if done else None,
    }


def encoder_only(args: argparse.Namespace) -> dict:
    """Documents/s of one TextEncoder in this process (the per-actor work, no Ray)."""
    from santa.models.encoding import TextEncoder

    work = Path(tempfile.mkdtemp(prefix="santa-bench-encoder-"))
    corpus = synthetic_corpus(args.docs, args.queries, work)
    encoder = TextEncoder(tiny_model(work, corpus), None, num_gpus=args.gpus, threads=1)
    texts = corpus.doc_texts(range(corpus.num_docs))
    encoder.encode(texts[: args.batch], args.doc_length, args.batch)  # warm-up
    started = time.perf_counter()
    embeddings = encoder.encode(texts, args.doc_length, args.batch)
    seconds = time.perf_counter() - started
    result = {
        "device": encoder.device,
        "autocast": str(encoder.dtype),
        "documents": len(texts),
        "doc_length": args.doc_length,
        "batch": args.batch,
        "seconds": seconds,
        "documents_per_s": len(texts) / seconds,
        "dim": int(embeddings.shape[1]),
    }
    print(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    """Time the refreshes (or one encoder); print the tables and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=2000, help="stdlib corpus size (pairs)")
    parser.add_argument("--docs", type=int, default=50_000, help="synthetic corpus documents")
    parser.add_argument("--queries", type=int, default=5000, help="synthetic training queries")
    parser.add_argument("--actors", default="1,2", help="encoder actor counts to compare")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--batch", type=int, default=64, help="texts per encoder batch")
    parser.add_argument("--doc-length", type=int, default=128, help="document tokens")
    parser.add_argument("--query-length", type=int, default=32, help="query tokens")
    parser.add_argument("--repeats", type=int, default=1, help="refreshes per setting (min)")
    parser.add_argument("--train-steps", type=int, default=20, help="idle steps timed")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--encoder-only", action="store_true", help="one TextEncoder, no Ray")
    parser.add_argument("--gpus", type=float, default=0.0, help="--encoder-only: GPU (> 0)")
    args = parser.parse_args(argv)
    bench = common.BenchRun(__file__, argv)
    if args.encoder_only:
        result = encoder_only(args)
        output = args.output.with_name(f"refresh-encoder-{result['device']}.json")
        bench.write_json(output, result)
        print(f"wrote {output}")
        return 0
    import ray

    actor_counts = [int(a) for a in args.actors.split(",")]
    settings = get_recipe("tiny").with_overrides(
        [
            "negatives.per_query=1",
            "negatives.top_k=100",
            f"negatives.batch_size={args.batch}",
            f"train.max_query_length={args.query_length}",
            f"train.max_document_length={args.doc_length}",
        ]
    )
    load_before = common.load_average()
    work = Path(tempfile.mkdtemp(prefix="santa-bench-refresh-"))
    corpora = {f"stdlib {args.pairs} pairs": stdlib_corpus(work, args.pairs)}
    if args.docs:
        corpora[f"synthetic {args.docs} docs"] = synthetic_corpus(args.docs, args.queries, work)
    model_dir = tiny_model(work, next(iter(corpora.values())))
    ray.init(num_cpus=args.cpus, log_to_driver=False, include_dashboard=False)
    results: dict = {
        "cpus": args.cpus,
        "load_before": load_before,
        "settings": {
            "batch": args.batch,
            "doc_length": args.doc_length,
            "query_length": args.query_length,
            "model": "tiny recipe T5 (random weights)",
            "encoder": "1 CPU and 1 torch thread per actor",
        },
        "refresh": {},
    }
    refresh_rows = []
    for label, corpus in corpora.items():
        rows = {}
        for actors in actor_counts:
            rows[actors] = time_refreshes(model_dir, corpus, settings, actors, args.repeats)
        tables = [rows[a].pop("negatives") for a in actor_counts]
        base = rows[actor_counts[0]]["refresh_s"]
        for actors, row in rows.items():
            row["speedup"] = base / row["refresh_s"]
            row["encode_speedup"] = rows[actor_counts[0]]["encode_s"] / row["encode_s"]
            print(f"{label}, {actors} actors: refresh {row['refresh_s']:.1f} s", flush=True)
            refresh_rows.append(
                [
                    label,
                    f"{corpus.num_docs:,}",
                    f"{corpus.num_queries:,}",
                    actors,
                    f"{row['refresh_s']:.1f}",
                    f"{row['encode_s']:.1f}",
                    f"{row['speedup']:.2f}x",
                ]
            )
        results["refresh"][label] = {
            "docs": corpus.num_docs,
            "queries": corpus.num_queries,
            "same_table": all(np.array_equal(t, tables[0]) for t in tables),
            "by_actors": {str(a): r for a, r in rows.items()},
            "load_after": common.load_average(),
        }
        # What is done so far survives an interrupted run.
        bench.write_json(args.output, results)
    header = ["corpus", "docs", "queries", "actors", "refresh s", "encode s", "speed-up"]
    print("\n" + common.format_table(header, refresh_rows))
    if not args.skip_training:
        corpus = next(iter(corpora.values()))
        training = []
        for actors in actor_counts:
            row = step_times_during_refresh(model_dir, corpus, settings, actors, args.train_steps)
            training.append(row)
        results["training"] = training
        rows = [
            [
                row["actors"],
                f"{row['step_s_idle']:.3f}",
                None
                if row["step_s_during_refresh"] is None
                else f"{row['step_s_during_refresh']:.3f}",
                row["steps_during_refresh"],
                None if row["refresh_s"] is None else f"{row['refresh_s']:.1f}",
            ]
            for row in training
        ]
        header = ["actors", "step s idle", "step s during refresh", "steps during", "refresh s"]
        print("\n" + common.format_table(header, rows, align="rrrrr"))
    ray.shutdown()
    results["load_after"] = common.load_average()
    print(f"\nload average before {load_before}, after {results['load_after']}")
    bench.write_json(args.output, results)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
