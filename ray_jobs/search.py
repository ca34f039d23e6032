"""Search an index built by ray_jobs.index: top-k per query as a table, or JSON.

    python -m ray_jobs.search --index runs/default/index "get the size of the terminal window"
    python -m ray_jobs.search --index s3://b/indexes/csn --queries queries.txt -k 5 --json
    python -m ray_jobs.search --index runs/default/index          # a prompt: one query a line
    python -m ray_jobs.search --index runs/default/index --serve --replicas 2   # Ray Serve

Queries are encoded exactly as the evaluator encodes queries (same model, length, pooling
and normalization). Loading the index and its model is most of a single search's time: give
several queries (arguments, --queries FILE, - for standard input) or none for a prompt that
answers one after the other. The start-up and the searching are timed apart on stderr.
--serve starts the HTTP deployment instead (see ray_jobs.serve).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator

from santa.jobs.errors import exit_with, with_exit_codes
from santa.jobs.lifecycle import Job


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The search command line."""
    parser = with_exit_codes(
        argparse.ArgumentParser(prog="python -m ray_jobs.search", description=__doc__)
    )
    parser.add_argument("--index", required=True, help="index folder (local or s3://)")
    parser.add_argument("queries", nargs="*", help="query texts")
    parser.add_argument(
        "--queries",
        dest="queries_file",
        help="file with one query per line (- : standard input)",
    )
    parser.add_argument("-k", "--top-k", type=int, default=10, help="hits per query")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of tables")
    parser.add_argument("--model", default=None, help="model to use instead of the manifest's")
    parser.add_argument(
        "--dim", type=int, default=None, help="search the first DIM dimensions (Matryoshka)"
    )
    parser.add_argument(
        "--serve", action="store_true", help="serve over HTTP instead (ray_jobs.serve's flags)"
    )
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors")
    return parser.parse_args(argv)


PROMPT = "query> "


def _prompted() -> Iterator[str]:
    """Queries typed at a prompt, one a line, until an empty line or end of input."""
    while True:
        try:
            query = input(PROMPT).strip()
        except EOFError:
            print(file=sys.stderr)
            return
        if not query:
            return
        yield query


def _given(args: argparse.Namespace) -> list[str]:
    """The queries of the command line: arguments, then --queries FILE (- : stdin)."""
    from santa.files import storage

    queries = list(args.queries)
    if args.queries_file == "-":
        queries += [line.strip() for line in sys.stdin if line.strip()]
    elif args.queries_file:
        text = storage.read_bytes(args.queries_file).decode("utf-8")
        queries += [line.strip() for line in text.splitlines() if line.strip()]
    return queries


def _say(text: str) -> None:
    """A timing line on stderr: stdout stays the tables (or JSON lines) alone."""
    print(f"[search] {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Load the index and its model once, then answer every query: those given, or those
    typed at a prompt (standard input a terminal), or standard input's lines."""
    from santa.files import storage
    from santa.search.searcher import Searcher, format_hits

    queries = _given(args)
    if not queries and not sys.stdin.isatty():
        queries = [line.strip() for line in sys.stdin if line.strip()]
        if not queries:
            raise ValueError("no query: give queries as arguments, --queries FILE, or type them")
    started = time.perf_counter()
    searcher = Searcher.open(storage.absolute(args.index), model=args.model, dim=args.dim)
    _say(
        f"ready in {time.perf_counter() - started:.1f} s (index of {len(searcher):,} "
        "documents and its model loaded)"
        + ("" if queries else "; one query a line, an empty line to end")
    )

    def show(query: str, hits) -> None:
        if args.json:
            payload = {"query": query, "hits": [hit.to_dict(text_chars=500) for hit in hits]}
            print(json.dumps(payload, ensure_ascii=False), flush=True)
        else:
            print(format_hits(query, hits) + "\n", flush=True)

    seconds, count = 0.0, 0  # searching only, not the time a person takes to type
    if queries:  # in one batch: one encoder pass for all of them
        searching = time.perf_counter()
        for query, hits in zip(queries, searcher.search(queries, args.top_k), strict=True):
            show(query, hits)
        seconds, count = time.perf_counter() - searching, len(queries)
    else:
        for query in _prompted():
            asked = time.perf_counter()
            show(query, searcher.search([query], args.top_k)[0])
            took = time.perf_counter() - asked
            _say(f"{1000 * took:.0f} ms")
            seconds, count = seconds + took, count + 1
    _say(
        f"{count} quer{'y' if count == 1 else 'ies'} searched in {seconds:.2f} s"
        + (f" ({1000 * seconds / count:.0f} ms each)" if count else "")
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse → search (or, with --serve, hand every other flag to ray_jobs.serve)."""
    command_line = argv is None  # run_job quiets a job run from the command line only
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--serve" in argv:
        from ray_jobs import serve

        return serve.main([arg for arg in argv if arg != "--serve"])
    args = parse_args(argv)
    job = Job("search")  # reads only: no lock; an interruption leaves nothing to say
    return job.main(lambda: run(args), None if command_line else argv)


if __name__ == "__main__":
    exit_with(main())
