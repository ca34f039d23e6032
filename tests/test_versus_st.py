"""bench/versus_st.py's timing arithmetic (the benchmark itself runs in test_bench, slow)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("versus_st", REPO / "bench" / "versus_st.py")
versus_st = importlib.util.module_from_spec(spec)
spec.loader.exec_module(versus_st)


def test_loop_time_leaves_out_the_first_window() -> None:
    # Steps end at 10, 11, 13, 14 s: after the first 2 steps, 2 steps × 8 pairs in 3 s.
    assert versus_st.loop_pairs_per_s([10.0, 11.0, 13.0, 14.0], 0.0, 8, 2) == 16 / 3
    # No window: timed from the start.
    assert versus_st.loop_pairs_per_s([2.0, 4.0], 0.0, 8, 0) == 4.0
    with pytest.raises(ValueError, match="need more than 2 steps"):
        versus_st.loop_pairs_per_s([1.0, 2.0], 0.0, 8, 2)


def test_santa_windows_are_weighted_by_their_steps() -> None:
    # Windows at steps 5, 10 and a short last one at 12 (batch 4): the first is left out;
    # 5 steps at 10 pairs/s (2 s) and 2 steps at 4 pairs/s (2 s) → 28 pairs in 4 s.
    lines = [
        json.dumps({"step": 12, "pairs_per_s": 4.0}),
        json.dumps({"step": 5, "pairs_per_s": 100.0}),
        json.dumps({"step": 10, "pairs_per_s": 10.0}),
    ]
    assert versus_st.windows_pairs_per_s(lines, 4, 5) == 28 / 4
    with pytest.raises(ValueError, match="no logged window"):
        versus_st.windows_pairs_per_s(lines[1:2], 4, 5)


def test_summary_takes_medians_and_ratios_against_the_reference() -> None:
    runs = [
        {"system": "st-mnrl", "loop_pairs_per_s": 2.0, "end_to_end_s": 100.0},
        {"system": "st-mnrl", "loop_pairs_per_s": 4.0, "end_to_end_s": 120.0},
        {"system": "st-mnrl", "loop_pairs_per_s": 3.0, "end_to_end_s": 110.0},
        {"system": "santa-ray", "loop_pairs_per_s": 6.0, "end_to_end_s": 220.0},
    ]
    summary = versus_st.summarize(runs, ["santa-ray", "st-mnrl"], "st-mnrl")
    assert summary["st-mnrl"]["loop_pairs_per_s"] == 3.0
    assert summary["st-mnrl"]["end_to_end_s"] == 110.0
    assert summary["santa-ray"]["loop_vs_reference"] == 2.0
    assert summary["santa-ray"]["end_to_end_vs_reference"] == 0.5
    table = versus_st.format_table(summary, "st-mnrl")
    assert "| 6.00 | 2.00x | 220.0 | 0.50x |" in table


quality_spec = importlib.util.spec_from_file_location(
    "versus_st_quality", REPO / "bench" / "versus_st_quality.py"
)
quality = importlib.util.module_from_spec(quality_spec)
quality_spec.loader.exec_module(quality)


def test_bootstrap_intervals_and_paired_differences() -> None:
    queries = [f"q{i}" for i in range(50)]
    santa = {q: (1.0 if i % 2 else 0.5) for i, q in enumerate(queries)}
    scores = {
        "zero-shot": {q: 0.5 for q in queries},
        "santa": santa,
        "sentence-transformers": dict(santa),
    }
    per_system, differences = quality.bootstrap(scores, resamples=500, seed=0)
    assert per_system["zero-shot"] == {"mean": 0.5, "ci_low": 0.5, "ci_high": 0.5}
    row = per_system["santa"]
    assert row["mean"] == 0.75 and row["ci_low"] < 0.75 < row["ci_high"]
    # Equal per-query scores: the paired difference is exactly zero on every resample.
    same = differences["santa - sentence-transformers"]
    assert same["mean"] == same["ci_low"] == same["ci_high"] == 0.0
    better = differences["santa - zero-shot"]
    assert better["mean"] == 0.25 and better["ci_low"] > 0 and better["p_below_zero"] == 0.0
    scores["santa"].pop("q0")
    with pytest.raises(ValueError, match="other queries"):
        quality.bootstrap(scores, resamples=10, seed=0)


def test_per_query_rr_reads_a_trec_run_with_ranx(tmp_path) -> None:
    from tests.training import write_beir

    rows = [
        {"query_id": f"q{i}", "query": f"q {i}", "doc_id": f"d{i}", "document": f"d {i}"}
        for i in range(3)
    ]
    beir = write_beir(tmp_path / "beir", rows)
    trec = tmp_path / "run.trec"
    # q0: its document first (1); q1: second (1/2); q2: not ranked (0).
    trec.write_text("q0 Q0 d0 1 2.0 m\nq0 Q0 d1 2 1.0 m\nq1 Q0 d0 1 2.0 m\nq1 Q0 d1 2 1.0 m\n")
    assert quality.per_query_rr(beir, str(trec), "test") == {"q0": 1.0, "q1": 0.5, "q2": 0.0}
