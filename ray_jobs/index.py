"""Encode a corpus with a trained model into a searchable index (Ray Data batch inference).

    python -m ray_jobs.index --checkpoint runs/default/finetune --corpus runs/default/data/test \\
        --output runs/default/index
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m ray_jobs.index \\
        --checkpoint s3://b/runs/csn/ance --corpus s3://b/csn-test --output s3://b/indexes/csn

The corpus is santa's preprocessed pairs or BEIR folder, a BEIR corpus.jsonl, a
CodeSearchNet folder or a jsonl of {"id", "text"} lines (local or s3://). The output holds
Parquet shards of (id, embedding), a faiss index, the documents and a manifest
(report.json), published whole. An interrupted run, re-run, encodes only the missing shards.
"""

from __future__ import annotations

import argparse

from santa.index.faiss_index import INDEX_KINDS
from santa.jobs.errors import exit_with, run_job, with_exit_codes
from santa.jobs.quiet import PROGRESS_HELP
from santa.search.corpus import CORPUS_FORMATS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The index job's command line."""
    parser = with_exit_codes(
        argparse.ArgumentParser(prog="python -m ray_jobs.index", description=__doc__)
    )
    parser.add_argument("--checkpoint", required=True, help="model folder, checkpoint, run, sweep")
    parser.add_argument(
        "--corpus",
        required=True,
        nargs="+",
        metavar="URI",
        help="corpus URI (local or s3://); several are indexed together, a document whose "
        "id an earlier one holds left out",
    )
    parser.add_argument("--output", required=True, help="index folder to publish")
    parser.add_argument("--corpus-format", choices=CORPUS_FORMATS, default="auto")
    parser.add_argument("--index-kind", choices=("auto", *INDEX_KINDS), default="auto")
    parser.add_argument("--nlist", type=int, default=0, help="IVF cells (default 4·√n)")
    parser.add_argument("--nprobe", type=int, default=32, help="IVF cells searched")
    parser.add_argument("--shard-size", type=int, default=0, help="documents per shard")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")
    parser.add_argument(
        "--actors",
        type=int,
        default=0,
        help="encoder actors (default: auto; none for up to 1,000 documents on CPU, encoded "
        "in this process)",
    )
    parser.add_argument("--cpus-per-actor", type=float, default=1.0)
    device = parser.add_mutually_exclusive_group()
    device.add_argument("--gpu", action="store_true", help="GPU actors (default: if there)")
    device.add_argument("--cpu", action="store_true", help="CPU actors even with GPUs")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--max-query-length", type=int, default=None)
    parser.add_argument("--max-document-length", type=int, default=None)
    parser.add_argument(
        "--dim", type=int, default=None, help="keep the first DIM dimensions (Matryoshka)"
    )
    parser.add_argument("--force", action="store_true", help="take over a stale S3 lease")
    parser.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS)")
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors")
    parser.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    """Check inputs, start or join Ray, build and publish the index."""
    from santa.files import storage
    from santa.jobs.lifecycle import Job
    from santa.jobs.preflight import check_input
    from santa.search.indexing import IndexConfig, build_index

    config = IndexConfig(
        checkpoint=_local_or_as_is(args.checkpoint),
        corpus=storage.absolute(args.corpus[0]),
        more_corpora=tuple(storage.absolute(uri) for uri in args.corpus[1:]),
        output=storage.absolute(args.output),
        corpus_format=args.corpus_format,
        index_kind=args.index_kind,
        nlist=args.nlist,
        nprobe=args.nprobe,
        shard_size=args.shard_size,
        batch_size=args.batch_size,
        num_actors=args.actors,
        cpus_per_actor=args.cpus_per_actor,
        use_gpu=True if args.gpu else (False if args.cpu else "auto"),
        precision=args.precision,
        max_query_length=args.max_query_length,
        max_document_length=args.max_document_length,
        dim=args.dim,
        force=args.force,
    )
    # The output's lock before Ray starts: a second writer is refused in a second.
    job = Job(
        "index",
        output=config.output,
        force=config.force,
        kept=lambda: f"nothing was published; {config.output} is as it was",
        hint="run the same command to resume (the encoded shards are kept)",
    )
    corpora = (config.corpus, *config.more_corpora)
    with job.running(checks=[lambda: [check_input(uri, "--corpus") for uri in corpora]]):
        job.start_ray(args.address, progress=args.progress)
        manifest = build_index(config)
    # build_index printed what it published ("[index] published ..."): no JSON dump here.
    print(f"output: {config.output}")
    return manifest


def _local_or_as_is(uri: str) -> str:
    """An existing local path made absolute (Ray workers run elsewhere); URIs, hub names
    and missing paths as given (the resolver names what is wrong with them)."""
    import os

    return os.path.abspath(uri) if os.path.exists(uri) else uri


def main(argv: list[str] | None = None) -> int:
    """Parse → run; errors as one line (``--debug``: the traceback)."""
    args = parse_args(argv)
    return run_job(lambda: run(args) and 0, argv)


if __name__ == "__main__":
    exit_with(main())
