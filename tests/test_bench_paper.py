"""bench/quality/paper.py: santa's number beside the paper's, on the shared fixtures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from santa.eval.paper_numbers import TABLE7_SIZES, numbers_for
from tests.conftest import REPO
from tests.test_evaluate import write_beir


def load_bench():
    spec = importlib.util.spec_from_file_location(
        "bench_paper", REPO / "bench" / "quality" / "paper.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return load_bench()


def test_paper_numbers_name_their_table_and_row() -> None:
    table6 = {n.column: n.value for n in numbers_for("codesearch") if n.row == "zero-shot SANTA"}
    assert table6["ruby"] == 72.6 and table6["overall"] == 70.9
    four = {n.source: n.value for n in numbers_for("esci-4")}
    assert four["SANTA Table 2, SANTA (Hard Negative)"] == 83.15
    assert {n.source for n in numbers_for("adv")} >= {"SCodeR Table 1, SCodeR"}
    assert TABLE7_SIZES["ruby"]["codebase"] == 4_360
    with pytest.raises(ValueError, match="setting must be one of"):
        numbers_for("cosqa")


def test_codesearch_and_adv_on_the_shared_fixtures(bench, shared_fixtures, tiny_checkpoint, capsys):
    common = ["--checkpoint", tiny_checkpoint, "--max-document-length", "64", "--limit", "40"]
    ruby = str(shared_fixtures / "csn" / "ruby" / "valid.jsonl.gz")
    result = bench.main(["--setting", "codesearch", "--data", ruby, *common])
    (row,) = result["rows"]  # one language: no overall row
    model = result["metrics"]["model"]["by_language"]["ruby"]
    assert row["column"] == "ruby" and row["santa"] == round(100 * model["mrr"], 2)
    assert row["SANTA Table 6, zero-shot SANTA"] == 72.6 and row["SCodeR Table 1, SCodeR"] == 77.5
    assert result["split"] == "valid" and result["sizes"]["ruby"]["candidates"] == 40
    assert result["sizes"]["ruby"]["paper_candidates"] == 4_360
    printed = capsys.readouterr().out
    assert "| ruby |" in printed and "SANTA Table 7, valid: 1,400 queries" in printed

    adv = str(shared_fixtures / "advtest" / "test_sample.jsonl")
    result = bench.main(["--setting", "adv", "--data", adv, *common])
    row, uncut = result["rows"]  # MRR@100 as the papers' scripts, then without a cut-off
    assert row["santa"] == round(100 * result["metrics"]["model"]["mrr@100"], 2)
    assert row["SANTA Table 2, SANTA (Hard Negative)"] == 47.5
    assert uncut == {"column": "adv, uncut MRR", "santa": round(100 * model_mrr(result), 2)}
    assert result["sizes"]["adv"] == {
        "queries": 40,
        "candidates": 40,
        "paper_queries": 19_210,
        "paper_candidates": 19_210,
        "paper_table": "SANTA Table 1",
    }


@pytest.mark.parametrize(
    ("setting", "metric"), [("esci-2", "ndcg@100"), ("esci-4", "ndcg@100_4class")]
)
def test_esci_settings(bench, tiny_checkpoint, tmp_path: Path, setting: str, metric: str) -> None:
    beir = write_beir(
        tmp_path / "esci",
        [{"_id": f"P{i}", "title": f"Acme lamp {i}", "text": "a lamp"} for i in range(4)],
        [{"_id": "q1", "text": "lamp"}, {"_id": "q2", "text": "desk lamp"}],
        [("q1", "P0", 3), ("q1", "P1", 1), ("q2", "P2", 2), ("q2", "P3", 0)],
    )
    output = tmp_path / "paper.json"
    result = bench.main(
        [
            "--setting",
            setting,
            "--checkpoint",
            tiny_checkpoint,
            "--data",
            beir,
            "--output",
            str(output),
        ]
    )
    row, *caption = result["rows"]
    assert row["santa"] == round(100 * result["metrics"]["model"][metric], 2)
    expected = 82.59 if setting == "esci-2" else 83.15
    assert row["SANTA Table 2, SANTA (Hard Negative)"] == expected
    if setting == "esci-4":  # the released gains carry the numbers; the caption's follow
        from santa.eval.esci import esci_metrics
        from santa.eval.metrics import gains_text

        ranking = {"q1": [("P1", 2.0), ("P0", 1.0)], "q2": [("P2", 2.0), ("P3", 1.0)]}
        qrels = {"q1": {"P0": 3, "P1": 1}, "q2": {"P2": 2, "P3": 0}}
        released = esci_metrics(qrels, ranking, "released")["ndcg@100_4class"]
        paper = esci_metrics(qrels, ranking, "paper")["ndcg@100_4class"]
        assert released != paper and gains_text("released") == "E 1, S 0.01, C 0.1, I 0"
        (caption,) = caption
        assert caption == {
            "column": "four-class, Table 2 caption's gains",
            "santa": round(100 * result["metrics"]["model"]["ndcg@100_4class_caption_gains"], 2),
        }
    else:
        assert caption == []
    assert result["sizes"]["esci"]["paper_queries"] == 8_956 and output.is_file()
    assert result["sizes"]["esci"]["paper_candidates"] == 181_701
    assert result["sizes"]["esci"]["candidates"] == 4  # the judged products


def test_codesearch_on_a_beir_folder_is_retrieval_per_language(bench, tiny_checkpoint, tmp_path):
    """A one-language code BEIR folder: CodeSearch ranks the same texts as retrieval, so
    their MRR@100 agree exactly; with two languages, each is ranked apart."""
    from santa.eval import EvalConfig, evaluate
    from tests.datagen import other_language_records, stdlib_python_records

    records = {
        "python": stdlib_python_records(limit=16),
        "ruby": other_language_records("ruby", 6),
    }
    corpus, queries, qrels = [], [], []
    for language, rows in records.items():
        for index, record in enumerate(rows):
            doc, query = f"{language}-d{index}", f"{language}-q{index}"
            corpus.append({"_id": doc, "text": record["code"], "language": language})
            queries.append({"_id": query, "text": " ".join(record["docstring_tokens"])})
            qrels.append((query, doc, 1))
    python_only = write_beir(
        tmp_path / "python", corpus[:16], queries[:16], qrels[:16], split="valid"
    )
    lengths = ["--max-query-length", "32", "--max-document-length", "64"]
    common = ["--setting", "codesearch", "--checkpoint", tiny_checkpoint, *lengths]
    result = bench.main([*common, "--data", python_only, "--split", "valid"])
    retrieval = evaluate(
        tiny_checkpoint,
        python_only,
        EvalConfig(
            split="valid",
            baseline=None,
            progress=False,
            max_query_length=32,
            max_document_length=64,
        ),  # fmt: skip
    )
    by_language = result["metrics"]["model"]["by_language"]
    assert by_language["python"]["mrr@100"] == pytest.approx(retrieval["model"]["mrr@100"])
    both = write_beir(tmp_path / "both", corpus, queries, qrels, split="valid")
    result = bench.main([*common, "--data", both, "--split", "valid"])
    assert [row["column"] for row in result["rows"]] == ["python", "ruby", "overall"]
    assert result["sizes"]["ruby"]["candidates"] == 6


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> str:
    from santa.config.recipes import get_recipe
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from tests.datagen import other_language_records, stdlib_python_records

    records = stdlib_python_records() + other_language_records("ruby", 20)
    tokenizer = train_tokenizer([r["code"] for r in records] * 2, vocab_size=600)
    model = DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0)
    folder = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(str(folder), santa_config=get_recipe("tiny"))
    return str(folder)


def model_mrr(result) -> float:
    return result["metrics"]["model"]["mrr"]


def test_one_checkpoint_per_language_at_one_pair_of_lengths(bench, tiny_checkpoint, tmp_path):
    """SANTA trains a model per language: each language is evaluated with its own, every
    model at the same lengths (50/240 unless asked), the mean over the languages."""
    from tests.datagen import other_language_records, stdlib_python_records

    records = {"python": stdlib_python_records(limit=12), "ruby": other_language_records("ruby", 8)}
    for language, rows in records.items():
        rows = [dict(row, language=language) for row in rows]
        bench.write_codesearch_layout(rows, tmp_path / "cs", language, "test")
    result = bench.main(
        [
            "--setting",
            "codesearch",
            "--data",
            str(tmp_path / "cs"),
            "--checkpoint",
            f"python={tiny_checkpoint}",
            f"ruby={tiny_checkpoint}",
        ]
    )
    model = result["metrics"]["model"]
    assert (model["max_query_length"], model["max_document_length"]) == (50, 240)
    assert model["lengths_from"] == "asked"
    by_language = model["by_language"]
    assert set(by_language) == {"python", "ruby"}
    assert by_language["ruby"]["checkpoint"] == tiny_checkpoint
    assert model["mrr"] == pytest.approx(
        (by_language["python"]["mrr"] + by_language["ruby"]["mrr"]) / 2
    )
    assert [row["column"] for row in result["rows"]] == ["python", "ruby", "overall"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--setting", "adv", "--data", "x", "--checkpoint", "a", "b"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--setting", "codesearch", "--data", "x", "--checkpoint", "cobol=a"])


def test_broken_input_files_are_named(bench, tiny_checkpoint, shared_fixtures, tmp_path, capsys):
    """A malformed line is skipped and counted with the file named; a compressed file cut
    short ends in one line naming the file and the rows read before the cut."""
    import gzip

    ruby = shared_fixtures / "csn" / "ruby" / "valid.jsonl.gz"
    lines = gzip.decompress(ruby.read_bytes()).splitlines()[:30]
    broken = tmp_path / "valid.jsonl"
    broken.write_bytes(b"\n".join([*lines[:10], b"{not json", *lines[10:], b"[1, 2]"]) + b"\n")
    common = ["--setting", "codesearch", "--checkpoint", tiny_checkpoint, "--limit", "20"]
    result = bench.main([*common, "--data", str(broken)])
    assert result["notes"]["skipped"] == {str(broken): {"malformed_json": 2}}
    assert f"skipped 2 rows of {broken}: malformed_json 2" in capsys.readouterr().out

    data = gzip.compress(b"\n".join(lines) + b"\n")
    cut = tmp_path / "cut" / "valid.jsonl.gz"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(
        ValueError,
        match=rf"^{cut}: compressed file ended before the end-of-stream marker \(after \d+ rows\)$",
    ):
        bench.main([*common, "--data", str(cut)])
