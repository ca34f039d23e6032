"""The pipeline's last step: index the held-out corpus with the final model and show it at
work on a few held-out queries (the judged answer's rank marked), with the commands to go on.
"""

from __future__ import annotations

from typing import Any

from santa.data.beir import load_beir
from santa.runtime import storage
from santa.search.indexing import IndexConfig, build_index
from santa.search.searcher import Searcher, format_hits

__all__ = ["index_and_show", "pick_queries"]


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
) -> dict[str, Any]:
    """Index the corpus of the BEIR folder ``beir_uri`` with ``model_uri`` into ``output``
    (Ray Data actor pool; needs Ray initialised), search ``examples`` of its judged queries
    and print their top ``k``; returns the index summary and the examples."""
    manifest = build_index(
        IndexConfig(checkpoint=model_uri, corpus=beir_uri, output=output, force=force)
    )
    data = load_beir(beir_uri, split)
    chosen = pick_queries(data.queries, examples)
    searcher = Searcher.open(output)
    texts = [data.queries[qid] for qid in chosen]
    shown = []
    for qid, query, hits in zip(chosen, texts, searcher.search(texts, k), strict=True):
        answers = set(doc for doc, label in data.qrels[qid].items() if label > 0)
        first_answer = next((hit.rank for hit in hits if hit.id in answers), None)
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
                "hits": [hit.to_dict(text_chars=200) for hit in hits],
            }
        )
    print(
        "search it yourself:\n"
        f'  python -m ray_jobs.search --index {output} "parse a date string"\n'
        f"  python -m ray_jobs.serve --index {output}    # POST /search on :8000",
        flush=True,
    )
    return {
        "index": output,
        "count": manifest["count"],
        "index_kind": manifest["index"]["kind"],
        "throughput": manifest["throughput"],
        "examples": shown,
        "index_s": manifest["throughput"]["total_s"] if not manifest.get("up_to_date") else 0.0,
        "uri": storage.absolute(output),
    }


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
