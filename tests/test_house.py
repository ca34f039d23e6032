"""House rules a change can break silently: the README's map names every module, job scripts
stay thin."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO


def readme_map() -> dict[str, str]:
    """The README's map, folder by folder: each line that starts at the margin opens (or
    adds to) its folder's entry (``santa/train/``, or ``tuning/`` for ``tuning/sweep.py``),
    and the indented lines under it belong to that folder."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Where things are")
    block = readme[
        readme.index("```\n", start) + 4 : readme.index("```\n", readme.index("```", start) + 3)
    ]
    folders: dict[str, str] = {}
    folder = ""
    for line in block.splitlines():
        if line and not line[0].isspace():
            first = line.split()[0]
            folder = first if first.endswith("/") else first.rsplit("/", 1)[0] + "/"
        folders[folder] = folders.get(folder, "") + "\n" + line
    return folders


def _named(name: str, text: str) -> bool:
    """``name`` (``rows.py``) stands in ``text`` as a file name of its own, not as the tail of
    another path (``files/rows.py``) or name (``scoder_rows.py``)."""
    return re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w])", text) is not None


def test_the_readme_map_names_every_module_under_its_folder() -> None:
    folders = readme_map()
    tracked = subprocess.run(
        ["git", "ls-files", "santa", "ray_jobs", "tuning", "bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    modules = [path for path in tracked if path.endswith(".py") and "__init__" not in path]
    assert modules, "no modules found (not a git checkout?)"
    missing = [
        path
        for path in modules
        if not _named(path.rsplit("/", 1)[-1], folders.get(path.rsplit("/", 1)[0] + "/", ""))
        and not _named(path, "\n".join(folders.values()))
    ]
    assert missing == [], f"modules the README's map does not name under their folder: {missing}"
    # ... and the map names no module that is gone.
    stale = [
        folder + name
        for folder, text in folders.items()
        for name in re.findall(r"(?<![\w/.])(\w+\.py)\b", text)
        if folder + name not in tracked
    ]
    assert stale == [], f"modules the README's map names that do not exist: {stale}"


def test_the_map_check_tells_folders_apart() -> None:
    """A module named under another folder's heading is not counted as named."""
    assert _named("rows.py", "  rows.py   the row file")
    assert not _named("rows.py", "  scoder_rows.py   x")
    assert not _named("rows.py", "  see files/rows.py")
    assert "santa/scoder/" in readme_map() and _named("rows.py", readme_map()["santa/scoder/"])


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
