"""Your own pairs (``--dataset pairs``): every labelled pair kept, negatives as a table, bad
rows counted by reason, and the output readable by the trainer's and the miner's readers."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from santa.data.pairs import MISSING_POSITIVE, pair_rows_from_record, run_pairs_preprocess
from santa.data.records import DropRow
from santa.data.schema import PAIR_SCHEMA

LIMITS = {"max_query_chars": 100, "max_document_chars": 200}


def test_one_record_gives_one_pair_per_positive():
    rows = pair_rows_from_record(
        {"query": "sort a list", "positive": ["a.sort()", "sorted(a)"], "negatives": ["a[0]"]},
        "f.jsonl:3",
        **LIMITS,
    )
    assert [row["document"] for row in rows] == ["a.sort()", "sorted(a)"]
    assert len({row["query_id"] for row in rows}) == 1 and len({row["id"] for row in rows}) == 2
    assert [row["negatives"] for row in rows] == [["a[0]"], []]
    assert all(row["kind"] == "text_pair" and row["label"] == 1 for row in rows)
    named = pair_rows_from_record({"id": "x1", "query": "q", "positive": "p"}, "k", **LIMITS)
    assert named[0]["id"] == "x1"
    for record, reason in [
        ({"query": "q"}, MISSING_POSITIVE),
        ({"query": "q", "positive": "  "}, MISSING_POSITIVE),
        ({"query": "q", "positive": [1]}, MISSING_POSITIVE),
        ({"positive": "p"}, "missing_query"),
        ({"query": "q", "positive": "p", "negatives": "n"}, "bad_negatives"),
        ({"query": "q" * 101, "positive": "p"}, "too_long"),
    ]:
        with pytest.raises(DropRow) as caught:
            pair_rows_from_record(record, "k", **LIMITS)
        assert caught.value.reason == reason


def test_pairs_job_keeps_every_pair_and_counts_bad_rows(tmp_path, ray_cluster, capsys):
    from ray_jobs import preprocess
    from santa.jobs.preflight import check_pairs
    from santa.negatives.corpus import load_mining_corpus
    from santa.negatives.table import read_negatives_table

    shared = "def add(a, b):\n    return a + b"
    lines = [
        {"query": "add two numbers", "positive": shared, "negatives": ["def sub(a, b): ..."]},
        {"query": "sum of a and b", "positive": shared},  # another query, same positive
        {"query": "sum of a and b", "positive": shared},  # the same pair again: kept
        {"query": "reverse a string", "positive": ["s[::-1]", "''.join(reversed(s))"]},
        {
            "query": "open a file",
            "positive": "open(path)",
            "negatives": ["os.remove(path)", "open(path)", "os.stat(path)"],
        },
        {"query": "no positive here"},
        {"query": "bad negatives", "positive": "x", "negatives": [1, 2]},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n{broken json\n"
    (tmp_path / "mine.jsonl").write_text(text)
    output = tmp_path / "pairs"
    argv = ["--dataset", "pairs", "--input", str(tmp_path / "mine.jsonl"), "--output", str(output)]
    assert preprocess.main(argv) == 0
    assert "dropped  missing_positive" in capsys.readouterr().out

    report = json.loads((output / "report.json").read_text())
    assert report["rows_read"] == 8 and report["rows_written"] == 6
    assert report["dropped"] == {"bad_negatives": 1, "malformed_json": 1, "missing_positive": 1}
    assert report["queries"] == 4 and report["queries_with_several_positives"] == 1
    assert report["documents_of_several_queries"] == 1
    # open(path) is the query's own positive: not one of its negatives.
    assert report["negatives"] == {
        "queries": 2,
        "total": 3,
        "table": str(output / "negatives" / "negatives.parquet"),
    }

    check_pairs(str(output))
    table = pq.read_table(output / "data")
    assert table.schema.names == PAIR_SCHEMA.names and table.num_rows == 6
    rows = table.to_pylist()
    assert sum(row["document"] == shared for row in rows) == 3
    assert len({row["doc_id"] for row in rows if row["document"] == shared}) == 1

    corpus = load_mining_corpus(str(output), str(tmp_path / "rows"))
    negatives = read_negatives_table(report["negatives"]["table"], corpus)
    by_query = {row["query"]: row["query_id"] for row in rows}
    (opened,) = corpus.query_numbers([by_query["open a file"]])
    # Negatives that are not documents of the pairs keep their own texts.
    assert [negatives.extra_texts[-2 - d] for d in negatives.of(int(opened))] == [
        "os.remove(path)",
        "os.stat(path)",
    ]

    # The trainer's input pipeline takes the rows (kind text_pair embeds the positive).
    from santa.config.recipes import minilm_path
    from santa.train.data import tokenize_pairs

    tokenized = tokenize_pairs(
        table,
        tokenizer_path=minilm_path(),
        max_query_length=16,
        max_document_length=32,
        max_target_length=8,
        with_mep=False,
        with_document=True,
    )
    assert tokenized["document_input_ids"].shape == (6, 32)

    (reverse,) = corpus.query_numbers([by_query["reverse a string"]])
    assert len(corpus.positives(int(reverse))) == 2
    assert corpus.num_queries == 4 and corpus.num_docs == 4


def test_cosqa_dev_keeps_all_313_labelled_pairs(shared_fixtures, tmp_path, ray_cluster):
    """CoSQA dev as pairs: several queries share one function, and every pair is kept
    (as CodeSearchNet rows, de-duplication by code dropped 23 of them)."""
    records = json.loads((shared_fixtures / "cosqa" / "cosqa-dev.json").read_text())
    labelled = [r for r in records if r["label"] == 1]
    with open(tmp_path / "cosqa.jsonl", "w") as handle:
        for record in labelled:
            handle.write(json.dumps({"query": record["doc"], "positive": record["code"]}) + "\n")
    report = run_pairs_preprocess(str(tmp_path / "cosqa.jsonl"), str(tmp_path / "out"))
    assert report["rows_read"] == report["rows_written"] == len(labelled) == 313
    assert report["documents"] < 313 and report["documents_of_several_queries"] > 0
