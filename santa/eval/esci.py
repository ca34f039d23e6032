"""ESCI product search as SANTA's Table 2 evaluates it: each query's judged products only.

SANTA's scripts (github.com/OpenMatch/SANTA, ``evaluate_product/``) take every judgment of
ESCI's small version, US locale, of the split (test; dev is carved from train as
:mod:`santa.data.esci` does), score each (query, product) pair with the model, rank each
query's judged products by score and run ``trec_eval -c -J -m ndcg.1=0,2=0.01,3=0.1,4=1``
over E/S/C/I mapped to 4/2/3/1: four-class gains Exact 1, Substitute 0.01, Complement 0.1,
Irrelevant 0 (two-class: Exact 1, else 0). Table 2's caption words the four-class gains the
other way round (Substitute 0.1, Complement 0.01); ``EvalConfig.esci_gains`` picks
``released`` (the default, what produced the table) or ``paper`` (the caption's). santa reads the BEIR folder ``ray_jobs.preprocess --dataset esci --stage eval
--split test|valid`` writes (its qrels are exactly those judgments), re-ranks each query's
judged products and scores with ranx (linear-gain NDCG, as trec_eval's).

Averaging as ``trec_eval -c``: every query of the split counts, a query with no relevant
product (no Exact for the two-class scores, only Irrelevant for the four-class one) with
0; ``num_queries_with_exact`` and ``num_queries_with_gain`` say how many could score.
"""

from __future__ import annotations

import time
from typing import Any

from santa.data.beir import load_beir
from santa.data.schema import ESCI_LABEL_GRADES
from santa.eval.bm25 import bm25_rerank
from santa.eval.evaluation import EvalConfig
from santa.eval.metrics import NDCG_4CLASS, compute_metrics, gains_text
from santa.eval.protocol_parts import Encoder, ProtocolResult, markdown_table
from santa.eval.retrieval import dense_rerank
from santa.files.outputs import read_manifest

__all__ = ["ESCI_METRICS", "esci_metrics", "run_esci"]

ESCI_METRICS = ("mrr@100", "ndcg@100", NDCG_4CLASS)


def esci_metrics(
    qrels: dict[str, dict[str, int]], ranking, esci_gains: str = "released"
) -> dict[str, Any]:
    """MRR@100 and NDCG@100 (two- and four-class, the gains ``ESCI_GAINS[esci_gains]``) of
    ``ranking``, every query averaged."""
    metrics = compute_metrics(qrels, ranking, graded=True, esci_gains=esci_gains)
    total = len(qrels)
    with_exact, with_gain = metrics["num_queries"], metrics.get("num_queries_4class", 0)
    # compute_metrics averages over the queries that can score; trec_eval -c averages over
    # all of them, the others at 0: rescale the means to that denominator.
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        if name.startswith("num_queries") or name == "by_language":
            continue
        scored = with_gain if name.endswith("_4class") else with_exact
        out[name] = value * scored / total if total else 0.0
    out.update(
        num_queries=total,
        num_queries_with_exact=with_exact,
        num_queries_with_gain=with_gain,
        num_judgments=sum(len(docs) for docs in qrels.values()),
        averaging="every query of the split, 0 where none is relevant (trec_eval -c)",
        esci_gains=esci_gains,
    )
    return out


def run_esci(encoder: Encoder, data: str, config: EvalConfig) -> ProtocolResult:
    """Re-rank each query's judged products; two- and four-class NDCG@100 and MRR@100."""
    manifest = read_manifest(data) or {}
    dataset = (manifest.get("config") or {}).get("dataset")
    if dataset not in (None, "esci"):
        raise ValueError(f"--protocol esci needs an ESCI BEIR folder; {data} holds {dataset}")
    beir = load_beir(data, config.split)
    labels = {label for docs in beir.qrels.values() for label in docs.values()}
    if not labels <= set(ESCI_LABEL_GRADES.values()) or not beir.graded:
        raise ValueError(
            f"--protocol esci needs ESCI's graded qrels (E/S/C/I as 3/2/1/0): {data} "
            f"qrels/{config.split}.tsv has labels {sorted(labels)} (write it with "
            "ray_jobs.preprocess --dataset esci --stage eval)"
        )
    candidates = beir.candidates()
    query_ids = list(beir.queries)
    query_texts = [beir.queries[qid] for qid in query_ids]
    doc_ids, doc_texts = beir.doc_ids, beir.document_texts()
    doc_embeddings = encoder.documents(doc_texts, desc="products")
    query_embeddings = encoder.queries(query_texts)
    timings = {}
    started = time.perf_counter()
    rankings = {
        "model": dense_rerank(
            query_embeddings,
            query_ids,
            doc_embeddings,
            doc_ids,
            candidates,
            similarity=encoder.similarity,
        )
    }
    timings["rerank_model_s"] = round(time.perf_counter() - started, 3)
    if config.with_bm25:
        started = time.perf_counter()
        rankings["bm25"] = bm25_rerank(doc_texts, doc_ids, query_texts, query_ids, candidates)
        timings["rerank_bm25_s"] = round(time.perf_counter() - started, 3)
    results = {
        system: esci_metrics(beir.qrels, ranking, config.esci_gains)
        for system, ranking in rankings.items()
    }
    missing = sum(len(docs) - len(candidates[qid]) for qid, docs in beir.qrels.items())
    header = ["system", "MRR@100", "NDCG@100 two-class", "NDCG@100 four-class", "queries"]
    markdown = (
        f"ESCI ({config.split}): each query's judged products re-ranked, every query "
        f"averaged (trec_eval -c); four-class gains {config.esci_gains} "
        f"({gains_text(config.esci_gains)})\n\n"
        + markdown_table(
            header,
            [
                [s, *(results[s][m] for m in ESCI_METRICS), results[s]["num_queries"]]
                for s in results
            ],
        )
    )
    info = {
        "num_queries": len(query_ids),
        "num_judgments": sum(len(docs) for docs in beir.qrels.values()),
        "judged_not_in_corpus": missing,
        "timings_s": timings,
    }
    return ProtocolResult(results, rankings, markdown, info)
