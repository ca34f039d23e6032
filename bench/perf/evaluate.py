"""Benchmark: encoding throughput and the evaluator's overhead over a raw faiss search.

    python bench/perf/evaluate.py [--docs 3000] [--models tiny minilm] [--scale 30000 100000]

The corpus is real code: documented Python functions of this interpreter's standard
library, turned into (docstring tokens → code) pairs by the same builder the eval stage of
the preprocessing job uses (no Ray). For each model (``tiny``: a random-init T5 with a
tokenizer trained on the corpus, lengths 32/128; ``minilm``: all-MiniLM-L6-v2, 50/240):

- documents/s and queries/s encoded in-process (``santa.models.encoding.encode_texts``);
- the evaluator's retrieval + metrics (``dense_retrieve`` through ``EmbeddingIndex`` and
  ranx's metrics, the work ``evaluate_model`` does after encoding) against a raw faiss
  ``IndexFlatIP`` add + search of the same embeddings, top 100. ranx's one-time start-up
  (import and loading its numba kernels, once per process) is reported apart.

``--scale`` repeats the overhead measurement on random embeddings (MiniLM's 384
dimensions, 1,000 queries) for bigger corpora: the evaluator's extra work grows with
queries × 100 while the search grows with queries × corpus size.
Results go to ``bench/results/evaluate.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python bench/perf/x.py): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common
from santa.config.recipes import get_recipe
from santa.data.beir import BeirData
from santa.data.records import DropRow, PairOptions, build_code_pair
from santa.data.source import SourceRecords, default_source_root
from santa.eval import compute_metrics, dense_retrieve
from santa.models.dual_encoder import DualEncoder
from santa.models.encoding import encode_texts

TOP_K = 100
REPEATS = 10


def build_corpus(limit: int) -> BeirData:
    """``limit`` code-search pairs from the stdlib, as the eval stage builds them."""
    options = PairOptions(stage="eval")
    corpus, queries, qrels = {}, {}, {}
    for record in SourceRecords(default_source_root(), languages=["python"]):
        try:
            row = build_code_pair(record, "bench", options)
        except DropRow:
            continue
        if row["doc_id"] in corpus:
            continue
        corpus[row["doc_id"]] = {"title": "", "text": row["document"], "language": "python"}
        queries[row["query_id"]] = row["query"]
        qrels[row["query_id"]] = {row["doc_id"]: 1}
        if len(corpus) >= limit:
            break
    return BeirData(corpus, queries, qrels, {q: "python" for q in queries}, uri="stdlib")


def load(name: str, beir: BeirData) -> tuple[DualEncoder, int, int]:
    """The recipe's model (tiny: tokenizer trained on the corpus) and its two lengths."""
    config = get_recipe(name)
    if config.model.is_tiny:
        from santa.models.tokenizer import train_tokenizer

        texts = beir.document_texts() + list(beir.queries.values())
        tokenizer = train_tokenizer(texts, vocab_size=config.model.tiny_vocab_size)
        model = DualEncoder.build_tiny(config.model, tokenizer, seed=0)
    else:
        model = DualEncoder.from_pretrained(config.model.backbone, config.model)
    return model.eval(), config.train.max_query_length, config.train.max_document_length


def timed(function, repeats: int = REPEATS) -> tuple[float, object]:
    """Best wall time of ``repeats`` calls and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - started)
    return best, result


def raw_faiss(doc_embeddings: np.ndarray, query_embeddings: np.ndarray) -> None:
    """The search alone: a flat inner-product index, built and searched."""
    import faiss

    index = faiss.IndexFlatIP(doc_embeddings.shape[1])
    index.add(doc_embeddings)
    index.search(query_embeddings, TOP_K)


def overhead(
    query_embeddings: np.ndarray,
    query_ids: list[str],
    doc_embeddings: np.ndarray,
    doc_ids: list[str],
    qrels: dict,
) -> dict[str, float]:
    """Raw faiss vs the evaluator's retrieval and metrics on the same embeddings.

    The three are timed in turn, ``REPEATS`` rounds, best of each: on a shared machine
    interleaving keeps a burst of load from landing on one side only.
    """
    best = {"raw_faiss_s": float("inf"), "retrieval_s": float("inf"), "metrics_s": float("inf")}
    for _ in range(REPEATS):
        raw_s, _ = timed(lambda: raw_faiss(doc_embeddings, query_embeddings), repeats=1)
        retrieval_s, ranking = timed(
            lambda: dense_retrieve(
                query_embeddings, query_ids, doc_embeddings, doc_ids, top_k=TOP_K
            ),
            repeats=1,
        )
        started = time.perf_counter()
        compute_metrics(qrels, ranking)
        metrics_s = time.perf_counter() - started
        for name, value in zip(best, (raw_s, retrieval_s, metrics_s), strict=True):
            best[name] = min(best[name], value)
    total = best["retrieval_s"] + best["metrics_s"]
    return {**best, "overhead_pct": 100 * (total - best["raw_faiss_s"]) / best["raw_faiss_s"]}


def bench_model(name: str, beir: BeirData, batch_size: int) -> dict:
    """Encoding rates of one model and the evaluator's overhead on its embeddings."""
    model, query_length, document_length = load(name, beir)
    doc_texts = beir.document_texts()
    query_ids = list(beir.queries)
    query_texts = [beir.queries[q] for q in query_ids]
    encode_texts(model, doc_texts[:batch_size], max_length=document_length, progress=False)
    started = time.perf_counter()
    docs = encode_texts(
        model, doc_texts, max_length=document_length, batch_size=batch_size, progress=False
    )
    docs_s = time.perf_counter() - started
    started = time.perf_counter()
    queries = encode_texts(
        model, query_texts, max_length=query_length, batch_size=batch_size, progress=False
    )
    queries_s = time.perf_counter() - started
    result = {
        "model": name,
        "dim": int(docs.shape[1]),
        "documents": len(doc_texts),
        "queries": len(query_texts),
        "max_document_length": document_length,
        "max_query_length": query_length,
        "documents_per_s": len(doc_texts) / docs_s,
        "queries_per_s": len(query_texts) / queries_s,
        **overhead(queries, query_ids, docs, beir.doc_ids, beir.qrels),
    }
    ranking = dense_retrieve(queries, query_ids, docs, beir.doc_ids, top_k=TOP_K)
    result["mrr@100"] = compute_metrics(beir.qrels, ranking)["mrr@100"]
    return result


def bench_scale(num_docs: int, num_queries: int = 1000, dim: int = 384) -> dict:
    """The evaluator's overhead on random embeddings of a bigger corpus."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((num_docs, dim)).astype(np.float32)
    queries = rng.standard_normal((num_queries, dim)).astype(np.float32)
    doc_ids = [
        f"https://github.com/owner/repo/blob/main/file{i}.py#L1-L20" for i in range(num_docs)
    ]
    query_ids = [f"q{i}" for i in range(num_queries)]
    qrels = {q: {doc_ids[int(rng.integers(num_docs))]: 1} for q in query_ids}
    return {"documents": num_docs, "queries": num_queries, "dim": dim} | overhead(
        queries, query_ids, docs, doc_ids, qrels
    )


def main(argv: list[str] | None = None) -> None:
    """Encode, retrieve, time; print the tables and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--models", nargs="*", default=["tiny", "minilm"])
    parser.add_argument("--scale", nargs="*", type=int, default=[30_000, 100_000])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", default=str(common.RESULTS_DIR / "evaluate.json"))
    args = parser.parse_args(argv)

    import torch

    bench = common.BenchRun(__file__, argv)
    beir = build_corpus(args.docs)
    # ranx's one-time start-up: import + loading (or compiling) its numba kernels.
    started = time.perf_counter()
    compute_metrics({"q": {"d": 1}}, {"q": ["d", "e"]})
    ranx_startup_s = time.perf_counter() - started
    models = [bench_model(name, beir, args.batch_size) for name in args.models]
    scale = [bench_scale(n) for n in args.scale]

    print(f"corpus: {len(beir.corpus)} stdlib functions; torch threads {torch.get_num_threads()}")
    print(f"ranx start-up (once per process): {ranx_startup_s:.2f} s")
    print()
    print(
        common.format_table(
            [
                "model",
                "dim",
                "docs/s",
                "queries/s",
                "raw faiss s",
                "retrieval s",
                "metrics s",
                "overhead",
            ],
            [
                [
                    r["model"],
                    r["dim"],
                    f"{r['documents_per_s']:.1f}",
                    f"{r['queries_per_s']:.1f}",
                    f"{r['raw_faiss_s']:.4f}",
                    f"{r['retrieval_s']:.4f}",
                    f"{r['metrics_s']:.4f}",
                    f"{r['overhead_pct']:.0f}%",
                ]
                for r in models
            ],
        )
    )
    print()
    print(
        common.format_table(
            ["documents", "queries", "dim", "raw faiss s", "retrieval s", "metrics s", "overhead"],
            [
                [
                    r["documents"],
                    r["queries"],
                    r["dim"],
                    f"{r['raw_faiss_s']:.3f}",
                    f"{r['retrieval_s']:.3f}",
                    f"{r['metrics_s']:.3f}",
                    f"{r['overhead_pct']:.0f}%",
                ]
                for r in scale
            ],
            align="rrrrrrr",
        )
    )
    payload = {
        "corpus_documents": len(beir.corpus),
        "ranx_startup_s": ranx_startup_s,
        "models": models,
        "scale": scale,
    }
    bench.write_json(args.output, payload)
    print(f"\nwritten: {args.output}")


if __name__ == "__main__":
    main()
