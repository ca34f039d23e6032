"""Unknown input layouts fail fast with one line naming the file: JSON arrays instead of
JSON lines, and a language filter that matches none of the files found."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from santa.data.plan import PreprocessConfig, check_inputs
from tests.datagen import other_language_records, write_csn_layout

REPO = Path(__file__).resolve().parents[1]


def _config(root: Path, **options) -> PreprocessConfig:
    return PreprocessConfig(dataset=options.pop("dataset", "codesearchnet"), input=str(root),
                            output=str(root.parent / "out"), **options)  # fmt: skip


@pytest.mark.parametrize(
    "name, indent",
    [("data.json", None), ("data.jsonl", 2), ("data.json.gz", None)],
)
def test_a_json_array_file_is_named(tmp_path, name, indent):
    records = other_language_records("ruby", count=3)
    text = json.dumps(records, indent=indent).encode()
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(
        gzip.compress(b"\n  " + text) if name.endswith(".gz") else b"\xef\xbb\xbf" + text
    )
    with pytest.raises(ValueError, match=f"^{path} is a JSON array, not JSON lines"):
        check_inputs(_config(tmp_path / "in"))


def test_json_lines_pass(tmp_path):
    write_csn_layout(tmp_path / "in", languages=("ruby",))
    check_inputs(_config(tmp_path / "in"))


def test_languages_not_present_names_those_found(tmp_path):
    write_csn_layout(tmp_path / "in", languages=("ruby", "go"))
    with pytest.raises(FileNotFoundError) as caught:
        check_inputs(_config(tmp_path / "in", languages=("python",)))
    assert (
        str(caught.value) == f"no python files under {tmp_path / 'in'} (languages found: go, ruby)"
    )


def test_source_tree_languages_not_present(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "lib.rb").write_text("def f\n  1\nend\n")
    with pytest.raises(
        FileNotFoundError, match=r"no python source files .* \(languages found: ruby\)"
    ):
        check_inputs(_config(tmp_path / "in", dataset="source", languages=("python",)))


def test_preprocess_cli_json_array_is_one_line_before_ray(tmp_path):
    path = tmp_path / "in" / "data.json"
    path.parent.mkdir()
    path.write_text(json.dumps(other_language_records("ruby", count=3)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "ray_jobs.preprocess", "--dataset", "codesearchnet",
         "--input", str(path.parent), "--output", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"santa: error: {path} is a JSON array, not JSON lines (one object per line): "
        "convert it, e.g. jq -c '.[]' FILE > FILE.jsonl"
    ]
    assert "Ray:" not in proc.stdout and not (tmp_path / "out").exists()
