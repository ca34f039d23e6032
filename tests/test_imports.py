"""The house's import graph: no circles among santa's modules, ray_jobs/, tuning/ and bench/,
and benchmarks never import the tests.

Every import counts, also those inside functions (a lazy import is still a dependency: it
only moves the failure to run time); imports under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("santa", "ray_jobs", "tuning", "bench")


def module_name(path: Path) -> str:
    """``santa/train/loop.py`` → ``santa.train.loop`` (a package's ``__init__`` → the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Every Python module of the checked packages, by dotted name."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "results" not in path.parts:
                modules[module_name(path)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(path: Path, module: str) -> set[str]:
    """Dotted names a module imports (absolute and relative, at any depth)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                is_package = path.name == "__init__.py"
                anchor = package if is_package else package[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports (a name resolves to the longest module)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_names(path, name):
            parts = imported.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules:
                    if candidate != name:
                        targets.add(candidate)
                    break
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
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
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_lazy_imports_are_seen(tmp_path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "def f():\n    import santa.train.loop\n"
        "if TYPE_CHECKING:\n    from santa.models import dual_encoder\n"
    )
    names = imported_names(source, "santa.train.m")
    assert {"santa.train.sibling", "santa.train.loop"} <= names
    assert not any("dual_encoder" in name for name in names)


def test_no_import_circles() -> None:
    graph = import_graph()
    assert "santa.train.loop" in graph and graph["santa.train.loop"]  # the walk sees imports
    assert cycles(graph) == []


def test_bench_never_imports_the_tests() -> None:
    offenders = {
        name: sorted(imported)
        for name, path in project_modules().items()
        if name.startswith("bench")
        for imported in [
            {n for n in imported_names(path, name) if n == "tests" or n.startswith("tests.")}
        ]
        if imported
    }
    assert offenders == {}
