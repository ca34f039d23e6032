"""The benchmark scripts run end to end at small sizes and write consistent results.

Benchmarks are not timed tests: these only catch a script that no longer runs (one broke
unnoticed before) or whose modes stop doing the same work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import parse_tables
from bench.perf import versus_st
from tests.conftest import REPO


def run_bench(script: str, *args: str, timeout: int = 600) -> str:
    """Run ``bench/<script>`` as a user does (a file, from the repository root)."""
    env = dict(os.environ, RAY_DATA_DISABLE_PROGRESS_BARS="1")
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def cosqa_sample(shared_fixtures: Path, tmp_path: Path, records: int = 80) -> tuple[str, int]:
    """The first ``records`` of CoSQA dev (../shared's, or its stand-in) as a file of their
    own, and how many judged queries they hold: the quality benches score on it in an
    eighth of the whole file's encoding (fewer than 100 functions: every query's answer is
    in its top 100, so no interval reaches 0)."""
    from santa.data.cosqa import cosqa_beir

    rows = json.loads((shared_fixtures / "cosqa" / "cosqa-dev.json").read_text())[:records]
    path = tmp_path / "cosqa-sample.json"
    path.write_text(json.dumps(rows))
    return str(path), len(cosqa_beir(rows).queries)


@pytest.mark.slow
def test_evaluate_bench(tmp_path: Path) -> None:
    output = tmp_path / "evaluate.json"
    stdout = run_bench(
        "perf/evaluate.py",
        "--docs",
        "150",
        "--models",
        "tiny",
        "--scale",
        "2000",
        "--output",
        str(output),
    )
    models, _ = parse_tables(stdout)
    assert [row["model"] for row in models] == ["tiny"]
    result = json.loads(output.read_text())
    (tiny,) = result["models"]
    assert tiny["documents"] == tiny["queries"] == 150
    assert tiny["documents_per_s"] > 0 and 0 <= tiny["mrr@100"] <= 1
    (scale,) = result["scale"]
    assert scale["documents"] == 2000 and scale["raw_faiss_s"] > 0 and scale["metrics_s"] > 0


def test_preprocess_bench_takes_the_lower_median_of_each_mode_and_size() -> None:
    from bench.perf.preprocess import MODES, medians

    runs = [
        {"mode": mode, "records": records, "seconds": seconds * (1 + index)}
        for records in (600, 300)
        for index, mode in enumerate(reversed(MODES))
        for seconds in (3.0, 1.0, 2.0, 4.0)
    ]
    table = medians(runs)
    assert [(r["records"], r["mode"]) for r in table] == [(n, m) for n in (300, 600) for m in MODES]
    for row in table:  # the lower of the two middle repeats, with every repeat's seconds
        scale = 3 - MODES.index(row["mode"])
        assert row["seconds"] == 2.0 * scale
        assert row["repeats_s"] == [round(s * scale, 2) for s in (1.0, 2.0, 3.0, 4.0)]


@pytest.mark.long(seconds=50)
def test_preprocess_bench_modes_write_the_same_rows(tmp_path: Path) -> None:
    output = tmp_path / "preprocess.json"
    run_bench(
        "perf/preprocess.py",
        *("--records", "300", "600", "--repeats", "1"),
        *("--workdir", str(tmp_path / "work"), "--output", str(output)),
    )
    result = json.loads(output.read_text())
    for records in (300, 600):
        runs = [r for r in result["results"] if r["records"] == records]
        assert [r["mode"] for r in runs] == ["single process", "Ray Data, 1 CPU", "Ray Data, 2 CPU"]
        assert {r["rows"] for r in runs} == {records}
        assert len({r["written"] for r in runs}) == 1 and runs[0]["written"] > records // 2
        assert all(r["repeats_s"] == [round(r["seconds"], 2)] for r in runs)
    assert len(result["runs"]) == 2 * 3
    assert set(result["steady_state"]) == {"single process", "Ray Data, 1 CPU", "Ray Data, 2 CPU"}
    assert result["entity_functions_per_s"] > 0


@pytest.mark.long(seconds=75)
def test_negatives_bench(tmp_path: Path) -> None:
    output = tmp_path / "negatives.json"
    run_bench(
        "perf/negatives.py",
        *("--docs", "3000", "--queries", "200", "--dim", "32", "--k", "20"),
        # 4 steps: a checkpoint (a window of metrics) at each, the first left out as warm-up.
        *("--steps", "4", "--refresh-every", "3", "--pairs", "200", "--batch", "8"),
        *("--output", str(output)),
    )
    result = json.loads(output.read_text())
    assert result["search"]["top_k_agreement"] > 0.99
    for label in ("static table", "async refresh"):
        assert result["training"][label]["step_time_s"] > 0
    assert result["training"]["static table"]["swaps"] == 0


@pytest.mark.long(seconds=75)
def test_train_throughput_bench(tmp_path: Path, monkeypatch) -> None:
    """Also Ray Train's report cadence (santa's own poll interval, unset here): its
    controller takes one report per poll, and a worker reporting again before that poll
    waits for it. With a report every step (a few tens of ms on the tiny model) the steps
    must not wait for polls: at Ray's 2 s or a 0.5 s interval each step waited ~0.3-2 s
    beyond its own time; at santa's 0.1 s, at most ~0.1."""
    from santa.train.trainer import POLL_INTERVAL_ENV

    monkeypatch.delenv(POLL_INTERVAL_ENV, raising=False)
    output = tmp_path / "train.json"
    stdout = run_bench(
        "perf/train_throughput.py",
        # Windows of one step (a report each): the first (warm-up) left out, 7 measured.
        *("--steps", "8", "--window", "1", "--skip-minilm", "--batch", "16", "--pairs", "200"),
        *("--workdir", str(tmp_path / "work"), "--output", str(output)),
    )
    result = json.loads(output.read_text())
    plain, ray_loop = result["results"]
    assert all(r["pairs_per_s"] > 0 for r in (plain, ray_loop))
    assert ray_loop["mode"].startswith("Ray Train, 2 workers")
    assert 0 <= ray_loop["step_wait_s"] < 0.25, ray_loop
    assert result["worker_rss_mb"]["tiny"] > 0
    (table,) = parse_tables(stdout)
    assert [row["wait per step (ms)"] for row in table] == [
        f"{1000 * r['step_wait_s']:.0f}" for r in (plain, ray_loop)
    ]


@pytest.mark.long(seconds=110)
def test_scoder_bench(tmp_path: Path, shared_fixtures: Path) -> None:
    output = tmp_path / "scoder.json"
    cosqa, _ = cosqa_sample(shared_fixtures, tmp_path)
    stdout = run_bench(
        "quality/scoder.py",
        "--cosqa",
        cosqa,
        "--recipe",
        "tiny-ci-scoder",
        "--warmup-steps",
        "4",
        "--steps",
        "4",
        "--iterations",
        "1",
        "--batch",
        "8",
        "--max-files",
        "25",
        "--in-process",
        "--output",
        str(output),
        timeout=1500,
    )
    result = json.loads(output.read_text())
    assert set(result["results"]) == {"warm-up", "in-batch, same steps", "scoder"}
    for row in result["results"].values():
        assert 0 <= row["cosqa_mrr@100"] <= 1 and 0 <= row["stdlib_mrr@100"] <= 1
    (iteration,) = result["per_iteration"]
    assert 0 <= iteration["heldout_accuracy_text_code"] <= 1
    assert all(iteration[key] > 0 for key in ("mine_s", "discriminators_s", "dual_encoder_s"))
    assert "seconds per iteration" in stdout


@pytest.mark.long(seconds=45)
def test_versus_st_bench_runs_its_systems(tmp_path: Path) -> None:
    """Every system but santa-ray (the finetune job's Ray Train run: its command line is
    pinned in tests/test_versus_st.py, its Ray path in the job tests)."""
    output = tmp_path / "versus.json"
    systems = [system for system in versus_st.SYSTEMS if system != "santa-ray"]
    stdout = run_bench(
        "perf/versus_st.py",
        # 2 steps: the first (--window) left out, the second timed.
        *("--systems", ",".join(systems), "--steps", "2", "--window", "1", "--batch", "4"),
        *("--repeats", "1", "--query-length", "16", "--doc-length", "32", "--mini-batch", "2"),
        *("--output", str(output)),
    )
    result = json.loads(output.read_text())
    summary = result["summary"]
    assert list(summary) == systems == ["santa-local", "st-mnrl", "st-cached", "santa-cached"]
    assert [r["system"] for r in result["runs"]] == list(summary)
    for row in summary.values():
        assert row["loop_pairs_per_s"] > 0 and row["end_to_end_s"] > 0
    # The ratios against the reference (st-mnrl), recomputed from the raw runs (one each).
    runs = {run["system"]: run for run in result["runs"]}
    reference = runs["st-mnrl"]
    for system, row in summary.items():
        loop = runs[system]["loop_pairs_per_s"] / reference["loop_pairs_per_s"]
        end_to_end = reference["end_to_end_s"] / runs[system]["end_to_end_s"]
        assert row["loop_vs_reference"] == pytest.approx(loop)
        assert row["end_to_end_vs_reference"] == pytest.approx(end_to_end)
    (table,) = parse_tables(stdout)
    printed = {row["system"]: row for row in table}
    santa = printed[versus_st.LABELS["santa-local"]]
    assert santa["runs"] == "1"
    assert santa["vs st-mnrl"] == f"{summary['santa-local']['loop_vs_reference']:.2f}x"
    assert output.with_suffix(".png").stat().st_size > 0
    assert result["meta"]["command"].startswith("python bench/perf/versus_st.py --systems")


@pytest.mark.long(seconds=75)
def test_versus_st_quality_bench(tmp_path: Path, shared_fixtures: Path) -> None:
    output = tmp_path / "quality.json"
    sample, queries = cosqa_sample(shared_fixtures, tmp_path)
    stdout = run_bench(
        "quality/versus_st_quality.py",
        *("--cosqa", sample),
        *("--steps", "2", "--batch", "4", "--query-length", "16", "--doc-length", "32"),
        *("--bootstrap", "200", "--in-process", "--output", str(output)),
    )
    result = json.loads(output.read_text())
    (cosqa,) = result["results"].values()
    assert cosqa["queries"] == queries
    assert list(cosqa["systems"]) == ["zero-shot", "santa", "sentence-transformers"]
    for row in cosqa["systems"].values():
        assert 0 < row["ci_low"] <= row["mean"] <= row["ci_high"] <= 1
    assert set(cosqa["differences"]) == {
        "santa - sentence-transformers",
        "santa - zero-shot",
        "sentence-transformers - zero-shot",
    }
    _, differences = parse_tables(stdout)
    assert [row["paired difference"] for row in differences] == list(cosqa["differences"])
    assert output.with_suffix(".png").stat().st_size > 0


@pytest.mark.long(seconds=115)
def test_cosqa_transfer_bench_cross_fits(tmp_path: Path, shared_fixtures: Path) -> None:
    from bench.corpora import stdlib_pair_rows, write_pairs

    output = tmp_path / "transfer.json"
    stdlib = write_pairs(tmp_path / "stdlib", stdlib_pair_rows()[:12])
    sample, queries = cosqa_sample(shared_fixtures, tmp_path)
    stdout = run_bench(
        "quality/cosqa_transfer.py",
        *("--cosqa", sample),
        *("--steps", "2", "--batch", "4", "--query-length", "16", "--doc-length", "32"),
        *("--systems", "cosqa,stdlib-large", "--stdlib-data", stdlib, "--bootstrap", "200"),
        "--in-process",
        *("--output", str(output)),
    )
    result = json.loads(output.read_text())
    assert result["queries"] == queries and sum(result["fold_queries"]) == queries
    # Each fold's model trains on the other fold's labelled pairs only.
    assert result["train_pairs"]["CoSQA web queries, cross-fitted"] == result["fold_queries"][::-1]
    assert result["train_pairs"]["stdlib docstrings, no pair repeated"] == 12
    assert list(result["systems"]) == [
        "zero-shot",
        "CoSQA web queries, cross-fitted",
        "stdlib docstrings, no pair repeated",
    ]
    for row in result["systems"].values():
        assert 0 < row["ci_low"] <= row["mean"] <= row["ci_high"] <= 1
    assert list(result["differences"]) == [
        "CoSQA web queries, cross-fitted - zero-shot",
        "stdlib docstrings, no pair repeated - zero-shot",
    ]
    (table,) = parse_tables(stdout)
    assert [row["training"] for row in table] == list(result["systems"])
    assert output.with_suffix(".png").stat().st_size > 0


@pytest.mark.long(seconds=100)
def test_ablation_bench(tmp_path: Path) -> None:
    output = tmp_path / "ablation.json"
    stdout = run_bench(
        "quality/ablation.py",
        *("--steps", "3", "--max-files", "25", "--bootstrap", "200", "--in-process"),
        *("--set", "train.max_document_length=64", "--set", "model.tiny_vocab_size=500"),
        *("--output", str(output)),
    )
    result = json.loads(output.read_text())
    assert list(result["results"]) == [
        "baseline",
        "w/ MEP",
        "w/ SDA",
        "SDA + MEP (entity)",
        "SDA + MEP (span)",
    ]
    assert result["training_seconds"]["baseline"] == 0.0
    assert all(result["training_seconds"][n] > 0 for n in list(result["results"])[1:])
    assert result["corpus"]["test_queries"] > 0
    assert "SDA + MEP (entity) - SDA + MEP (span)" in result["differences"]
    _, paired = parse_tables(stdout)
    assert paired[0]["paired difference"] == "w/ SDA - baseline"
    assert output.with_suffix(".png").stat().st_size > 0


@pytest.mark.slow
def test_cpu_scaling_bench(tmp_path: Path) -> None:
    output = tmp_path / "cpu.json"
    run_bench("perf/cpu_scaling.py", "--iterations", "5", "--rounds", "1", "--output", str(output))
    result = json.loads(output.read_text())
    (round_,) = result["rounds"]
    assert round_["one"]["processes"] == 1 and len(round_["two"]["seconds"]) == 2
    assert round_["speedup"] > 0


def test_ivf_cells_bench_measures_each_setting_against_the_exact_search(tmp_path: Path) -> None:
    from santa.index.faiss_index import ivf_cells

    output = tmp_path / "ivf.json"
    stdout = run_bench(
        "perf/ivf_cells.py",
        *("--vectors", "6000", "--queries", "100", "-k", "10", "--data", "random"),
        *("--settings", "0:64:2:1000,8:39:8", "--output", str(output)),
    )
    result = json.loads(output.read_text())
    default_few, default_all, eight = result["results"]
    assert default_few["cells"] == default_all["cells"] == ivf_cells(6000) == 309
    assert (default_few["probes"], default_all["probes"], eight["cells"]) == (2, 1000, 8)
    assert default_all["recall@10"] == 1.0  # every cell probed: the exact top 10
    assert 0 < default_few["recall@10"] < 1 and eight["points_per_cell"] == 39
    assert result["flat_search_ms_per_query"] > 0 and default_few["train_s"] >= 0
    (table,) = parse_tables(stdout)
    assert [row["probes"] for row in table] == ["2", "1000", "8"]
