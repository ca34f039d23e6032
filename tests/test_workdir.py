"""The oneMKL abort at the start of a submitted job (issue 33): torch's MKL aborts the process
at `import torch` when the working directory is gone; santa's jobs move out of a vanished one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_torch_in_a_vanished_directory_aborts_without_santa(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = _run(f"import shutil; shutil.rmtree({str(gone)!r}); import torch", gone)
    assert proc.returncode == 2
    assert "Intel oneMKL FATAL ERROR: Cannot load" in proc.stdout + proc.stderr


def test_a_job_whose_directory_vanished_still_runs(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    code = f"""
    import shutil
    shutil.rmtree({str(gone)!r})
    from santa.jobs.errors import run_job

    def main():
        import torch
        print("sum", float(torch.ones(3).sum()))
        return 0

    raise SystemExit(run_job(main, argv=[]))
    """
    proc = _run(code, gone)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sum 3.0" in proc.stdout


def test_a_submitted_job_loads_torch_while_its_folder_is_there(tmp_path, monkeypatch) -> None:
    from santa.jobs.workdir import steady_working_directory

    package = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123abcd"
    package.mkdir(parents=True)
    monkeypatch.chdir(package)
    assert steady_working_directory() == "kept"  # not a submitted job: nothing to do
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert steady_working_directory() == "preloaded"
    assert "torch" in sys.modules
