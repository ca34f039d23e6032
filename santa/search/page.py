"""The search service's page: one self-contained HTML document (no scripts from elsewhere, no
build step), so that it works on a cluster without internet.

``GET /`` shows a query box; ``GET /?q=...&k=...`` shows the top hits under it, rendered on
the server (a plain form, no JavaScript): rank, score, id, title and a snippet of the text
with the query's words marked, the model and index being served, and the time the search
took.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["STOP_WORDS", "highlight", "render_page", "snippet"]

SNIPPET_LINES = 12
SNIPPET_CHARS = 800

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:60rem;padding:0 1rem;color:#222}
h1{font-size:1.3rem;margin-bottom:.2rem}
.about{color:#666;font-size:.85rem;margin-bottom:1rem}
form{display:flex;gap:.5rem;margin-bottom:1rem}
input[name=q]{flex:1;font-size:1rem;padding:.4rem}
input[name=k]{width:4rem;font-size:1rem;padding:.4rem}
button{font-size:1rem;padding:.4rem 1rem}
.took{color:#666;font-size:.85rem}
.error{color:#a00}
ol{padding-left:0;list-style:none}
li.hit{border-top:1px solid #ddd;padding:.6rem 0}
.head{display:flex;gap:1rem;align-items:baseline;font-size:.9rem}
.score{font-variant-numeric:tabular-nums;color:#555}
.id{font-family:ui-monospace,monospace;font-weight:600}
pre{background:#f6f6f6;padding:.5rem;overflow-x:auto;font-size:.85rem;margin:.3rem 0 0}
mark{background:#ffe38a}
"""


# Words a query shares with nearly every text: marked, they were most of the page's marks.
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "how",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "will",
        "with",
    ]
)


def _words(query: str) -> list[str]:
    """The query's words worth marking (two characters or more, not stop words), longest
    first."""
    words = {w.lower() for w in re.findall(r"\w{2,}", query)} - STOP_WORDS
    return sorted(words, key=lambda w: (-len(w), w))


def highlight(text: str, query: str) -> str:
    """``text`` as escaped HTML with the query's words in ``<mark>`` where they stand as
    words: between non-alphanumerics, so ``read_file`` marks ``file`` but ``bits`` does not
    mark ``its`` and ``SameFileError`` does not mark ``file``."""
    words = _words(query)
    if not words:
        return html.escape(text)
    alternatives = "|".join(re.escape(w) for w in words)
    pattern = re.compile(rf"(?<![^\W_])(?:{alternatives})(?![^\W_])", re.IGNORECASE)
    parts, last = [], 0
    for match in pattern.finditer(text):
        parts.append(html.escape(text[last : match.start()]))
        parts.append(f"<mark>{html.escape(match.group(0))}</mark>")
        last = match.end()
    parts.append(html.escape(text[last:]))
    return "".join(parts)


def snippet(text: str) -> str:
    """The first lines of a hit's text (at most ``SNIPPET_LINES`` lines and
    ``SNIPPET_CHARS`` characters), marked as cut where it was."""
    lines = text.strip("\n").splitlines()
    cut = "\n".join(lines[:SNIPPET_LINES])
    if len(cut) > SNIPPET_CHARS:
        cut = cut[:SNIPPET_CHARS]
    return cut + ("\n…" if cut != text.strip("\n") else "")


def _about(describe: dict[str, Any]) -> str:
    parts = [
        f"model <code>{html.escape(str(describe.get('model')))}</code>",
        f"{describe.get('count', 0):,} documents",
        f"{html.escape(str(describe.get('index')))} index",
        f"{html.escape(str(describe.get('similarity')))} similarity",
    ]
    return " · ".join(parts)


def render_page(
    describe: dict[str, Any],
    *,
    query: str = "",
    k: int = 10,
    hits: Iterable[dict[str, Any]] | None = None,
    took_ms: float | None = None,
    error: str | None = None,
) -> str:
    """The page: the form, then the hits of ``query`` (or the error), as one HTML string."""
    body = [
        "<h1>santa search</h1>",
        f'<div class="about" id="about">{_about(describe)}</div>',
        '<form method="get" action="">',
        f'<input name="q" id="q" value="{html.escape(query)}" placeholder="a query" autofocus>',
        f'<input name="k" id="k" type="number" min="1" value="{int(k)}">',
        '<button type="submit" id="go">Search</button>',
        "</form>",
    ]
    if error:
        body.append(f'<p class="error" id="error">{html.escape(error)}</p>')
    elif hits is not None:
        hits = list(hits)
        took = f" in {took_ms:.1f} ms" if took_ms is not None else ""
        body.append(f'<p class="took" id="took">{len(hits)} hits{took}</p>')
        body.append('<ol id="hits">')
        # The score says what it is: the model's similarity of the hit to the query.
        similarity = html.escape(str(describe.get("similarity") or "score"))
        for hit in hits:
            title = f" {html.escape(hit['title'])}" if hit.get("title") else ""
            body.append(
                f'<li class="hit" data-id="{html.escape(hit["id"])}">'
                f'<div class="head"><span class="rank">{hit["rank"]}</span>'
                f'<span class="score" title="{similarity} similarity to the query">'
                f"{similarity} {hit['score']:.4f}</span>"
                f'<span class="id">{html.escape(hit["id"])}</span>{title}</div>'
                f"<pre>{highlight(snippet(hit['text']), query)}</pre></li>"
            )
        body.append("</ol>")
    title = f"{html.escape(query)} · santa search" if query else "santa search"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title><style>{_STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
