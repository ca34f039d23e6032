"""House rules a change can break silently: the README's map names every module, job scripts
stay thin."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO


def test_the_readme_map_names_every_module() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Where things are")
    section = readme[start : readme.index("```\n", readme.index("```", start) + 3)]
    tracked = subprocess.run(
        ["git", "ls-files", "santa", "ray_jobs", "tuning", "bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    modules = [path for path in tracked if path.endswith(".py") and "__init__" not in path]
    assert modules, "no modules found (not a git checkout?)"
    missing = [path for path in modules if path.rsplit("/", 1)[-1] not in section]
    assert missing == [], f"modules the README's map does not name: {missing}"


def test_job_scripts_stay_thin() -> None:
    """A ray_jobs script parses, calls the library and prints: 150 lines at most."""
    long = {
        path.name: lines
        for path in sorted((REPO / "ray_jobs").glob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 150
    }
    assert long == {}, f"job scripts over 150 lines (move the work into santa/): {long}"


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    """CI's last line is the README's test command, word for word: a tier added to one and
    not the other is caught here."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("```bash\n", readme.index("Run the tests")) + len("```bash\n")
    command = readme[start : readme.index("```", start)].strip()
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == command
    assert "python -m pytest" in command


def test_the_library_imports_no_job_script() -> None:
    """ray_jobs/ is the top: santa/ and tuning/ import nothing from it (the flags the
    command lines share live in santa/jobs/flags.py)."""
    found = subprocess.run(
        ["git", "grep", "-n", "-E", r"^\s*(from|import) ray_jobs\b", "--", "santa", "tuning"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    assert found == "", f"library modules importing ray_jobs:\n{found}"


def test_no_module_passes_600_lines() -> None:
    """The house's limit: a module past 600 lines is split where its parts separate."""
    tracked = subprocess.run(
        ["git", "ls-files", "santa", "ray_jobs", "tuning"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    long = {
        path: lines
        for path in tracked
        if path.endswith(".py")
        and (lines := len((REPO / path).read_text(encoding="utf-8").splitlines())) > 600
    }
    assert long == {}, f"modules over 600 lines: {long}"
