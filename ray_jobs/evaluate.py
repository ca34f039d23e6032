"""Evaluate a checkpoint (and BM25) on a BEIR split; print the metrics table.

    python -m ray_jobs.evaluate --checkpoint runs/ft/checkpoint_000003 --data runs/beir
    ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python -m ray_jobs.evaluate --checkpoint s3://b/ft/checkpoint_000003 \\
        --data s3://b/beir --output s3://b/eval --protocol both

``--checkpoint`` takes a Ray checkpoint folder (its ``model/``), a Ray Train run folder
(its newest checkpoint), a sweep's ``best.json``, a santa or Hugging Face model folder, or
an ``s3://`` URI of one of these. The BEIR folder is what ``ray_jobs.preprocess
--stage eval`` writes. Encoding runs in this process unless the corpus outnumbers
``--ray-threshold`` texts (or ``--ray`` forces it): then a Ray Data actor pool encodes on
the cluster (GPUs when it has some) and Ray is started or joined only then.
"""

from __future__ import annotations

import argparse
import logging

from santa.data.outputs import claim_output
from santa.eval import DEFAULT_RAY_THRESHOLD, DEFAULT_TOP_K, EvalConfig, evaluate, format_markdown
from santa.runtime import interrupts
from santa.runtime.errors import exit_with, run_job, with_exit_codes
from santa.runtime.preflight import check_input, check_writable


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--checkpoint", required=True, help="model: checkpoint, run or model folder (or s3://)"
    )
    parser.add_argument("--data", required=True, help="BEIR folder: local path or s3:// URI")
    parser.add_argument("--split", default="test", help="qrels split (default: test)")
    parser.add_argument(
        "--output", default=None, help="where metrics.json/.md and TREC runs go (optional)"
    )
    parser.add_argument("--baseline", choices=("bm25", "none"), default="bm25")
    parser.add_argument("--protocol", choices=("full", "rerank", "both"), default="full")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K)
    parser.add_argument("--batch-size", type=int, default=64, help="texts per encoder batch")
    parser.add_argument(
        "--max-query-length",
        type=int,
        default=None,
        help="tokens per query (default: the checkpoint's config, else 50)",
    )
    parser.add_argument(
        "--max-document-length",
        type=int,
        default=None,
        help="tokens per document (default: the checkpoint's config, else 240)",
    )
    parser.add_argument("--index", choices=("flat", "ivf", "hnsw"), default="flat")
    parser.add_argument(
        "--ray-threshold",
        type=int,
        default=DEFAULT_RAY_THRESHOLD,
        help="encode on Ray when there are more texts than this",
    )
    parser.add_argument(
        "--ray", action="store_true", help="always encode through a Ray Data actor pool"
    )
    parser.add_argument(
        "--num-actors", type=int, default=0, help="Ray encoder actors (default: auto)"
    )
    parser.add_argument(
        "--address", default=None, help="Ray address (default: RAY_ADDRESS or local)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors")
    return with_exit_codes(parser)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse → evaluate → print the table."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    config = EvalConfig(
        split=args.split,
        output=args.output,
        baseline=None if args.baseline == "none" else args.baseline,
        protocol=args.protocol,
        max_query_length=args.max_query_length,
        max_document_length=args.max_document_length,
        top_k=args.top_k,
        batch_size=args.batch_size,
        use_ray=True if args.ray else None,
        ray_threshold=args.ray_threshold,
        ray_address=args.address,
        ray_options={"num_actors": args.num_actors},
        index_kind=args.index,
        progress=not args.no_progress,
    )

    def evaluate_and_print() -> int:
        check_input(args.data, "--data")
        if not args.output:
            return report(evaluate(args.checkpoint, args.data, config))
        check_writable(args.output, "--output")
        # One writer per output; published whole, so an interruption leaves it as it was.
        with (
            claim_output(args.output, "evaluate"),
            interrupts.keeping(lambda: f"no metrics were published; {args.output} is as it was"),
        ):
            return report(evaluate(args.checkpoint, args.data, config))

    def report(results) -> int:
        print(format_markdown(results), end="")
        if args.output:
            print(f"output: {args.output}")
        return 0

    return run_job(evaluate_and_print, argv)


if __name__ == "__main__":
    exit_with(main())
