"""The arithmetic and the data split of bench/quality/shuffle_mrr.py (the benchmark trains
six models; it runs by hand, its result in bench/results/shuffle_mrr.json)."""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import pytest

from bench.quality import shuffle_mrr as bench


def test_t_interval_of_three_seeds() -> None:
    row = bench.t_interval([0.10, 0.12, 0.14])
    half = 4.302653 * 0.02 / math.sqrt(3)  # t(0.975, 2 df) · sd / √n
    assert row["mean"] == pytest.approx(0.12)
    assert row["sd"] == pytest.approx(0.02)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((0.12 - half, 0.12 + half))
    assert math.isnan(bench.t_interval([0.3])["ci_low"])  # one seed: no interval


def test_welch_interval_and_the_table_without_scipy(monkeypatch) -> None:
    a, b = [0.20, 0.22, 0.24], [0.10, 0.11, 0.12]
    row = bench.welch_interval(a, b)
    va, vb = 0.02**2 / 3, 0.01**2 / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    assert row["mean"] == pytest.approx(0.11) and row["df"] == pytest.approx(df)
    with_scipy = row["ci_high"] - row["mean"]
    monkeypatch.setitem(sys.modules, "scipy", None)  # `from scipy import stats` fails
    assert bench.t_quantile(2) == 4.303 and bench.t_quantile(2.9) == 4.303
    assert bench.t_quantile(11) == 2.228 and bench.t_quantile(40) == 1.96
    table = bench.welch_interval(a, b)
    assert table["ci_high"] - table["mean"] >= with_scipy  # floor(df): a wider interval
    assert bench.welch_interval([0.1, 0.1], [0.1, 0.1])["ci_low"] == 0.0


def test_split_by_repository_keeps_corpus_order(tmp_path: Path) -> None:
    rows = [{"repo": f"r{i // 3}", "path": f"f{i}.rb", "n": i} for i in range(30)]  # 10 repos
    source = tmp_path / "valid.jsonl.gz"
    with gzip.open(source, "wt") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    sizes = bench.split_by_repository(source, tmp_path / "raw", every=5)
    assert sizes == {
        "train_functions": 24,
        "train_repositories": 8,
        "test_functions": 6,
        "test_repositories": 2,
    }
    with gzip.open(tmp_path / "raw" / "test.jsonl.gz", "rt") as handle:
        test = [json.loads(line) for line in handle]
    assert [row["repo"] for row in test] == ["r4"] * 3 + ["r9"] * 3
    with gzip.open(tmp_path / "raw" / "train.jsonl.gz", "rt") as handle:
        train = [json.loads(line)["n"] for line in handle]
    assert train == sorted(train) and not {12, 13, 14, 27} & set(train)


def test_same_file_share_of_batches() -> None:
    url = "https://github.com/o/r/blob/0123abc/lib/a/b.rb#L1-L9"
    assert bench.file_and_repository(url) == (
        "https://github.com/o/r/lib/a/b.rb",
        "https://github.com/o/r",
    )
    assert bench.same_share([["a", "a", "b", "c"]]) == pytest.approx(1 / 6)
    assert bench.same_share([["a", "a"], ["b", "c"]]) == pytest.approx(1 / 2)
    assert bench.uniform_share(["a", "a", "b", "c"]) == pytest.approx(2 / 12)
