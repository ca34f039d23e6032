"""Exit codes documented once (the README's table) and every job's --help agreeing (issue 33)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from santa.jobs.errors import EXIT_CODES

README = Path(__file__).resolve().parents[1] / "README.md"
JOBS = [
    "ray_jobs.pretrain", "ray_jobs.finetune", "ray_jobs.pipeline", "ray_jobs.preprocess",
    "ray_jobs.scoder", "ray_jobs.evaluate", "ray_jobs.mine_negatives", "ray_jobs.export",
    "tuning.sweep",
]  # fmt: skip


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
