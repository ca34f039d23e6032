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
``SentenceTransformer(DIR)`` encodes as santa does; T5 models (decoder-position-0 pooling)
are refused with the reason. S3 credentials come from the standard AWS chain; the endpoint from ``AWS_ENDPOINT_URL``.
Errors are one line on stderr (``santa: error: ...``): exit status 2 when nothing complete
is found, the bucket is missing or the credentials are refused, 1 when S3 cannot be reached.
"""

from __future__ import annotations

import argparse

from santa.runtime.errors import exit_with, run_job, with_exit_codes

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
    return with_exit_codes(parser)


def main(argv: list[str] | None = None) -> int:
    """Parse → resolve → download → report."""
    args = build_parser().parse_args(argv)
    return run_job(lambda: export(args), argv)


def export(args: argparse.Namespace) -> int:
    """Resolve → download → report."""
    from santa.data.outputs import claim_output
    from santa.runtime import interrupts
    from santa.runtime.preflight import check_writable

    check_writable(args.to, "--to")
    with (
        claim_output(args.to, "export", "--to"),
        interrupts.keeping(lambda: f"nothing was written; {args.to} is as it was"),
    ):
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    from santa.models import checkpoints

    if args.checkpoint:
        resolved = checkpoints.resolve_checkpoint(args.checkpoint)
    elif args.latest:
        resolved = checkpoints.latest_checkpoint(args.latest)
    else:
        resolved = checkpoints.best_checkpoint(args.best)
    if args.format == "sentence-transformers":
        target, written = _export_sentence_transformers(resolved, args.to, args.overwrite)
        print(f"sentence-transformers: {written}")
    else:
        target = checkpoints.download(resolved, args.to, overwrite=args.overwrite)
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


def _export_sentence_transformers(resolved, to: str, overwrite: bool):
    """Download into a hidden folder beside ``to``, add the module files, rename into place."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from santa.models import checkpoints
    from santa.search.st_export import write_sentence_transformers_files

    target = Path(os.path.abspath(os.path.expanduser(to)))
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not overwrite:
        raise checkpoints.CheckpointError(
            f"{target} already exists and is not empty (pass --overwrite)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        folder = checkpoints.download(resolved, staging / "model")
        written = write_sentence_transformers_files(folder)
        checkpoints._move_into_place(folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, written


if __name__ == "__main__":
    exit_with(main())
