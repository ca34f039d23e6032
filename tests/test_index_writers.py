"""One writer per index folder (issue 40, point 9): a second ray_jobs.index into an output
another index job holds is refused in one line naming the output and its flag."""

from __future__ import annotations

import pytest

from santa.files.outputs import claim_output
from tests.training import stdlib_pair_rows, write_beir


def test_a_second_index_job_into_an_output_in_use_is_refused_naming_the_output(tmp_path, capsys):
    """The index job (its Python face, ``ray_jobs.index.main``) takes the output's lock
    through the job lifecycle: held by another writer, the job ends in one line, exit 2."""
    from ray_jobs import index

    beir = write_beir(tmp_path / "beir", stdlib_pair_rows()[:8])
    output = tmp_path / "index"
    argv = ["--checkpoint", str(tmp_path / "model"), "--corpus", beir, "--output", str(output)]
    with claim_output(str(output), "index"):  # the first job's lock
        code = index.main(argv)  # refused before the model is read or Ray started
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"santa: error: output {output} is in use by pid "), lines
    assert lines[0].endswith("wait for it or pick another --output"), lines
    assert not output.exists()


def test_the_index_output_is_taken_again_by_the_index_job_only(tmp_path):
    """A published index folder is the index job's: it may write there again, another job
    (an evaluation) is refused in one line."""
    from santa.files.outputs import output_kind

    output = tmp_path / "index"
    output.mkdir()
    (output / "index.faiss").write_bytes(b"")
    assert output_kind(str(output)) == "index"
    with claim_output(str(output), "index"):
        pass
    with (
        pytest.raises(ValueError, match="holds the output of index"),
        claim_output(str(output), "evaluate"),
    ):
        pass


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
    with claim_output(str(output), "index"):
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        seconds = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"santa: error: output {output} is in use")
    assert "Ray" not in proc.stdout and "ray" not in proc.stdout.lower(), proc.stdout
    assert seconds < 30, seconds
    assert not output.exists()  # the lock is beside the output: a refused job leaves nothing
