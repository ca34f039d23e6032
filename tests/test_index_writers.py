"""One writer per index folder (issue 40, point 9): a second ray_jobs.index into an output
another index job holds is refused in one line naming the output and its flag."""

from __future__ import annotations

import pytest

from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from santa.recipes import get_recipe
from santa.runtime.runlock import RunLockedError
from santa.search.indexing import IndexConfig, build_index, output_lock
from tests.training import stdlib_pair_rows, write_beir


def test_a_second_index_job_into_an_output_in_use_is_refused_naming_the_output(tmp_path):
    rows = stdlib_pair_rows()
    tokenizer = train_tokenizer([r["query"] for r in rows] + [r["document"] for r in rows], 500)
    model = DualEncoder.build_tiny(get_recipe("tiny").model, tokenizer, seed=0)
    model.save_pretrained(str(tmp_path / "model"), santa_config=get_recipe("tiny"))
    beir = write_beir(tmp_path / "beir", rows)
    output = tmp_path / "index"
    config = IndexConfig(checkpoint=str(tmp_path / "model"), corpus=beir, output=str(output))
    with (
        output_lock(config),  # the first job's lock
        pytest.raises(RunLockedError) as refused,
    ):
        build_index(config)  # refused before any encoding (no Ray needed)
    line = str(refused.value)
    assert line.startswith(f"output {output} is in use by pid "), line
    assert line.endswith("wait for it or pick another --output"), line
    assert not (output / "report.json").exists()


def test_the_index_job_is_refused_before_ray_starts(tmp_path):
    """``ray_jobs.index`` takes the output's lock before starting Ray: a second writer ends
    in one line within seconds (it used to be refused only after Ray had started, 34-102 s
    on a loaded machine), and no Ray was started for it."""
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    beir = write_beir(tmp_path / "beir", stdlib_pair_rows()[:8])
    output = tmp_path / "index"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "ray_jobs.index", "--checkpoint", str(tmp_path / "model")]
    command += ["--corpus", beir, "--output", str(output)]
    with output_lock(IndexConfig(checkpoint="", corpus=beir, output=str(output))):
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        seconds = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"santa: error: output {output} is in use")
    assert "Ray" not in proc.stdout and "ray" not in proc.stdout.lower(), proc.stdout
    assert seconds < 30, seconds
    assert not output.exists()  # the lock is beside the output: a refused job leaves nothing
