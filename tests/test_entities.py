"""Tests for santa.method.entities: identifier and product-noun extraction."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from santa.data.schema import CODE_LANGUAGES
from santa.method.entities import (
    UnparsableCodeError,
    extract_code_entities,
    extract_product_entities,
    token_spans,
)
from tests.conftest import SHARED

RUBY_KEYWORDS = frozenset(
    re.findall(
        r"\S+",
        """BEGIN END alias and begin break case class def defined? do else elsif end ensure
        false for if in module next nil not or redo rescue retry return self super then true
        undef unless until when while yield __FILE__ __LINE__ __ENCODING__""",
    )
)


def identifiers(code: str, language: str) -> list[str]:
    """Extract and check the span invariants, returning the identifier strings in order."""
    spans = extract_code_entities(code, language)
    assert spans == sorted(spans)
    for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False):
        assert end <= next_start, "spans overlap"
    assert all(0 <= start < end <= len(code) for start, end in spans)
    return [code[start:end] for start, end in spans]


# --------------------------------------------------------------------------------------
# Python
# --------------------------------------------------------------------------------------


def test_python_excludes_keywords_and_constants() -> None:
    code = "def add(a, b):\n    return a + b if a else None"
    assert identifiers(code, "python") == ["add", "a", "b", "a", "b", "a"]


def test_python_keeps_builtins_and_soft_keywords() -> None:
    code = "def f(match, _):\n    return len(match) or True or print(_)"
    assert set(identifiers(code, "python")) == {"f", "match", "_", "len", "print"}


def test_python_indented_method() -> None:
    # A method cut out of its class: indented first line.
    code = "    def area(self):\n        return self.width * self.height\n"
    assert set(identifiers(code, "python")) == {"area", "self", "width", "height"}


def test_python_indentation_that_does_not_nest() -> None:
    # The last line dedents to a level that never existed: tokenize raises
    # IndentationError, the fallback must still give correct offsets.
    code = "    def f(self):\n        x = self.y\n  return x\n"
    assert identifiers(code, "python") == ["f", "self", "x", "self", "y", "x"]


def test_python2_code() -> None:
    code = 'def show(name):\n    print "hello", name\n    return 10L + `name` + len(ur"x")\n'
    # "L" (long suffix) and "ur" (string prefix) are not identifiers.
    assert identifiers(code, "python") == ["show", "name", "print", "name", "name", "len"]


def test_python_non_ascii_before_identifier() -> None:
    code = 'def f():\n    s = "héllo wörld 😀"; naïve = s\n    return naïve\n'
    assert identifiers(code, "python") == ["f", "s", "naïve", "s", "naïve"]


def test_python_crlf_and_form_feed_offsets() -> None:
    code = "x = 1\r\n\x0cy = x\r\nz = y\n"
    assert identifiers(code, "python") == ["x", "y", "x", "z", "y"]


def test_python_unparsable() -> None:
    with pytest.raises(UnparsableCodeError):
        extract_code_entities('def f():\n    return """never closed\n', "python")
    with pytest.raises(UnparsableCodeError):
        extract_code_entities("def f(:\n    return (1,\n", "python")
    with pytest.raises(UnparsableCodeError):
        extract_code_entities("\x00\x01 ?? $$ !! \x02\x03 ?$", "python")


# --------------------------------------------------------------------------------------
# tree-sitter languages
# --------------------------------------------------------------------------------------


def test_java_method() -> None:
    code = (
        "@Override\n"
        "public int add(int a, List<String> names) {\n"
        "    var total = this.base + a;\n"
        "    for (String name : names) { total += name.length(); }\n"
        "    return total > 0 ? total : null;\n"
        "}"
    )
    assert set(identifiers(code, "java")) == {
        "Override",
        "add",
        "a",
        "List",
        "String",
        "names",
        "total",
        "base",
        "name",
        "length",
    }


def test_java_member_that_needs_class_wrapper() -> None:
    # A field declaration with an initializer block is only valid inside a class body.
    code = "private static final Logger LOG = Logger.getLogger(Foo.class);\nstatic { init(); }"
    assert set(identifiers(code, "java")) == {"Logger", "LOG", "getLogger", "Foo", "init"}


def test_go_method() -> None:
    code = (
        "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) error {\n"
        '\tif r == nil {\n\t\treturn errors.New("no request")\n\t}\n'
        "\tfor i := range s.routes {\n\t\tfmt.Println(i)\n\t}\n"
        "\treturn nil\n}"
    )
    assert set(identifiers(code, "go")) == {
        "s",
        "Server",
        "Handle",
        "w",
        "http",
        "ResponseWriter",
        "r",
        "Request",
        "error",
        "errors",
        "New",
        "i",
        "routes",
        "fmt",
        "Println",
    }


def test_javascript_function_expression_and_method() -> None:
    code = (
        "function (options, callback) {\n"
        "  const { timeout, retries } = options;\n"
        "  return this.client.get(url, { timeout }).then((res) => callback(null, res));\n"
        "}"
    )
    assert set(identifiers(code, "javascript")) == {
        "options",
        "callback",
        "timeout",
        "retries",
        "client",
        "get",
        "url",
        "then",
        "res",
    }
    method = "render(props) {\n  return this.#cache[props.id] || undefined;\n}"
    assert set(identifiers(method, "javascript")) == {"render", "props", "#cache", "id"}


def test_ruby_method() -> None:
    code = (
        "def save!(attrs = {})\n"
        "  @record ||= Model::Record.new(attrs)\n"
        "  $stdout.puts @@count if valid?\n"
        "  raise $! unless self.class.exists?\n"
        "  yield @record\n"
        "end"
    )
    assert set(identifiers(code, "ruby")) == {
        "save!",
        "attrs",
        "@record",
        "Model",
        "Record",
        "new",
        "$stdout",
        "puts",
        "@@count",
        "valid?",
        "raise",
        "exists?",
    }


def test_php_method_without_open_tag() -> None:
    code = (
        "public function find($id, array $options = [])\n"
        "{\n"
        "    $row = $this->db->fetch(self::TABLE, $id);\n"
        "    return $row ?: NULL;\n"
        "}"
    )
    assert set(identifiers(code, "php")) == {
        "find",
        "id",
        "options",
        "row",
        "this",
        "db",
        "fetch",
        "TABLE",
    }


def test_php_statements() -> None:
    code = "$total = count($items);\necho strtoupper($name);"
    assert identifiers(code, "php") == ["total", "count", "items", "strtoupper", "name"]


@pytest.mark.parametrize(
    ("language", "code", "expected"),
    [
        ("java", 'String s = "é€😀"; int n = s.length();', ["String", "s", "n", "s", "length"]),
        ("go", 'func f() int { s := "é€😀"; return len(s) }', ["f", "int", "s", "len", "s"]),
        ("javascript", "const s = 'é€😀'; let n = s.length;", ["s", "n", "s", "length"]),
        ("ruby", "s = 'é€😀'\nn = s.length", ["s", "n", "s", "length"]),
        ("php", "$s = 'é€😀'; $n = strlen($s);", ["s", "n", "strlen", "s"]),
    ],
)
def test_non_ascii_offsets(language: str, code: str, expected: list[str]) -> None:
    # tree-sitter reports UTF-8 byte offsets; spans must be str indices.
    assert identifiers(code, language) == expected


GARBAGE = "}}}} ))) ]]] ;;; @@@ ### !!! ??? ::: \x00\x01\x02 }}} ))"


@pytest.mark.parametrize("language", CODE_LANGUAGES)
def test_garbage_is_unparsable(language: str) -> None:
    with pytest.raises(UnparsableCodeError):
        extract_code_entities(GARBAGE, language)


def test_unsupported_language() -> None:
    with pytest.raises(ValueError, match="unsupported language"):
        extract_code_entities("x", "cobol")


@pytest.mark.parametrize("language", CODE_LANGUAGES)
def test_empty_code(language: str) -> None:
    assert extract_code_entities("", language) == []


def test_codesearchnet_ruby_sample(shared_fixtures: Path) -> None:
    """../shared's 1,400 Ruby functions (or their stand-in on a clone without it)."""
    ruby = shared_fixtures / "csn" / "ruby" / "valid.jsonl.gz"
    with gzip.open(ruby, "rt", encoding="utf-8") as lines:
        codes = [json.loads(line)["code"] for line in lines]
    # $0, $1, ...: numbered globals; punctuation globals ($!, $$) are excluded.
    identifier = re.compile(r"(?:@@?|\$)?[A-Za-z_]\w*[!?=]?|\$\d+")
    parsed = 0
    for code in codes:
        try:
            names = identifiers(code, "ruby")
        except UnparsableCodeError:
            continue
        parsed += 1
        for name in names:
            assert identifier.fullmatch(name), name
            assert name not in RUBY_KEYWORDS, name
    assert parsed >= 0.95 * len(codes)


# --------------------------------------------------------------------------------------
# Products and tokens
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pos_tagger_data() -> None:
    # NLTK reads NLTK_DATA when it is imported; fall back to the shared checkout copy
    # when the variable is not set.
    import nltk.data

    shared = SHARED / "nltk_data"
    if "NLTK_DATA" not in os.environ and shared.is_dir():
        nltk.data.path.insert(0, str(shared))
    from tests.conftest import pos_tagger_available

    if not pos_tagger_available():  # a fresh clone without ../shared, nothing downloaded
        pytest.skip(
            "NLTK tagger missing: set NLTK_DATA or run "
            "`python -m nltk.downloader averaged_perceptron_tagger_eng`"
        )


def test_product_entities_title_nouns(pos_tagger_data: None) -> None:
    """The paper's sentence read literally: description nouns whose word is in the title."""
    title = "Apple iPhone 12 Case with Screen Protector"
    description = (
        "This case fits the Apple iPhone 12 perfectly and comes with a screen protector. "
        "The protector is made of tempered glass; the case has a soft microfiber lining."
    )
    spans = extract_product_entities(title, description, rule="title_nouns")
    assert [description[start:end] for start, end in spans] == [
        "case",
        "Apple",
        "iPhone",
        "screen",
        "protector",
        "protector",
        "case",
    ]
    # "12" (a number) and "with" (a preposition) are in the title but are not nouns.
    assert extract_product_entities(title, "", rule="title_nouns") == []
    assert extract_product_entities("", description, rule="title_nouns") == []


def test_product_entities_follow_santas_scripts(pos_tagger_data: None) -> None:
    """SANTA's build_product_entity.py: every proper noun (NNP/NNPS) of the description, and
    every description word that is a proper noun of the title (each text tagged alone)."""
    title = "Apple iPhone 12 Case with Screen Protector"  # iPhone is tagged NN here
    description = (
        "This case fits the Apple iPhone 12 perfectly and comes with a screen protector. "
        "The protector is made of tempered glass. Works with MagSafe chargers from Apple."
    )
    spans = extract_product_entities(title, description)
    assert [description[start:end] for start, end in spans] == [
        "case",  # a common noun here, a proper noun (Case) of the title
        "Apple",
        "screen",
        "protector",
        "protector",
        "MagSafe",  # a proper noun the title does not have: masked all the same
        "Apple",
    ]
    # "iPhone" is in the title but not as a proper noun; "glass" is in neither.
    assert "iPhone" not in [description[a:b] for a, b in spans]
    assert extract_product_entities(title, "") == []
    assert extract_product_entities("", description) == []
    with pytest.raises(ValueError, match="product entity rule"):
        extract_product_entities(title, description, rule="nouns")


def test_missing_pos_tagger_names_the_install_command(tmp_path: Path) -> None:
    script = (
        "import os, nltk.data\n"
        # Also hide NLTK's default locations (~/nltk_data, /usr/share/nltk_data, ...).
        "nltk.data.path[:] = [os.environ['NLTK_DATA']]\n"
        "from santa.method.entities import ensure_pos_tagger\n"
        "try:\n"
        "    ensure_pos_tagger()\n"
        "except LookupError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    raise SystemExit('no LookupError')\n"
    )
    env = {**os.environ, "NLTK_DATA": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "python -m nltk.downloader averaged_perceptron_tagger_eng" in result.stdout
    assert "NLTK_DATA" in result.stdout


def test_token_spans() -> None:
    text = "foo_bar(x, 42)  +é"
    assert [text[start:end] for start, end in token_spans(text)] == [
        "foo_bar",
        "(",
        "x",
        ",",
        "42",
        ")",
        "+",
        "é",
    ]
