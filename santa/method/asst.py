"""Code-code positive pairs for SCodeR: abstract syntax sub-trees (ASST) and ICT baselines.

ASST (SCodeR paper, Section 3.2 and Algorithm 1) cuts one statement-level sub-tree out of a
function: the sub-tree's code ``s`` and the remaining code ``s~`` form a positive pair. A
leaf is drawn at random among the leaves that lie under a node of a selectable type (the
set ``N`` of the paper), and we walk towards the root until a node of ``N`` whose code has
at least ``l_min`` tokens; if the walk reaches the root, another leaf is tried, up to a
bound. The token-level and line-level Inverse Cloze Task variants (paper Table 6) cut a
random contiguous span of tokens or of lines instead, without looking at the syntax.

Every function returns a :class:`CodeSplit` whose ``start``/``end`` are ``str`` indices
into the given code, so that ``context[:start] + span + context[start:] == code`` holds
exactly (tree-sitter's UTF-8 byte offsets are mapped back to characters), or ``None`` when
the snippet has no valid span (the caller counts that as a drop reason, ``no_subtree``).
Randomness comes only from the ``random.Random`` passed in (or seeded from an ``int``), so
the same seed gives the same split.

Tokens, for ``l_min`` and the ICT spans, are word and punctuation tokens (regex
``\\w+|[^\\w\\s]``, :func:`santa.method.entities.token_spans`). The paper does not state its
``l_min``; :data:`DEFAULT_MIN_TOKENS` is our choice.

Grammars and parsers come from :mod:`santa.method.entities` (Java, Go, JavaScript, Ruby, PHP,
with its wrappers for methods cut out of a class). It extracts Python identifiers with
``tokenize`` and so has no Python tree-sitter grammar; the Python grammar is built here
with the same helpers. Snippets whose syntax errors cover more than
:data:`santa.method.entities.MAX_ERROR_FRACTION` of them raise
:class:`santa.method.entities.UnparsableCodeError`, as entity extraction does.
"""

from __future__ import annotations

import bisect
import itertools
import random
import threading
from dataclasses import dataclass

import tree_sitter

from santa.method.entities import (
    CODE_LANGUAGES,
    _Grammar,
    _grammar,
    _GrammarSpec,
    _load,
    _utf8_length,
    parse_snippet,
    parser_for,
    token_spans,
)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MIN_TOKENS",
    "SUBTREE_TYPES",
    "CodeSplit",
    "SubtreeTypes",
    "extract_subtree",
    "split_lines",
    "split_tokens",
]

# Shortest sub-tree (in word/punctuation tokens) worth predicting. Not given in the paper;
# 8 keeps one-line statements such as "total = compute(a, b)" and drops "i += 1".
DEFAULT_MIN_TOKENS = 8
# Leaves tried before giving up on a snippet (Algorithm 1 draws one; we retry on failure).
DEFAULT_MAX_ATTEMPTS = 10


@dataclass(frozen=True)
class CodeSplit:
    """A positive pair cut out of one snippet: ``span = code[start:end]``, ``context`` the rest.

    ``start`` and ``end`` are ``str`` indices; ``node_type`` is the tree-sitter type of the
    extracted sub-tree for ASST, ``"ict_tokens"`` or ``"ict_lines"`` for the ICT variants.
    """

    start: int
    end: int
    span: str
    context: str
    node_type: str

    def reconstruct(self) -> str:
        """Return the original code: the span put back into its context."""
        return self.context[: self.start] + self.span + self.context[self.start :]


@dataclass(frozen=True)
class SubtreeTypes:
    """The selectable node types ``N`` of one grammar, and what bounds a call.

    The paper's ``N`` holds statement-level types, plus function calls "if not under an
    indivisible node like assignment_statement" (its Appendix A). A node of ``calls`` is
    selectable only when no ancestor of it, up to the nearest node of ``statements`` or
    ``blocks``, is of an ``indivisible`` type: ``foo(x)`` as a statement or an ``if``
    condition can be cut out, ``y = foo(x)``, ``return foo(x)`` and ``a.b().c()``'s inner
    call cannot.
    """

    statements: frozenset[str]  # always selectable
    calls: frozenset[str]  # selectable unless under an indivisible node
    indivisible: frozenset[str]
    blocks: frozenset[str]  # statement containers: where the search for "under" stops

    @property
    def selectable(self) -> frozenset[str]:
        """Every type of ``N``."""
        return self.statements | self.calls


def _types(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Node type names are those of the installed grammars (tree-sitter-python 0.25, -java
# 0.23, -go 0.25, -javascript 0.25, -ruby 0.23, -php 0.25); tests/test_asst.py checks that
# each exists. Go has no while/with/try; Ruby has no statement wrapper, so its assignments
# are bounded like calls ("a = b = 1" must not yield "b = 1").
SUBTREE_TYPES: dict[str, SubtreeTypes] = {
    "python": SubtreeTypes(
        statements=_types(
            """for_statement while_statement if_statement with_statement try_statement
            match_statement expression_statement"""
        ),
        calls=_types("call"),
        indivisible=_types("assignment augmented_assignment return_statement raise_statement call"),
        blocks=_types("block module"),
    ),
    "java": SubtreeTypes(
        statements=_types(
            """for_statement enhanced_for_statement while_statement do_statement
            if_statement try_statement try_with_resources_statement switch_expression
            synchronized_statement expression_statement local_variable_declaration"""
        ),
        calls=_types("method_invocation"),
        indivisible=_types(
            """assignment_expression variable_declarator return_statement throw_statement
            method_invocation object_creation_expression"""
        ),
        blocks=_types("block switch_block_statement_group constructor_body"),
    ),
    "go": SubtreeTypes(
        statements=_types(
            """for_statement if_statement expression_switch_statement
            type_switch_statement select_statement expression_statement
            assignment_statement short_var_declaration var_declaration go_statement
            defer_statement"""
        ),
        calls=_types("call_expression"),
        indivisible=_types(
            """assignment_statement short_var_declaration var_declaration return_statement
            go_statement defer_statement call_expression"""
        ),
        blocks=_types("block statement_list"),
    ),
    "javascript": SubtreeTypes(
        statements=_types(
            """for_statement for_in_statement while_statement do_statement if_statement
            try_statement switch_statement with_statement expression_statement
            lexical_declaration variable_declaration"""
        ),
        calls=_types("call_expression"),
        indivisible=_types(
            """assignment_expression augmented_assignment_expression variable_declarator
            return_statement throw_statement call_expression new_expression"""
        ),
        blocks=_types("statement_block switch_case switch_default"),
    ),
    "ruby": SubtreeTypes(
        statements=_types(
            """for while until if unless case begin if_modifier unless_modifier
            while_modifier until_modifier"""
        ),
        calls=_types("call assignment operator_assignment"),
        indivisible=_types("assignment operator_assignment return call"),
        blocks=_types("body_statement block_body then else do ensure"),
    ),
    "php": SubtreeTypes(
        statements=_types(
            """for_statement foreach_statement while_statement do_statement if_statement
            switch_statement try_statement expression_statement echo_statement"""
        ),
        calls=_types(
            """function_call_expression member_call_expression
            nullsafe_member_call_expression scoped_call_expression"""
        ),
        indivisible=_types(
            """assignment_expression augmented_assignment_expression
            reference_assignment_expression return_statement function_call_expression
            member_call_expression nullsafe_member_call_expression scoped_call_expression
            object_creation_expression"""
        ),
        blocks=_types("compound_statement case_statement default_statement"),
    ),
}

# An expression statement that is only a string literal is a docstring or a directive
# ("use strict"): cutting it out would pair documentation with code, which is the other
# positive-pair source of the paper (comments), not ASST.
_STRING_TYPES = _types("string concatenated_string template_string encapsed_string")


# --------------------------------------------------------------------------------------
# Parsing: santa.method.entities' grammars, plus Python
# --------------------------------------------------------------------------------------

_PYTHON_SPEC = _GrammarSpec(
    load_language=_load("tree_sitter_python"), node_types=(), keywords=frozenset()
)
_python_grammar: _Grammar | None = None
_python_lock = threading.Lock()
_thread_local = threading.local()


def _grammar_and_parser(language: str) -> tuple[_Grammar, tree_sitter.Parser]:
    """Return the grammar and this thread's parser for ``language``."""
    global _python_grammar
    if language != "python":
        return _grammar(language), parser_for(language)
    if _python_grammar is None:
        with _python_lock:
            if _python_grammar is None:
                ts_language = tree_sitter.Language(_PYTHON_SPEC.load_language())
                _python_grammar = _Grammar(
                    spec=_PYTHON_SPEC,
                    language=ts_language,
                    identifier_query=tree_sitter.Query(ts_language, "(identifier) @identifier"),
                    error_query=tree_sitter.Query(ts_language, "(ERROR) @error (MISSING) @error"),
                )
    parser = getattr(_thread_local, "python_parser", None)
    if parser is None:
        parser = _thread_local.python_parser = tree_sitter.Parser(_python_grammar.language)
    return _python_grammar, parser


def _parse(code: str, language: str) -> tuple[tree_sitter.Node, int, int]:
    """Parse ``code``; return the root, and the byte range of the snippet in the parsed text.

    Wrappers are tried as :mod:`santa.method.entities` does: the first error-free parse wins,
    otherwise the one with the fewest ERROR/MISSING nodes.
    """
    if language not in SUBTREE_TYPES:
        raise ValueError(
            f"unsupported language {language!r}; expected one of {', '.join(CODE_LANGUAGES)}"
        )
    grammar, parser = _grammar_and_parser(language)
    snippet = code.encode("utf-8", "surrogatepass")
    return parse_snippet(grammar, parser, snippet, language)


# --------------------------------------------------------------------------------------
# ASST (Algorithm 1)
# --------------------------------------------------------------------------------------


def _is_selectable(node: tree_sitter.Node, types: SubtreeTypes) -> bool:
    """Whether ``node``'s type is in ``N`` (for calls: and it is not under an indivisible node)."""
    if node.type in types.statements:
        return not (node.named_child_count == 1 and node.named_children[0].type in _STRING_TYPES)
    if node.type not in types.calls:
        return False
    ancestor = node.parent
    while ancestor is not None:
        if ancestor.type in types.indivisible:
            return False
        if ancestor.type in types.statements or ancestor.type in types.blocks:
            return True
        ancestor = ancestor.parent
    return True


def _candidate_leaves(
    root: tree_sitter.Node, types: SubtreeTypes, start: int, end: int
) -> list[tree_sitter.Node]:
    """Algorithm 1, line 1: the leaves (in source order) under some node of ``N``."""
    leaves: list[tree_sitter.Node] = []
    stack = [(root, False)]
    while stack:
        node, under_selectable = stack.pop()
        if node.end_byte <= start or node.start_byte >= end:
            continue  # wrapper text
        under_selectable = under_selectable or _is_selectable(node, types)
        if node.child_count == 0:
            if under_selectable and node.end_byte > node.start_byte:  # not MISSING
                leaves.append(node)
        else:
            stack.extend((child, under_selectable) for child in reversed(node.children))
    return leaves


def _walk_up(
    leaf: tree_sitter.Node, types: SubtreeTypes, snippet: bytes, offset: int, min_tokens: int
) -> tuple[int, int, str] | None:
    """Algorithm 1, lines 3-10: the first ancestor in ``N`` with ``min_tokens`` tokens.

    Returns its byte range in ``snippet`` and its type, or ``None`` when the walk leaves
    the snippet (reaches the root or a wrapper) first. Sub-trees holding a syntax error, or
    covering all the code's tokens (no context left), are passed over like short ones.
    """
    node: tree_sitter.Node | None = leaf
    while node is not None:
        start, end = node.start_byte - offset, node.end_byte - offset
        if start < 0 or end > len(snippet):
            return None
        if _is_selectable(node, types) and not node.has_error:
            span = snippet[start:end].decode("utf-8", "surrogatepass")
            context = (snippet[:start] + snippet[end:]).decode("utf-8", "surrogatepass")
            if len(token_spans(span)) >= min_tokens and token_spans(context):
                return start, end, node.type
        node = node.parent
    return None


def _rng(rng: random.Random | int) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


def _split(code: str, start: int, end: int, node_type: str) -> CodeSplit:
    return CodeSplit(
        start=start,
        end=end,
        span=code[start:end],
        context=code[:start] + code[end:],
        node_type=node_type,
    )


def extract_subtree(
    code: str,
    language: str,
    rng: random.Random | int,
    *,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> CodeSplit | None:
    """Cut a random statement-level sub-tree out of ``code`` (ASST, SCodeR Algorithm 1).

    Args:
        code: one function (a CodeSearchNet ``code`` field).
        language: one of :data:`santa.method.entities.CODE_LANGUAGES`.
        rng: the source of randomness, or an ``int`` seed for a fresh ``random.Random``.
        min_tokens: ``l_min``, the fewest word/punctuation tokens of the sub-tree's code.
        max_attempts: leaves tried (without replacement) before returning ``None``.

    Returns:
        The split, ``node_type`` being the sub-tree's grammar type; ``None`` when no tried
        leaf has an ancestor in ``N`` that is error-free, at least ``min_tokens`` long and
        leaves some code as context.

    Raises:
        UnparsableCodeError: syntax errors cover more than half of the snippet.
    """
    if min_tokens < 1 or max_attempts < 1:
        raise ValueError(
            f"min_tokens and max_attempts must be ≥ 1, got {min_tokens}, {max_attempts}"
        )
    rng = _rng(rng)
    types = SUBTREE_TYPES.get(language)
    root, snippet_start, snippet_end = _parse(code, language)
    assert types is not None  # _parse rejected unknown languages
    leaves = _candidate_leaves(root, types, snippet_start, snippet_end)
    if not leaves:
        return None
    snippet = code.encode("utf-8", "surrogatepass")
    for leaf in rng.sample(leaves, min(max_attempts, len(leaves))):
        found = _walk_up(leaf, types, snippet, snippet_start, min_tokens)
        if found is None:
            continue
        start, end, node_type = found
        if len(snippet) != len(code):  # non-ASCII: UTF-8 byte offsets to str indices
            char_starts = list(itertools.accumulate(map(_utf8_length, code), initial=0))
            start = bisect.bisect_left(char_starts, start)
            end = bisect.bisect_left(char_starts, end)
        return _split(code, start, end, node_type)
    return None


# --------------------------------------------------------------------------------------
# ICT variants (Table 6)
# --------------------------------------------------------------------------------------


def split_tokens(
    code: str,
    rng: random.Random | int,
    *,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    max_fraction: float = 0.5,
) -> CodeSplit | None:
    """Cut a random contiguous span of tokens out of ``code`` (token-level ICT, SCodeR_T).

    The span's length in tokens is uniform in ``[min_tokens, max(min_tokens, ⌊max_fraction ·
    n⌋)]`` (capped so that one token stays in the context), its first token uniform among
    those where it fits; it runs from the first token's first character to the last
    token's last character. ``None`` when ``code`` has fewer than ``min_tokens + 1`` tokens.
    """
    if min_tokens < 1 or not 0 < max_fraction <= 1:
        raise ValueError(
            f"need min_tokens ≥ 1 and 0 < max_fraction ≤ 1, got {min_tokens}, {max_fraction}"
        )
    rng = _rng(rng)
    tokens = token_spans(code)
    if len(tokens) < min_tokens + 1:
        return None
    longest = min(max(min_tokens, int(max_fraction * len(tokens))), len(tokens) - 1)
    length = rng.randint(min_tokens, longest)
    first = rng.randint(0, len(tokens) - length)
    return _split(code, tokens[first][0], tokens[first + length - 1][1], "ict_tokens")


def split_lines(
    code: str,
    rng: random.Random | int,
    *,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    max_fraction: float = 0.5,
) -> CodeSplit | None:
    """Cut random consecutive whole lines out of ``code`` (line-level ICT, SCodeR_L).

    Lines end at ``\\n`` (kept with the line). A window is a run of consecutive lines that
    starts and ends on a non-blank line, holds at most ``max(1, ⌊max_fraction · n⌋)`` of
    the ``n`` non-blank lines (at least one non-blank line stays in the context) and at
    least ``min_tokens`` tokens, as ASST's ``l_min``; one is drawn uniformly among all such
    windows. ``None`` when there is none.
    """
    if min_tokens < 1 or not 0 < max_fraction <= 1:
        raise ValueError(
            f"need min_tokens ≥ 1 and 0 < max_fraction ≤ 1, got {min_tokens}, {max_fraction}"
        )
    rng = _rng(rng)
    starts = [0, *(i + 1 for i, c in enumerate(code) if c == "\n")]
    bounds = [(s, e) for s, e in zip(starts, [*starts[1:], len(code)], strict=True) if s < e]
    nonblank = [(s, e) for s, e in bounds if code[s:e].strip()]
    longest = min(max(1, int(max_fraction * len(nonblank))), len(nonblank) - 1)
    counts = [len(token_spans(code[s:e])) for s, e in nonblank]
    windows = [
        (nonblank[first][0], nonblank[first + length - 1][1])
        for first in range(len(nonblank))
        for length in range(1, min(longest, len(nonblank) - first) + 1)
        if sum(counts[first : first + length]) >= min_tokens
    ]
    if not windows:
        return None
    start, end = rng.choice(windows)
    return _split(code, start, end, "ict_lines")
