"""The whole method in one job: corpus → preprocess → pretrain → evaluate → report.

    python -m ray_jobs.pipeline                      # the embedded default, on a local Ray
    python -m ray_jobs.pipeline --storage s3://bucket/runs --name csn --recipe codet5-base-code \\
        --data s3://bucket/csn-pretrain --eval-data s3://bucket/csn-eval --gpu

With no arguments it builds the default corpus (this interpreter's standard library as
CodeSearchNet-format records), preprocesses it (train / valid / test split by file, held-out
rows never in the training pairs), pretrains the ``tiny`` recipe with SDA + MEP on 2 workers
with asynchronous hard negatives, evaluates the trained model zero-shot on the held-out test
split against the untrained model and BM25, and writes everything under
``./runs/<name>/``: ``data/`` (pairs, BEIR sets), the Ray Train run (``checkpoint_*``,
``init_model/``, ``tensorboard/``), ``eval/`` (TREC runs, metrics), ``training.png`` and
``report.md``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from ray_jobs.args import recipe_config, run_parser
from santa import storage
from santa.config import get_recipe
from santa.data.source import default_source_root

logger = logging.getLogger("santa.pipeline")

# The default run: sized to finish in a few minutes on a 2-core laptop.
DEFAULT_STEPS = {"tiny": 300}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The pipeline's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[run_parser(address_help="Ray address (default: RAY_ADDRESS)")],
    )
    parser.add_argument("--name", default="default", help="run name (same name = resume)")
    parser.add_argument("--storage", default="./runs", help="local path or s3:// URI")
    parser.add_argument(
        "--input", default=None, help="source tree for the corpus (default: this Python's stdlib)"
    )
    parser.add_argument(
        "--data", default="", help="existing preprocessed training pairs (skips the corpus)"
    )
    parser.add_argument("--eval-data", default="", help="existing BEIR eval set (with --data)")
    parser.add_argument("--eval-split", default="test")
    parser.add_argument(
        "--hard-negatives",
        default="async",
        metavar="{none,table:URI,async}",
        help="hard negatives during pretraining (default: async miner actor)",
    )
    parser.add_argument("--baseline", choices=("bm25", "none"), default="bm25")
    args = parser.parse_args(argv)
    if bool(args.data) != bool(args.eval_data):
        parser.error("--data and --eval-data go together (or neither: build the default corpus)")
    return args


def build_config(args: argparse.Namespace):
    """The recipe with the pipeline's settings and the user's overrides."""
    recipe = get_recipe(args.recipe)
    overrides = ["train.stage=pretrain"]
    steps = args.max_steps or DEFAULT_STEPS.get(args.recipe)
    if steps:
        overrides.append(f"train.max_steps={steps}")
        overrides.append(f"train.checkpoint_every={max(1, steps // 3)}")
    if args.hard_negatives != "none":
        overrides.append(f"train.hard_negatives={args.hard_negatives}")
        if recipe.train.hard_negatives_per_query < 1:
            overrides.append("train.hard_negatives_per_query=1")
        overrides.append(f"train.negatives_refresh_every={max(1, (steps or 300) // 4)}")
    return recipe_config(args, overrides)


def build_corpus(args: argparse.Namespace, run_uri: str) -> tuple[str, str, str, dict]:
    """Preprocess the source tree: training pairs, dev (valid) and test BEIR sets."""
    from santa.data.pipeline import PreprocessConfig, run_preprocess

    source = args.input or default_source_root()
    outputs = {
        "pretrain": (storage.join(run_uri, "data", "pretrain"), "pretrain", "train"),
        "dev": (storage.join(run_uri, "data", "dev"), "eval", "valid"),
        "test": (storage.join(run_uri, "data", "test"), "eval", "test"),
    }
    reports = {}
    for key, (output, stage, split) in outputs.items():
        report_uri = storage.join(output, "report.json")
        if storage.exists(report_uri):
            print(f"[corpus] {key}: reusing {output}", flush=True)
            reports[key] = storage.read_json(report_uri)
            continue
        print(f"[corpus] {key}: {source} → {output} ({stage}, {split})", flush=True)
        config = PreprocessConfig(
            dataset="source",
            input=source,
            output=output,
            stage=stage,
            split=split,
            languages=("python",) if not args.input else (),
            # The stdlib's own test suite is a third of its files and few docstrings.
            skip_tests=not args.input,
        )
        reports[key] = run_preprocess(config)
        print(
            f"[corpus] {key}: {reports[key]['rows_written']:,} rows in "
            f"{reports[key]['wall_time_s']:.1f}s",
            flush=True,
        )
    return outputs["pretrain"][0], outputs["dev"][0], outputs["test"][0], reports


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the pipeline; returns the report dict (also written as report.json / .md)."""
    from santa.ray_utils import init_ray
    from santa.train.trainer import RunSpec, fit

    started = time.time()
    config = build_config(args)
    for name in ("storage", "data", "eval_data", "input"):
        if getattr(args, name, None):
            setattr(args, name, storage.absolute(getattr(args, name)))
    run_uri = storage.join(args.storage, args.name)
    print(init_ray(args.address), flush=True)
    phases: dict[str, float] = {}

    if args.data:
        train_uri, dev_uri, test_uri, corpus_reports = args.data, "", args.eval_data, {}
    else:
        train_uri, dev_uri, test_uri, corpus_reports = build_corpus(args, run_uri)
    phases["corpus_s"] = time.time() - started

    print(
        f"[train] {args.recipe}: {config.train.max_steps} steps, {args.num_workers} workers, "
        f"hard negatives {config.train.hard_negatives}",
        flush=True,
    )
    spec = RunSpec(
        data=train_uri,
        storage=args.storage,
        name=args.name,
        cpus_per_worker=args.cpus_per_worker,
        eval_data=dev_uri,
        eval_split="valid",
    )
    trained_at = time.time()
    result = fit(config, spec)
    phases["train_s"] = time.time() - trained_at
    if result.error is not None or result.checkpoint is None:
        raise RuntimeError(f"training failed: {result.error}")
    checkpoint_uri = _checkpoint_uri(result.checkpoint, args.storage)
    history = _history(result)

    print(f"[eval] {test_uri} ({args.eval_split})", flush=True)
    evaluated_at = time.time()
    metrics = evaluate_systems(
        trained=storage.join(checkpoint_uri, "model"),
        untrained=_initial_model(config, run_uri),
        data=test_uri,
        split=args.eval_split,
        output=storage.join(run_uri, "eval"),
        baseline=None if args.baseline == "none" else args.baseline,
    )
    phases["evaluate_s"] = time.time() - evaluated_at
    phases["total_s"] = time.time() - started

    report = {
        "name": args.name,
        "recipe": args.recipe,
        "run": run_uri,
        "checkpoint": checkpoint_uri,
        "data": {"train": train_uri, "dev": dev_uri, "test": test_uri},
        "corpus": {k: _corpus_summary(v) for k, v in corpus_reports.items()},
        "final_metrics": {k: v for k, v in (result.metrics or {}).items() if _is_number(v)},
        "metrics": metrics,
        "phases": phases,
        "config": config.to_dict(),
    }
    storage.write_json(storage.join(run_uri, "report.json"), report)
    plot = _plot_history(history, run_uri)
    markdown = format_report(report, plot)
    storage.write_bytes(storage.join(run_uri, "report.md"), markdown.encode())
    print(markdown)
    print(f"outputs: {run_uri} (report.md, checkpoint {checkpoint_uri})", flush=True)
    return report


def evaluate_systems(
    *, trained: str, untrained: str | None, data: str, split: str, output: str, baseline
) -> dict[str, dict[str, Any]]:
    """The trained model, the untrained one and the baseline on the same BEIR split."""
    from santa.eval import EvalConfig, evaluate

    results = evaluate(trained, data, EvalConfig(split=split, output=output, baseline=baseline))
    systems = {"santa (trained)": results.pop("model")}
    if untrained:
        zero_shot_config = EvalConfig(
            split=split, output=storage.join(output, "untrained"), baseline=None, progress=False
        )
        zero_shot = evaluate(untrained, data, zero_shot_config)
        systems["untrained"] = zero_shot["model"]
    systems.update(results)
    return systems


def format_report(report: dict[str, Any], plot: str | None) -> str:
    """``report.md``: the metrics table, training summary and where things are."""
    from santa.eval import format_markdown

    final = report["final_metrics"]
    lines = [
        f"# santa pipeline: {report['name']}",
        "",
        f"Recipe `{report['recipe']}`; evaluated on `{report['data']['test']}`.",
        "",
        "## Retrieval (held-out split)",
        "",
        format_markdown(report["metrics"]).strip(),
        "",
        "## Training",
        "",
        "| step | loss | loss_sda | loss_mep | dev_mrr | pairs/s | negatives swaps |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        "| {} | {:.4f} | {:.4f} | {:.4f} | {} | {:.1f} | {} |".format(
            int(final.get("step", 0)),
            final.get("loss", float("nan")),
            final.get("loss_sda", float("nan")),
            final.get("loss_mep", float("nan")),
            f"{final['dev_mrr']:.4f}" if "dev_mrr" in final else "-",
            final.get("pairs_per_s", 0.0),
            int(final.get("negatives_swaps", 0)),
        ),
        "",
    ]
    if plot:
        lines += [f"![training curves]({plot.rsplit('/', 1)[-1]})", ""]
    if report["corpus"]:
        lines += [
            "## Corpus",
            "",
            "| set | rows read | rows written | wall s |",
            "|---|---:|---:|---:|",
        ]
        for key, summary in report["corpus"].items():
            lines.append(
                f"| {key} | {summary['rows_read']:,} | {summary['rows_written']:,} "
                f"| {summary['wall_time_s']:.1f} |"
            )
        lines.append("")
    phases = report["phases"]
    lines += [
        "## Time",
        "",
        " · ".join(f"{k.removesuffix('_s')} {v:.0f}s" for k, v in phases.items()),
        "",
        "## Where things are",
        "",
        f"- run: `{report['run']}` (TensorBoard: `tensorboard --logdir {report['run']}`)",
        f"- final checkpoint: `{report['checkpoint']}`",
        f"- metrics and TREC runs: `{storage.join(report['run'], 'eval')}`",
        "",
    ]
    return "\n".join(lines)


def _initial_model(config, run_uri: str) -> str | None:
    """The untrained model: the tiny init saved in the run, or the recipe's backbone."""
    if config.model.is_tiny:
        return storage.join(run_uri, "init_model")
    return config.model.backbone


def _checkpoint_uri(checkpoint, storage_root: str) -> str:
    path = checkpoint.path
    if storage.is_s3(storage_root) and not path.startswith("s3://"):
        return f"s3://{path}"
    return path


def _history(result) -> list[dict[str, float]]:
    frame = getattr(result, "metrics_dataframe", None)
    if frame is None or frame.empty:
        return []
    return frame.to_dict("records")


def _plot_history(history: list[dict[str, float]], run_uri: str) -> str | None:
    """``training.png``: losses and dev MRR over the steps."""
    points = [h for h in history if _is_number(h.get("step")) and _is_number(h.get("loss"))]
    if not points:
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in points]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key in ("loss", "loss_sda", "loss_mep"):
        left.plot(steps, [h.get(key, float("nan")) for h in points], label=key)
    left.set_xlabel("step")
    left.set_title("training losses")
    left.legend()
    dev = [(h["step"], h["dev_mrr"]) for h in points if _is_number(h.get("dev_mrr"))]
    if dev:
        right.plot(*zip(*dev, strict=True), marker="o")
    right.set_xlabel("step")
    right.set_title("dev MRR@100")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    target = storage.join(run_uri, "training.png")
    storage.write_bytes(target, buffer.getvalue())
    return target


def _corpus_summary(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("rows_read", "rows_written", "dropped", "filtered", "entity_ratio", "wall_time_s")
    return {k: report.get(k) for k in keys}


def _is_number(value: Any) -> bool:
    import math

    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def main(argv: list[str] | None = None) -> int:
    """Parse → run → print where the outputs are."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    try:
        run(args)
    except (ValueError, RuntimeError, storage.StorageError) as error:
        print(f"python -m ray_jobs.pipeline: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
