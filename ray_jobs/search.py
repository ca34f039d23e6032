"""Search an index built by ray_jobs.index: top-k per query as a table, or JSON.

    python -m ray_jobs.search --index runs/default/index "get the size of the terminal window"
    python -m ray_jobs.search --index s3://b/indexes/csn --queries queries.txt -k 5 --json
    python -m ray_jobs.search --index runs/default/index --serve --replicas 2   # Ray Serve

Queries are encoded exactly as the evaluator encodes queries (same model, length, pooling
and normalization). --serve starts the HTTP deployment instead (see ray_jobs.serve).
"""

from __future__ import annotations

import argparse
import json
import sys

from santa.runtime.errors import exit_with, run_job


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The search command line."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--index", required=True, help="index folder (local or s3://)")
    parser.add_argument("queries", nargs="*", help="query texts")
    parser.add_argument("--queries", dest="queries_file", help="file with one query per line")
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
    args = parser.parse_args(argv)
    if not args.queries and not args.queries_file:
        parser.error("give queries as arguments or --queries FILE")
    return args


def run(args: argparse.Namespace) -> int:
    """Load the index, search, print."""
    from santa.runtime import storage
    from santa.search.searcher import Searcher, format_hits

    queries = list(args.queries)
    if args.queries_file:
        text = storage.read_bytes(args.queries_file).decode("utf-8")
        queries += [line.strip() for line in text.splitlines() if line.strip()]
    searcher = Searcher.open(storage.absolute(args.index), model=args.model, dim=args.dim)
    results = searcher.search(queries, args.top_k)
    for query, hits in zip(queries, results, strict=True):
        if args.json:
            payload = {"query": query, "hits": [hit.to_dict(text_chars=500) for hit in hits]}
            print(json.dumps(payload, ensure_ascii=False))
        else:
            print(format_hits(query, hits) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse → search (or, with --serve, hand every other flag to ray_jobs.serve)."""
    command_line = argv is None  # run_job quiets a job run from the command line only
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--serve" in argv:
        from ray_jobs import serve

        return serve.main([arg for arg in argv if arg != "--serve"])
    args = parse_args(argv)
    return run_job(lambda: run(args), None if command_line else argv)


if __name__ == "__main__":
    exit_with(main())
