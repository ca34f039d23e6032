"""ESCI prepared as SANTA's scripts prepare it: the dev carve, the locale join, the pairs."""

from __future__ import annotations

import pandas as pd
import pytest
from sklearn.model_selection import train_test_split

from santa.data import esci
from santa.data.beir import load_beir
from santa.data.plan import PreprocessConfig, run_preprocess
from tests.conftest import needs_tagger
from tests.datagen import write_esci_splits


@pytest.mark.parametrize("count", [8, 41, 20_888])
def test_carve_is_scikit_learns_train_test_split(count: int) -> None:
    """SANTA's build_product.py: train_test_split(ids, test_size=0.125, random_state=10)."""
    ids = [f"q{(i * 7919) % 100_003}" for i in range(count)]
    _, expected = train_test_split(ids, test_size=0.125, random_state=10)
    assert esci.carve_dev(ids, 0.125, 10) == list(expected)
    if count == 20_888:  # ESCI small's US train queries: Table 1's dev split
        assert len(expected) == esci.TABLE1["valid"]["queries"] == 2_611


def test_select_judgments_carves_valid_from_train_by_query(tmp_path) -> None:
    data = write_esci_splits(tmp_path)
    examples = pd.DataFrame(data["examples"])
    parts = {
        split: esci.select_judgments(examples, version="small", locale="us", split=split)
        for split in ("train", "valid", "test")
    }
    queries = {split: set(frame["query_id"]) for split, (frame, _, _) in parts.items()}
    us_train = examples[(examples["split"] == "train") & (examples["product_locale"] == "us")]
    order = list(us_train["query_id"].unique())
    _, expected_dev = train_test_split(order, test_size=0.125, random_state=10)
    assert queries["valid"] == set(expected_dev) and len(expected_dev) == 3
    assert queries["train"] | queries["valid"] == set(order)
    assert not queries["train"] & queries["valid"]
    assert queries["test"] == set(examples.loc[examples["split"] == "test", "query_id"])
    frame, filtered, counts = parts["valid"]
    assert counts["queries"] == {"train": 21, "valid": 3, "test": 4}
    assert counts["judgments"]["valid"] == len(frame) == 12
    # Every other US judgment is another split's; the ES query another locale's.
    assert filtered == {"other_version": 0, "other_locale": 1, "other_split": 100}
    again, _, _ = esci.select_judgments(examples, version="small", locale="us", split="valid")
    pd.testing.assert_frame_equal(again, frame)
    seeded, _, _ = esci.select_judgments(
        examples, version="small", locale="us", split="valid", dev_seed=11
    )
    assert set(seeded["query_id"]) != queries["valid"]


def test_valid_split_join_and_leaks_through_the_pipeline(tmp_path, ray_cluster) -> None:
    """--split valid writes the carved dev queries (the carve's own test above shows it is
    the same on every run); products are joined on (product_id, product_locale); the
    train split never holds a dev query."""
    data = write_esci_splits(tmp_path / "raw")
    common = {"dataset": "esci", "input": str(tmp_path / "raw")}
    reports = [
        run_preprocess(
            PreprocessConfig(output=str(tmp_path / "valid"), stage="eval", split="valid", **common)
        )
    ]
    valid = load_beir(str(tmp_path / "valid"), "valid")
    examples = pd.DataFrame(data["examples"])
    expected, _, counts = esci.select_judgments(
        examples, version="small", locale="us", split="valid"
    )
    assert set(valid.qrels) == {str(q) for q in expected["query_id"]}
    assert reports[0]["rows_written"] == len(expected) == 12
    assert reports[0]["esci"]["queries"] == counts["queries"]
    assert reports[0]["esci"]["paper_table1"]["valid"]["queries"] == 2_611

    train = run_preprocess(
        PreprocessConfig(output=str(tmp_path / "train"), stage="eval", split="train", **common)
    )
    beir = load_beir(str(tmp_path / "train"), "train")
    assert not set(beir.qrels) & set(valid.qrels) and train["rows_written"] == 84
    # Query 1000 judges the US product BSHARED; an ES product has the same id.
    assert "1000" in beir.qrels and beir.qrels["1000"]["BSHARED"] == 0
    assert beir.corpus["BSHARED"]["title"] == "US Shared Lamp"
    assert "lampara" not in beir.queries.values()


@needs_tagger
def footer_readers(cluster) -> int:
    """How many footer-reading actors Ray Data's Parquet reader has started on ``cluster``,
    dead or alive (its address named: another Ray on this machine is not asked)."""
    from ray.util.state import list_actors

    actors = list_actors(address=cluster.address, limit=10_000)
    return sum(a.class_name == "FooterReader" for a in actors)


@needs_tagger
def test_pretraining_pairs_by_the_papers_rule_and_santas(tmp_path, ray_cluster) -> None:
    data = write_esci_splits(tmp_path / "raw")
    footer_readers_before = footer_readers(ray_cluster)
    common = {"dataset": "esci", "input": str(tmp_path / "raw"), "stage": "pretrain"}
    paper = run_preprocess(
        PreprocessConfig(output=str(tmp_path / "paper"), esci_pretrain="paper", **common)
    )
    products = {(p["product_id"], p["product_locale"]): p for p in data["products"]}
    examples = pd.DataFrame(data["examples"])
    us = examples[examples["product_locale"] == "us"]
    dev = set(esci.carve_dev(list(us["query_id"].unique()), 0.05, 10))
    exact = us[(us["esci_label"] == "E") & ~us["query_id"].isin(dev)]
    with_html = [
        row
        for row in exact.itertuples()
        if "<p>" in products[(row.product_id, "us")]["product_description"]
    ]
    assert paper["rows_written"] == len(with_html) > 0  # one pair per Exact judgment
    assert paper["filtered"]["plain_description"] == len(exact) - len(with_html)
    assert paper["filtered"]["other_label"] == int((us["esci_label"] != "E").sum()) - int(
        (us["query_id"].isin(dev) & (us["esci_label"] != "E")).sum()
    )
    counts = paper["esci"]
    assert counts["paper_table5_pairs"] == 331_590 and counts["pairs_written"] == len(with_html)
    assert counts["test_judgments"] == int((exact["split"] == "test").sum()) > 0
    assert counts["comparable_to_table5"] is False  # the small version of a test file
    pairs = pd.read_parquet(tmp_path / "paper" / "data")
    test_products = set(examples.loc[examples["split"] == "test", "product_id"])
    assert set(pairs["doc_id"]) & test_products  # the scripts pretrain on test products

    santa = run_preprocess(PreprocessConfig(output=str(tmp_path / "santa"), **common))
    pairs = pd.read_parquet(tmp_path / "santa" / "data")
    held = set(examples.loc[examples["split"] == "test", "product_id"])
    assert not set(pairs["doc_id"]) & held
    assert santa["dropped"]["heldout_leak"] > 0
    assert santa["esci"]["comparable_to_table5"] is False
    # One products file, one actor to read its footer (Ray's default starts 32 a read: 32
    # Python processes, a 1-CPU node starting them one at a time).
    assert footer_readers(ray_cluster) - footer_readers_before == 2


def test_the_job_summary_prints_the_counts_beside_the_papers(tmp_path) -> None:
    from santa.data.accounting import format_text as format_report

    examples = pd.DataFrame(write_esci_splits(tmp_path)["examples"])
    config = {"esci_version": "small", "locale": "us"}
    base = {"rows_read": 1, "rows_written": 1, "dropped": {}, "filtered": {}, "config": config}
    base.update(entity_ratio={}, wall_time_s=1.0)
    _, _, split = esci.select_judgments(examples, version="small", locale="us", split="valid")
    text = format_report({**base, "esci": split})
    assert "  valid         3 queries        12 judgments" in text
    assert "(SANTA Table 1, small us: 2,611 / 51,706)" in text
    _, _, pairs = esci.paper_pretrain_examples(examples, version="large", locale="us")
    text = format_report({**base, "esci": {**pairs, "pairs_written": 40}})
    assert "ESCI pretraining pairs 40   (SANTA Table 5, large us: 331,590)" in text
