"""Export a trained model as a plain Hugging Face folder (from local storage or S3).

    python -m ray_jobs.export --checkpoint s3://bucket/runs/demo/checkpoint_... --to models/demo
    python -m ray_jobs.export --latest s3://bucket/runs/demo --to models/demo
    python -m ray_jobs.export --best s3://bucket/sweeps/lr --to models/best
    python -m ray_jobs.export --latest runs/default/finetune --to models/st --format sentence-transformers

``--latest`` takes the newest complete checkpoint of a Ray Train run folder
(``storage_path/name``), as Ray recorded it; ``--best`` follows the ``best.json`` a Tune
sweep writes at its root. The folder at ``--to`` (config.json, model.safetensors, tokenizer
files, santa_config.json) loads with ``santa.load`` and with plain transformers; it is
written beside ``--to`` first and renamed into place, so it is never left half-written.
``--format sentence-transformers`` adds sentence-transformers' module files
(modules.json, pooling, Dense, Normalize where santa scores by cosine), so that
``SentenceTransformer(DIR)`` encodes as santa does (a decoder's last-token pooling and its
query/document prefixes as prompts; ``--dim N`` declares ``truncate_dim`` for a Matryoshka
model); T5 models (decoder-position-0 pooling) are refused with the reason. A LoRA
checkpoint's adapters are merged into the weights and an FSDP checkpoint's sharded weights
gathered, so the folder loads without peft or santa. Every folder gets a model card (README.md: Hugging Face
metadata, the training recipe and stages, the run's evaluation table beside BM25 when the
pipeline evaluated this checkpoint or ``--eval`` names a ``ray_jobs.evaluate`` output, how
to load it, the papers to cite). S3 credentials come from the standard AWS chain; the endpoint from ``AWS_ENDPOINT_URL``.
Errors are one line on stderr (``santa: error: ...``): exit status 2 when nothing complete
is found, the bucket is missing or the credentials are refused, 1 when S3 cannot be reached.
"""

from __future__ import annotations

import argparse

from santa.jobs.errors import exit_with, with_exit_codes

PROG = "python -m ray_jobs.export"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint", metavar="URI", help="a checkpoint folder (with model/) or a model folder"
    )
    source.add_argument(
        "--latest", metavar="RUN", help="a Ray Train run folder: its newest complete checkpoint"
    )
    source.add_argument(
        "--best", metavar="SWEEP", help="a Tune sweep root (or its best.json): the best checkpoint"
    )
    parser.add_argument("--to", required=True, metavar="DIR", help="local folder to write")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace DIR if it exists and is not empty"
    )
    parser.add_argument(
        "--format",
        choices=("hf", "sentence-transformers"),
        default="hf",
        help="hf: a Hugging Face folder; sentence-transformers: one SentenceTransformer(DIR) loads",
    )
    parser.add_argument(
        "--dim",
        type=int,
        metavar="N",
        help="sentence-transformers: encode to the first N dimensions (truncate_dim; a "
        "Matryoshka model)",
    )
    parser.add_argument(
        "--eval",
        metavar="URI",
        help="a ray_jobs.evaluate output folder whose table goes into the model card "
        "(default: the pipeline's evaluation of this checkpoint, if any)",
    )
    return with_exit_codes(parser)


def main(argv: list[str] | None = None) -> int:
    """Parse → lock --to → resolve → download → report."""
    from santa.jobs.lifecycle import Job

    args = build_parser().parse_args(argv)
    job = Job(
        "export",
        output=args.to,
        output_flag="--to",
        kept=lambda: f"nothing was written; {args.to} is as it was",
    )
    return job.main(lambda: _export(args), argv)


def _export(args: argparse.Namespace) -> int:
    from santa.models import checkpoints
    from santa.models.export import export_model

    if args.checkpoint:
        resolved = checkpoints.resolve_checkpoint(args.checkpoint)
    elif args.latest:
        resolved = checkpoints.latest_checkpoint(args.latest)
    else:
        resolved = checkpoints.best_checkpoint(args.best)
    evaluation = None
    if args.eval:
        from santa.models.card import read_evaluation

        evaluation = read_evaluation(args.eval)
        if evaluation is None:
            raise checkpoints.CheckpointError(
                f"--eval {args.eval}: no evaluation there (metrics.json and info.json)"
            )
    target, written = export_model(
        resolved,
        args.to,
        overwrite=args.overwrite,
        sentence_transformers=args.format == "sentence-transformers",
        evaluation=evaluation,
        dim=args.dim,
    )
    if written:
        print(f"sentence-transformers: {written}")
    step = "unknown" if resolved.step is None else resolved.step
    print(f"wrote {target} (step {step}) from {resolved.model_uri}")
    if args.best:
        facts = {
            key: value
            for key, value in resolved.details.items()
            if isinstance(value, str | int | float | bool)
        }
        if facts:
            print("best: " + ", ".join(f"{key}={value}" for key, value in sorted(facts.items())))
    return 0


if __name__ == "__main__":
    exit_with(main())
