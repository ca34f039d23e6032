"""ASST positive pairs (SCodeR Algorithm 1) and the ICT splits, on hand-checked snippets."""

from __future__ import annotations

import random

import pytest

from santa.method.asst import (
    DEFAULT_MIN_TOKENS,
    SUBTREE_TYPES,
    CodeSplit,
    _grammar_and_parser,
    _is_selectable,
    _parse,
    extract_subtree,
    split_lines,
    split_tokens,
)
from santa.method.entities import CODE_LANGUAGES, UnparsableCodeError, token_spans

SEEDS = range(25)

# One snippet per language with exactly one sub-tree of N at least 8 tokens long, so every
# seed must find it: (language, code, expected span, expected node type).
UNIQUE_SUBTREES = [
    (
        "python",
        'def f(x):\n    """Return a positive value for positive x, or 0."""\n'
        "    if x > 0:\n        return compute(x, 1)\n    return 0\n",
        "if x > 0:\n        return compute(x, 1)",
        "if_statement",
    ),
    (
        "java",
        "public int f(int x) {\n    if (x > 0) {\n        return compute(x, 1);\n    }\n"
        "    return 0;\n}",
        "if (x > 0) {\n        return compute(x, 1);\n    }",
        "if_statement",
    ),
    (
        "go",
        "func Sum(a []int) int {\n\ts := 0\n\tfor _, v := range a {\n\t\ts += v\n\t}\n"
        "\treturn s\n}",
        "for _, v := range a {\n\t\ts += v\n\t}",
        "for_statement",
    ),
    (
        "javascript",
        "function drain(queue) {\n  'use strict';\n  while (queue.length) {\n"
        "    queue.pop();\n  }\n  return queue;\n}",
        "while (queue.length) {\n    queue.pop();\n  }",
        "while_statement",
    ),
    (
        "ruby",
        "def names(users)\n  users.map { |user| user.name }\nend",
        "users.map { |user| user.name }",
        "call",
    ),
    (
        "php",
        "public function total($items)\n{\n    $sum = 0;\n    foreach ($items as $item) {\n"
        "        $sum += $item;\n    }\n    return $sum;\n}",
        "foreach ($items as $item) {\n        $sum += $item;\n    }",
        "foreach_statement",
    ),
]

# Snippets with several candidates, to check every draw against the parse tree.
SNIPPETS = {
    "python": "def bubble_sort(arr):\n    n = len(arr)\n    for i in range(n):\n"
    "        for j in range(n - i - 1):\n            if arr[j] > arr[j + 1]:\n"
    "                arr[j], arr[j + 1] = arr[j + 1], arr[j]\n"
    '    print("sorted", arr)\n    return arr\n',
    "java": "public int foo(List<Integer> xs) {\n    int total = 0;\n"
    '    switch (mode) { case 1: log("a"); break; default: break; }\n'
    "    for (int x : xs) { total += x; }\n    builder.add(x).build(y);\n    return total;\n}",
    "go": "func Foo(a []int) (int, error) {\n\ts := 0\n\tfor _, v := range a {\n\t\ts += v\n"
    "\t}\n\tfmt.Println(s)\n\tif err := check(s); err != nil {\n\t\treturn 0, err\n\t}\n"
    "\treturn s, nil\n}",
    "javascript": "function foo(items) {\n  const total = items.reduce((a, b) => a + b, 0);\n"
    "  items.forEach(function (i) { console.log(i); });\n  return total;\n}",
    "ruby": "def foo(items, x)\n  total = 0\n  items.each do |i|\n    puts i\n"
    "    total += i\n  end\n  bar(x, total) if x > 0\n  return total\nend",
    "php": "public function foo($items)\n{\n    $total = 0;\n    foreach ($items as $item) {\n"
    "        $total += $item->value();\n    }\n    $this->log($total);\n    return $total;\n}",
}


def check_split(split: CodeSplit, code: str) -> None:
    assert split.span == code[split.start : split.end]
    assert split.context == code[: split.start] + code[split.end :]
    assert split.context[: split.start] + split.span + split.context[split.start :] == code
    assert split.reconstruct() == code


def node_at(code: str, language: str, split: CodeSplit):
    """The parse-tree node covering exactly the split's span, with the split's type."""
    root, offset, _ = _parse(code, language)
    start = offset + len(code[: split.start].encode())
    end = offset + len(code[: split.end].encode())
    node = root.descendant_for_byte_range(start, end)
    while node is not None and (node.start_byte, node.end_byte) == (start, end):
        if node.type == split.node_type:
            return node
        node = node.parent
    return None


def test_every_node_type_exists_in_its_grammar() -> None:
    assert set(SUBTREE_TYPES) == set(CODE_LANGUAGES)
    for language, types in SUBTREE_TYPES.items():
        ts_language = _grammar_and_parser(language)[0].language
        named = {
            ts_language.node_kind_for_id(i)
            for i in range(ts_language.node_kind_count)
            if ts_language.node_kind_is_named(i)
        }
        for type_set in (types.statements, types.calls, types.indivisible, types.blocks):
            assert type_set <= named, (language, sorted(type_set - named))


@pytest.mark.parametrize(("language", "code", "span", "node_type"), UNIQUE_SUBTREES)
def test_the_only_valid_subtree_is_found_for_every_seed(
    language: str, code: str, span: str, node_type: str
) -> None:
    for seed in SEEDS:
        split = extract_subtree(code, language, seed)
        assert split is not None
        assert (split.span, split.node_type) == (span, node_type)
        assert split.start == code.index(span)
        check_split(split, code)


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_every_draw_is_a_complete_selectable_node_of_min_length(language: str) -> None:
    code = SNIPPETS[language]
    types = SUBTREE_TYPES[language]
    seen = set()
    for seed in SEEDS:
        split = extract_subtree(code, language, seed)
        assert split is not None
        check_split(split, code)
        assert split.node_type in types.selectable
        node = node_at(code, language, split)
        assert node is not None, split
        assert _is_selectable(node, types)
        assert len(token_spans(split.span)) >= DEFAULT_MIN_TOKENS
        seen.add(split.span)
    assert len(seen) > 1  # the draw is random, not always the same sub-tree


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_same_seed_same_split(language: str) -> None:
    code = SNIPPETS[language]
    assert [extract_subtree(code, language, seed) for seed in SEEDS] == [
        extract_subtree(code, language, random.Random(seed)) for seed in SEEDS
    ]
    first, second = random.Random(7), random.Random(7)
    assert [extract_subtree(code, language, first) for _ in range(5)] == [
        extract_subtree(code, language, second) for _ in range(5)
    ]


def test_known_draws_of_the_bubble_sort() -> None:
    code = SNIPPETS["python"]
    spans = {extract_subtree(code, "python", seed).span for seed in range(200)}
    assert spans == {
        "for i in range(n):\n        for j in range(n - i - 1):\n"
        "            if arr[j] > arr[j + 1]:\n"
        "                arr[j], arr[j + 1] = arr[j + 1], arr[j]",
        "for j in range(n - i - 1):\n            if arr[j] > arr[j + 1]:\n"
        "                arr[j], arr[j + 1] = arr[j + 1], arr[j]",
        "if arr[j] > arr[j + 1]:\n                arr[j], arr[j + 1] = arr[j + 1], arr[j]",
        "arr[j], arr[j + 1] = arr[j + 1], arr[j]",
        "range(n - i - 1)",  # a call in a loop header is under no indivisible node
        'print("sorted", arr)',
    }


def test_calls_under_an_assignment_are_not_cut_out() -> None:
    code = "def f(x):\n    y = compute(alpha, beta, gamma)\n    return y\n"
    for seed in SEEDS:
        split = extract_subtree(code, "python", seed, min_tokens=6)
        assert (split.span, split.node_type) == (
            "y = compute(alpha, beta, gamma)",
            "expression_statement",
        )


def test_a_call_statement_is_cut_out() -> None:
    code = "def f(x):\n    compute(alpha, beta, gamma)\n    return x\n"
    split = extract_subtree(code, "python", 0)
    assert (split.span, split.node_type) == ("compute(alpha, beta, gamma)", "call")
    assert split.context == "def f(x):\n    \n    return x\n"


def test_min_tokens_is_a_parameter() -> None:
    code = UNIQUE_SUBTREES[0][1]
    assert extract_subtree(code, "python", 0, min_tokens=12) is not None  # the if: 12 tokens
    assert extract_subtree(code, "python", 0, min_tokens=13) is None


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "def f(x):\n    return x + 1\n"),  # nothing of N
        ("python", "def f(x):\n    y = x\n    return y\n"),  # N, but too short
        ("python", 'def f(x):\n    """A docstring that is long enough to count."""\n'),
        ("java", "public int f(int x) {\n    return compute(x, 1, 2, 3);\n}"),
        ("go", "func F(x int) int {\n\treturn compute(x, 1, 2, 3)\n}"),
        ("javascript", "function f(x) {\n  return compute(x, 1, 2, 3);\n}"),
        ("ruby", "def f(x)\n  x + 1\nend"),
        ("php", "public function f($x)\n{\n    return compute($x, 1, 2, 3);\n}"),
    ],
)
def test_no_valid_subtree_gives_none(language: str, code: str) -> None:
    assert all(extract_subtree(code, language, seed) is None for seed in range(5))


def test_non_ascii_code_uses_str_indices() -> None:
    code = (
        'def grüße(x):\n    s = "日本"\n    if x > 0:\n        print("héllo wörld", x, s)\n'
        "    return s\n"
    )
    expected = {'if x > 0:\n        print("héllo wörld", x, s)', 'print("héllo wörld", x, s)'}
    seen = set()
    for seed in SEEDS:
        split = extract_subtree(code, "python", seed)
        assert split.span in expected
        assert split.start == code.index(split.span)
        check_split(split, code)
        seen.add(split.span)
    assert seen == expected


def test_unparsable_code_raises() -> None:
    with pytest.raises(UnparsableCodeError):
        extract_subtree("}}}} )))) ;;;; ]]]] {{{{", "java", 0)


def test_unknown_language_raises() -> None:
    with pytest.raises(ValueError, match="unsupported language"):
        extract_subtree("x", "cobol", 0)


# --------------------------------------------------------------------------------------
# ICT variants
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_token_ict_cuts_whole_tokens_and_reconstructs(language: str) -> None:
    code = SNIPPETS[language]
    tokens = token_spans(code)
    starts, ends = {s for s, _ in tokens}, {e for _, e in tokens}
    for seed in SEEDS:
        split = split_tokens(code, seed)
        check_split(split, code)
        assert split.node_type == "ict_tokens"
        assert split.start in starts and split.end in ends
        count = len(token_spans(split.span))
        assert DEFAULT_MIN_TOKENS <= count <= max(DEFAULT_MIN_TOKENS, len(tokens) // 2)
        assert split == split_tokens(code, random.Random(seed))


def test_token_ict_needs_context() -> None:
    assert split_tokens("a b c d e f g h", 0) is None  # 8 tokens: nothing left
    split = split_tokens("a b c d e f g h i", 0)
    assert split.span == "a b c d e f g h" or split.span == "b c d e f g h i"


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_line_ict_cuts_whole_lines_and_reconstructs(language: str) -> None:
    code = SNIPPETS[language]
    for seed in SEEDS:
        split = split_lines(code, seed)
        check_split(split, code)
        assert split.node_type == "ict_lines"
        assert split.start == 0 or code[split.start - 1] == "\n"
        assert split.end == len(code) or code[split.end - 1] == "\n"
        assert len(token_spans(split.span)) >= DEFAULT_MIN_TOKENS
        assert split.context.strip()
        assert split == split_lines(code, random.Random(seed))


def test_line_ict_hand_example() -> None:
    code = "a = compute(x, y)\n\nb = compute(y, z)\nreturn a + b\n"
    spans = {split_lines(code, seed).span for seed in range(50)}
    # 3 non-blank lines: windows of 1 line (max(1, ⌊0.5·3⌋)) with ≥ 8 tokens.
    assert spans == {"a = compute(x, y)\n", "b = compute(y, z)\n"}
    assert split_lines("a = compute(x, y, z)", 0) is None  # one line: no context left
