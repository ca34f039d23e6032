"""The arithmetic of bench/perf/versus_st.py, bench/quality/versus_st_quality.py and
bench/quality/cosqa_transfer.py (the benchmarks themselves run in test_bench, slow)."""

from __future__ import annotations

import json

import pytest

from bench.common import logged_windows, parse_tables, write_json
from bench.perf import versus_st
from bench.quality import cosqa_transfer as transfer
from bench.quality import scoring


def test_loop_time_leaves_out_the_first_window() -> None:
    # Steps end at 10, 11, 13, 14 s: after the first 2 steps, 2 steps × 8 pairs in 3 s.
    assert versus_st.loop_pairs_per_s([10.0, 11.0, 13.0, 14.0], 0.0, 8, 2) == 16 / 3
    # No window: timed from the start.
    assert versus_st.loop_pairs_per_s([2.0, 4.0], 0.0, 8, 0) == 4.0
    with pytest.raises(ValueError, match="need more than 2 steps"):
        versus_st.loop_pairs_per_s([1.0, 2.0], 0.0, 8, 2)


def test_santa_windows_are_weighted_by_their_steps(tmp_path) -> None:
    # Windows at steps 5, 10 and a short last one at 12 (batch 4), as a run's metrics.jsonl
    # may hold them out of order: the first is left out; 5 steps at 10 pairs/s (2 s) and
    # 2 steps at 4 pairs/s (2 s) → 28 pairs in 4 s.
    lines = [
        json.dumps({"step": 12, "pairs_per_s": 4.0}),
        json.dumps({"step": 5, "pairs_per_s": 100.0}),
        json.dumps({"step": 10, "pairs_per_s": 10.0}),
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    windows = logged_windows(tmp_path)
    assert [m["step"] for m in windows] == [5, 10, 12]
    assert versus_st.windows_pairs_per_s(windows, 4, 5) == 28 / 4
    with pytest.raises(ValueError, match="no logged window"):
        versus_st.windows_pairs_per_s(windows[:1], 4, 5)


def test_santa_ray_is_the_finetune_job_at_the_bench_s_settings(tmp_path) -> None:
    """santa-ray's command line, read by the finetune job's own parser into its config:
    the bench's batch, lengths, seed, steps and window reach the run (the bench's test
    leaves santa-ray out: its run is the finetune job's, whose Ray path the job tests
    cover; this pins what the bench hands it)."""
    from ray_jobs.train_cli import build_parser, parse_args
    from santa.jobs.flags import recipe_config

    args = versus_st.build_parser().parse_args(
        ["--child", "santa-ray", "--data", "/d", "--steps", "7", "--window", "2"]
        + ["--batch", "6", "--query-length", "16", "--doc-length", "40", "--seed", "3"]
        + ["--set", "train.warmup_ratio=0.5"]
    )
    argv = versus_st.santa_ray_argv(args, str(tmp_path / "runs"))
    job = parse_args(build_parser("python -m ray_jobs.finetune", ""), argv)
    assert (job.recipe, job.data, job.name, job.num_workers) == (versus_st.RECIPE, "/d", "run", 2)
    assert (job.max_steps, job.cpus_per_worker) == (7, 0.5)
    train = recipe_config(job).train
    assert (train.global_batch_size, train.seed, train.warmup_ratio) == (6, 3, 0.5)
    assert (train.max_query_length, train.max_document_length) == (16, 40)
    assert (train.log_every, train.checkpoint_every) == (2, 7)


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
    (table,) = parse_tables(versus_st.format_table(summary, "st-mnrl"))
    assert list(table[0].values()) == [
        versus_st.LABELS["santa-ray"],
        "1",
        "6.00",
        "2.00x",
        "220.0",
        "0.50x",
        "—",
        "—",
    ]


def test_fixed_cost_and_the_run_lengths_at_which_a_system_finishes_first() -> None:
    # 10 steps of 8 pairs: the reference loops at 2 pairs/s (4 s a step) and spends 20 s
    # besides; santa-ray loops at 4 pairs/s (2 s a step) but spends 60 s besides: 40 s
    # more, caught up at 2 s a step from step 20 on. santa-local spends 10 s less but
    # loops at 1 pair/s (8 s a step): ahead while 4 s a step has not eaten the 10 s.
    runs = [
        {"system": "st-mnrl", "loop_pairs_per_s": 2.0, "end_to_end_s": 60.0},
        {"system": "santa-ray", "loop_pairs_per_s": 4.0, "end_to_end_s": 80.0},
        {"system": "st-cached", "loop_pairs_per_s": 1.0, "end_to_end_s": 100.0},
        {"system": "santa-local", "loop_pairs_per_s": 1.0, "end_to_end_s": 90.0},
    ]
    systems = ["santa-ray", "santa-local", "st-mnrl", "st-cached"]
    summary = versus_st.summarize(runs, systems, "st-mnrl", steps=10, batch=8)
    assert summary["st-mnrl"]["fixed_s"] == 20.0
    assert summary["santa-ray"]["fixed_s"] == 60.0
    assert summary["santa-ray"]["ahead"] == "from 20"
    assert summary["santa-local"]["fixed_s"] == 10.0
    assert summary["santa-local"]["ahead"] == "up to 2"  # 10 s / 4 s a step = 2.5 steps
    assert summary["st-cached"]["ahead"] == "never"  # slower loop, as much fixed cost
    assert summary["st-mnrl"]["ahead"] == "always"  # the reference against itself
    (table,) = parse_tables(versus_st.format_table(summary, "st-mnrl"))
    ahead = {
        row["system"]: (row["fixed s"], row["ahead of st-mnrl end to end, in steps"])
        for row in table
    }
    assert ahead[versus_st.LABELS["santa-ray"]] == ("60.0", "from 20")
    assert ahead[versus_st.LABELS["st-cached"]] == ("20.0", "never")
    assert ahead[versus_st.LABELS["santa-local"]] == ("10.0", "up to 2")


def test_bootstrap_intervals_and_paired_differences() -> None:
    queries = [f"q{i}" for i in range(50)]
    santa = {q: (1.0 if i % 2 else 0.5) for i, q in enumerate(queries)}
    scores = {
        "zero-shot": {q: 0.5 for q in queries},
        "santa": santa,
        "sentence-transformers": dict(santa),
    }
    pairs = (("santa", "sentence-transformers"), ("santa", "zero-shot"))
    per_system, differences = scoring.bootstrap(scores, resamples=500, seed=0, pairs=pairs)
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
        scoring.bootstrap(scores, resamples=10, seed=0)


def test_per_query_rr_reads_a_trec_run_with_ranx(tmp_path) -> None:
    from bench.corpora import write_beir

    rows = [
        {"query_id": f"q{i}", "query": f"q {i}", "doc_id": f"d{i}", "document": f"d {i}"}
        for i in range(3)
    ]
    beir = write_beir(tmp_path / "beir", rows)
    trec = tmp_path / "run.trec"
    # q0: its document first (1); q1: second (1/2); q2: not ranked (0).
    trec.write_text("q0 Q0 d0 1 2.0 m\nq0 Q0 d1 2 1.0 m\nq1 Q0 d0 1 2.0 m\nq1 Q0 d1 2 1.0 m\n")
    assert scoring.per_query_rr(beir, str(trec), "test") == {"q0": 1.0, "q1": 0.5, "q2": 0.0}


def test_intervals_are_written_as_the_tables_show_them() -> None:
    row = {"mean": 0.02049, "ci_low": -0.00346, "ci_high": 0.03847}
    assert scoring.format_interval(row) == "0.0205 [-0.0035, 0.0385]"
    assert scoring.format_interval(row, signed=True) == "+0.0205 [-0.0035, +0.0385]"


def _cosqa_records() -> list[dict]:
    """Six labelled queries over four functions (f0 answers two, f3 three), one unlabelled."""
    codes = [f"def f{i}(x):\n    return x + {i}\n" for i in range(5)]
    answers = {"q0": 0, "q1": 0, "q2": 1, "q3": 2, "q4": 3, "q5": 3, "q6": 3}
    records = [
        {"idx": q, "doc": f"web query {q}", "code": codes[f], "label": 1}
        for q, f in answers.items()
    ]
    return [*records, {"idx": "q9", "doc": "unanswered", "code": codes[4], "label": 0}]


def test_cosqa_folds_keep_each_function_s_queries_together() -> None:
    from santa.data.cosqa import cosqa_beir

    beir = cosqa_beir(_cosqa_records())
    folds = transfer.function_folds(beir.qrels, 2, seed=0)
    assert set().union(*folds) == {f"q{i}" for i in range(7)}
    assert not folds[0] & folds[1]
    doc_of = {q: d for q, d in beir.qrels}
    for fold in folds:
        other = set().union(*(f for f in folds if f is not fold))
        assert not {doc_of[q] for q in fold} & {doc_of[q] for q in other}
    # Groups of 3, 2, 1, 1: the largest goes alone, the rest fill the other fold.
    assert sorted(len(f) for f in folds) == [3, 4]
    assert transfer.function_folds(beir.qrels, 2, seed=0) == folds  # seeded
    with pytest.raises(ValueError, match="at least 2 folds"):
        transfer.function_folds(beir.qrels, 1, seed=0)
    with pytest.raises(ValueError, match="cannot fill 5 folds"):
        transfer.function_folds(beir.qrels, 5, seed=0)


def test_cosqa_training_pairs_and_held_out_fold(tmp_path) -> None:
    import pyarrow.parquet as pq

    from bench.corpora import write_pairs
    from santa.data.beir import load_beir
    from santa.data.cosqa import cosqa_beir

    beir = cosqa_beir(_cosqa_records())
    rows = transfer.cosqa_pair_rows(beir, {"q0", "q4"})
    assert [(r["query"], r["document"]) for r in rows] == [
        ("web query q0", "def f0(x):\n    return x + 0\n"),
        ("web query q4", "def f3(x):\n    return x + 3\n"),
    ]
    written = write_pairs(tmp_path / "pairs", rows)
    table = pq.read_table(f"{written}/data/part-0.parquet").to_pylist()
    assert [r["query_id"] for r in table] == ["q0", "q4"]
    assert {r["kind"] for r in table} == {"code_pair"} and {r["label"] for r in table} == {1}

    held_out = transfer.write_fold_beir(beir, {"q2", "q3"}, str(tmp_path / "fold"))
    data = load_beir(held_out, "test")
    assert len(data.corpus) == 5  # every function, the unlabelled one included
    assert set(data.queries) == {"q2", "q3"}
    assert set(data.qrels) == {"q2", "q3"}


def test_a_failed_system_is_reported_not_fatal() -> None:
    assert versus_st.failure_reason(1, "ray.exceptions.OutOfMemoryError: Task was killed") == (
        "out of memory"
    )
    assert versus_st.failure_reason(-9, "") == "out of memory"  # the kernel's SIGKILL
    assert versus_st.failure_reason(2, "santa: error: bad value") == "exit 2"
    runs = [
        {"system": "santa-ray", "loop_pairs_per_s": 4.0, "end_to_end_s": 80.0},
        {"system": "st-mnrl", "end_to_end_s": 30.0, "failed": "out of memory"},
        {"system": "st-cached", "loop_pairs_per_s": 2.0, "end_to_end_s": 60.0},
    ]
    summary = versus_st.summarize(runs, ["santa-ray", "st-mnrl", "st-cached"], "st-cached")
    assert summary["st-mnrl"] == {
        "label": versus_st.LABELS["st-mnrl"],
        "runs": 0,
        "failed": "out of memory",
    }
    assert summary["santa-ray"]["loop_vs_reference"] == 2.0
    (table,) = parse_tables(versus_st.format_table(summary, "st-cached"))
    failed = next(row for row in table if row["runs"] == "0")
    assert failed["system"] == "sentence-transformers, MNRL, 2 threads"
    assert failed["loop pairs/s"] == "out of memory"


def test_too_few_pairs_for_the_batch_is_one_line(tmp_path) -> None:
    from bench.corpora import stdlib_pair_rows, write_pairs

    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:3])
    with pytest.raises(SystemExit, match="has 3 pairs, fewer than --batch 8"):
        versus_st.main(["--data", data, "--batch", "8", "--steps", "6"])


def test_bench_json_is_written_whole(tmp_path) -> None:
    path = tmp_path / "results" / "bench.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["bench.json"]  # no temporary left
