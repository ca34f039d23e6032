"""Evaluation: ranx metrics against hand computation, retrieval against brute force, and
preprocess → evaluate end to end (local, S3, the CLI, the Ray encode path, ../shared)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from santa import eval as ev
from santa.config.recipes import get_recipe
from santa.data.beir import document_text, load_beir
from santa.eval import EvalConfig, evaluation
from santa.files import storage
from santa.models.checkpoints import resolve_model
from santa.models.dual_encoder import DualEncoder
from santa.models.encoding import encode_corpus_ray, encode_texts
from santa.models.tokenizer import train_tokenizer
from tests.datagen import stdlib_python_records, write_csn_layout

CSN_LANGUAGES = ("python", "go", "ruby")


def log2(x: float) -> float:
    return math.log2(x)


# ============================================================================ fixtures


@pytest.fixture(scope="module")
def tiny_model() -> DualEncoder:
    records = stdlib_python_records()
    texts = [r["code"] for r in records] + [r["docstring"] for r in records]
    products = ["Acme wireless mouse for laptop", "burr coffee grinder with travel pouch"]
    tokenizer = train_tokenizer(texts + products * 20, vocab_size=1000)
    return DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_model, tmp_path_factory) -> str:
    """A Ray checkpoint-shaped folder: the model (with santa_config.json) under model/."""
    root = tmp_path_factory.mktemp("checkpoint")
    tiny_model.save_pretrained(str(root / "model"), santa_config=get_recipe("tiny"))
    return str(root)


@pytest.fixture(scope="module")
def csn_beir(tmp_path_factory, ray_cluster) -> str:
    """CodeSearchNet test split (three languages) → BEIR, through the preprocessing job."""
    from santa.data.plan import PreprocessConfig, run_preprocess

    root = tmp_path_factory.mktemp("csn")
    write_csn_layout(root / "raw", languages=CSN_LANGUAGES)
    output = str(root / "beir")
    run_preprocess(
        PreprocessConfig(
            dataset="codesearchnet", input=str(root / "raw"), output=output, stage="eval"
        )
    )
    return output


def write_beir(root: Path, corpus: list[dict], queries: list[dict], qrels, split="test") -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels").mkdir(exist_ok=True)
    rows = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, d, s in qrels]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return str(root)


@pytest.fixture
def product_beir(tmp_path) -> str:
    """Graded ESCI-style judgments: two queries, E/S/C/I labels as 3/2/1/0, a stray query."""
    kinds = ["wireless mouse", "coffee grinder", "yoga mat", "desk lamp"]
    corpus = [
        {"_id": f"P{i}", "title": f"Acme {kinds[i % 4]} {i}", "text": f"A {kinds[i % 4]}."}
        for i in range(12)
    ]
    queries = [
        {"_id": "1", "text": "wireless mouse", "language": "us"},
        {"_id": "2", "text": "coffee grinder", "language": "us"},
        {"_id": "3", "text": "not judged in this split", "language": "us"},
    ]
    qrels = [("1", "P0", 3), ("1", "P4", 2), ("1", "P1", 1), ("1", "P2", 0)]
    qrels += [("2", "P1", 3), ("2", "P5", 3), ("2", "P9", 2), ("2", "P3", 0)]
    return write_beir(tmp_path / "products", corpus, queries, qrels)


# ============================================================================ metrics


def test_binary_metrics_equal_hand_computation() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}, "q3": {"z": 1}}
    ranking = {
        "q1": [("x", 3.0), ("a", 2.0), ("y", 1.0)],  # first hit at rank 2
        "q2": ["b", "x", "c"],  # plain id lists work too
        "q3": [("x", 1.0), ("y", 0.5)],  # nothing relevant retrieved
    }
    languages = {"q1": "python", "q2": "python", "q3": "ruby"}
    metrics = ev.compute_metrics(qrels, ranking, query_languages=languages)
    ndcg_q1 = (1 / log2(3)) / 1
    ndcg_q2 = (1 / log2(2) + 1 / log2(4)) / (1 / log2(2) + 1 / log2(3))
    assert metrics["mrr@100"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert metrics["recall@1"] == pytest.approx((0 + 1 / 2 + 0) / 3)
    assert metrics["recall@10"] == pytest.approx((1 + 1 + 0) / 3)
    assert metrics["recall@100"] == pytest.approx(2 / 3)
    assert metrics["ndcg@100"] == pytest.approx((ndcg_q1 + ndcg_q2 + 0) / 3)
    assert metrics["num_queries"] == 3 and "ndcg@100_4class" not in metrics
    python = metrics["by_language"]["python"]
    assert python["mrr@100"] == pytest.approx(0.75) and python["num_queries"] == 2
    assert metrics["by_language"]["ruby"]["ndcg@100"] == 0.0


def test_per_query_scores_of_every_judged_query_in_qrels_order() -> None:
    from santa.eval.metrics import per_query_scores

    qrels = {"q3": {"z": 1}, "q1": {"a": 1}, "q2": {"b": 0, "c": 1}, "q4": {"a": 1}}
    ranking = {"q1": ["x", "a"], "q2": ["b", "x", "c"], "q3": ["x"]}  # q4 not ranked
    scores = per_query_scores(qrels, ranking, "mrr@100")
    assert scores == {"q3": 0.0, "q1": 0.5, "q2": 1 / 3, "q4": 0.0}
    assert list(scores) == list(qrels)
    assert per_query_scores(qrels, ranking, "mrr@2") == {"q3": 0.0, "q1": 0.5, "q2": 0.0, "q4": 0.0}


def test_recall_counts_relevant_documents_missing_from_the_ranking() -> None:
    metrics = ev.compute_metrics({"q": {"a": 1, "b": 1, "c": 1, "d": 1}}, {"q": ["a", "x", "b"]})
    assert metrics["recall@100"] == pytest.approx(2 / 4)
    assert metrics["recall@1"] == pytest.approx(1 / 4)


@pytest.mark.parametrize(
    ("esci_gains", "substitute", "complement"), [("released", 0.01, 0.1), ("paper", 0.1, 0.01)]
)
def test_four_class_ndcg_gains_by_label_both_ways(esci_gains, substitute, complement) -> None:
    # Ranked: Complement, Substitute, Exact, Irrelevant.
    qrels = {"q": {"e": 3, "s": 2, "c": 1, "i": 0}}
    ranking = {"q": ["c", "s", "e", "i"]}
    metrics = ev.compute_metrics(qrels, ranking, esci_gains=esci_gains)

    def ndcg(gains_in_rank_order, ideal_gains):
        dcg = sum(g / log2(r + 2) for r, g in enumerate(gains_in_rank_order))
        return dcg / sum(g / log2(r + 2) for r, g in enumerate(ideal_gains))

    expected = ndcg([complement, substitute, 1.0, 0.0], [1.0, 0.1, 0.01])
    swapped = ndcg([substitute, complement, 1.0, 0.0], [1.0, 0.1, 0.01])  # the other way
    # Burges' 2^gain - 1 on the integer gains ranx is given (100/10/1) would differ too.
    burges = ndcg([2**1 - 1, 2**10 - 1, 2**100 - 1, 0], [2**100 - 1, 2**10 - 1, 2**1 - 1])
    assert metrics["ndcg@100_4class"] == pytest.approx(expected, abs=1e-9)
    assert abs(expected - swapped) > 0.03 and abs(expected - burges) > 0.03
    # Two-class: Exact = 1, everything else 0; MRR and recall count Exact only.
    assert metrics["ndcg@100"] == pytest.approx(1 / log2(4))
    assert metrics["mrr@100"] == pytest.approx(1 / 3)
    assert metrics["recall@1"] == 0.0 and metrics["recall@10"] == 1.0
    assert metrics["num_queries"] == metrics["num_queries_4class"] == 1
    with pytest.raises(ValueError, match="esci_gains must be one of"):
        ev.compute_metrics(qrels, ranking, esci_gains="text")


def test_graded_queries_without_a_relevant_document_leave_that_schemes_mean() -> None:
    qrels = {"q1": {"e": 3, "s": 2}, "q2": {"s": 2, "i": 0}, "q3": {"i": 0}}
    ranking = {"q1": ["e", "s"], "q2": ["i", "s"], "q3": ["i"]}
    metrics = ev.compute_metrics(qrels, ranking)
    assert metrics["num_queries"] == 1  # q1 only has an Exact product
    assert metrics["num_queries_4class"] == 2  # q3 has no positive gain at all
    assert metrics["ndcg@100"] == 1.0
    assert metrics["ndcg@100_4class"] == pytest.approx((1.0 + 1 / log2(3)) / 2)
    with pytest.raises(ValueError, match="ESCI labels 0-3"):
        ev.compute_metrics({"q": {"a": 5}}, {"q": ["a"]})


def test_metrics_follow_the_ranking_order_not_tied_scores() -> None:
    ranking = {"q": [("x", 1.0), ("a", 1.0)]}
    assert ev.compute_metrics({"q": {"a": 1}}, ranking)["mrr@100"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="lists a document twice"):
        ev.compute_metrics({"q": {"a": 1}}, {"q": ["a", "a"]})


# ============================================================================ retrieval


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_dense_retrieval_equals_brute_force_ranking(similarity) -> None:
    rng = np.random.default_rng(1)
    norms = rng.uniform(0.5, 2, (200, 1))  # unequal norms: cosine and dot differ
    docs = (rng.standard_normal((200, 24)) * norms).astype(np.float32)
    queries = rng.standard_normal((15, 24)).astype(np.float32)
    doc_ids = [f"d{i}" for i in range(200)]
    query_ids = [f"q{i}" for i in range(15)]
    ranking = ev.dense_retrieve(queries, query_ids, docs, doc_ids, top_k=50, similarity=similarity)
    q, d = torch.from_numpy(queries), torch.from_numpy(docs)
    if similarity == "cosine":
        q, d = torch.nn.functional.normalize(q, dim=1), torch.nn.functional.normalize(d, dim=1)
    top = torch.topk(q @ d.T, 50)
    for row, qid in enumerate(query_ids):
        assert [doc for doc, _ in ranking[qid]] == [doc_ids[j] for j in top.indices[row]]
        scores = np.array([score for _, score in ranking[qid]])
        np.testing.assert_allclose(scores, top.values[row].numpy(), rtol=1e-5, atol=1e-5)


def test_array_rankings_read_as_lists_and_score_like_the_same_lists() -> None:
    """dense_retrieve's RankedLists: a Mapping of (doc, score) lists, and compute_metrics
    on its arrays equals compute_metrics on the same rankings as plain lists, for binary
    and ESCI-graded qrels, a judged document outside the corpus and an unranked query."""
    rng = np.random.default_rng(7)
    docs = rng.standard_normal((120, 16)).astype(np.float32)
    queries = rng.standard_normal((30, 16)).astype(np.float32)
    doc_ids = [f"d{i}" for i in range(120)]
    query_ids = [f"q{i}" for i in range(30)]
    ranking = ev.dense_retrieve(queries, query_ids, docs, doc_ids, top_k=20)
    assert isinstance(ranking, ev.RankedLists) and len(ranking) == 30
    assert list(ranking) == query_ids
    top = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :20]
    assert [doc for doc, _ in ranking["q3"]] == [doc_ids[j] for j in top[3]]
    as_lists = {qid: list(hits) for qid, hits in ranking.items()}

    for graded in (False, True):
        qrels = {}
        for q in range(30):
            labels = rng.integers(0, 4 if graded else 2, size=120)
            qrels[f"q{q}"] = {doc_ids[j]: int(labels[j]) for j in top[q][:12] if labels[j] > 0}
            qrels[f"q{q}"][doc_ids[int(rng.integers(120))]] = 3 if graded else 1
        qrels["q0"]["not-in-corpus"] = 3 if graded else 1
        qrels["unranked"] = {"d1": 3 if graded else 1}
        languages = {q: ("go" if len(q) % 2 else "ruby") for q in qrels}
        fast = ev.compute_metrics(qrels, ranking, graded=graded, query_languages=languages)
        slow = ev.compute_metrics(qrels, as_lists, graded=graded, query_languages=languages)
        assert fast.keys() == slow.keys() and fast["by_language"].keys() == {"go", "ruby"}
        for metric, value in fast.items():
            if metric == "by_language":
                for language, values in value.items():
                    assert values == pytest.approx(slow["by_language"][language])
            else:
                assert value == pytest.approx(slow[metric]), metric
        assert fast["num_queries"] == 31
        if graded:
            assert "ndcg@100_4class" in fast


def test_array_rankings_cut_missing_hits_and_reject_bad_shapes() -> None:
    rows = np.array([[2, 0, -1], [-1, -1, -1]])
    scores = np.array([[0.9, 0.5, -np.inf], [-np.inf] * 3], dtype=np.float32)
    ranking = ev.RankedLists(["a", "b"], ["x", "y", "z"], rows, scores)
    assert ranking["a"] == [("z", pytest.approx(0.9)), ("x", pytest.approx(0.5))]
    assert ranking["b"] == []
    result = ev.compute_metrics({"a": {"x": 1}, "b": {"y": 1}}, ranking)
    assert result["mrr@100"] == pytest.approx((0.5 + 0) / 2)
    with pytest.raises(ValueError, match="unique"):
        ev.RankedLists(["a", "a"], ["x", "y", "z"], rows, scores)
    with pytest.raises(ValueError, match="for 3 queries"):
        ev.RankedLists(["a", "b", "c"], ["x", "y", "z"], rows, scores)


def test_dense_rerank_ranks_each_querys_candidates_only() -> None:
    docs = np.array([[1, 0], [0, 1], [2, 0], [1, 1]], dtype=np.float32)
    queries = np.array([[1, 0], [0, 1]], dtype=np.float32)
    candidates = {"q0": ["d1", "d0", "d3", "missing"], "q1": ["d0"]}
    ranking = ev.dense_rerank(queries, ["q0", "q1"], docs, ["d0", "d1", "d2", "d3"], candidates)
    assert [doc for doc, _ in ranking["q0"]] == ["d0", "d3", "d1"]  # d0/d3 tie: corpus order
    assert ranking["q1"] == [("d0", 0.0)]


def test_bm25_tokenizer_splits_identifiers_and_retrieval_finds_the_match() -> None:
    assert ev.bm25_tokenize("getHTTPResponse_code(x2) + MAX_SIZE") == [
        "get",
        "http",
        "response",
        "code",
        "x2",
        "max",
        "size",
    ]
    docs = ["def read_config(path): pass", "def parseJsonValue(s): pass", "def add(a, b): pass"]
    ids = ["d0", "d1", "d2"]
    ranking = ev.bm25_retrieve(docs, ids, ["parse json value", "zzz"], ["q0", "q1"], top_k=2)
    assert ranking["q0"][0][0] == "d1" and len(ranking["q0"]) == 2
    assert [doc for doc, _ in ranking["q1"]] == ["d0", "d1"]  # no match: ties by corpus order
    reranked = ev.bm25_rerank(docs, ids, ["parse json value"], ["q0"], {"q0": ["d2", "d0"]})
    assert [doc for doc, _ in reranked["q0"]] == ["d0", "d2"]


# ============================================================================ data and files


def test_load_beir_keeps_judged_queries_and_infers_languages(tmp_path) -> None:
    corpus = [
        {"_id": "u1", "title": "read_config", "text": "def f(): pass", "language": "python"},
        {"_id": "u2", "title": "", "text": "def g; end", "language": "ruby"},
    ]
    queries = [{"_id": "a", "text": "read a config"}, {"_id": "b", "text": "g"}, {"_id": "c"}]
    uri = write_beir(tmp_path / "b", corpus, queries, [("a", "u1", 1), ("b", "u2", 1)])
    beir = load_beir(uri)
    assert beir.queries == {"a": "read a config", "b": "g"}
    assert beir.query_languages == {"a": "python", "b": "ruby"}
    assert not beir.graded and beir.doc_ids == ["u1", "u2"]
    # Code is embedded without its title (the function name; AdvTest's de-obfuscated one).
    assert beir.document_texts() == ["def f(): pass", "def g; end"]
    assert document_text({"title": "Acme Mat", "text": "A mat."}) == "Acme Mat A mat."

    with pytest.raises(
        storage.StorageError, match=r"no qrels/dev.tsv \(splits present: \['test'\]"
    ):
        load_beir(uri, "dev")
    with pytest.raises(storage.StorageError, match="has no corpus.jsonl"):
        load_beir(str(tmp_path / "nowhere"))
    bad = write_beir(tmp_path / "bad", corpus, queries, [("zz", "u1", 1)])
    with pytest.raises(ValueError, match="judges 1 queries that queries.jsonl lacks"):
        load_beir(bad)


def test_trec_run_files_round_trip(tmp_path) -> None:
    ranking = {"q1": [("d1", 2.5), ("d2", -1.0)], "q2": [("d3", 0.125)]}
    path = str(tmp_path / "run.model.trec")
    ev.write_trec(path, ranking, tag="model")
    assert Path(path).read_text().splitlines()[0] == "q1 Q0 d1 1 2.500000 model"
    assert ev.read_trec(path) == ranking


# ============================================================================ encoding


def test_encode_texts_is_order_and_batch_invariant(tiny_model) -> None:
    texts = ["def add(a, b): return a + b", "x", "read a config file from disk", ""]
    tiny_model.train()
    first = encode_texts(tiny_model, texts, max_length=16, batch_size=3, progress=False)
    assert tiny_model.training  # the caller's mode is restored
    assert first.shape == (4, tiny_model.embedding_dim) and first.dtype == np.float32
    reversed_texts = encode_texts(
        tiny_model, texts[::-1], max_length=16, batch_size=1, progress=False
    )
    np.testing.assert_allclose(reversed_texts[::-1], first, atol=1e-5)
    with torch.inference_mode():
        encoded = tiny_model.tokenizer(
            texts[:1], max_length=16, truncation=True, return_tensors="pt"
        )
        direct = tiny_model.eval().encode(encoded["input_ids"], encoded["attention_mask"])
    np.testing.assert_allclose(first[0], direct[0].numpy(), atol=1e-5)


def test_forcing_ray_routes_encoding_through_the_actor_pool(monkeypatch, tiny_model, product_beir):
    calls = []

    def fake_ray_encode(model, texts, **kwargs):
        calls.append(len(texts))
        return encode_texts(tiny_model, texts, max_length=kwargs["max_length"], progress=False)

    monkeypatch.setattr(evaluation, "encode_corpus_ray", fake_ray_encode)
    monkeypatch.setattr("santa.cluster.ray_utils.init_ray", lambda address=None, **kw: None)
    ev.evaluate(tiny_model, product_beir, EvalConfig(baseline=None, use_ray=True, progress=False))
    assert calls == [12, 2]  # documents, then the judged queries
    calls.clear()
    ev.evaluate(
        tiny_model, product_beir, EvalConfig(baseline=None, ray_threshold=5, progress=False)
    )
    assert calls == [12]  # only the corpus outnumbers the threshold


# ============================================================================ end to end


def test_graded_evaluation_both_protocols_without_ray(tiny_model, product_beir, tmp_path):
    output = str(tmp_path / "eval")
    results = ev.evaluate(
        tiny_model, product_beir, EvalConfig(output=output, protocol="both", progress=False)
    )
    assert set(results) == {"model", "bm25", "model-rerank", "bm25-rerank"}
    for metrics in results.values():
        for name in (*ev.METRICS, ev.NDCG_4CLASS):
            assert 0.0 <= metrics[name] <= 1.0
        assert metrics["num_queries"] == 2 and metrics["by_language"]["us"]["num_queries"] == 2
    # BM25 finds the products named in the query among the judged candidates.
    assert results["bm25-rerank"]["mrr@100"] == 1.0
    rerank_run = ev.read_trec(f"{output}/run.model-rerank.trec")
    assert {doc for doc, _ in rerank_run["1"]} == {"P0", "P4", "P1", "P2"}
    full_run = ev.read_trec(f"{output}/run.model.trec")
    assert len(full_run["1"]) == 12 and set(full_run) == {"1", "2"}
    assert json.loads(Path(output, "metrics.json").read_text()) == results
    # The in-process helper gives the same numbers without writing anything.
    beir = load_beir(product_beir)
    single = ev.evaluate_model(tiny_model, beir, max_query_length=50, max_document_length=240)
    for name in (*ev.METRICS, ev.NDCG_4CLASS):
        assert single[name] == pytest.approx(results["model"][name])
    assert set(single["timings"]) >= {"retrieval_s", "metrics_s"}


def test_evaluation_in_blocks_of_one_query_writes_the_same_outputs(
    tiny_model, product_beir, tmp_path, monkeypatch
):
    """``block_size`` is honoured (ranx and the TREC writer get that many queries at a
    time) and changes nothing in metrics.json, metrics.md or the run files."""
    from santa.eval import metrics as metrics_module
    from santa.eval import runfiles

    seen: dict[str, list[int]] = {"scored": [], "written": []}
    score, blocks = metrics_module._Judgments.score, runfiles.trec_blocks

    def recording_score(self, relevance, metrics, block_size):
        seen["scored"].append(block_size)
        return score(self, relevance, metrics, block_size)

    def recording_blocks(ranking, tag, *, block_size):
        seen["written"].append(block_size)
        return blocks(ranking, tag, block_size=block_size)

    monkeypatch.setattr(metrics_module._Judgments, "score", recording_score)
    monkeypatch.setattr(runfiles, "trec_blocks", recording_blocks)
    outputs = {}
    for block_size in (1, 10_000):
        output = tmp_path / f"eval-{block_size}"
        config = EvalConfig(
            output=str(output), protocol="both", block_size=block_size, progress=False
        )
        ev.evaluate(tiny_model, product_beir, config)
        assert set(seen["scored"]) == {block_size} and set(seen["written"]) == {block_size}
        seen = {"scored": [], "written": []}
        outputs[block_size] = {
            name: (output / name).read_bytes()
            for name in ("metrics.json", "metrics.md", *(f"run.{s}.trec" for s in SYSTEMS))
        }
    assert outputs[1] == outputs[10_000]


SYSTEMS = ("model", "bm25", "model-rerank", "bm25-rerank")


def test_preprocess_then_evaluate_a_checkpoint_with_bm25(csn_beir, tiny_checkpoint, tmp_path):
    assert resolve_model(tiny_checkpoint).model_uri == str(Path(tiny_checkpoint, "model"))
    output = str(tmp_path / "eval")
    results = ev.evaluate(tiny_checkpoint, csn_beir, EvalConfig(output=output, progress=False))
    beir = load_beir(csn_beir)
    assert set(results) == {"model", "bm25"}
    for metrics in results.values():
        assert all(0.0 <= metrics[name] <= 1.0 for name in ev.METRICS)
        assert metrics["num_queries"] == len(beir.queries)
        assert set(metrics["by_language"]) == set(CSN_LANGUAGES)
    # A docstring shares words with its code: BM25 beats chance (MRR ~0.1 for ~40 docs).
    assert results["bm25"]["mrr@100"] > 0.15
    table = Path(output, "metrics.md").read_text()
    assert "| model |" in table and "| bm25 |" in table and "Per language" in table
    info = json.loads(Path(output, "info.json").read_text())
    # Lengths come from the checkpoint's santa_config.json (the tiny recipe's 32/128).
    assert (info["max_query_length"], info["max_document_length"]) == (32, 128)
    assert not info["ray"]["documents"]
    for system in results:
        assert Path(output, f"run.{system}.trec").stat().st_size > 0


def test_s3_data_model_and_output_on_moto(csn_beir, tiny_checkpoint, moto_s3):
    bucket = moto_s3.create_bucket("santa-eval")
    for path in Path(csn_beir).rglob("*"):
        if path.is_file() and path.name != "report.json":
            storage.write_bytes(f"{bucket}/beir/{path.relative_to(csn_beir)}", path.read_bytes())
    for path in Path(tiny_checkpoint, "model").iterdir():
        storage.write_bytes(f"{bucket}/ckpt/model/{path.name}", path.read_bytes())
    results = ev.evaluate(
        f"{bucket}/ckpt",
        f"{bucket}/beir",
        EvalConfig(output=f"{bucket}/eval", baseline=None, progress=False),
    )
    assert set(results) == {"model"}
    # Published whole: on S3 the files sit under the run prefix the manifest names.
    from santa.files.outputs import published_root, read_manifest

    assert read_manifest(f"{bucket}/eval")["manifest"]["complete"]
    published = published_root(f"{bucket}/eval")
    assert published.startswith(f"{bucket}/eval/runs/")
    assert storage.read_json(f"{published}/metrics.json") == results
    assert "| model |" in storage.read_bytes(f"{published}/metrics.md").decode()
    assert storage.read_json(f"{published}/info.json")["max_document_length"] == 128


def test_cli_prints_the_table(evaluate_cli_run):
    """conftest's ``evaluate_cli_run``: the model and the BM25 baseline, the options recorded."""
    from tests.job_runs import MAX_DOCUMENT_LENGTH

    proc = evaluate_cli_run["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| model |" in proc.stdout and "| bm25 |" in proc.stdout
    info = json.loads((evaluate_cli_run["output"] / "info.json").read_text())
    assert info["max_document_length"] == MAX_DOCUMENT_LENGTH
    assert "Ray resources" not in proc.stderr  # the small corpus never starts Ray


def test_ray_encode_path_matches_the_plain_path(tiny_model, tiny_checkpoint, ray_cluster):
    records = stdlib_python_records(limit=40)
    texts = [r["code"] for r in records]
    plain = encode_texts(tiny_model, texts, max_length=64, batch_size=16, progress=False)
    on_ray = encode_corpus_ray(tiny_checkpoint, texts, max_length=64, batch_size=16)
    assert on_ray.shape == plain.shape
    np.testing.assert_allclose(on_ray, plain, atol=1e-5, rtol=0)


# ============================================================================ ../shared


def test_shared_codesearchnet_ruby_valid(shared_fixtures, tiny_checkpoint, ray_cluster, tmp_path):
    from santa.data.plan import PreprocessConfig, run_preprocess

    beir = str(tmp_path / "ruby")
    run_preprocess(
        PreprocessConfig(
            dataset="codesearchnet",
            input=str(shared_fixtures / "csn" / "ruby"),
            output=beir,
            stage="eval",
            split="valid",
        )
    )
    results = ev.evaluate(
        tiny_checkpoint,
        beir,
        EvalConfig(split="valid", max_document_length=64, progress=False),
    )
    assert results["model"]["num_queries"] > 1300
    assert set(results["model"]["by_language"]) == {"ruby"}
    assert all(0.0 <= results[s][m] <= 1.0 for s in results for m in ev.METRICS)
    assert results["bm25"]["mrr@100"] > results["model"]["mrr@100"]  # untrained vs BM25


def test_shared_esci_graded_both_protocols(shared_fixtures, tiny_checkpoint, ray_cluster, tmp_path):
    from santa.data.plan import PreprocessConfig, run_preprocess

    beir = str(tmp_path / "esci")
    run_preprocess(
        PreprocessConfig(
            dataset="esci", input=str(shared_fixtures / "esci"), output=beir, stage="eval"
        )
    )
    results = ev.evaluate(tiny_checkpoint, beir, EvalConfig(protocol="both", progress=False))
    assert set(results) == {"model", "bm25", "model-rerank", "bm25-rerank"}
    for metrics in results.values():
        assert 0.0 <= metrics[ev.NDCG_4CLASS] <= 1.0 and metrics["num_queries"] == 1


# ============================================================================ progress


def test_evaluation_shows_progress_lines_not_bars(tiny_model, tmp_path, monkeypatch, capsys):
    """Evaluation's encoding says how far it got as santa's own ``[eval]`` lines (every
    15 s; here every batch): the pipeline's [eval] showed nothing for 91 s but the empty
    lines of tqdm bars. No empty line, no carriage return or escape sequence."""
    import re

    monkeypatch.setenv("SANTA_PROGRESS_EVERY_S", "0")
    corpus = [
        {"_id": f"d{i}", "title": "", "text": f"def f{i}(x): return x + {i}"} for i in range(20)
    ]
    queries = [{"_id": f"q{i}", "text": f"add {i} to a value"} for i in range(20)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(20)]
    beir = write_beir(tmp_path / "beir", corpus, queries, qrels)
    ev.evaluate(tiny_model, beir, EvalConfig(baseline=None, batch_size=8))
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    progress = [line for line in lines if line.startswith("[eval] ")]
    assert re.fullmatch(
        r"\[eval\] documents: 8/20 texts \(40%\), [\d,]+ texts/s, \d+ s", progress[0]
    )
    assert any(re.fullmatch(r"\[eval\] documents: 20 texts in \d+ s.*", p) for p in progress)
    assert any(re.fullmatch(r"\[eval\] queries: 20 texts in \d+ s.*", p) for p in progress)
    assert "" not in lines and "\r" not in captured.out + captured.err
    assert "\x1b" not in captured.out + captured.err

    # Quiet where asked (--no-progress), and a phase shorter than the interval is silent.
    ev.evaluate(tiny_model, beir, EvalConfig(baseline=None, batch_size=8, progress=False))
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("SANTA_PROGRESS_EVERY_S", "15")
    ev.evaluate(tiny_model, beir, EvalConfig(baseline=None, batch_size=8))
    assert capsys.readouterr().out == ""
