"""Helpers that turn raw code/product records into clean (query, document) pairs.

Follows the SANTA paper, Appendix A.2: code search pairs use the first paragraph of
the docstring as the query and the code *without* its docstring as the document;
product search pairs take one bullet point per product, chosen reproducibly.

Everything here is plain Python (standard library only) so it can run inside any
Ray Data map function or in a unit test without a cluster.
"""

from __future__ import annotations

import hashlib
import html
import io
import re
import tokenize
from collections.abc import Sequence
from html.parser import HTMLParser

__all__ = [
    "choose_bullet_point",
    "clean_docstring",
    "has_markup",
    "remove_docstring",
    "split_bullet_points",
    "split_for_key",
    "strip_comment_markers",
    "strip_html",
]

# --------------------------------------------------------------------------- docstrings

# Python string prefixes that may precede the opening quotes of a docstring
# (``ur`` is Python 2 only but common in CodeSearchNet).
_PY_QUOTES_RE = re.compile(r"""^(?:[rRuUbB]{0,2})("{3}|'{3}|"|')(.*)\1$""", re.DOTALL)

# Lines that open a tag/parameter section.  Everything from such a line on is
# dropped: continuation lines of ``@param x ...`` would otherwise leak into the summary.
_SECTION_RE = re.compile(
    r"""^(?:
        @\w+                                   # javadoc / JSDoc / phpdoc / YARD tags
      | :(?:param|parameter|arg|argument|key|keyword|type|returns?|rtype|raises?
          |except|exception|var|ivar|cvar|vartype|yields?|ytype|meta)\b   # Sphinx fields
      | (?:Args|Arguments|Parameters|Params|Returns?|Yields?|Raises?|Throws
          |Keyword\ Args|Keyword\ Arguments|Other\ Parameters|Attributes
          |Examples?|Example\ usage|Usage|Notes?|See\ Also|Todo|Warnings?|Warns
          |References)\s*:                      # Google style section headers
      | >>>                                     # doctest
      | \.\.\ [\w-]+::                          # reST directives (.. note::)
    )""",
    re.VERBOSE,
)
# numpy style: "Parameters" followed by an underline of dashes.
_UNDERLINE_RE = re.compile(r"^(?:-{3,}|={3,})$")
# Javadoc separates paragraphs with <p>; a line holding only that tag is a break.
_PARAGRAPH_TAG_RE = re.compile(r"^<p\s*/?>$", re.IGNORECASE)
_INLINE_TAG_RE = re.compile(r"\{@(?:link|linkplain|code|literal)\s+([^}]*)\}")
_WS_RE = re.compile(r"\s+")


def _strip_line_prefix(lines: list[str], prefix_re: re.Pattern[str]) -> list[str] | None:
    """Strip ``prefix_re`` from every non-blank line, or return None if one lacks it."""
    out = []
    for line in lines:
        stripped = line.strip()
        if not stripped:
            out.append("")
            continue
        m = prefix_re.match(stripped)
        if m is None:
            return None
        out.append(stripped[m.end() :])
    return out


_BLOCK_STAR_RE = re.compile(r"\*(?!/) ?")
_SLASHES_RE = re.compile(r"//+!? ?")
_HASHES_RE = re.compile(r"#+ ?")


def strip_comment_markers(text: str) -> str:
    """Return the body of a doc comment / docstring literal with its comment syntax removed."""
    text = text.strip()
    m = _PY_QUOTES_RE.match(text)
    # A single-quoted "literal" whose body contains the quote is prose that happens to
    # start and end with quotes ('"a" and "b"'), not a string literal.
    if m is not None and (len(m.group(1)) == 3 or m.group(1) not in m.group(2)):
        text = m.group(2)
    elif text.startswith("/*"):
        text = text[2:]
        # "/**" javadoc and "/*!" doxygen openers.
        text = text.lstrip("*!")
        if text.endswith("*/"):
            text = text[:-2].rstrip("*")
    elif text.startswith("=begin"):
        # Ruby block comment.
        text = text[len("=begin") :]
        if text.rstrip().endswith("=end"):
            text = text.rstrip()[: -len("=end")]
    lines = text.split("\n")
    # Only strip a per-line marker when *every* non-blank line carries it, so that
    # e.g. a '#' inside ordinary docstring prose is kept.
    for prefix_re in (_BLOCK_STAR_RE, _SLASHES_RE, _HASHES_RE):
        stripped = _strip_line_prefix(lines, prefix_re)
        if stripped is not None and any(stripped):
            lines = stripped
            break
    lines = [line.rstrip() for line in lines]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def clean_docstring(docstring: str) -> str:
    """Return the first paragraph of a docstring with markers, tags and extra whitespace removed."""
    if not docstring:
        return ""
    body = strip_comment_markers(docstring)
    paragraph: list[str] = []
    lines = body.split("\n")
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line or _PARAGRAPH_TAG_RE.match(line):
            if paragraph:
                break
            continue
        if _SECTION_RE.match(line):
            break
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if _UNDERLINE_RE.match(nxt):
            # numpy section header such as "Parameters\n----------".
            break
        paragraph.append(line)
    text = _INLINE_TAG_RE.sub(r"\1", " ".join(paragraph))
    return _WS_RE.sub(" ", text).strip()


# --------------------------------------------------------------------- docstring removal

# Python 2 string prefixes that Python 3's tokenize splits into NAME + STRING.
_PY2_PREFIXES = {"ur", "uR", "Ur", "UR"}


def _line_offsets(code: str) -> list[int]:
    """Offsets of the start of each line, split on '\\n' like ``io.StringIO.readline``."""
    offsets = [0]
    for m in re.finditer("\n", code):
        offsets.append(m.end())
    return offsets


def _remove_python_docstring(code: str) -> str:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        # IndentationError is a SyntaxError subclass raised by tokenize on bad dedents.
        raise ValueError(f"cannot tokenize Python code: {exc}") from exc

    ignorable = {tokenize.NL, tokenize.COMMENT}
    i, n = 0, len(tokens)
    # 1. find the first 'def' (decorators and 'async' come before it).
    while i < n and not (tokens[i].type == tokenize.NAME and tokens[i].string == "def"):
        i += 1
    # 2. find the ':' that ends the header (outside of parentheses).
    depth = 0
    while i < n:
        tok = tokens[i]
        if tok.type == tokenize.OP:
            if tok.string in "([{":
                depth += 1
            elif tok.string in ")]}":
                depth -= 1
            elif tok.string == ":" and depth == 0:
                break
        i += 1
    i += 1
    while i < n and tokens[i].type in ignorable:
        i += 1
    # 3. the body is either an indented block (NEWLINE INDENT) or a one-line suite
    #    ("def f(): 'doc'", common in doctest-heavy code).  The latter is removed too:
    #    leaving the docstring in the document would leak the query into it.
    same_line = True
    if i < n and tokens[i].type == tokenize.NEWLINE:
        same_line = False
        i += 1
        while i < n and tokens[i].type in ignorable:
            i += 1
        if i >= n or tokens[i].type != tokenize.INDENT:
            return code
        i += 1
        while i < n and tokens[i].type in ignorable:
            i += 1
    if i >= n:
        return code
    first = tokens[i]
    if (
        first.type == tokenize.NAME
        and first.string in _PY2_PREFIXES
        and i + 1 < n
        and tokens[i + 1].type == tokenize.STRING
        and tokens[i + 1].start == first.end
    ):
        i += 1  # Python 2 ur"..." docstring: the NAME token is part of the literal.
    if tokens[i].type != tokenize.STRING:
        return code
    # 4. the statement must consist of string literals only (implicit concatenation
    #    is allowed); '"abc".join(x)' or '"%s" % x' are expressions, not docstrings.
    last = i
    j = i + 1
    while j < n and tokens[j].type in (tokenize.STRING, tokenize.NL, tokenize.COMMENT):
        if tokens[j].type == tokenize.STRING:
            last = j
        j += 1
    semicolon = False
    if j < n and tokens[j].type == tokenize.OP and tokens[j].string == ";":
        semicolon = True
    elif j >= n or tokens[j].type not in (tokenize.NEWLINE, tokenize.DEDENT, tokenize.ENDMARKER):
        return code

    offsets = _line_offsets(code)
    (srow, scol), (erow, ecol) = first.start, tokens[last].end
    start = offsets[srow - 1] + scol
    end = offsets[erow - 1] + ecol
    line_start = offsets[srow - 1]
    line_end = offsets[erow] if erow < len(offsets) else len(code)
    if semicolon:
        # "'''doc'''; x = 1": drop the string, the ';' and the space after it.
        semi_end = offsets[tokens[j].end[0] - 1] + tokens[j].end[1]
        while semi_end < len(code) and code[semi_end] in " \t":
            semi_end += 1
        return code[:start] + code[semi_end:]
    rest = code[end:line_end]
    if same_line:
        # "def f(): 'doc'" -> "def f():" (the rest of the line is the NEWLINE / a comment).
        return code[:start].rstrip(" \t") + code[end:]
    if not code[line_start:start].strip() and (not rest.strip() or rest.lstrip().startswith("#")):
        # The docstring owns its lines: remove them entirely (with the newline).
        return code[:line_start] + code[line_end:]
    return code[:start] + code[end:]


# Non-Python comments: /* ... */ blocks, Ruby =begin/=end blocks, and runs of whole-line
# '//' or '#' comments.
_BLOCK_COMMENT_RE = re.compile(r"/\*.*?\*/", re.DOTALL)
_RUBY_BLOCK_RE = re.compile(r"^=begin\b.*?^=end\b[^\n]*", re.DOTALL | re.MULTILINE)
_LINE_COMMENT_MARKERS = {
    "java": ("//",),
    "go": ("//",),
    "javascript": ("//",),
    "php": ("//", "#"),
    "ruby": ("#",),
}


def _comment_spans(code: str, language: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in _BLOCK_COMMENT_RE.finditer(code)]
    if language == "ruby":
        spans = [m.span() for m in _RUBY_BLOCK_RE.finditer(code)]
    markers = _LINE_COMMENT_MARKERS.get(language, ("//", "#"))
    offset = 0
    run_start = None
    for line in code.split("\n"):
        if line.strip().startswith(markers):
            if run_start is None:
                run_start = offset
            run_end = offset + len(line)
        elif run_start is not None:
            spans.append((run_start, run_end))
            run_start = None
        offset += len(line) + 1
    if run_start is not None:
        spans.append((run_start, run_end))
    return sorted(spans)


def _remove_comment(code: str, docstring: str, language: str) -> str:
    first_line = next(
        (ln.strip() for ln in strip_comment_markers(docstring).split("\n") if ln.strip()), ""
    )
    if not first_line:
        return code
    needle = _WS_RE.sub(" ", first_line)
    previous_end = 0
    for start, end in _comment_spans(code, language):
        # Doc comments precede the declaration: only look at the leading comments, so a
        # body comment that repeats the summary ("# Parse the file") is kept.
        if code[previous_end:start].strip():
            break
        previous_end = end
        if needle not in _WS_RE.sub(" ", strip_comment_markers(code[start:end])):
            continue
        line_start = code.rfind("\n", 0, start) + 1
        line_end = code.find("\n", end)
        line_end = len(code) if line_end == -1 else line_end + 1
        if not code[line_start:start].strip() and not code[end:line_end].strip():
            return code[:line_start] + code[line_end:]
        # "/** doc */ int f()": also drop the blank that separated comment and code.
        return code[:start] + code[end:].lstrip(" \t")
    return code


def remove_docstring(code: str, docstring: str, language: str) -> str:
    """Return ``code`` with its docstring (Python) or doc comment (other languages) removed."""
    if language == "python":
        # tokenize rather than ast: CodeSearchNet holds Python 2 code that ast rejects.
        return _remove_python_docstring(code)
    return _remove_comment(code, docstring, language)


# ---------------------------------------------------------------------------- HTML / ESCI

# Inline formatting tags join their text to the neighbours; every other tag
# (br, p, li, div, td, ...) separates words.
_INLINE_TAGS = frozenset(
    {
        "a",
        "abbr",
        "b",
        "bdi",
        "big",
        "code",
        "em",
        "font",
        "i",
        "mark",
        "s",
        "small",
        "span",
        "strike",
        "strong",
        "sub",
        "sup",
        "tt",
        "u",
    }
)
_SKIP_CONTENT_TAGS = frozenset({"script", "style"})


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_CONTENT_TAGS:
            self._skip += 1
        elif tag not in _INLINE_TAGS:
            self.parts.append(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _INLINE_TAGS:
            self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_CONTENT_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag not in _INLINE_TAGS:
            self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def strip_html(text: str) -> str:
    """Return ``text`` with HTML tags removed, entities unescaped and whitespace collapsed."""
    if not text:
        return ""
    parser = _TextExtractor()
    parser.feed(text)
    parser.close()
    # A second unescape catches double-escaped entities ("&amp;quot;") seen in ESCI.
    out = html.unescape("".join(parser.parts))
    return _WS_RE.sub(" ", out).strip()


# What an HTML parser's text would change: a tag, a comment or doctype, or an entity.
_MARKUP_RE = re.compile(r"<[A-Za-z/!?][^>]*>|&(?:#[0-9]+|#[xX][0-9A-Fa-f]+|[A-Za-z][A-Za-z0-9]*);")


def has_markup(text: str | None) -> bool:
    """Whether ``text`` holds HTML markup (a tag, comment, doctype or entity)."""
    return bool(text) and _MARKUP_RE.search(text) is not None


def split_bullet_points(text: str | None) -> list[str]:
    """Return the non-empty stripped bullets of a newline-separated ESCI bullet string."""
    if not isinstance(text, str):
        # ESCI stores missing bullets as null (None / NaN after pandas).
        return []
    return [b.strip() for b in text.splitlines() if b.strip()]


def _stable_unit(seed: int, key: str) -> int:
    """A 64-bit integer hash of (seed, key) that is identical in every process."""
    digest = hashlib.blake2b(f"{seed}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def choose_bullet_point(product_id: str, bullets: Sequence[str], seed: int) -> str | None:
    """Pick one bullet reproducibly from (seed, product_id), or None when there are none."""
    if not bullets:
        return None
    # Derived from a stable hash (not random state or hash()) so the choice does not
    # depend on the order in which Ray workers process products.
    return bullets[_stable_unit(seed, product_id) % len(bullets)]


_SPLITS = ("train", "valid", "test")


def split_for_key(key: str, seed: int = 0, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> str:
    """Assign ``key`` to "train", "valid" or "test" deterministically from a stable hash."""
    if len(fractions) != 3 or any(f < 0 for f in fractions):
        raise ValueError(f"fractions must be three non-negative numbers, got {fractions!r}")
    total = float(sum(fractions))
    if total <= 0:
        raise ValueError("fractions must not all be zero")
    u = _stable_unit(seed, key) / 2**64
    cumulative = 0.0
    for name, frac in zip(_SPLITS, fractions, strict=True):
        cumulative += frac / total
        if u < cumulative:
            return name
    # Floating point rounding can leave u just above the last cumulative sum.
    return next(
        name for name, frac in zip(reversed(_SPLITS), reversed(fractions), strict=True) if frac > 0
    )
