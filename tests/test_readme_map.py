"""The README's map ("Where things are") names every module of the project."""

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
