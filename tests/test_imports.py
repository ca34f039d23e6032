"""The house's import graph: no circles among the modules of santa/, ray_jobs/, tuning/ and
bench/, and bench/ stands on santa alone (it never imports tests/).

Every import counts, a function's own included: a circle through a function-level import
(bench/faults.py ↔ bench/fault_cases.py, santa/train/entry.py ↔ loop.py did this) still
ties the two files together. Imports under ``if TYPE_CHECKING:`` do not count (they never
run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO


def module_name(path: Path, root: Path) -> str:
    """``bench/perf/gpu.py`` → ``bench.perf.gpu``; a package's ``__init__.py`` → the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, root: Path) -> set[str]:
    """Every module name ``path`` imports (``from a import b`` gives ``a`` and ``a.b``),
    relative imports resolved; ``importlib.import_module("x")`` with a literal counts."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in _walk_running(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def _walk_running(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (its ``else`` kept)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(root: Path, package: str | tuple[str, ...]) -> dict[str, set[str]]:
    """Module → the modules of ``package`` (one or several) it imports (itself left out).
    ``from a.b import name`` counts as importing ``a.b.name`` when that is a module, else
    ``a.b``."""
    packages = (package,) if isinstance(package, str) else package
    paths = sorted(path for name in packages for path in (root / name).rglob("*.py"))
    modules = {module_name(path, root): path for path in paths}
    graph = {}
    for module, path in modules.items():
        targets = {name for name in imported_names(path, root) if name in modules}
        graph[module] = targets - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: its strongly connected components of two or more modules
    (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def imports_of_tests(root: Path, package: str) -> dict[str, list[str]]:
    """Module → the names it imports from ``tests`` (or ``tests`` itself)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        names = sorted(
            name
            for name in imported_names(path, root)
            if name == "tests" or name.startswith("tests.")
        )
        if names:
            found[module_name(path, root)] = names
    return found


def test_bench_never_imports_tests() -> None:
    modules = import_graph(REPO, "bench")
    assert "bench.common" in modules and "bench.perf.gpu" in modules  # the walk found them
    assert imports_of_tests(REPO, "bench") == {}


def test_bench_modules_import_no_circle() -> None:
    graph = import_graph(REPO, "bench")
    assert "bench.common" in graph["bench.perf.versus_st"]  # the walk sees the imports
    assert import_cycles(graph) == []


def test_bench_modules_import_each_other_by_full_name() -> None:
    """``from versus_st_quality import ...`` (a sibling put on sys.path) would hide a
    circle from the walk above: bench modules import each other as ``bench.…``."""
    stems = {path.stem for path in (REPO / "bench").rglob("*.py")} - {"__init__"}
    bare = {
        module_name(path, REPO): sorted(
            name for name in imported_names(path, REPO) if name.split(".")[0] in stems
        )
        for path in sorted((REPO / "bench").rglob("*.py"))
    }
    assert {module: names for module, names in bare.items() if names} == {}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "cycles"),
    [
        (  # the old bench/faults.py ↔ bench/fault_cases.py, through a function's import
            {
                "pkg/__init__.py": "",
                "pkg/faults.py": "def main():\n    from pkg.fault_cases import build\n",
                "pkg/fault_cases.py": "from pkg.faults import Fault\n",
            },
            [["pkg.fault_cases", "pkg.faults"]],
        ),
        (  # three modules, relative and ``from package import module`` imports
            {
                "pkg/__init__.py": "",
                "pkg/sub/__init__.py": "",
                "pkg/sub/a.py": "from . import b\n",
                "pkg/sub/b.py": "from pkg import c\n",
                "pkg/c.py": "import pkg.sub.a\n",
            },
            [["pkg.c", "pkg.sub.a", "pkg.sub.b"]],
        ),
        (  # a chain is no circle
            {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "x = 1\n"},
            [],
        ),
    ],
)
def test_the_walk_finds_circles(tmp_path: Path, files: dict[str, str], cycles) -> None:
    _write(tmp_path, files)
    assert import_cycles(import_graph(tmp_path, "pkg")) == cycles


def test_the_walk_finds_imports_of_tests(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from tests.training import write_pairs\n",
            "pkg/b.py": "import importlib\nimportlib.import_module('tests.conftest')\n",
            "pkg/c.py": "import tests_of_mine\nfrom santa import tests\n",
        },
    )
    assert imports_of_tests(tmp_path, "pkg") == {
        "pkg.a": ["tests.training", "tests.training.write_pairs"],
        "pkg.b": ["tests.conftest"],
    }


HOUSE = ("santa", "ray_jobs", "tuning", "bench")


def test_the_house_imports_no_circle() -> None:
    graph = import_graph(REPO, HOUSE)
    assert "santa.train.loop" in graph["santa.train.entry"]  # the walk sees function imports
    assert "santa.files.storage" in graph["santa.files.layout"]
    assert import_cycles(graph) == []


def test_type_checking_imports_do_not_count(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
            "pkg/b.py": "from pkg import a\n",
        },
    )
    assert import_cycles(import_graph(tmp_path, "pkg")) == []
