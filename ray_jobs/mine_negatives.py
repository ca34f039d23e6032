"""The offline ANCE step: mine hard negatives with a trained model into a Parquet table.

    python -m ray_jobs.mine_negatives --checkpoint runs/ckpt/demo/checkpoint_... \\
        --data runs/csn-finetune --output runs/negatives [--top-k 100] [--sample 1]

Encodes every document and training query of ``--data`` (the preprocess job's output),
retrieves the top-K documents per query with faiss, drops every positive of the query,
duplicates of positives (normalized text) and hits scoring too close to the positive
(``--max-score-ratio``, ``--min-margin``: likely false negatives), samples ``--sample``
negatives per query (seeded) and writes ``negatives.parquet`` (query_id, negative_ids, and
the counts of what was dropped in its metadata) under ``--output``. Train on it with
``python -m ray_jobs.finetune ... --hard-negatives table:OUTPUT``.
"""

from __future__ import annotations

import argparse
import json
import logging

from santa.config import NegativesConfig, SantaConfig
from santa.jobs.errors import exit_with, with_exit_codes
from santa.jobs.lifecycle import Job
from santa.jobs.preflight import check_pairs
from santa.models.checkpoints import load_model
from santa.models.encoding import DEFAULT_MAX_DOCUMENT_LENGTH, DEFAULT_MAX_QUERY_LENGTH
from santa.negatives.corpus import load_mining_corpus
from santa.negatives.miner import refresh_table
from santa.negatives.table import NO_NEGATIVE, publish_table


def main(argv: list[str] | None = None) -> int:
    """Parse → load → mine → write."""
    parser = with_exit_codes(
        argparse.ArgumentParser(prog="python -m ray_jobs.mine_negatives", description=__doc__)
    )
    parser.add_argument("--checkpoint", required=True, help="model folder or checkpoint URI")
    parser.add_argument("--data", required=True, help="preprocessed pairs: local path or s3://")
    parser.add_argument("--output", required=True, help="where negatives.parquet goes")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--sample", type=int, default=1, help="negatives kept per query")
    parser.add_argument("--skip-top", type=int, default=0, help="hits skipped after positives")
    parser.add_argument(
        "--max-score-ratio",
        default=str(NegativesConfig().max_score_ratio).lower(),
        help="drop hits scoring above this share of the positive's score ('none': off)",
    )
    parser.add_argument(
        "--min-margin",
        default="none",
        help="drop hits scoring within this margin of the positive's score ('none': off)",
    )
    parser.add_argument("--index", choices=("flat", "ivf", "hnsw"), default="flat")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-query-length", type=int, default=None)
    parser.add_argument("--max-document-length", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    job = Job(
        "mine_negatives",
        output=args.output,
        kept=lambda: f"no table was published; {args.output} is as it was",
    )
    return job.main(lambda: _mine(args), argv, checks=[lambda: check_pairs(args.data)])


def _mine(args: argparse.Namespace) -> int:
    model, train = load_model(args.checkpoint)
    corpus = load_mining_corpus(args.data)
    config = SantaConfig().with_overrides(
        [
            f"negatives.per_query={args.sample}",
            f"negatives.top_k={args.top_k}",
            f"negatives.skip_top={args.skip_top}",
            f"negatives.index={args.index}",
            f"negatives.max_score_ratio={args.max_score_ratio}",
            f"negatives.min_margin={args.min_margin}",
            f"negatives.batch_size={args.batch_size}",
            f"train.seed={args.seed}",
            "train.max_query_length="
            f"{args.max_query_length or train.get('max_query_length', DEFAULT_MAX_QUERY_LENGTH)}",
            "train.max_document_length="
            + str(
                args.max_document_length
                or train.get("max_document_length", DEFAULT_MAX_DOCUMENT_LENGTH)
            ),
        ]
    )
    print(
        f"mining {args.sample} negative(s) per query for {corpus.num_queries} queries "
        f"among {corpus.num_docs} documents (top {args.top_k})"
    )
    table = refresh_table(model, corpus, config)
    target = publish_table(table, args.output, corpus)
    counts = (table.negatives != NO_NEGATIVE).sum(axis=1)  # (queries,)
    summary = {
        "output": target,
        "queries": int(len(counts)),
        "negatives": int(counts.sum()),
        "queries_short": int((counts < args.sample).sum()),
        "filtered": table.filtered,
        "build_s": round(table.build_s, 2),
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    exit_with(main())
