"""The papers' evaluation protocols: CodeSearch per language, AdvTest, ESCI's candidates.

Metrics are checked against hand computations from the model's own embeddings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from santa.config.recipes import get_recipe
from santa.eval import EvalConfig
from santa.eval.advtest import read_advtest
from santa.eval.codesearch import find_languages, read_language, write_codesearch_layout
from santa.eval.esci import esci_metrics
from santa.eval.protocols import evaluate_protocol, run_protocol
from santa.files import storage
from santa.files.outputs import read_manifest
from santa.models.dual_encoder import DualEncoder
from santa.models.encoding import encode_texts
from santa.models.tokenizer import train_tokenizer
from tests.datagen import other_language_records, stdlib_python_records
from tests.test_evaluate import write_beir

LENGTHS = {"max_query_length": 32, "max_document_length": 64}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[DualEncoder, str]:
    """A tiny untrained model and its checkpoint folder (lengths saved with it)."""
    records = stdlib_python_records() + other_language_records("ruby", 20)
    texts = [r["code"] for r in records] + [r["docstring"] for r in records]
    tokenizer = train_tokenizer(texts * 2, vocab_size=800)
    model = DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0).eval()
    folder = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(str(folder), santa_config=get_recipe("tiny"))
    return model, str(folder)


def embed(model: DualEncoder, texts: list[str], length: int) -> np.ndarray:
    vectors = encode_texts(model, texts, max_length=length, batch_size=16, progress=False)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)  # tiny: cosine


def mrr_by_hand(queries: np.ndarray, docs: np.ndarray, answers: list[int]) -> float:
    """Mean 1/rank of each query's answer; equal scores ranked by corpus order."""
    scores = queries @ docs.T
    total = 0.0
    for row, answer in enumerate(answers):
        above = scores[row] > scores[row, answer]
        before = (scores[row] == scores[row, answer]) & (np.arange(docs.shape[0]) < answer)
        total += 1.0 / (1 + above.sum() + before.sum())
    return total / len(answers)


# =========================================================================== codesearch


@pytest.fixture(scope="module")
def codesearch(tmp_path_factory) -> Path:
    """Two languages in GraphCodeBERT's layout. Ruby's codebase also holds, as functions,
    the exact text of every Python query: pooled with Ruby, each Python query would find
    its own words first and its answer would drop a place."""
    root = tmp_path_factory.mktemp("codesearch")
    python = stdlib_python_records(limit=16)
    write_codesearch_layout(python, root, "python", "test")
    ruby = other_language_records("ruby", 8)
    write_codesearch_layout(ruby, root, "ruby", "test")
    lures = [
        {"url": f"lure-{i}", "code": " ".join(r["docstring_tokens"]), "language": "ruby"}
        for i, r in enumerate(python)
    ]
    with open(root / "ruby" / "codebase.jsonl", "a") as handle:
        handle.writelines(json.dumps(lure) + "\n" for lure in lures)
    return root


def test_codesearch_ranks_each_language_against_its_own_codebase(tiny, codesearch) -> None:
    model, folder = tiny
    config = EvalConfig(baseline=None, progress=False, **LENGTHS)
    results = evaluate_protocol("codesearch", folder, str(codesearch), config)
    by_language = results["model"]["by_language"]
    assert set(by_language) == {"python", "ruby"}
    expected = {}
    for language in ("python", "ruby"):
        subset = read_language(str(codesearch / language), language, "test")
        docs = embed(model, subset.documents, LENGTHS["max_document_length"])
        queries = embed(model, subset.queries, LENGTHS["max_query_length"])
        answers = [subset.doc_ids.index(subset.answers[q]) for q in subset.query_ids]
        expected[language] = mrr_by_hand(queries, docs, answers)
        assert by_language[language]["mrr"] == pytest.approx(expected[language], abs=1e-6)
        assert by_language[language]["num_candidates"] == len(subset.doc_ids)
    assert by_language["ruby"]["num_candidates"] == 8 + 16  # its functions and the lures
    assert results["model"]["mrr"] == pytest.approx(sum(expected.values()) / 2, abs=1e-6)
    assert results["model"]["num_queries"] == 16 + 8

    # Pooled, the lures (Python queries' own words, as Ruby functions) outrank answers.
    python = read_language(str(codesearch / "python"), "python", "test")
    ruby = read_language(str(codesearch / "ruby"), "ruby", "test")
    pooled = embed(model, python.documents + ruby.documents, LENGTHS["max_document_length"])
    queries = embed(model, python.queries, LENGTHS["max_query_length"])
    answers = [python.doc_ids.index(python.answers[q]) for q in python.query_ids]
    assert mrr_by_hand(queries, pooled, answers) < expected["python"]


def test_codesearch_layout_errors_name_what_is_there(codesearch, tmp_path) -> None:
    assert set(find_languages(str(codesearch), "test")) == {"python", "ruby"}
    assert set(find_languages(str(codesearch / "ruby"), "test")) == {"ruby"}
    with pytest.raises(FileNotFoundError, match="languages found: python, ruby"):
        find_languages(str(codesearch), "test", ["go"])
    with pytest.raises(FileNotFoundError, match="has no valid.jsonl"):
        find_languages(str(codesearch), "valid")
    with pytest.raises(FileNotFoundError, match="not a CodeSearch folder"):
        find_languages(str(tmp_path), "test")


def test_codesearch_from_s3_with_outputs(tiny, codesearch, moto_s3, tmp_path) -> None:
    _, folder = tiny
    bucket = moto_s3.create_bucket("codesearch")
    for path in codesearch.rglob("*.jsonl"):
        relative = path.relative_to(codesearch).as_posix()
        storage.write_bytes(f"{bucket}/cs/{relative}", path.read_bytes())
    config = EvalConfig(progress=False, output=str(tmp_path / "out"), **LENGTHS)
    results = evaluate_protocol("codesearch", folder, f"{bucket}/cs", config, languages=["ruby"])
    assert set(results) == {"model", "bm25"} and set(results["model"]["by_language"]) == {"ruby"}
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert written == json.loads(json.dumps(results))
    run = (tmp_path / "out" / "run.model.trec").read_text().splitlines()
    assert len(run) == 8 * 24  # 8 queries, every candidate ranked (24 < top_k)
    info = json.loads((tmp_path / "out" / "info.json").read_text())
    assert info["protocol"] == "codesearch" and info["languages"]["ruby"]["queries"] == 8


@pytest.mark.parametrize(
    ("language", "code", "without_comments"),
    [
        (
            "python",
            'def f(x):\n    """Add one."""\n    # the step\n    return x + 1  # done\n',
            "def f(x):\n    return x + 1",
        ),
        (
            "go",
            "// F adds one.\nfunc F(x int) int {\n\t/* the step */ return x + 1 // done\n}\n",
            "func F(x int) int {\n\t return x + 1\n}",
        ),
        ("ruby", "# Adds one.\ndef f(x)\n  x + 1 # done\nend\n", "def f(x)\n  x + 1\nend"),
    ],
)
def test_candidate_text_follows_the_named_reference(language, code, without_comments) -> None:
    from santa.eval.codesearch import candidate_text

    tokens = ["def", "f", "(", "x", ")", ":", "return", "x", "+", "1"]
    docstring = {"python": "Add one.", "go": "F adds one.", "ruby": "Adds one."}[language]
    row = {"code": code, "code_tokens": tokens, "docstring": docstring}
    # SANTA's build_test_code.py: the code tokens joined by spaces.
    assert candidate_text(row, language, "released") == " ".join(tokens)
    # GraphCodeBERT: every comment and docstring gone, blank lines dropped.
    stripped = candidate_text(row, language, "graphcodebert")
    assert [line.rstrip() for line in stripped.split("\n")] == without_comments.split("\n")
    # As santa trains: the docstring (doc comment) gone, the body's comment kept.
    training = candidate_text(row, language, "training")
    assert docstring not in training and "done" in training
    # No tokens: released falls back to the source without comments.
    assert candidate_text({"code": code}, language, "released") == stripped
    with pytest.raises(ValueError, match="code_text must be one of"):
        candidate_text(row, language, "tokens")


def test_protocol_results_carry_the_lengths_used(tiny, codesearch) -> None:
    _, folder = tiny
    config = EvalConfig(baseline="bm25", progress=False, **LENGTHS)
    asked = run_protocol("codesearch", folder, str(codesearch), config, languages=["ruby"])
    model = asked.results["model"]
    assert (model["max_query_length"], model["max_document_length"]) == (32, 64)
    assert model["lengths_from"] == "asked" and "max_query_length" not in asked.results["bm25"]
    assert asked.markdown.rstrip().endswith("model encoded at 32/64 query/document tokens (asked)")
    assert asked.info["lengths_from"] == "asked"
    trained = run_protocol(
        "codesearch",
        folder,
        str(codesearch),
        EvalConfig(baseline=None, progress=False),
        languages=["ruby"],
    )
    saved = json.loads((Path(folder) / "santa_config.json").read_text())["train"]
    model = trained.results["model"]
    assert model["lengths_from"] == "trained"
    assert model["max_query_length"] == saved["max_query_length"]


# =========================================================================== advtest


def write_advtest_rows(path: Path) -> list[dict]:
    """AdvTest test rows; rows 3 and 4 hold the same function (their scores tie)."""
    records = stdlib_python_records(limit=16)
    rows = []
    for index, record in enumerate(records):
        code = records[3]["code"] if index == 4 else record["code"]
        rows.append(
            {
                "url": "https://github.com/same/commit/",  # AdvTest's urls repeat
                "function": code,
                "docstring": record["docstring"] if index != 4 else records[3]["docstring"],
                "docstring_tokens": record["docstring_tokens"],
                "idx": str(100 + index),
            }
        )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def test_advtest_scores_as_codexglue_with_ties_against_the_answer(tiny, tmp_path) -> None:
    model, folder = tiny
    write_advtest_rows(tmp_path / "test.jsonl")
    adv = read_advtest(str(tmp_path), "test")
    assert adv.ids == [str(100 + i) for i in range(16)]
    config = EvalConfig(baseline=None, progress=False, **LENGTHS)
    results = evaluate_protocol("advtest", folder, str(tmp_path / "test.jsonl"), config)
    functions = embed(model, adv.functions, LENGTHS["max_document_length"])
    queries = embed(model, adv.queries, LENGTHS["max_query_length"])
    scores = queries @ functions.T
    # CodeXGLUE: rank = 1 + #{j != i: s_ij >= s_ii}
    ranks = [1 + sum(scores[i, j] >= scores[i, i] for j in range(16) if j != i) for i in range(16)]
    assert results["model"]["mrr"] == pytest.approx(np.mean([1 / r for r in ranks]), abs=1e-6)
    assert scores[4, 3] == pytest.approx(scores[4, 4], abs=1e-6)  # the tie...
    assert ranks[4] >= 2 and ranks[3] >= 2  # ...counts against both answers
    assert results["model"]["num_queries"] == 16


# =========================================================================== esci


ESCI_LABELS = {"E": 3, "S": 2, "C": 1, "I": 0}


@pytest.fixture
def esci_beir(tmp_path) -> str:
    """Three queries judging some of six products; q3 judges only an Irrelevant one."""
    corpus = [
        {"_id": f"P{i}", "title": f"Acme meter {i}", "text": f"measures thing {i}"}
        for i in range(6)
    ]
    queries = [{"_id": q, "text": f"meter {q}"} for q in ("q1", "q2", "q3")]
    qrels = [
        ("q1", "P0", ESCI_LABELS["E"]),
        ("q1", "P1", ESCI_LABELS["S"]),
        ("q1", "P2", ESCI_LABELS["I"]),
        ("q2", "P3", ESCI_LABELS["C"]),
        ("q2", "P4", ESCI_LABELS["E"]),
        ("q3", "P5", ESCI_LABELS["I"]),
    ]
    return write_beir(Path(tmp_path) / "esci", corpus, queries, qrels)


def test_advtest_mrr_at_100_scores_an_answer_below_the_top_100_as_zero() -> None:
    from santa.eval.advtest import codexglue_scores

    count = 150
    rng = np.random.default_rng(3)
    scores = rng.random((count, count)).astype(np.float32)
    np.fill_diagonal(scores, 2.0)  # every answer first...
    scores[0, 1:120] = 3.0  # ...but query 0's, ranked 120th
    metrics, _, _ = codexglue_scores(lambda start, end: scores[start:end], count, top_k=10)
    assert metrics["mrr"] == pytest.approx((1 / 120 + (count - 1)) / count)
    assert metrics["mrr@100"] == pytest.approx((count - 1) / count)
    assert metrics["recall@100"] == pytest.approx((count - 1) / count)


def test_esci_ranks_only_each_querys_judged_products(tiny, esci_beir, tmp_path) -> None:
    _, folder = tiny
    config = EvalConfig(progress=False, output=str(tmp_path / "out"), **LENGTHS)
    outcome = run_protocol("esci", folder, esci_beir, config)
    judged = {"q1": {"P0", "P1", "P2"}, "q2": {"P3", "P4"}, "q3": {"P5"}}
    for system in ("model", "bm25"):
        ranking = outcome.rankings[system]
        assert {q: {d for d, _ in hits} for q, hits in ranking.items()} == judged
    lines = (tmp_path / "out" / "run.model.trec").read_text().splitlines()
    assert len(lines) == 6


@pytest.mark.parametrize(
    ("esci_gains", "substitute", "complement"), [("released", 0.01, 0.1), ("paper", 0.1, 0.01)]
)
def test_esci_gains_and_averaging_as_the_paper(esci_gains, substitute, complement) -> None:
    """Four-class gains (SANTA's script: S 0.01, C 0.1; Table 2's caption: S 0.1, C 0.01);
    two-class E 1; every query averaged, a query with nothing relevant at 0 (trec_eval
    -c), against a hand computation."""
    qrels = {
        "q1": {"P0": 3, "P1": 2, "P2": 0},
        "q2": {"P3": 1, "P4": 3},
        "q3": {"P5": 0},
    }
    ranking = {
        "q1": [("P1", 3.0), ("P2", 2.0), ("P0", 1.0)],
        "q2": [("P4", 2.0), ("P3", 1.0)],
        "q3": [("P5", 1.0)],
    }

    def dcg(gains):
        return sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, start=1))

    q1_four = dcg([substitute, 0, 1]) / dcg([1, substitute, 0])
    q2_four = dcg([1, complement]) / dcg([1, complement])
    q1_two = dcg([0, 0, 1]) / dcg([1])
    metrics = esci_metrics(qrels, ranking, esci_gains)
    assert metrics["ndcg@100_4class"] == pytest.approx((q1_four + q2_four + 0) / 3)
    assert metrics["ndcg@100"] == pytest.approx((q1_two + 1 + 0) / 3)
    assert metrics["mrr@100"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert metrics["num_queries"] == 3 and metrics["num_queries_with_exact"] == 2
    assert metrics["num_queries_with_gain"] == 2
    assert metrics["esci_gains"] == esci_gains


def test_esci_released_gains_equal_trec_eval_with_the_scripts_gain_map() -> None:
    """SANTA's evaluate_product.py maps E/S/C/I to 4/2/3/1 and runs trec_eval with
    ``-c -m ndcg.1=0,2=0.01,3=0.1,4=1``. pytrec_eval (trec_eval's own code) cannot parse that
    gain parameter, so its qrels carry the script's gains as relevance values, scaled by 100
    (trec_eval's ndcg takes the relevance as the gain; NDCG is scale-invariant)."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = np.random.default_rng(7)
    script_gain = {"E": 100, "S": 1, "C": 10, "I": 0}  # 4=1, 2=0.01, 3=0.1, 1=0 (x 100)
    grade = {"E": 3, "S": 2, "C": 1, "I": 0}
    qrels, trec_qrels, ranking, trec_run = {}, {}, {}, {}
    for q in range(40):
        labels = rng.choice(list("ESCI"), size=int(rng.integers(1, 12)), p=[0.4, 0.2, 0.1, 0.3])
        docs = [f"q{q}d{i}" for i in range(len(labels))]
        qrels[f"q{q}"] = {d: grade[label] for d, label in zip(docs, labels, strict=True)}
        trec_qrels[f"q{q}"] = {d: script_gain[label] for d, label in zip(docs, labels, strict=True)}
        scores = rng.permutation(len(docs)).astype(float) + 1.0
        ranked = sorted(zip(docs, scores, strict=True), key=lambda hit: -hit[1])
        ranking[f"q{q}"] = ranked
        trec_run[f"q{q}"] = dict(ranked)
    per_query = pytrec_eval.RelevanceEvaluator(trec_qrels, {"ndcg"}).evaluate(trec_run)
    # trec_eval -c: every query in the mean, a query without any gain at 0.
    expected = sum(per_query.get(q, {"ndcg": 0.0})["ndcg"] for q in qrels) / len(qrels)
    released = esci_metrics(qrels, ranking, "released")["ndcg@100_4class"]
    paper = esci_metrics(qrels, ranking, "paper")["ndcg@100_4class"]
    assert released == pytest.approx(expected, abs=1e-9)
    assert abs(paper - expected) > 1e-3  # the caption's gains give another number


def test_esci_refuses_ungraded_data(tiny, tmp_path) -> None:
    _, folder = tiny
    beir = write_beir(
        tmp_path / "code", [{"_id": "d", "text": "x"}], [{"_id": "q", "text": "x"}], [("q", "d", 1)]
    )
    with pytest.raises(ValueError, match="graded qrels"):
        evaluate_protocol("esci", folder, beir, EvalConfig(progress=False))


# =========================================================================== the job


def test_evaluate_job_protocols_old_spellings_and_publishing(tiny, codesearch, tmp_path, capsys):
    from ray_jobs.evaluate import main

    _, folder = tiny
    output = tmp_path / "eval"
    common = ["--checkpoint", folder, "--max-query-length", "32", "--max-document-length", "64"]
    args = [*common, "--protocol", "codesearch", "--data", str(codesearch), "--no-progress"]
    assert main([*args, "--output", str(output), "--languages", "python"]) == 0
    printed = capsys.readouterr().out
    assert "| system | python | Overall | queries |" in printed
    manifest = read_manifest(str(output))
    assert manifest["manifest"]["complete"] and manifest["config"]["protocol"] == "codesearch"
    assert {p.name for p in output.iterdir()} == {
        "report.json",
        "metrics.json",
        "metrics.md",
        "info.json",
        "run.model.trec",
        "run.bm25.trec",
    }
    assert not list(tmp_path.glob("eval.tmp-*"))  # staged beside, renamed in
    # --protocol full (before the papers' protocols) still runs the BEIR retrieval protocol.
    beir = write_beir(
        tmp_path / "beir",
        [{"_id": "d1", "text": "def add(a, b): return a + b"}, {"_id": "d2", "text": "x = 1"}],
        [{"_id": "q1", "text": "add two numbers"}],
        [("q1", "d1", 1)],
    )
    assert main([*common, "--protocol", "full", "--data", beir, "--no-progress"]) == 0
    assert "| model |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--data", beir, "--languages", "ruby"])
    assert exit_info.value.code == 2
    assert "--languages selects CodeSearch languages" in capsys.readouterr().err


def test_evaluate_job_names_broken_files(tiny, codesearch, tmp_path, capsys):
    """A malformed line is skipped and counted under the table with its folder; a
    compressed file cut short ends the job in one line naming it (exit 2)."""
    import gzip
    import shutil

    from ray_jobs.evaluate import main

    _, folder = tiny
    data = tmp_path / "cs"
    shutil.copytree(codesearch / "ruby", data / "ruby")
    test = data / "ruby" / "test.jsonl"
    test.write_text(test.read_text() + "{broken\n")
    common = ["--checkpoint", folder, "--protocol", "codesearch", "--no-progress"]
    assert main([*common, "--data", str(data), "--baseline", "none"]) == 0
    printed = capsys.readouterr().out
    assert f"skipped 1 row of {data / 'ruby'}: query_malformed_json 1" in printed
    assert "model encoded at " in printed and "(trained)" in printed

    codebase = data / "ruby" / "codebase.jsonl"
    packed = gzip.compress(codebase.read_bytes())
    codebase.unlink()
    (data / "ruby" / "codebase.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    assert main([*common, "--data", str(data)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]  # the last line (the job's)
    assert line.startswith(f"santa: error: {data / 'ruby' / 'codebase.jsonl.gz'}: compressed file")
    assert "end-of-stream marker (after " in line
