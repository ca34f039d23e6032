"""bench/results.py: the tables of bench/RESULTS.md are the result files, rendered."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import results
from bench.common import parse_tables
from tests.conftest import REPO


def test_results_md_tables_match_the_result_files(capsys) -> None:
    assert results.main(["--check"]) == 0, capsys.readouterr().out
    names = [match["name"] for match in results.BLOCK.finditer(results.DOCUMENT.read_text())]
    assert sorted(names) == sorted(results.RENDERERS)  # each table once, none unknown


def test_a_table_edited_by_hand_is_stale_and_rendered_again(tmp_path: Path, capsys) -> None:
    document = tmp_path / "RESULTS.md"
    original = results.DOCUMENT.read_text()
    assert original.count("0.7796") == 1  # the dot-product row of the minilm table
    document.write_text(original.replace("0.7796", "0.7800"))
    assert document.read_text() != original
    assert results.main(["--check", "--document", str(document)]) == 1
    assert "stale tables (python bench/results.py): minilm_similarity" in capsys.readouterr().out
    assert results.main(["--document", str(document)]) == 0
    assert document.read_text() == original


def test_a_new_result_file_changes_its_table(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    shutil.copytree(REPO / "bench" / "results", folder, ignore=shutil.ignore_patterns("*.png"))
    path = folder / "minilm_similarity.json"
    result = json.loads(path.read_text())
    result["results"]["cosine, τ=0.05 (now)"].update({"mrr@100": 0.86126, "train_s": 99.6})
    path.write_text(json.dumps(result))
    (table,) = parse_tables(results.minilm_similarity(folder))
    now = table[-1]
    assert now["MRR@100"] == "0.8613" and now["training"] == "100 s"
    assert results.main(["--check", "--results", str(folder)]) == 1


def test_a_missing_result_file_or_unknown_table_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no result file .*scoder.json"):
        results.scoder(tmp_path)
    document = tmp_path / "RESULTS.md"
    document.write_text("<!-- results: nonesuch -->\n| a |\n<!-- /results -->\n")
    with pytest.raises(SystemExit, match="unknown table 'nonesuch'"):
        results.main(["--document", str(document)])


def test_numbers_are_written_as_the_prose_writes_them() -> None:
    assert results.short_float(2e-05) == "2e-5"
    assert results.short_float(2.0000000000000003e-06) == "2e-6"
    assert results.minus("-0.0047 [-0.0104, +0.0002]") == "−0.0047 [−0.0104, +0.0002]"
    assert results.pair_name("w/ SDA - baseline") == "w/ SDA − baseline"


def test_faults_rows_name_the_scratch_folder_w_and_cut_long_lines(tmp_path: Path) -> None:
    rows = [
        {
            "fault": "pretrain: Ctrl-C",
            "running": True,
            "exit": 130,
            "expected": 130,
            "seconds": 52.64,
            "after_fault_s": 20.31,
            "terminal_lines": 8,
            "message": "santa: interrupted: run /tmp/santa-faults-ab_1/running/cut kept "
            + "x" * 200,
            "data_safe": True,
            "last_line": "[train] step 6/8 loss 8.1 in /tmp/santa-faults-ab_1/running/cut",
            "resume_exact": True,
        },
        {"fault": "a bad path", "exit": 2, "expected": 2, "seconds": 0.5, "terminal_lines": 1}
        | {"message": "", "data_safe": False},
        {"fault": "a re-run", "exit": 0, "expected": 0, "seconds": 9.0, "terminal_lines": 3}
        | {"message": "santa: error: x", "last_line": "santa: error: x", "resume_exact": False}
        | {"data_safe": True, "running": True},
    ]
    (tmp_path / "faults.json").write_text(json.dumps({"faults": rows}))
    (running,) = parse_tables(results.RENDERERS["faults_running"](tmp_path))
    row, rerun = running
    assert row["how it ended"].startswith("santa: interrupted: run W/running/cut kept xx")
    assert len(row["how it ended"]) == 160 and row["how it ended"].endswith("...")
    assert row["exit (want)"] == "130 (130)" and row["s to the end"] == "52.6 (20.3 after)"
    assert rerun["s to the end"] == "9.0"  # no fault injected: from the start only
    # A worker's line after the santa line shows as the last line, the scratch folder W.
    assert row["last line"] == "[train] step 6/8 loss 8.1 in W/running/cut"
    assert row["resume exact"] == "yes"
    assert rerun["last line"] == "same" and rerun["resume exact"] == "NO"
    ((before,),) = parse_tables(results.RENDERERS["faults_before"](tmp_path))
    assert before["how it ended"] == "(no message)" and before["data safe"] == "NO"
    assert before["last line"] == "-" and before["resume exact"] == "-"  # not recorded
