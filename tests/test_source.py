"""Tests for santa.data.source (local source tree -> CodeSearchNet records)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from santa.data.cleaning import split_for_key
from santa.data.source import (
    EXTENSIONS,
    SourceRecords,
    default_source_root,
    extract_functions,
    iter_source_files,
    iter_source_records,
)

CSN_FIELDS = {
    "repo",
    "path",
    "func_name",
    "original_string",
    "language",
    "code",
    "code_tokens",
    "docstring",
    "docstring_tokens",
    "url",
    "partition",
}


def _check_record(rec: dict, language: str, path: str) -> None:
    assert set(rec) >= CSN_FIELDS
    assert rec["language"] == language
    assert rec["path"] == path
    assert rec["original_string"] == rec["code"]
    assert rec["partition"] == split_for_key(path)
    assert rec["code_tokens"] and all(isinstance(t, str) for t in rec["code_tokens"])
    assert rec["url"].startswith(f"file://{rec['repo']}/{path}#L")


def _by_name(records: list[dict]) -> dict[str, dict]:
    return {r["func_name"]: r for r in records}


# ---------------------------------------------------------------------------------- Python

PY_SOURCE = '''\
"""Module docstring."""
import functools


def top(a, b):
    """Add two numbers.

    Args:
        a: first
    """
    return a + b


def undocumented(x):
    return x


class Shape:
    """A shape."""

    @functools.cache
    def area(self):
        """Area of the shape."""

        def helper():
            """Inner helper."""
            return 1

        return helper()

    async def fetch(self):
        \'\'\'Fetch it.\'\'\'
        return None

    class Inner:
        def method(self):
            "Inner method."
            return "é"


if True:
    def conditional():
        """Defined in an if block."""
'''


def test_extract_python() -> None:
    records = extract_functions(PY_SOURCE, "pkg/shapes.py", "python", repo="demo")
    assert [r["func_name"] for r in records] == [
        "top",
        "Shape.area",
        "Shape.area.helper",
        "Shape.fetch",
        "Shape.Inner.method",
        "conditional",
    ]
    for rec in records:
        _check_record(rec, "python", "pkg/shapes.py")
        assert rec["repo"] == "demo"
    recs = _by_name(records)

    top = recs["top"]
    assert top["docstring"] == "Add two numbers.\n\nArgs:\n    a: first"
    assert top["docstring_tokens"] == ["Add", "two", "numbers", "."]
    assert top["code"] == (
        'def top(a, b):\n    """Add two numbers.\n\n    Args:\n        a: first\n    """\n'
        "    return a + b"
    )
    # Like CodeSearchNet, the code tokens leave out the docstring.
    assert top["code_tokens"] == [
        "def",
        "top",
        "(",
        "a",
        ",",
        "b",
        ")",
        ":",
        "return",
        "a",
        "+",
        "b",
    ]
    assert top["url"] == "file://demo/pkg/shapes.py#L5-L11"

    # Methods start at 'def' (not the decorator); later lines keep their indentation.
    area = recs["Shape.area"]
    assert area["code"].startswith('def area(self):\n        """Area of the shape."""\n')
    assert area["code"].endswith("        return helper()")
    assert area["url"].endswith("#L22-L29")
    assert recs["Shape.area.helper"]["code"] == (
        'def helper():\n            """Inner helper."""\n            return 1'
    )
    assert recs["Shape.fetch"]["code"].startswith("async def fetch(self):")
    assert recs["Shape.Inner.method"]["docstring"] == "Inner method."
    assert recs["Shape.Inner.method"]["code"].endswith('return "é"')
    assert recs["conditional"]["docstring"] == "Defined in an if block."


def test_extract_python_crlf_and_form_feed() -> None:
    source = 'def a():\r\n    """A."""\r\n    return 1\r\n\x0c\r\ndef b():\r\n    """B."""\r\n'
    records = _by_name(extract_functions(source, "m.py", "python"))
    assert records["a"]["code"] == 'def a():\r\n    """A."""\r\n    return 1'
    assert records["b"]["url"].endswith("#L5-L6")


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("def f(:\n    pass\n", SyntaxError),
        ("def f():\n  x = 1\n    y = 2\n", SyntaxError),  # IndentationError
        ("print 'python 2'\n", SyntaxError),
        ("x = 1\x00\n", (SyntaxError, ValueError)),  # ValueError on 3.11, SyntaxError on 3.12+
        ("x = " + "(" * 300 + ")" * 300 + "\n", (SyntaxError, ValueError)),  # too deeply nested
    ],
)
def test_extract_python_unparsable(source: str, error: type | tuple[type, ...]) -> None:
    with pytest.raises(error):
        extract_functions(source, "bad.py", "python")


def test_extract_unknown_language() -> None:
    with pytest.raises(ValueError):
        extract_functions("x", "a.c", "c")


# --------------------------------------------------------------------------- tree-sitter

JAVA_SOURCE = """\
package demo;

/**
 * A calculator.
 */
public class Calculator {
    /**
     * Adds two numbers.
     *
     * @param a the first
     * @return the sum
     */
    @Override
    public int add(int a, int b) {
        return a + b;
    }

    // Not a javadoc comment.
    public int sub(int a, int b) { return a - b; }

    public int undocumented() { return 0; }

    static class Inner {
        /** Creates an inner. */
        Inner() {}
    }
}
"""

GO_SOURCE = """\
package demo

// Add returns the sum of a and b.
// It never overflows.
func Add(a, b int) int {
\treturn a + b
}

// Stray comment.

func Undocumented() {}

// Close closes the server.
func (s *Server) Close() error {
\treturn nil
}
"""

JS_SOURCE = """\
/**
 * Adds numbers.
 * @param {number} a
 */
function add(a, b) {
  return a + b;
}

/** Exported. */
export function exported() {}

/** Arrow function. */
const arrow = (x) => x * 2;

/** Prototype method. */
Foo.prototype.bar = function () {
  return 1;
};

// Line comment, not JSDoc.
function lineCommented() {}

function undocumented() {}

class Widget {
  /**
   * Renders the widget.
   */
  render() {
    return null;
  }
}
"""

RUBY_SOURCE = """\
module Demo
  class Greeter
    # Greets someone.
    #
    # @param name [String] who
    def greet(name)
      "Hello #{name}"
    end

    def undocumented
    end

    # Builds a greeter.
    def self.build
      new
    end
  end
end
"""

PHP_SOURCE = """\
<?php
/**
 * Adds two numbers.
 * @param int $a
 */
function add($a, $b) {
    return $a + $b;
}

class Calculator {
    /**
     * Multiplies.
     */
    public function mul($a, $b) {
        return $a * $b;
    }

    public function undocumented() {}
}
"""


def test_extract_java() -> None:
    records = extract_functions(JAVA_SOURCE, "src/Calculator.java", "java")
    assert [r["func_name"] for r in records] == ["Calculator.add", "Calculator.Inner.Inner"]
    for rec in records:
        _check_record(rec, "java", "src/Calculator.java")
    add = records[0]
    assert add["docstring"] == "Adds two numbers.\n\n@param a the first\n@return the sum"
    assert add["docstring_tokens"] == ["Adds", "two", "numbers", "."]
    assert add["code"] == (
        "@Override\n    public int add(int a, int b) {\n        return a + b;\n    }"
    )
    assert add["url"] == "file://local/src/Calculator.java#L13-L16"
    assert records[1]["docstring"] == "Creates an inner."
    assert records[1]["code"] == "Inner() {}"


def test_extract_go() -> None:
    records = extract_functions(GO_SOURCE, "demo.go", "go")
    assert [r["func_name"] for r in records] == ["Add", "Server.Close"]
    for rec in records:
        _check_record(rec, "go", "demo.go")
    assert records[0]["docstring"] == "Add returns the sum of a and b.\nIt never overflows."
    assert records[0]["code"] == "func Add(a, b int) int {\n\treturn a + b\n}"
    assert records[1]["docstring"] == "Close closes the server."
    assert records[1]["code"].startswith("func (s *Server) Close() error {")


def test_extract_javascript() -> None:
    records = extract_functions(JS_SOURCE, "lib/demo.js", "javascript")
    assert [r["func_name"] for r in records] == [
        "add",
        "exported",
        "arrow",
        "Foo.prototype.bar",
        "Widget.render",
    ]
    for rec in records:
        _check_record(rec, "javascript", "lib/demo.js")
    recs = _by_name(records)
    assert recs["add"]["docstring"] == "Adds numbers.\n@param {number} a"
    assert recs["add"]["code"] == "function add(a, b) {\n  return a + b;\n}"
    assert recs["exported"]["code"] == "function exported() {}"
    assert recs["arrow"]["code"] == "const arrow = (x) => x * 2;"
    assert recs["Foo.prototype.bar"]["code"] == "Foo.prototype.bar = function () {\n  return 1;\n};"
    assert recs["Widget.render"]["docstring"] == "Renders the widget."
    assert recs["Widget.render"]["code"] == "render() {\n    return null;\n  }"


def test_extract_ruby() -> None:
    records = extract_functions(RUBY_SOURCE, "lib/greeter.rb", "ruby")
    assert [r["func_name"] for r in records] == ["Demo.Greeter.greet", "Demo.Greeter.build"]
    for rec in records:
        _check_record(rec, "ruby", "lib/greeter.rb")
    assert records[0]["docstring"] == "Greets someone.\n\n@param name [String] who"
    assert records[0]["docstring_tokens"] == ["Greets", "someone", "."]
    assert records[0]["code"] == 'def greet(name)\n      "Hello #{name}"\n    end'
    assert records[0]["url"].endswith("#L6-L8")
    assert records[1]["docstring"] == "Builds a greeter."
    assert records[1]["code"] == "def self.build\n      new\n    end"


def test_extract_php() -> None:
    records = extract_functions(PHP_SOURCE, "src/calc.php", "php")
    assert [r["func_name"] for r in records] == ["add", "Calculator.mul"]
    for rec in records:
        _check_record(rec, "php", "src/calc.php")
    assert records[0]["docstring"] == "Adds two numbers.\n@param int $a"
    assert records[0]["code"] == "function add($a, $b) {\n    return $a + $b;\n}"
    assert records[1]["docstring"] == "Multiplies."
    assert records[1]["code"] == ("public function mul($a, $b) {\n        return $a * $b;\n    }")


# ----------------------------------------------------------------------------- the walk


def _write(root: Path, rel: str, content: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    doc = 'def f():\n    """Doc."""\n'
    _write(tmp_path, "b.py", PY_SOURCE)
    _write(tmp_path, "a/x.py", doc)
    _write(tmp_path, "a/Calc.java", JAVA_SOURCE)
    _write(tmp_path, "a/readme.md", "not code")
    _write(tmp_path, "a/tests/test_x.py", doc)
    _write(tmp_path, "a/test/y.py", doc)
    _write(tmp_path, ".hidden/h.py", doc)
    _write(tmp_path, "__pycache__/c.py", doc)
    _write(tmp_path, "site-packages/s.py", doc)
    _write(tmp_path, "node_modules/n.js", "/** N. */\nfunction n() {}\n")
    _write(tmp_path, "vendor/v.go", "// V.\nfunc V() {}\n")
    _write(tmp_path, "c/greeter.rb", RUBY_SOURCE)
    _write(tmp_path, "c/latin1.py", b'# -*- coding: latin-1 -*-\ndef f():\n    "caf\xe9"\n')
    _write(tmp_path, "c/py2.py", 'def f():\n    """Doc."""\n    print "x"\n')
    return tmp_path


def test_extensions() -> None:
    assert EXTENSIONS == {
        ".py": "python",
        ".java": "java",
        ".go": "go",
        ".js": "javascript",
        ".rb": "ruby",
        ".php": "php",
    }


def test_default_source_root_is_stdlib() -> None:
    root = default_source_root()
    assert os.path.isfile(os.path.join(root, "os.py"))
    assert os.path.realpath(root) == os.path.realpath(os.path.dirname(os.__file__))


def test_iter_source_files(tree: Path) -> None:
    rel = [os.path.relpath(p, tree) for p in iter_source_files(str(tree), skip_tests=True)]
    assert rel == ["b.py", "a/Calc.java", "a/x.py", "c/greeter.rb", "c/latin1.py", "c/py2.py"]
    with_tests = [os.path.relpath(p, tree) for p in iter_source_files(str(tree))]
    assert with_tests == [
        "b.py",
        "a/Calc.java",
        "a/x.py",
        "a/test/y.py",
        "a/tests/test_x.py",
        "c/greeter.rb",
        "c/latin1.py",
        "c/py2.py",
    ]
    only_java = [os.path.relpath(p, tree) for p in iter_source_files(str(tree), ["java"])]
    assert only_java == ["a/Calc.java"]
    with pytest.raises(ValueError):
        list(iter_source_files(str(tree), ["cobol"]))


def test_iter_source_records(tree: Path) -> None:
    records = iter_source_records(str(tree), skip_tests=True)
    assert isinstance(records, SourceRecords)
    out = list(records)
    stats = records.stats
    assert stats.files == 6
    assert set(stats.undecodable) == {"c/latin1.py"}
    assert set(stats.parse_errors) == {"c/py2.py"}
    assert stats.parse_errors["c/py2.py"].startswith("SyntaxError")
    assert stats.records == len(out) == 6 + 1 + 2 + 2
    assert stats.records_by_language == {"python": 7, "java": 2, "ruby": 2}
    assert stats.files_with_records == 4
    assert {r["repo"] for r in out} == {tree.name}
    assert len({r["url"] for r in out}) == len(out)
    # Iterating again walks again and resets the counters.
    assert len(list(records)) == len(out)
    assert records.stats.records == len(out)
    with_tests = list(iter_source_records(str(tree)))
    assert len(with_tests) == len(out) + 2


@pytest.mark.slow
def test_stdlib_records() -> None:
    root = default_source_root()
    everything = iter_source_records(root)  # default: test directories included
    records = list(everything)
    stats = everything.stats
    # What skip_tests=True reads: the records outside test directories (one pass over the
    # standard library instead of two; the small tree above checks the option itself).
    n_without = sum(1 for r in records if not {"test", "tests"} & set(Path(r["path"]).parts[:-1]))
    print(
        f"\nstdlib {sys.version.split()[0]}: {n_without} records without tests, "
        f"{len(records)} with tests ({stats.files} files, {len(stats.parse_errors)} parse "
        f"errors, {len(stats.undecodable)} undecodable)"
    )
    # The standard library has far fewer than 20,000 documented functions (about 6,900
    # without and 8,500 with test directories on CPython 3.11), so the default includes tests.
    assert n_without > 5_000
    assert len(records) > n_without
    assert stats.records == len(records)
    for rec in records:
        assert set(rec) >= CSN_FIELDS
        assert rec["docstring"].strip()
    assert len({r["url"] for r in records}) == len(records)
    assert {r["partition"] for r in records} == {"train", "valid", "test"}
    # Files that cannot be used are rare: Python 2 test data and deliberate encoding tests.
    assert len(stats.parse_errors) + len(stats.undecodable) < 50


def test_python_parse_retries_cpython_ast_depth_mismatch(monkeypatch) -> None:
    """CPython 3.11 can raise a spurious SystemError from ast.parse when another thread
    converts an AST at the same time: retried, and counted as unparsable if it persists."""
    import ast

    import santa.data.source as source_module

    real_parse = ast.parse
    failures = {"left": 1}

    def flaky_parse(source, *args, **kwargs):
        if failures["left"]:
            failures["left"] -= 1
            raise SystemError("AST constructor recursion depth mismatch (before=129, after=69)")
        return real_parse(source, *args, **kwargs)

    code = 'def f(x):\n    """Double x."""\n    return 2 * x\n'
    monkeypatch.setattr(source_module.ast, "parse", flaky_parse)
    assert [r["func_name"] for r in extract_functions(code, "m.py", "python")] == ["f"]
    failures["left"] = 10
    with pytest.raises(ValueError, match="cannot parse"):
        extract_functions(code, "m.py", "python")
    failures["left"] = 0
    monkeypatch.setattr(
        source_module.ast, "parse", lambda *a, **k: (_ for _ in ()).throw(SystemError("other"))
    )
    with pytest.raises(SystemError, match="other"):
        extract_functions(code, "m.py", "python")
