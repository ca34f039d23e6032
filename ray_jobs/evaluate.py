"""Evaluate a checkpoint (and BM25) under one of the protocols; print the metrics table.

    python -m ray_jobs.evaluate --checkpoint runs/ft/checkpoint_000003 --data runs/beir
    python -m ray_jobs.evaluate --checkpoint runs/ft --protocol codesearch \\
        --data data/CodeSearch --languages ruby go          # GraphCodeBERT's layout
    python -m ray_jobs.evaluate --checkpoint runs/ft --protocol advtest --data AdvTest/test.jsonl
    python -m ray_jobs.evaluate --checkpoint runs/ft --protocol esci --data runs/esci-test
    ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python -m ray_jobs.evaluate --checkpoint s3://b/ft/checkpoint_000003 \\
        --data s3://b/beir --output s3://b/eval

Protocols (santa.eval.protocols): ``retrieval`` (the default; BEIR, every query against the
split's whole corpus), ``codesearch`` (SANTA Table 6: each language's queries against its
own codebase, MRR per language and the mean), ``advtest`` (CodeXGLUE's AdvTest MRR) and
``esci`` (SANTA Table 2: each query's judged products, two- and four-class NDCG@100).
Earlier spellings still work: ``full`` is ``retrieval``; ``rerank`` and ``both`` re-rank (or
also re-rank) a BEIR folder's judged candidates, santa's own ESCI re-ranking (``esci`` is
the paper's, averaging every query as trec_eval -c).

``--checkpoint`` takes a Ray checkpoint folder (its ``model/``), a Ray Train run folder
(its newest checkpoint), a sweep's ``best.json``, a santa or Hugging Face model folder, or
an ``s3://`` URI of one of these. The BEIR folder is what ``ray_jobs.preprocess
--stage eval`` writes. Encoding runs in this process unless the corpus outnumbers
``--ray-threshold`` texts (or ``--ray`` forces it): then a Ray Data actor pool encodes on
the cluster (GPUs when it has some) and Ray is started or joined only then.

``--output`` is published whole: written beside and renamed in (locally), or under
``runs/<run id>/`` named by the manifest ``report.json`` written last (S3).
"""

from __future__ import annotations

import argparse
import logging

from santa.data.schema import CODE_LANGUAGES
from santa.eval import DEFAULT_RAY_THRESHOLD, DEFAULT_TOP_K, EvalConfig
from santa.eval.evaluation import CODE_TEXTS
from santa.eval.metrics import DEFAULT_BLOCK_SIZE
from santa.eval.protocols import PROTOCOLS, run_and_publish
from santa.jobs.errors import exit_with, with_exit_codes
from santa.jobs.lifecycle import Job
from santa.jobs.preflight import check_input

# Spellings of --protocol from before the papers' protocols: variants of `retrieval`.
LEGACY_PROTOCOLS = {"full": "full", "rerank": "rerank", "both": "both"}
LANGUAGES_HELP = "codesearch: the languages to evaluate (default: every one in --data)"
LENGTHS_HELP = (
    "(default: the length the checkpoint was trained with, else a sentence-transformers "
    "folder's max_seq_length, else {}; printed below the table)"
)
GAINS_HELP = "esci four-class gains: SANTA's script (S 0.01, C 0.1) or Table 2's caption's"
CODE_TEXT_HELP = (
    "codesearch/advtest candidates: code tokens joined (SANTA's script), source without "
    "comments (GraphCodeBERT) or without its docstring (as santa trains)"
)
RAY_THRESHOLD_HELP = "encode on Ray when there are more texts than this"
BLOCK_SIZE_HELP = "queries scored and written to the TREC run at a time (bounds memory)"


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--checkpoint", required=True, help="model: checkpoint, run or model folder (or s3://)")
    add("--data", required=True, help="BEIR folder: local path or s3:// URI")
    add("--split", default="test", help="split: qrels/{split}.tsv, {lang}/{split}.jsonl (test)")
    add("--output", help="where metrics.json/.md and TREC runs go (optional)")
    add("--baseline", choices=("bm25", "none"), default="bm25")
    add(
        "--protocol",
        choices=(*PROTOCOLS, *LEGACY_PROTOCOLS),
        default="retrieval",
        metavar="{" + ",".join(PROTOCOLS) + "}",
        help="how to evaluate (default: retrieval; full, rerank, both: retrieval's variants)",
    )
    add("--languages", nargs="*", choices=CODE_LANGUAGES, default=[], help=LANGUAGES_HELP)
    add("--top-k", type=int, default=DEFAULT_TOP_K)
    add("--batch-size", type=int, default=64, help="texts per encoder batch")
    add("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help=BLOCK_SIZE_HELP)
    add("--max-query-length", type=int, help="query tokens " + LENGTHS_HELP.format(50))
    add("--max-document-length", type=int, help="document tokens " + LENGTHS_HELP.format(240))
    add("--esci-gains", choices=("released", "paper"), default="released", help=GAINS_HELP)
    add("--code-text", choices=CODE_TEXTS, default="released", help=CODE_TEXT_HELP)
    add("--index", choices=("flat", "ivf", "hnsw"), default="flat")
    add("--dim", type=int, help="score the first DIM dimensions only (a Matryoshka model)")
    add("--ray-threshold", type=int, default=DEFAULT_RAY_THRESHOLD, help=RAY_THRESHOLD_HELP)
    add("--ray", action="store_true", help="always encode through a Ray Data actor pool")
    add("--num-actors", type=int, default=0, help="Ray encoder actors (default: auto)")
    add("--address", help="Ray address (default: RAY_ADDRESS or local)")
    add("--no-progress", action="store_true", help="hide progress bars")
    add("--debug", action="store_true", help="tracebacks on errors")
    return with_exit_codes(parser)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse → evaluate → print the table."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.languages and args.protocol != "codesearch":
        parser.error("--languages selects CodeSearch languages: use it with --protocol codesearch")
    protocol = "retrieval" if args.protocol in LEGACY_PROTOCOLS else args.protocol
    config = EvalConfig(
        split=args.split,
        baseline=None if args.baseline == "none" else args.baseline,
        protocol=LEGACY_PROTOCOLS.get(args.protocol, "full"),
        max_query_length=args.max_query_length,
        max_document_length=args.max_document_length,
        esci_gains=args.esci_gains,
        code_text=args.code_text,
        top_k=args.top_k,
        batch_size=args.batch_size,
        block_size=args.block_size,
        use_ray=True if args.ray else None,
        ray_threshold=args.ray_threshold,
        ray_address=args.address,
        ray_options={"num_actors": args.num_actors},
        index_kind=args.index,
        progress=not args.no_progress,
        dim=args.dim,
    )

    def evaluate_and_print() -> int:
        outcome = run_and_publish(
            protocol,
            args.checkpoint,
            args.data,
            config,
            output=args.output,
            languages=args.languages,
        )
        print(outcome.markdown, end="")
        if args.output:
            print(f"output: {args.output}")
        return 0

    kept = f"no metrics were published; {args.output} is as it was" if args.output else ""
    job = Job("evaluate", output=args.output or "", kept=lambda: kept)
    return job.main(evaluate_and_print, argv, checks=[lambda: check_input(args.data, "--data")])


if __name__ == "__main__":
    exit_with(main())
