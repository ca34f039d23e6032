"""bench/common.py, the harness of every benchmark: tables, result JSON, machine, figures."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import common
from tests.conftest import REPO


def test_markdown_table_lines_up_and_parses_back() -> None:
    table = common.format_table(
        ["system", "pairs/s", "note"],
        [["santa", "4.83", "a|b"], ["sentence-transformers", "3.92", None]],
        align="lrl",
    )
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1  # every line as wide: columns line up
    assert lines[1] == "| --------------------- | ------: | ---- |"
    assert lines[2] == "| santa                 |    4.83 | a\\|b |"
    assert (
        common.parse_tables(f"before\n{table}\nafter\n\n{table}")
        == [
            [
                {"system": "santa", "pairs/s": "4.83", "note": "a|b"},
                {"system": "sentence-transformers", "pairs/s": "3.92", "note": "—"},
            ]
        ]
        * 2
    )


def test_text_table_and_bad_shapes() -> None:
    text = common.format_table(
        ["mode", "s"], [["single", 1.5], ["Ray Data, 2 CPU", 10]], style="text"
    )
    assert text.splitlines() == [
        "mode               s",
        "---------------  ---",
        "single           1.5",
        "Ray Data, 2 CPU   10",
    ]
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        common.format_table(["a", "b", "c"], [["x", "y"]])
    with pytest.raises(ValueError, match="one of 'l'/'r' per column"):
        common.format_table(["a", "b"], [], align="lx")
    with pytest.raises(ValueError, match="style"):
        common.format_table(["a"], [], style="html")


def test_result_json_carries_date_commit_command_and_machine(tmp_path: Path) -> None:
    run = common.BenchRun(REPO / "bench" / "perf" / "gpu.py", ["--size", "tiny"], quiet=True)
    path = run.write_json(tmp_path / "out" / "gpu.json", {"train": {"pairs_per_s": 1.0}})
    result = json.loads(path.read_text())
    assert result["train"] == {"pairs_per_s": 1.0}
    meta = result["meta"]
    assert meta["command"] == "python bench/perf/gpu.py --size tiny"
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert meta["commit"] in (head, f"{head}-dirty")
    assert meta["date"][:4].isdigit() and "T" in meta["date"]  # ISO 8601
    machine = meta["machine"]
    assert machine["cpu_count"] >= machine["cpus_usable"] >= 1
    assert len(machine["load_average"]) == 3 and len(meta["load_average_end"]) == 3
    assert machine["versions"]["torch"] and machine["versions"]["ray"]
    line = common.describe_machine(machine)
    assert f"({machine['cpus_usable']} of {machine['cpu_count']} cores)" in line
    assert f"ray {machine['versions']['ray']}" in line
    with pytest.raises(ValueError, match="'meta'"):
        run.write_json(tmp_path / "x.json", {"meta": {}})


def test_bench_run_prints_the_machine_and_warns_when_busy(capsys) -> None:
    common.BenchRun(__file__, [], busy_above=-1.0)
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    assert "warning: 1-minute load" in out
    common.BenchRun(__file__, [], busy_above=1e9)
    assert "warning" not in capsys.readouterr().out


def test_json_that_cannot_be_written_leaves_the_old_file(tmp_path: Path) -> None:
    path = common.write_json(tmp_path / "r.json", {"a": 1})
    with pytest.raises(TypeError):
        common.write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_no_commit_outside_a_repository(tmp_path: Path) -> None:
    assert common.git_commit(tmp_path) is None


def test_figures_are_written_whole(tmp_path: Path) -> None:
    row = {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6}
    single = common.plot_intervals(
        {"zero-shot": {"MRR@100": row}, "santa": {"MRR@100": dict(row, mean=0.55)}},
        tmp_path / "single.png",
        "title",
        ylabel="MRR@100",
        reference=0.5,
        wrap=True,
    )
    grouped = common.plot_intervals(
        {"CoSQA": {"a": row, "b": row}, "CSN": {"a": row, "b": row}},
        tmp_path / "grouped.png",
        "title",
        ylabel="MRR@100",
    )
    for path in (single, grouped):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grouped.png", "single.png"]


def test_a_faults_rerun_replaces_only_its_rows(tmp_path) -> None:
    """``faults.py --only`` runs some faults again: their rows replace the recorded ones and
    the rest of the table stays (a real fault, run for real)."""
    import json

    from bench.robustness import faults

    results = tmp_path / "faults.json"
    old = {"fault": "preprocess: --input missing", "exit": 99, "ok": False, "data_safe": False}
    other = {"fault": "some other fault", "exit": 0, "ok": True, "data_safe": True}
    results.write_text(json.dumps({"faults": [old, other]}))
    code = faults.main(
        ["--bad-input-only", "--only", "preprocess: --input missing", "--results", str(results)]
    )
    rows = json.loads(results.read_text())["faults"]
    assert code == 0
    assert [row["fault"] for row in rows] == ["preprocess: --input missing", "some other fault"]
    assert rows[0]["exit"] == 2 and rows[0]["ok"] and rows[0]["data_safe"]
    assert rows[1] == other
    assert faults.merge_rows([old], [other]) == [old, other]
