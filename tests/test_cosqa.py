"""CoSQA as a retrieval set, and santa's evaluator scoring a sentence-transformers model
exactly as sentence-transformers itself does (all-MiniLM-L6-v2, real web queries)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from santa.config.recipes import minilm_path
from santa.data.beir import load_beir
from santa.data.cosqa import cosqa_beir, write_cosqa_beir
from tests.conftest import SHARED_FIXTURES


def test_cosqa_records_become_positive_queries_over_distinct_functions(tmp_path: Path) -> None:
    records = [
        {"idx": "q0", "doc": "python sort dict", "code": "def a(): pass", "label": 1},
        {"idx": "q1", "doc": "python open file", "code": "def a(): pass", "label": 0},
        {"idx": "q2", "doc": "python read json", "code": "def b(): pass", "label": 1},
        {"idx": "q3", "doc": "   ", "code": "def c(): pass", "label": 1},
        {"idx": "q4", "code": "def d(): pass", "label": 1},
        "not a record",
    ]
    beir = cosqa_beir(records)
    assert [q["_id"] for q in beir.queries] == ["q0", "q2"]
    assert [d["text"] for d in beir.corpus] == ["def a(): pass", "def b(): pass", "def c(): pass"]
    assert beir.qrels == {("q0", "cosqa-code-0"): 1, ("q2", "cosqa-code-1"): 1}
    assert beir.skipped == {
        "missing_field": 2,
        "empty_query": 1,
        "empty_code": 0,
        "duplicate_query_id": 0,
    }
    source = tmp_path / "cosqa.json"
    source.write_text(json.dumps(records))
    report = write_cosqa_beir(str(source), str(tmp_path / "beir"))
    assert report["beir"] == {"corpus": 3, "queries": 2, "qrels": 2}
    loaded = load_beir(str(tmp_path / "beir"))
    assert loaded.qrels == {"q0": {"cosqa-code-0": 1}, "q2": {"cosqa-code-1": 1}}
    source.write_text(json.dumps({"not": "an array"}))
    with pytest.raises(ValueError, match="not a CoSQA JSON array"):
        write_cosqa_beir(str(source), str(tmp_path / "bad"))


@pytest.mark.slow
def test_evaluator_scores_minilm_like_sentence_transformers(
    tmp_path: Path, shared_fixtures: Path
) -> None:
    """The README's figure: ray_jobs.evaluate on all-MiniLM-L6-v2 equals
    SentenceTransformer.encode + cosine on the same queries and corpus (MRR@100 ± 0.002);
    on the first 200 records of ../shared's CoSQA dev file, or of its stand-in on a clone
    without it."""
    # The first 200 records (about 100 judged queries over 200 functions): a third of the
    # file's encoding, twice over (santa's and sentence-transformers'), on 2 CPU cores.
    cosqa = tmp_path / "cosqa-dev.json"
    records = json.loads((shared_fixtures / "cosqa" / "cosqa-dev.json").read_text())
    cosqa.write_text(json.dumps(records[:200]))
    import pytrec_eval
    from sentence_transformers import SentenceTransformer

    beir_dir = tmp_path / "cosqa"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    subprocess.run(
        [sys.executable, "-m", "ray_jobs.preprocess", "--dataset", "cosqa", "--input", str(cosqa),
         "--output", str(beir_dir), "--stage", "eval"],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    out = tmp_path / "eval"
    subprocess.run(
        [sys.executable, "-m", "ray_jobs.evaluate", "--checkpoint", minilm_path(), "--data",
         str(beir_dir), "--baseline", "none", "--no-progress", "--output", str(out)],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    santa_mrr = json.loads((out / "metrics.json").read_text())["model"]["mrr@100"]
    info = json.loads((out / "info.json").read_text())
    assert (info["similarity"], info["pooling"], info["max_document_length"]) == (
        "cosine",
        "mean",
        256,
    )

    beir = load_beir(str(beir_dir))
    model = SentenceTransformer(minilm_path(), device="cpu")
    doc_ids, query_ids = beir.doc_ids, list(beir.queries)
    docs = model.encode([beir.corpus[d]["text"] for d in doc_ids], normalize_embeddings=True)
    queries = model.encode([beir.queries[q] for q in query_ids], normalize_embeddings=True)
    scores = queries @ docs.T  # cosine: (queries, docs)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :100]
    run = {q: {doc_ids[j]: float(scores[i, j]) for j in top[i]} for i, q in enumerate(query_ids)}
    # Scored by trec_eval's own code (reciprocal rank over the top 100 = MRR@100), apart
    # from santa's ranx path; ranx's Qrels/Run would compile numba code again for every
    # new id length (~40 s on 2 cores).
    per_query = pytrec_eval.RelevanceEvaluator(beir.qrels, {"recip_rank"}).evaluate(run)
    st_mrr = float(
        np.mean([per_query.get(q, {"recip_rank": 0.0})["recip_rank"] for q in beir.qrels])
    )
    assert santa_mrr == pytest.approx(st_mrr, abs=0.002), (santa_mrr, st_mrr)
    if shared_fixtures == SHARED_FIXTURES:  # real queries (not the stand-in's)
        assert santa_mrr > 0.5  # a real encoder, not random weights
