"""Entity extraction for Masked Entity Prediction (SANTA paper, Appendix A.3).

Code entities are identifiers: Python through the standard-library ``tokenize`` module
(NAME tokens that are not keywords), Java, Go, JavaScript, Ruby and PHP through
tree-sitter grammars (identifier-like leaf nodes that are not reserved words). Product
entities are the proper nouns of a product description and its words that are proper nouns
of its title, found with NLTK's averaged-perceptron POS tagger: the rule of SANTA's released
scripts (:data:`PRODUCT_ENTITY_RULES`).

Every function returns character spans ``(start, end)`` into the given string (Python
``str`` indices), sorted by start and non-overlapping, so that the masking step can cut
them out of the original text without re-tokenizing it.

Unparsable rule (both back ends): a snippet is rejected with :class:`UnparsableCodeError`
when the lexer/parser gives up outright (``tokenize`` raises; tree-sitter returns no
tree), or when the error regions cover more than half of it
(:data:`MAX_ERROR_FRACTION`): for tree-sitter, the bytes inside ``ERROR`` nodes of the
best parse; for Python, the non-whitespace characters of ``ERRORTOKEN`` tokens relative to
all non-whitespace characters. Real code with a local defect (a Python 2 backtick, an
unclosed quote, a construct the grammar does not know) therefore still yields its
identifiers, while garbage is dropped and counted by the pipeline.
"""

from __future__ import annotations

import bisect
import io
import itertools
import keyword
import os
import re
import threading
import token
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tree_sitter

from santa.data.schema import CODE_LANGUAGES

__all__ = [
    "MAX_ERROR_FRACTION",
    "PRODUCT_ENTITY_RULES",
    "PosTaggerMissingError",
    "UnparsableCodeError",
    "ensure_pos_tagger",
    "extract_code_entities",
    "extract_product_entities",
    "parser_for",
    "token_spans",
]


# Above this share of the snippet in error regions we call the code unparsable (see the
# module docstring). Half is generous on purpose: CodeSearchNet snippets are real code
# whose rare errors are local, while non-code gives error regions over nearly everything.
MAX_ERROR_FRACTION = 0.5

POS_TAGGER_RESOURCE = "averaged_perceptron_tagger_eng"
POS_TAGGER_INSTALL_COMMAND = f"python -m nltk.downloader {POS_TAGGER_RESOURCE}"

# Penn Treebank noun tags: common/proper, singular/plural.
_NOUN_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS"})
_PROPER_NOUN_TAGS = frozenset({"NNP", "NNPS"})
# How product entities are chosen. The paper (A.3) says "nouns and proper nouns that appear
# in both product descriptions and titles"; SANTA's released code
# (processing/Product/build_product_entity.py) masks every proper noun (NNP/NNPS) of the
# description, and every description word equal (case-insensitively) to a proper noun of
# the title, both texts tagged separately:
# - "scripts": that rule, santa's default;
# - "title_nouns": description nouns of any kind (NN/NNS/NNP/NNPS) whose word is in the
#   title, the paper's sentence read literally (santa's rule before it was checked).
PRODUCT_ENTITY_RULES = ("scripts", "title_nouns")

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_PRODUCT_WORD_RE = re.compile(r"\w+|[^\w\s]+")


class UnparsableCodeError(ValueError):
    """The snippet is not code of the given language (too broken to extract identifiers)."""


class PosTaggerMissingError(LookupError):
    """NLTK's English POS tagger data is not installed where NLTK looks for it."""


def token_spans(text: str) -> list[tuple[int, int]]:
    """Return the spans of word and punctuation tokens (regex ``\\w+|[^\\w\\s]``)."""
    return [m.span() for m in _TOKEN_RE.finditer(text)]


# --------------------------------------------------------------------------------------
# Python: tokenize
# --------------------------------------------------------------------------------------

# Python 2 string prefixes that Python 3's tokenize splits off as a NAME (``ur"x"``).
_PY2_STRING_PREFIXES = frozenset({"ur", "uR", "Ur", "UR"})
# Python 2 long-integer suffix, which Python 3's tokenize splits off as a NAME (``10L``).
_PY2_LONG_SUFFIXES = frozenset({"l", "L"})


def _line_starts(code: str) -> list[int]:
    """Return the offset at which each line starts, splitting only on ``\\n``."""
    # io.StringIO(...).readline splits on "\n" only (newline="\n" is its default), so rows
    # reported by tokenize count "\n"-separated lines; str.splitlines would also split on
    # "\r", "\x0c", "\u2028", ... and desynchronise the offsets.
    starts = [0]
    find = code.find
    position = find("\n")
    while position != -1:
        starts.append(position + 1)
        position = find("\n", position + 1)
    return starts


def _python_name_spans(code: str, strip_indentation: bool) -> list[tuple[int, int]]:
    """Tokenize ``code`` and return the spans of identifier NAME tokens."""
    line_starts = _line_starts(code)
    if strip_indentation:
        # Fallback for snippets cut out of a class whose indentation no longer nests
        # (tokenize raises IndentationError on a dedent to an unknown level). Indentation
        # only drives INDENT/DEDENT tokens, never NAMEs, so we feed every line without its
        # leading whitespace and add the stripped width back to the reported columns.
        lines = code.split("\n")
        stripped = [line.lstrip(" \t\x0c") for line in lines]
        shifts = [len(line) - len(s) for line, s in zip(lines, stripped, strict=True)]
        source = "\n".join(stripped)
    else:
        shifts = None
        source = code

    iskeyword = keyword.iskeyword
    name_type, number_type, string_type, error_type = (
        token.NAME,
        token.NUMBER,
        token.STRING,
        token.ERRORTOKEN,
    )
    spans: list[tuple[int, int]] = []
    error_chars = 0
    previous: tokenize.TokenInfo | None = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = tok.type
        if kind == name_type:
            text = tok.string
            if not iskeyword(text) and not (
                # "10L": the "L" glued to a number is a Python 2 suffix, not a name.
                text in _PY2_LONG_SUFFIXES
                and previous is not None
                and previous.type == number_type
                and previous.end == tok.start
            ):
                row, col = tok.start
                if shifts is not None:
                    col += shifts[row - 1]
                start = line_starts[row - 1] + col
                spans.append((start, start + len(text)))
        elif kind == string_type:
            # 'ur"x"': drop the NAME "ur" that tokenize emitted just before the string.
            if (
                previous is not None
                and previous.type == name_type
                and previous.string in _PY2_STRING_PREFIXES
                and previous.end == tok.start
                and spans
            ):
                spans.pop()
        elif kind == error_type and not tok.string.isspace():
            # Python 3.11's tokenize never raises on a stray character; it emits one
            # ERRORTOKEN per character (spaces included), which we count for the
            # unparsable rule.
            error_chars += len(tok.string)
        previous = tok

    if error_chars:
        non_whitespace = len(code) - sum(map(code.count, (" ", "\t", "\n", "\r", "\x0c")))
        if error_chars > MAX_ERROR_FRACTION * non_whitespace:
            raise UnparsableCodeError(
                f"python: {error_chars} of {non_whitespace} non-whitespace characters "
                "are not Python tokens"
            )
    return spans


def _extract_python_entities(code: str) -> list[tuple[int, int]]:
    """Return identifier spans of Python (2 or 3) code via ``tokenize``."""
    try:
        return _python_name_spans(code, strip_indentation=False)
    except IndentationError:
        pass
    except (tokenize.TokenError, SyntaxError) as error:
        raise UnparsableCodeError(f"python: {error}") from error
    try:
        return _python_name_spans(code, strip_indentation=True)
    except (tokenize.TokenError, SyntaxError) as error:  # IndentationError included
        raise UnparsableCodeError(f"python: {error}") from error


# --------------------------------------------------------------------------------------
# Java, Go, JavaScript, Ruby, PHP: tree-sitter
# --------------------------------------------------------------------------------------


def _words(text: str) -> frozenset[bytes]:
    return frozenset(word.encode() for word in text.split())


@dataclass(frozen=True)
class _GrammarSpec:
    """How to find identifiers in one tree-sitter grammar."""

    load_language: Callable[[], Any]  # returns the grammar's language capsule
    node_types: tuple[str, ...]  # identifier-like leaf node types
    keywords: frozenset[bytes]  # reserved words never counted as identifiers
    # (prefix, suffix) wrappers tried in order; the first error-free parse wins.
    wrappers: tuple[tuple[str, str], ...] = (("", ""),)
    case_insensitive_keywords: bool = False


def _load(module_name: str, function_name: str = "language") -> Callable[[], Any]:
    def load() -> Any:
        module = __import__(module_name)
        return getattr(module, function_name)()

    return load


# Suffixes start with a newline so that a snippet ending in a line comment cannot comment
# out the closing brace of a wrapper.
_GRAMMARS: dict[str, _GrammarSpec] = {
    "java": _GrammarSpec(
        load_language=_load("tree_sitter_java"),
        node_types=("identifier", "type_identifier"),
        # Reserved keywords and literals, plus "var", which tree-sitter-java parses as a
        # type_identifier although it is the local-type-inference keyword.
        keywords=_words(
            """abstract assert boolean break byte case catch char class const continue
            default do double else enum extends final finally float for goto if implements
            import instanceof int interface long native new package private protected
            public return short static strictfp super switch synchronized this throw
            throws transient try void volatile while true false null var _"""
        ),
        # CodeSearchNet Java snippets are methods; tree-sitter-java accepts a bare
        # method declaration, and the class wrapper catches other member kinds.
        wrappers=(("", ""), ("class _W_ {\n", "\n}")),
    ),
    "go": _GrammarSpec(
        load_language=_load("tree_sitter_go"),
        node_types=(
            "identifier",
            "field_identifier",
            "type_identifier",
            "package_identifier",
            "label_name",
        ),
        # Predeclared names (int, len, nil, ...) are identifiers in Go and stay in.
        keywords=_words(
            """break case chan const continue default defer else fallthrough for func go
            goto if import interface map package range return select struct switch type
            var"""
        ),
    ),
    "javascript": _GrammarSpec(
        load_language=_load("tree_sitter_javascript"),
        node_types=(
            "identifier",
            "property_identifier",
            "shorthand_property_identifier",
            "shorthand_property_identifier_pattern",
            "private_property_identifier",
            "statement_identifier",
        ),
        # Reserved words (ES2015+, strict mode) and literals; contextual words such as
        # "of", "get", "async" can be real variable names and stay in.
        keywords=_words(
            """await break case catch class const continue debugger default delete do else
            enum export extends false finally for function if implements import in
            instanceof interface let new null package private protected public return
            static super switch this throw true try typeof var void while with yield"""
        ),
        # CodeSearchNet JavaScript has function expressions ("function (a) {...}", valid
        # bare) and class methods ("foo(a) {...}", valid only inside a class body).
        wrappers=(("", ""), ("class _W_ {\n", "\n}")),
    ),
    "ruby": _GrammarSpec(
        load_language=_load("tree_sitter_ruby"),
        node_types=(
            "identifier",
            "constant",
            "instance_variable",
            "class_variable",
            "global_variable",
        ),
        keywords=_words(
            """BEGIN END alias and begin break case class def defined? do else elsif end
            ensure false for if in module next nil not or redo rescue retry return self
            super then true undef unless until when while yield __FILE__ __LINE__
            __ENCODING__"""
        )
        # Punctuation globals ($!, $$, $~, ...) are Perl-style special variables, closer
        # to operators than to names.
        | frozenset(f"${c}".encode() for c in "!@;,/\\*$?:\"<>.~=&`'+"),
    ),
    "php": _GrammarSpec(
        load_language=_load("tree_sitter_php", "language_php"),
        # "name" covers function/method/class/constant names and, as the child of
        # variable_name, variables without their "$".
        node_types=("name",),
        keywords=_words(
            """abstract and array as break callable case catch class clone const continue
            declare default do echo else elseif empty enddeclare endfor endforeach endif
            endswitch endwhile enum eval exit extends false final finally fn for foreach
            function global goto if implements include include_once instanceof insteadof
            interface isset list match namespace new null or print private protected
            public readonly require require_once return static switch throw trait true try
            unset use var while xor yield __class__ __dir__ __file__ __function__
            __line__ __method__ __namespace__ __trait__ __halt_compiler"""
        ),
        # PHP keywords are case-insensitive (NULL, True, ...).
        case_insensitive_keywords=True,
        # CodeSearchNet PHP snippets carry no "<?php" tag and are mostly methods
        # ("public function ..."), which parse only inside a class body.
        wrappers=(("<?php class _W_ {\n", "\n}"), ("<?php\n", "")),
    ),
}


@dataclass(frozen=True)
class _Grammar:
    """Loaded tree-sitter objects for one language (built once, then reused)."""

    spec: _GrammarSpec
    language: tree_sitter.Language
    identifier_query: tree_sitter.Query
    error_query: tree_sitter.Query


_grammars: dict[str, _Grammar] = {}
_grammars_lock = threading.Lock()
# A tree_sitter.Parser holds mutable parse state, so each thread gets its own (languages
# and queries are immutable and shared).
_thread_local = threading.local()


def _grammar(language: str) -> _Grammar:
    """Return the tree-sitter language and queries for ``language``, built on first use."""
    grammar = _grammars.get(language)
    if grammar is None:
        with _grammars_lock:
            grammar = _grammars.get(language)
            if grammar is None:
                spec = _GRAMMARS[language]
                ts_language = tree_sitter.Language(spec.load_language())
                types = " ".join(f"({node_type})" for node_type in spec.node_types)
                grammar = _Grammar(
                    spec=spec,
                    language=ts_language,
                    identifier_query=tree_sitter.Query(ts_language, f"[{types}] @identifier"),
                    error_query=tree_sitter.Query(ts_language, "(ERROR) @error (MISSING) @error"),
                )
                _grammars[language] = grammar
    return grammar


def parser_for(language: str) -> tree_sitter.Parser:
    """This thread's tree-sitter parser for ``language`` (parsers are not thread-safe)."""
    if language not in _GRAMMARS:
        raise ValueError(f"no tree-sitter grammar for {language!r}")
    parsers: dict[str, tree_sitter.Parser] | None = getattr(_thread_local, "parsers", None)
    if parsers is None:
        parsers = _thread_local.parsers = {}
    parser = parsers.get(language)
    if parser is None:
        parser = parsers[language] = tree_sitter.Parser(_grammar(language).language)
    return parser


def _utf8_length(character: str) -> int:
    code_point = ord(character)
    if code_point < 0x80:
        return 1
    if code_point < 0x800:
        return 2
    if code_point < 0x10000:
        return 3  # lone surrogates too, as encoded with "surrogatepass"
    return 4


def _error_nodes(grammar: _Grammar, root: tree_sitter.Node) -> list[tree_sitter.Node]:
    captures = tree_sitter.QueryCursor(grammar.error_query).captures(root)
    return captures.get("error", [])


def _error_bytes(nodes: list[tree_sitter.Node], start: int, end: int) -> int:
    """Return how many bytes of ``[start, end)`` lie inside ERROR nodes (nested ones once)."""
    intervals = sorted(
        (max(node.start_byte, start), min(node.end_byte, end))
        for node in nodes
        if node.type == "ERROR"
    )
    covered = 0
    current_start, current_end = -1, -1
    for low, high in intervals:
        if high <= low:
            continue
        if low > current_end:
            covered += current_end - current_start
            current_start, current_end = low, high
        else:
            current_end = max(current_end, high)
    return covered + current_end - current_start


def parse_snippet(
    grammar: _Grammar, parser: tree_sitter.Parser, snippet: bytes, language: str
) -> tuple[tree_sitter.Node, int, int]:
    """Parse a code snippet inside each of the grammar's wrappers; return the root and the
    byte range of the snippet in the parsed text.

    The first wrapper that gives an error-free tree wins; otherwise the tree with the fewest
    ERROR/MISSING nodes (earliest wrapper on ties), unless errors cover more than
    ``MAX_ERROR_FRACTION`` of the snippet (:class:`UnparsableCodeError`).
    """
    best: tuple[int, tree_sitter.Tree, int, list[tree_sitter.Node]] | None = None
    for prefix, suffix in grammar.spec.wrappers:
        prefix_bytes = prefix.encode()
        tree = parser.parse(prefix_bytes + snippet + suffix.encode())
        if tree is None:  # only on a parser timeout/cancellation
            continue
        if not tree.root_node.has_error:
            best = (0, tree, len(prefix_bytes), [])
            break
        errors = _error_nodes(grammar, tree.root_node)
        if best is None or len(errors) < best[0]:
            best = (len(errors), tree, len(prefix_bytes), errors)
    if best is None:
        raise UnparsableCodeError(f"{language}: tree-sitter returned no tree")
    _, tree, offset, errors = best
    end = offset + len(snippet)
    if errors:
        covered = _error_bytes(errors, offset, end)
        if covered > MAX_ERROR_FRACTION * max(len(snippet), 1):
            raise UnparsableCodeError(
                f"{language}: syntax errors cover {covered} of {len(snippet)} bytes"
            )
    return tree.root_node, offset, end


def _extract_tree_sitter_entities(code: str, language: str) -> list[tuple[int, int]]:
    """Return identifier spans of ``code`` using the tree-sitter grammar of ``language``."""
    grammar = _grammar(language)
    parser = parser_for(language)
    spec = grammar.spec
    snippet = code.encode("utf-8", "surrogatepass")

    root, offset, snippet_end = parse_snippet(grammar, parser, snippet, language)
    keywords = spec.keywords
    lower = spec.case_insensitive_keywords
    byte_spans: list[tuple[int, int]] = []
    captures = tree_sitter.QueryCursor(grammar.identifier_query).captures(root)
    for node in captures.get("identifier", ()):
        start, end = node.start_byte, node.end_byte
        # Skip wrapper names ("_W_"), zero-width MISSING nodes and non-leaves.
        if start < offset or end > snippet_end or end <= start or node.child_count:
            continue
        text = snippet[start - offset : end - offset]
        if (text.lower() if lower else text) in keywords:
            continue
        byte_spans.append((start - offset, end - offset))
    byte_spans = sorted(set(byte_spans))

    if len(snippet) == len(code):  # ASCII: byte offsets are character offsets
        return byte_spans
    # Map UTF-8 byte offsets (tree-sitter) to str indices: char_starts[i] is the byte
    # offset of character i, and every span boundary is a character boundary.
    char_starts = list(itertools.accumulate(map(_utf8_length, code), initial=0))
    return [
        (bisect.bisect_left(char_starts, start), bisect.bisect_left(char_starts, end))
        for start, end in byte_spans
    ]


def extract_code_entities(code: str, language: str) -> list[tuple[int, int]]:
    """Return sorted, non-overlapping ``(start, end)`` str spans of identifiers in ``code``."""
    if language == "python":
        return _extract_python_entities(code)
    if language in _GRAMMARS:
        return _extract_tree_sitter_entities(code, language)
    raise ValueError(
        f"unsupported language {language!r}; expected one of {', '.join(CODE_LANGUAGES)}"
    )


# --------------------------------------------------------------------------------------
# Products: NLTK POS tags
# --------------------------------------------------------------------------------------

_pos_tagger: Any = None
_pos_tagger_lock = threading.Lock()


def ensure_pos_tagger() -> Any:
    """Load (once) and return NLTK's English perceptron tagger, or raise a LookupError."""
    global _pos_tagger
    if _pos_tagger is not None:
        return _pos_tagger
    with _pos_tagger_lock:
        if _pos_tagger is None:
            from nltk.tag import PerceptronTagger

            try:
                _pos_tagger = PerceptronTagger()
            except LookupError as error:
                searched = os.environ.get("NLTK_DATA", "<unset>")
                raise PosTaggerMissingError(
                    f"NLTK's English POS tagger data ({POS_TAGGER_RESOURCE}) was not found "
                    f"(NLTK_DATA={searched}). Install it with `{POS_TAGGER_INSTALL_COMMAND}` "
                    "(add `-d DIR` and set the NLTK_DATA environment variable to DIR to "
                    "install it elsewhere)."
                ) from error
    return _pos_tagger


def extract_product_entities(
    title: str, description: str, rule: str = "scripts"
) -> list[tuple[int, int]]:
    """Spans of the description's entities under ``rule`` (:data:`PRODUCT_ENTITY_RULES`).

    Both texts are split into word/punctuation tokens (the pattern of NLTK's
    WordPunctTokenizer, kept with offsets; SANTA's code uses ``nltk.word_tokenize``, which
    needs the Punkt models) and tagged by NLTK's perceptron tagger.
    """
    if rule not in PRODUCT_ENTITY_RULES:
        raise ValueError(f"product entity rule must be one of {PRODUCT_ENTITY_RULES}, not {rule!r}")
    title_matches = list(_PRODUCT_WORD_RE.finditer(title))
    matches = list(_PRODUCT_WORD_RE.finditer(description))
    if not title_matches or not matches:
        return []
    tagger = ensure_pos_tagger()
    tags = tagger.tag([m.group() for m in matches])
    if rule == "title_nouns":
        title_words = {m.group().lower() for m in title_matches}
        return [
            m.span()
            for m, (_, tag) in zip(matches, tags, strict=True)
            if tag in _NOUN_TAGS and m.group().lower() in title_words
        ]
    title_tags = tagger.tag([m.group() for m in title_matches])
    title_proper = {word.lower() for word, tag in title_tags if tag in _PROPER_NOUN_TAGS}
    return [
        m.span()
        for m, (_, tag) in zip(matches, tags, strict=True)
        if tag in _PROPER_NOUN_TAGS or m.group().lower() in title_proper
    ]
