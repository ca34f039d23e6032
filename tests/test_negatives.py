"""Hard-negative mining: the sampling rules, the table format, and the corpus reader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from santa.negatives.mining import (
    NegativesTable,
    load_mining_corpus,
    mine_hard_negatives,
    read_negatives_table,
)
from tests.training import write_pairs


def test_positives_and_their_duplicates_never_come_back_as_negatives() -> None:
    hits = [["d1", "d2", "d3", "d4", "d5", "d6"], ["d4", "d1", "d2", "d6"]]
    positives = {"q1": {"d1", "d3"}, "q2": {"d4"}}
    duplicate_of = {"d5": "d3", "d3": "d3", "d6": "d6"}  # d5 has the same text as d3
    mined = mine_hard_negatives(
        ["q1", "q2"], hits, positives, n=10, duplicate_of=duplicate_of, seed=1
    )
    assert mined == {"q1": ["d2", "d4", "d6"], "q2": ["d1", "d2", "d6"]}


def test_duplicate_hits_are_kept_once_and_skip_top_drops_the_first_candidates() -> None:
    hits = [["p", "a", "a2", "b", "c", "d"]]
    duplicate_of = {"a2": "a"}
    mined = mine_hard_negatives(
        ["q"], hits, {"q": {"p"}}, n=10, skip_top=1, duplicate_of=duplicate_of
    )
    assert mined == {"q": ["b", "c", "d"]}  # 'a' skipped as the top candidate, 'a2' = 'a'


def test_sampling_is_seeded_order_independent_and_stays_in_the_window() -> None:
    hits = [[f"d{i}" for i in range(100)] for _ in range(3)]
    ids = ["q0", "q1", "q2"]
    first = mine_hard_negatives(ids, hits, {}, n=5, seed=7)
    again = mine_hard_negatives(list(reversed(ids)), list(reversed(hits)), {}, n=5, seed=7)
    other = mine_hard_negatives(ids, hits, {}, n=5, seed=8)
    assert first == again
    assert first != other
    for negatives in first.values():
        assert len(negatives) == len(set(negatives)) == 5
        ranks = [int(doc[1:]) for doc in negatives]
        assert ranks == sorted(ranks)  # kept in rank order


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="n and skip_top"):
        mine_hard_negatives(["q"], [["d"]], {}, n=-1)
    with pytest.raises(ValueError, match="1 query ids but 2 hit lists"):
        mine_hard_negatives(["q"], [["d"], ["e"]], {}, n=1)


def test_mining_from_an_exact_search_matches_brute_force_torch() -> None:
    from santa.index import NegativeIndex

    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 16)).astype(np.float32)
    queries = rng.standard_normal((20, 16)).astype(np.float32)
    doc_ids = [f"d{i}" for i in range(len(docs))]
    index = NegativeIndex.build(docs, doc_ids, kind="flat")
    hits, _ = index.search(queries, 10)
    expected = torch.topk(torch.from_numpy(queries) @ torch.from_numpy(docs).T, 10).indices
    assert hits == [[doc_ids[j] for j in row] for row in expected.tolist()]
    positives = {f"q{i}": {hits[i][0], hits[i][3]} for i in range(20)}
    mined = mine_hard_negatives([f"q{i}" for i in range(20)], hits, positives, n=8)
    for query_id, negatives in mined.items():
        assert not positives[query_id] & set(negatives)
        assert len(negatives) == 8


@pytest.mark.parametrize("where", ["local", "s3"])
def test_table_round_trips_through_parquet(where, tmp_path, moto_s3) -> None:
    uri = str(tmp_path / "neg") if where == "local" else f"{moto_s3.create_bucket('neg')}/t"
    table = NegativesTable({"q1": ["a", "b"], "q2": []}, step=30, version=2, build_s=1.5)
    target = table.write_parquet(uri)
    assert target.endswith("negatives.parquet")
    back = read_negatives_table(uri)
    assert back.negatives == table.negatives
    assert (back.step, back.version, back.build_s) == (30, 2, 1.5)
    assert back.built_at == pytest.approx(table.built_at)


def test_reading_a_missing_or_foreign_table_fails_clearly(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no hard-negatives table"):
        read_negatives_table(str(tmp_path / "nothing"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "foreign").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign" / "negatives.parquet")
    with pytest.raises(ValueError, match="not a hard-negatives table"):
        read_negatives_table(str(tmp_path / "foreign"))


def _row(**values):
    row = {
        "id": values["query_id"] + values["doc_id"],
        "dataset": "esci",
        "language": "us",
        "title": "",
        "label": 1,
        "entities": [],
        "masked_document": "",
        "mep_target": "",
        "num_tokens": 1,
        "num_masked_tokens": 0,
        "url": "",
        "drop_reason": "",
        "row_key": "",
        "dedup_key": "",
    }
    row.update(values)
    return row


def test_corpus_keeps_judged_products_and_trains_on_exact_only(tmp_path) -> None:
    rows = [
        _row(query_id="q1", query="red shoe", doc_id="p1", document="a red shoe", label=3),
        _row(query_id="q1", query="red shoe", doc_id="p2", document="a blue shoe", label=2),
        _row(query_id="q1", query="red shoe", doc_id="p3", document="shoe polish", label=1),
        _row(query_id="q1", query="red shoe", doc_id="p4", document="a lamp", label=0),
        _row(query_id="q2", query="lamp", doc_id="p4", document="a lamp", label=0),
        _row(query_id="q3", query="red", doc_id="p5", document="a red shoe", label=3),
    ]
    corpus = load_mining_corpus(write_pairs(tmp_path / "pairs", rows))
    assert corpus.queries == {"q1": "red shoe", "q3": "red"}  # q2 has no Exact product
    assert corpus.positives == {"q1": {"p1", "p2", "p3"}, "q3": {"p5"}}  # I is a negative
    assert set(corpus.documents) == {"p1", "p2", "p3", "p4", "p5"}
    assert corpus.duplicate_of["p5"] == "p1"  # same description text


def test_esci_judgments_are_embedded_as_title_and_text_like_evaluation(tmp_path) -> None:
    """Training, mining and evaluation embed an ESCI product the same way (title + text);
    code pairs (title = function name) and product pretraining pairs do not get the title."""
    from santa.data.beir import document_text
    from santa.data.kinds import CODE_PAIR, PRODUCT_JUDGMENT, PRODUCT_PRETRAIN, embedded_document
    from santa.data.schema import PAIR_SCHEMA, rows_to_table
    from santa.models.tokenizer import train_tokenizer
    from santa.train.data import tokenize_pairs

    lamp = embedded_document(PRODUCT_JUDGMENT, " Acme Lamp ", "a desk lamp")
    assert lamp == "Acme Lamp a desk lamp"
    assert embedded_document(PRODUCT_PRETRAIN, "Acme Lamp", "a desk lamp") == "a desk lamp"
    assert embedded_document(CODE_PAIR, "read_file", "def f(): pass") == "def f(): pass"
    assert document_text({"title": " Acme Lamp ", "text": "a desk lamp", "language": "us"}) == lamp

    rows = [
        _row(query_id="q1", query="lamp", doc_id="p1", title="Acme", document="a lamp", label=3),
        _row(
            query_id="q2",
            query="read",
            doc_id="c1",
            dataset="codesearchnet",
            language="python",
            title="read_file",
            document="def f(): pass",
        ),
    ]
    corpus = load_mining_corpus(write_pairs(tmp_path / "pairs", rows))
    assert corpus.documents == {"p1": "Acme a lamp", "c1": "def f(): pass"}

    tokenizer = train_tokenizer(["Acme a lamp def f(): pass read_file lamp read"] * 20, 400)
    tokenizer.save_pretrained(tmp_path / "tok")
    out = tokenize_pairs(
        rows_to_table(rows).select(PAIR_SCHEMA.names),
        tokenizer_path=str(tmp_path / "tok"),
        max_query_length=8,
        max_document_length=16,
        max_target_length=8,
        with_mep=False,
        with_document=True,
    )
    decoded = tokenizer.batch_decode(out["document_input_ids"], skip_special_tokens=True)
    assert [text.strip() for text in decoded] == ["Acme a lamp", "def f(): pass"]
