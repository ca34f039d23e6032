"""Tests for santa.data.cleaning (pair construction helpers, SANTA Appendix A.2)."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from santa.data.cleaning import (
    choose_bullet_point,
    clean_docstring,
    remove_docstring,
    split_bullet_points,
    split_for_key,
    strip_comment_markers,
    strip_html,
)

FIXTURES = Path("/work/shared/fixtures")
ADVTEST_TRAIN = FIXTURES / "advtest" / "train_sample.jsonl"
CSN_RUBY = FIXTURES / "csn" / "ruby" / "valid.jsonl.gz"


# ------------------------------------------------------------------------ clean_docstring


@pytest.mark.parametrize(
    ("docstring", "expected"),
    [
        pytest.param(
            "Fetch rows from a table.\n\n    Retrieves rows pertaining to the given keys.\n\n"
            "    Args:\n        keys: A sequence of strings.\n\n    Returns:\n        A dict.\n    ",
            "Fetch rows from a table.",
            id="python-google",
        ),
        pytest.param(
            "Fetch rows from a table\n    and cache them.\n    Args:\n        keys: the keys",
            "Fetch rows from a table and cache them.",
            id="python-google-no-blank-line",
        ),
        pytest.param(
            "Compute the checksum of\n    a file.\n    :param path: the file\n    :returns: the digest",
            "Compute the checksum of a file.",
            id="python-sphinx",
        ),
        pytest.param(
            '"""Return the sum.\n\n    >>> add(1, 2)\n    3\n    """',
            "Return the sum.",
            id="python-quoted-doctest",
        ),
        pytest.param(
            "Return the sum of a and b.\n    >>> add(1, 2)\n    3",
            "Return the sum of a and b.",
            id="python-doctest-in-first-paragraph",
        ),
        pytest.param(
            "Compute stuff\n\nParameters\n----------\nx : int",
            "Compute stuff",
            id="python-numpy",
        ),
        pytest.param(
            "Summary line\nParameters\n----------\nx : int",
            "Summary line",
            id="python-numpy-no-blank-line",
        ),
        pytest.param("r'''Raw docstring.'''", "Raw docstring.", id="python-raw-literal"),
        pytest.param(
            '"quoted" words and "more"', '"quoted" words and "more"', id="prose-with-quotes"
        ),
        pytest.param(
            "/**\n * Returns the absolute value of {@code x}.\n * <p>\n * More details.\n *\n"
            " * @param x the value\n * @return the absolute value\n */",
            "Returns the absolute value of x.",
            id="javadoc",
        ),
        pytest.param(
            "Returns the absolute\nvalue.\n@param x the value\n@return abs",
            "Returns the absolute value.",
            id="java-csn-stripped",
        ),
        pytest.param(
            "// NewClient returns a new API client.\n"
            "// If httpClient is nil, http.DefaultClient is used.\n//\n// Deprecated: use New.",
            "NewClient returns a new API client. If httpClient is nil, http.DefaultClient is used.",
            id="go-line-comments",
        ),
        pytest.param(
            "NewClient returns a new API client.\nIf httpClient is nil, a default is used.",
            "NewClient returns a new API client. If httpClient is nil, a default is used.",
            id="go-csn-stripped",
        ),
        pytest.param(
            "# Returns the full name of the user.\n#\n# @return [String] the name",
            "Returns the full name of the user.",
            id="ruby-hash-comments",
        ),
        pytest.param(
            "Register an extension with a target class\n When given a block, it is used\n"
            " @param [Class] t the target",
            "Register an extension with a target class When given a block, it is used",
            id="ruby-yard-csn-stripped",
        ),
        pytest.param(
            "/**\n * Formats a date as   ISO string.\n * @param {Date} d - The date.\n"
            " * @returns {string}\n */",
            "Formats a date as ISO string.",
            id="jsdoc",
        ),
        pytest.param(
            "/**\n * Get the route collection.\n *\n"
            " * @return \\Illuminate\\Routing\\RouteCollection\n */",
            "Get the route collection.",
            id="phpdoc",
        ),
        pytest.param("@param x foo\n@return bar", "", id="tags-only"),
        pytest.param("", "", id="empty"),
        pytest.param("  \n\t ", "", id="blank"),
    ],
)
def test_clean_docstring(docstring: str, expected: str) -> None:
    assert clean_docstring(docstring) == expected


def test_clean_docstring_on_csn_ruby_fixture() -> None:
    if not CSN_RUBY.exists():
        pytest.skip(f"fixture {CSN_RUBY} not present")
    with gzip.open(CSN_RUBY, "rt") as fh:
        records = [json.loads(line) for line in fh]
    for rec in records:
        cleaned = clean_docstring(rec["docstring"])
        assert cleaned, rec["docstring"]
        assert "  " not in cleaned and "\n" not in cleaned
        assert not cleaned.startswith(("#", "@"))


def test_strip_comment_markers_keeps_lines() -> None:
    assert strip_comment_markers("/**\n * A.\n *\n * B.\n */") == "A.\n\nB."
    assert strip_comment_markers("// A.\n//\n// B.") == "A.\n\nB."
    assert strip_comment_markers("## A.\n# B.") == "A.\nB."
    assert strip_comment_markers("=begin\nA.\n=end") == "A."


# ------------------------------------------------------------------------ remove_docstring


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        pytest.param(
            'def add(a, b):\n    """Add two numbers.\n\n    Returns the sum.\n    """\n    return a + b\n',
            "def add(a, b):\n    return a + b\n",
            id="function",
        ),
        pytest.param(
            "def area(self):\n        '''Area of the shape.'''\n        return self.w * self.h",
            "def area(self):\n        return self.w * self.h",
            id="csn-method-snippet",
        ),
        pytest.param(
            "    def area(self):\n        '''Area.'''  # noqa\n        return 1\n",
            "    def area(self):\n        return 1\n",
            id="indented-method-trailing-comment",
        ),
        pytest.param(
            'def greet(name):\n    u"""Print a greeting."""\n    print "Hello, %s" % name\n',
            'def greet(name):\n    print "Hello, %s" % name\n',
            id="python2-print",
        ),
        pytest.param(
            'def greet(name):\n    ur"""Print a greeting."""\n    print name\n',
            "def greet(name):\n    print name\n",
            id="python2-ur-prefix",
        ),
        pytest.param(
            'def f():\n    """doc"""\n    return 1',
            "def f():\n    return 1",
            id="one-line-docstring",
        ),
        pytest.param('def f(): """doc"""\n', "def f():\n", id="one-line-suite"),
        pytest.param('def f(): "doc"; return 1\n', "def f(): return 1\n", id="semicolon-suite"),
        pytest.param('def f():\n    "doc"; return 1\n', "def f():\n    return 1\n", id="semicolon"),
        pytest.param(
            'def f(x):\n    "a" \\\n    "b"\n    return x\n',
            "def f(x):\n    return x\n",
            id="implicit-concatenation",
        ),
        pytest.param(
            '@dec(a="s")\nasync def f(x: "int" = {1: 2}) -> "str":\n    # note\n\n'
            '    """Doc."""\n    return x\n',
            '@dec(a="s")\nasync def f(x: "int" = {1: 2}) -> "str":\n    # note\n\n    return x\n',
            id="decorated-async-annotations",
        ),
        pytest.param(
            'def f():\r\n    """Doc."""\r\n    return 1\r\n',
            "def f():\r\n    return 1\r\n",
            id="crlf",
        ),
        pytest.param("def f(x):\n    return x\n", "def f(x):\n    return x\n", id="no-docstring"),
        pytest.param(
            'def f(x):\n    "%s" % x\n', 'def f(x):\n    "%s" % x\n', id="string-expression"
        ),
        pytest.param(
            'def f():\n  if x:\n    """not doc"""\n',
            'def f():\n  if x:\n    """not doc"""\n',
            id="string-in-nested-block",
        ),
    ],
)
def test_remove_docstring_python(code: str, expected: str) -> None:
    assert remove_docstring(code, "", "python") == expected


@pytest.mark.parametrize(
    "code",
    [
        'def f(:\n    """x"""\n    return (1,\n',  # EOF in multi-line statement
        "def f():\n        x = 1\n    y = 2\n",  # inconsistent dedent
    ],
)
def test_remove_docstring_python_untokenizable(code: str) -> None:
    with pytest.raises(ValueError):
        remove_docstring(code, "", "python")


def _advtest_records() -> list[dict]:
    if not ADVTEST_TRAIN.exists():
        pytest.skip(f"fixture {ADVTEST_TRAIN} not present")
    with ADVTEST_TRAIN.open() as fh:
        return [json.loads(line) for line in fh]


def test_remove_docstring_on_advtest_records() -> None:
    records = _advtest_records()
    assert records
    for rec in records:
        code = rec["code"]
        out = remove_docstring(code, rec["docstring"], "python")
        first_line = rec["docstring"].strip().splitlines()[0].strip()
        assert first_line not in out, rec["url"]
        # Everything else survives: the docstring was one contiguous block of lines.
        assert len(out) < len(code)
        assert out.splitlines()[0] == code.splitlines()[0]
        assert out.rstrip().splitlines()[-1] == code.rstrip().splitlines()[-1]
        removed = [line for line in code.splitlines() if line not in out.splitlines()]
        assert all(
            line.strip() == "" or line.strip() in rec["docstring"] or '"' in line or "'" in line
            for line in removed
        ), rec["url"]


@pytest.mark.parametrize(
    ("code", "docstring", "language", "expected"),
    [
        pytest.param(
            "/**\n * Adds.\n */\n@Override\npublic int add(int x) { return x; }",
            "Adds.",
            "java",
            "@Override\npublic int add(int x) { return x; }",
            id="javadoc",
        ),
        pytest.param(
            "/** Adds. */ public int add(int x) { return x; }",
            "Adds.",
            "java",
            "public int add(int x) { return x; }",
            id="javadoc-same-line",
        ),
        pytest.param(
            "// Foo does x.\n// More.\nfunc Foo() {}",
            "Foo does x.\nMore.",
            "go",
            "func Foo() {}",
            id="go",
        ),
        pytest.param(
            "  # Parse it.\n  # More.\n  def parse; end",
            "Parse it.\nMore.",
            "ruby",
            "  def parse; end",
            id="ruby",
        ),
        pytest.param(
            "def parse\n  # Parse it.\n  load\nend",
            "Parse it.",
            "ruby",
            "def parse\n  # Parse it.\n  load\nend",
            id="ruby-body-comment-kept",
        ),
        pytest.param(
            "func Foo() {\n\t// unrelated\n}",
            "Foo does x.",
            "go",
            "func Foo() {\n\t// unrelated\n}",
            id="no-doc-comment",
        ),
        pytest.param("function f() {}", "", "javascript", "function f() {}", id="empty-docstring"),
    ],
)
def test_remove_docstring_other_languages(
    code: str, docstring: str, language: str, expected: str
) -> None:
    assert remove_docstring(code, docstring, language) == expected


def test_remove_docstring_csn_ruby_unchanged() -> None:
    # CodeSearchNet code already excludes the doc comment; nothing must be removed.
    if not CSN_RUBY.exists():
        pytest.skip(f"fixture {CSN_RUBY} not present")
    with gzip.open(CSN_RUBY, "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            assert remove_docstring(rec["code"], rec["docstring"], "ruby") == rec["code"]


# ------------------------------------------------------------------------------ ESCI text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "<p>Great <b>sound</b> quality&nbsp;&amp; bass<br/>Fits all</p>",
            "Great sound quality & bass Fits all",
        ),
        ("<ul><li>One</li><li>Two</li></ul>", "One Two"),
        ("Line one<br>Line two", "Line one Line two"),
        ("5 &lt; 6 &quot;inches&quot;", '5 < 6 "inches"'),
        ("<style>p {color: red}</style>Text", "Text"),
        ("  plain   text \n", "plain text"),
        ("", ""),
    ],
)
def test_strip_html(text: str, expected: str) -> None:
    assert strip_html(text) == expected


def test_split_bullet_points() -> None:
    assert split_bullet_points("  A  \n\n B\r\nC \n") == ["A", "B", "C"]
    assert split_bullet_points("") == []
    assert split_bullet_points(None) == []
    assert split_bullet_points(float("nan")) == []  # type: ignore[arg-type]


def test_choose_bullet_point_reproducible_and_order_independent() -> None:
    products = {f"B{i:09d}": [f"bullet {i}-{j}" for j in range(1 + i % 5)] for i in range(500)}
    first = {pid: choose_bullet_point(pid, bullets, seed=13) for pid, bullets in products.items()}
    order = list(products)
    random.Random(0).shuffle(order)
    shuffled = {pid: choose_bullet_point(pid, products[pid], seed=13) for pid in order}
    assert first == shuffled
    assert all(first[pid] in products[pid] for pid in products)
    # The seed matters, and choices are spread over the bullets.
    other = {pid: choose_bullet_point(pid, bullets, seed=14) for pid, bullets in products.items()}
    assert other != first
    five = [pid for pid, bullets in products.items() if len(bullets) == 5]
    assert len({products[pid].index(first[pid]) for pid in five}) == 5
    assert choose_bullet_point("B0", [], seed=0) is None


def test_choose_bullet_point_same_in_subprocess() -> None:
    bullets = ["a", "b", "c", "d", "e", "f", "g"]
    pids = [f"P{i}" for i in range(50)]
    here = [choose_bullet_point(pid, bullets, seed=3) for pid in pids]
    script = (
        "from santa.data.cleaning import choose_bullet_point\n"
        f"print([choose_bullet_point(p, {bullets!r}, seed=3) for p in {pids!r}])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == repr(here)


# ---------------------------------------------------------------------------- split_for_key


def test_split_for_key_deterministic_across_processes() -> None:
    keys = [f"pkg/module_{i}.py" for i in range(200)]
    here = [split_for_key(k, seed=7) for k in keys]
    script = (
        "from santa.data.cleaning import split_for_key\n"
        f"print([split_for_key(k, seed=7) for k in {keys!r}])\n"
    )
    # A different PYTHONHASHSEED proves the split does not rely on hash().
    out = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        cwd=str(Path(__file__).resolve().parents[1]),
    ).stdout
    assert out.strip() == repr(here)


def test_split_for_key_proportions() -> None:
    counts = Counter(split_for_key(f"file_{i}.py") for i in range(10_000))
    assert set(counts) == {"train", "valid", "test"}
    assert abs(counts["train"] / 10_000 - 0.8) < 0.02
    assert abs(counts["valid"] / 10_000 - 0.1) < 0.015
    assert abs(counts["test"] / 10_000 - 0.1) < 0.015
    # Another seed gives another assignment.
    assert [split_for_key(f"file_{i}.py", seed=1) for i in range(100)] != [
        split_for_key(f"file_{i}.py") for i in range(100)
    ]


def test_split_for_key_fractions() -> None:
    assert {split_for_key(str(i), fractions=(1, 0, 0)) for i in range(200)} == {"train"}
    assert {split_for_key(str(i), fractions=(0, 0, 2)) for i in range(200)} == {"test"}
    with pytest.raises(ValueError):
        split_for_key("x", fractions=(0.5, 0.5))
    with pytest.raises(ValueError):
        split_for_key("x", fractions=(-0.1, 0.6, 0.5))
    with pytest.raises(ValueError):
        split_for_key("x", fractions=(0, 0, 0))
