"""The pipeline's last step: index every function the run's corpus holds (held-out, dev and
training sets) with the final model, say what the index holds, and show it at work on a few
held-out queries (the judged answer's rank marked), with the commands to go on:
the query it suggests searching is one of those shown, the one whose judged answer ranked
best, so that the first query a newcomer copies finds what it asks for on this index.
"""

from __future__ import annotations

import shlex
from typing import Any

from santa.data.beir import load_beir
from santa.files import storage
from santa.search.indexing import IndexConfig, build_index
from santa.search.searcher import Searcher, format_hits

__all__ = ["index_and_show", "index_contents", "pick_queries", "suggest_query"]

# How deep the examples are searched for their judged answer's rank (the suggestion's
# choice); only the top ``k`` are shown.
RANK_DEPTH = 100


def pick_queries(queries: dict[str, str], count: int) -> list[str]:
    """``count`` query ids spread evenly over the split (the same ones on every run)."""
    ids = sorted(queries)
    if count >= len(ids):
        return ids
    step = len(ids) / count
    return [ids[int(i * step)] for i in range(count)]


def index_and_show(
    model_uri: str,
    beir_uri: str,
    output: str,
    *,
    split: str = "test",
    examples: int = 3,
    k: int = 3,
    force: bool = False,
    more_corpora: tuple[tuple[str, str], ...] = (),
    holds: str = "",
) -> dict[str, Any]:
    """Index the corpus of the BEIR folder ``beir_uri`` (and ``more_corpora``: the run's
    other sets, so that everyday questions find their function) with ``model_uri`` into
    ``output`` (Ray Data actor pool; needs Ray initialised), say in one line what it holds
    (``holds``: where its documents come from; ``more_corpora``: ``(name, uri)``, an empty
    uri left out), search ``examples`` of the held-out set's
    judged queries and print their top ``k``; returns the index summary and the examples."""
    more = [(name, uri) for name, uri in more_corpora if uri]
    manifest = build_index(
        IndexConfig(
            checkpoint=model_uri,
            corpus=beir_uri,
            more_corpora=tuple(uri for _, uri in more),
            output=output,
            force=force,
        )
    )
    names = ["held-out", *(name for name, _ in more)]
    print(index_contents(manifest, holds, names), flush=True)
    data = load_beir(beir_uri, split)
    chosen = pick_queries(data.queries, examples)
    searcher = Searcher.open(output)
    texts = [data.queries[qid] for qid in chosen]
    depth = max(k, RANK_DEPTH)
    shown = []
    # Functions that share a docstring (Node.pre_order and Leaf.pre_order: "Return a
    # pre-order iterator for the tree.") are separate queries with one answer each: every
    # one of them answers the text shown.
    same_text: dict[str, list[str]] = {}
    for other, text in data.queries.items():
        same_text.setdefault(" ".join(text.split()).lower(), []).append(other)
    for query, ranked in zip(texts, searcher.search(texts, depth), strict=True):
        answers = {
            doc
            for other in same_text[" ".join(query.split()).lower()]
            for doc, label in data.qrels.get(other, {}).items()
            if label > 0
        }
        judged_rank = next((hit.rank for hit in ranked if hit.id in answers), None)
        hits = ranked[:k]
        first_answer = judged_rank if judged_rank is not None and judged_rank <= k else None
        table = format_hits(_short(query), hits)
        marked = [
            line + ("   ← the judged answer" if hit.id in answers else "")
            for line, hit in zip(table.splitlines()[2:], hits, strict=True)
        ]
        print("\n".join([*table.splitlines()[:2], *marked]), flush=True)
        print(flush=True)
        shown.append(
            {
                "query": query,
                "answer_rank": first_answer,
                "judged_rank": judged_rank,
                "hits": [hit.to_dict(text_chars=200) for hit in hits],
            }
        )
    suggested = suggest_query(shown)
    print(
        "search it yourself:\n"
        f"  python -m ray_jobs.search --index {shlex.quote(output)} {shlex.quote(suggested)}\n"
        f"  python -m ray_jobs.serve --index {shlex.quote(output)}    # POST /search on :8000",
        flush=True,
    )
    return {
        "index": output,
        "count": manifest["count"],
        "index_kind": manifest["index"]["kind"],
        "throughput": manifest["throughput"],
        "examples": shown,
        "suggested_query": suggested,
        "index_s": manifest["throughput"]["total_s"] if not manifest.get("up_to_date") else 0.0,
        "uri": storage.absolute(output),
    }


def index_contents(
    manifest: dict[str, Any], holds: str = "", names: list[str] | None = None
) -> str:
    """One line saying what an index holds: its documents, how many from each of its
    corpora (``names``, in the order indexed), and whence (``holds``)."""
    parts = (manifest.get("corpus") or {}).get("parts") or []
    if isinstance(parts, dict):  # an index published before the parts kept their order
        parts = list(parts.items())
    parts = [count for _, count in parts]
    names = names or []
    split = ", ".join(
        f"{count:,} {names[i] if i < len(names) else f'from corpus {i + 1}'}"
        for i, count in enumerate(parts)
    )
    return (
        f"[index] holds {manifest['count']:,} documents"
        + (f" ({split})" if len(parts) > 1 else "")
        + (f": {holds}" if holds else "")
    )


def suggest_query(examples: list[dict[str, Any]]) -> str:
    """The query to suggest searching: of the ``examples`` shown (``query``,
    ``judged_rank``), the one whose judged answer ranked best (the first of equals), the
    first when none was found; its whitespace collapsed to one line."""
    if not examples:
        raise ValueError("no examples to suggest a query from")
    found = [example for example in examples if example.get("judged_rank") is not None]
    best = min(found, key=lambda example: example["judged_rank"]) if found else examples[0]
    return " ".join(str(best["query"]).split())


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
