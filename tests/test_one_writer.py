"""One writer per output (issue 33): preprocess, evaluate, export and mine_negatives take the
lease runs take; every output is published whole; a folder holding another tool's output is
refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from santa.files.outputs import check_output_owner, claim_output, output_kind, staged_output
from santa.files.runlock import RunLockedError

REPO = Path(__file__).resolve().parents[1]


def _job(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def _cosqa(path: Path) -> Path:
    records = [
        {"idx": f"q{i}", "doc": f"python read file {i}", "code": f"def f{i}(): pass", "label": 1}
        for i in range(6)
    ]
    path.write_text(json.dumps(records))
    return path


def _preprocess_cosqa(source: Path, output: Path, cwd: Path) -> subprocess.CompletedProcess:
    return _job(
        "ray_jobs.preprocess", "--dataset", "cosqa", "--input", str(source),
        "--output", str(output), "--stage", "eval", cwd=cwd,
    )  # fmt: skip


def test_output_kind_from_manifests_and_files(tmp_path: Path) -> None:
    assert output_kind(str(tmp_path / "missing")) is None
    (tmp_path / "empty").mkdir()
    assert output_kind(str(tmp_path / "empty")) is None
    with staged_output(str(tmp_path / "ev"), tool="evaluate") as staged:
        Path(staged.staging, "metrics.json").write_text("{}")
        staged.publish({})
    assert output_kind(str(tmp_path / "ev")) == "evaluate"
    run = tmp_path / "run"
    (run / "checkpoint_2026-01-01_00-00-00.000000").mkdir(parents=True)
    assert output_kind(str(run)) == "a training run"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my own files")
    assert output_kind(str(tmp_path / "mine")) == "files santa did not write"
    with pytest.raises(ValueError, match="holds files santa did not write"):
        check_output_owner(str(tmp_path / "mine"), "evaluate")
    with pytest.raises(ValueError, match="holds the output of evaluate; preprocess replaces"):
        check_output_owner(str(tmp_path / "ev"), "preprocess")
    check_output_owner(str(tmp_path / "ev"), "evaluate")  # its own: replaced whole


def test_a_second_preprocess_into_an_output_in_use_is_refused(tmp_path: Path) -> None:
    source = _cosqa(tmp_path / "cosqa.json")
    out = tmp_path / "out"
    with claim_output(str(out), "preprocess"):
        with pytest.raises(RunLockedError, match="in use"), claim_output(str(out), "preprocess"):
            pass
        proc = _preprocess_cosqa(source, out, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"santa: error: output {out} is in use by pid {os.getpid()}")
    assert "pick another --output" in lines[0]
    assert not out.exists()
    # Free again: the same command writes, and a rerun replaces its own output.
    assert _preprocess_cosqa(source, out, tmp_path).returncode == 0
    assert output_kind(str(out)) == "preprocess"
    assert _preprocess_cosqa(source, out, tmp_path).returncode == 0


def test_evaluate_refuses_another_tools_output(tmp_path: Path) -> None:
    source = _cosqa(tmp_path / "cosqa.json")
    beir = tmp_path / "beir"
    assert _preprocess_cosqa(source, beir, tmp_path).returncode == 0
    before = sorted(p.relative_to(beir) for p in beir.rglob("*"))
    proc = _job(
        "ray_jobs.evaluate", "--checkpoint", str(tmp_path / "any-model"), "--data", str(beir),
        "--output", str(beir), "--baseline", "none", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"santa: error: --output {beir} holds the output of preprocess; evaluate replaces its "
        "output folder whole, so it writes only into a new or empty folder or one it wrote "
        "before: pick another folder"
    ]
    assert sorted(p.relative_to(beir) for p in beir.rglob("*")) == before


def test_evaluate_rerun_replaces_its_output_whole(tmp_path: Path) -> None:
    from santa.config.recipes import get_recipe
    from santa.eval import EvalConfig, evaluate
    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer
    from tests.training import stdlib_pair_rows, write_beir

    rows = stdlib_pair_rows()[:24]
    beir = write_beir(tmp_path / "beir", rows)
    tokenizer = train_tokenizer([r["query"] for r in rows] + [r["document"] for r in rows], 400)
    model = DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0).eval()
    out = tmp_path / "eval"
    evaluate(model, beir, EvalConfig(output=str(out), baseline="bm25", progress=False))
    assert (out / "run.bm25.trec").is_file() and output_kind(str(out)) == "evaluate"
    evaluate(model, beir, EvalConfig(output=str(out), baseline=None, progress=False))
    names = sorted(p.name for p in out.iterdir())
    assert names == ["info.json", "metrics.json", "metrics.md", "report.json", "run.model.trec"]
    assert json.loads((out / "metrics.json").read_text()).keys() == {"model"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beir", "eval"]  # no staging left
