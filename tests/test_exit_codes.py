"""Exit codes documented once (the README's table) and every job's --help agreeing (issue 33)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from santa.jobs.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Every job a user runs: each module of ray_jobs/ with a command line of its own, and the sweep.
JOBS = sorted(
    f"ray_jobs.{path.stem}"
    for path in (ROOT / "ray_jobs").glob("*.py")
    if "\ndef main(" in path.read_text()
) + ["tuning.sweep"]


def test_the_job_list_is_every_job() -> None:
    assert {"ray_jobs.index", "ray_jobs.search", "ray_jobs.serve", "ray_jobs.pretrain"} <= set(JOBS)
    assert "ray_jobs.train_cli" not in JOBS  # the training jobs' shared parser, not a job


def readme_exit_codes() -> dict[int, str]:
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", README.read_text(), flags=re.MULTILINE)
    return {int(code): meaning.replace("`", "") for code, meaning in rows}


def test_the_readme_table_is_the_one_the_code_uses() -> None:
    assert readme_exit_codes() == EXIT_CODES


@pytest.mark.parametrize("job", JOBS)
def test_every_jobs_help_lists_the_same_exit_codes(job: str, capsys) -> None:
    module = importlib.import_module(job)
    with pytest.raises(SystemExit) as ended:
        module.main(["--help"])
    assert ended.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status:" in out
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in out, (job, code)
