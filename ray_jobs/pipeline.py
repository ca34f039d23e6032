"""The whole method in one job: corpus → preprocess → pretrain → fine-tune → ANCE → report.

    python -m ray_jobs.pipeline                      # the embedded default, on a local Ray
    python -m ray_jobs.pipeline --stages pretrain    # structure-aware pretraining only
    python -m ray_jobs.pipeline --storage s3://bucket/runs --name csn --recipe codet5-base-code \\
        --data s3://bucket/csn-pretrain --eval-data s3://bucket/csn-eval --gpu

The paper's staged recipe, each stage starting from the previous stage's checkpoint:
``pretrain`` (SDA + MEP, in-batch negatives only), ``finetune`` (the DR loss, in-batch
negatives) and ``ance`` (one hard negative per query sampled from the top 100 the fine-tuned
model retrieves, positives removed, at a lower learning rate; ``--hard-negatives async``
re-mines them while training goes on instead). Stage settings come from the recipe family
(``<recipe>``, ``<recipe>-finetune``, ``<recipe>-ance``).

With no arguments it builds the default corpus (this interpreter's standard library as
CodeSearchNet-format records), preprocesses it (train / valid / test split by file, held-out
rows never in the training pairs), runs the ``pretrain`` and ``finetune`` stages of the
``minilm`` recipe (all-MiniLM-L6-v2, shipped with santa's dependencies; 20/10 steps at
batch 32, lengths 32/128; ``--stages pretrain,finetune,ance`` adds ANCE; ``--recipe tiny``
is the one-million-parameter T5 of the tests, SDA + MEP) on 2 workers, evaluates every
stage's model on the held-out test split beside the untrained model and BM25, indexes the
held-out corpus with the final model and shows three of its queries' top hits, and writes
everything under ``./runs/<name>/``: ``data/`` (pairs, BEIR sets), one Ray Train run per
stage (``<stage>/checkpoint_*``, ``metrics.jsonl``, ``tensorboard/``), ``negatives/`` (the
mined table, with ANCE), ``eval/`` (TREC runs, metrics), ``index/`` (search it with
``ray_jobs.search``), ``training.png`` and ``report.md``. Fine-tuning uses the pretraining
pairs' unmasked documents unless ``--finetune-data`` names other pairs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from ray_jobs.args import cluster_overrides, run_parser
from ray_jobs.pipeline_report import format_report, is_number, plot_history, read_history
from santa import storage
from santa.config import SantaConfig
from santa.data.source import default_source_root
from santa.errors import exit_with, run_job
from santa.recipes import PIPELINE_STAGES, stage_recipe
from santa.runlock import RunLock

logger = logging.getLogger("santa.pipeline")

# The default run: sized to finish in under 10 minutes on a 2-core laptop.
DEFAULT_STEPS = {
    "tiny": {"pretrain": 150, "finetune": 100, "ance": 50},
    "minilm": {"pretrain": 20, "finetune": 10, "ance": 10},
}
# With the default step budget, MiniLM also trains at a batch and lengths that fit it (and
# its dev evaluation runs once per stage, at the end).
DEFAULT_OVERRIDES = {
    "minilm": [
        "train.global_batch_size=32",
        "train.max_query_length=32",
        "train.max_document_length=128",
    ]
}
# The default MiniLM run leaves out ANCE: mining re-encodes all 5,400 training documents
# and queries, about 4 minutes of a 22M-parameter encoder on 2 CPU cores, for +0.005
# held-out MRR (bench/RESULTS.md). --stages pretrain,finetune,ance runs it.
DEFAULT_STAGES = {"minilm": "pretrain,finetune"}
# The recipe of a run that names none: all-MiniLM-L6-v2 (ships with santa's dependencies).
DEFAULT_RECIPE = "minilm"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The pipeline's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m ray_jobs.pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[
            run_parser(
                address_help="Ray address (default: RAY_ADDRESS, else a local Ray of its own)",
                max_steps_help="steps of every stage (default: the recipe's epochs; minilm: "
                "20/10/10, tiny: 150/100/50)",
            )
        ],
    )
    parser.add_argument("--name", default="default", help="run name (same name = resume)")
    parser.add_argument("--storage", default="./runs", help="local path or s3:// URI")
    parser.add_argument(
        "--stages",
        default=None,
        help="comma-separated stages to run, in order (default: pretrain,finetune,ance; the "
        "default MiniLM run: pretrain,finetune)",
    )
    parser.add_argument(
        "--input", default=None, help="source tree for the corpus (default: this Python's stdlib)"
    )
    parser.add_argument(
        "--data", default="", help="existing preprocessed training pairs (skips the corpus)"
    )
    parser.add_argument(
        "--finetune-data",
        default="",
        help="pairs for the finetune and ance stages (default: the pretraining pairs)",
    )
    parser.add_argument("--eval-data", default="", help="existing BEIR eval set (with --data)")
    parser.add_argument("--eval-split", default="test")
    parser.add_argument(
        "--hard-negatives",
        choices=("table", "async"),
        default="table",
        help="ance stage: mine once with the fine-tuned model (table, the paper) or re-mine "
        "while training (async)",
    )
    parser.add_argument("--baseline", choices=("bm25", "none"), default="bm25")
    parser.add_argument(
        "--no-index",
        action="store_true",
        help="skip the last step (index the held-out corpus, show example searches)",
    )
    parser.add_argument("--force", action="store_true", help="take over a stale run lock")
    parser.add_argument("--verbose", action="store_true", help="show Ray's own logs")
    parser.set_defaults(recipe=DEFAULT_RECIPE)
    args = parser.parse_args(argv)
    if bool(args.data) != bool(args.eval_data):
        parser.error("--data and --eval-data go together (or neither: build the default corpus)")
    if args.stages is None:
        default = DEFAULT_STAGES.get(args.recipe) if args.max_steps is None else None
        args.stages = default or ",".join(PIPELINE_STAGES)
    stages = [stage.strip() for stage in args.stages.split(",") if stage.strip()]
    unknown = [stage for stage in stages if stage not in PIPELINE_STAGES]
    if unknown or not stages:
        parser.error(f"--stages takes {', '.join(PIPELINE_STAGES)}; got {args.stages!r}")
    if stages != sorted(stages, key=PIPELINE_STAGES.index) or len(set(stages)) < len(stages):
        parser.error(f"--stages must be in the order {','.join(PIPELINE_STAGES)}, each once")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error("--max-steps must be a positive number of steps")
    args.stages = stages
    return args


def stage_config(args: argparse.Namespace, stage: str, negatives: str = "none") -> SantaConfig:
    """The stage's recipe with the cluster flags, its step budget and the user's --set."""
    config = stage_recipe(args.recipe, stage)
    overrides = [f"train.num_workers={args.num_workers}", *cluster_overrides(args)]
    steps = args.max_steps or DEFAULT_STEPS.get(args.recipe, {}).get(stage)
    if steps:
        overrides += [f"train.max_steps={steps}", f"train.checkpoint_every={max(1, steps // 2)}"]
    if not args.max_steps and args.recipe in DEFAULT_OVERRIDES:
        overrides += [*DEFAULT_OVERRIDES[args.recipe], f"train.eval_every={steps}"]
    if stage == "ance":
        overrides.append(f"train.hard_negatives={negatives}")
        if negatives == "async":
            overrides.append(f"train.negatives_refresh_every={max(1, (steps or 400) // 4)}")
    return config.with_overrides([*overrides, *args.overrides])


def build_corpus(args: argparse.Namespace, run_uri: str) -> tuple[str, str, str, dict]:
    """Preprocess the source tree: training pairs, dev (valid) and test BEIR sets."""
    from santa.data.outputs import matching_manifest
    from santa.data.pipeline import PreprocessConfig, run_preprocess

    source = args.input or default_source_root()
    outputs = {
        "pretrain": (storage.join(run_uri, "data", "pretrain"), "pretrain", "train"),
        "dev": (storage.join(run_uri, "data", "dev"), "eval", "valid"),
        "test": (storage.join(run_uri, "data", "test"), "eval", "test"),
    }
    reports = {}
    for key, (output, stage, split) in outputs.items():
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
        # Reused only when published whole and made with these options (not when an
        # interrupted run left parts, or the corpus came from other settings).
        manifest = matching_manifest(output, _corpus_options(config))
        if manifest is not None:
            print(f"[corpus] {key}: reusing {output}", flush=True)
            reports[key] = manifest
            continue
        print(f"[corpus] {key}: {source} → {output} ({stage}, {split})", flush=True)
        reports[key] = run_preprocess(config)
        print(
            f"[corpus] {key}: {reports[key]['rows_written']:,} rows in "
            f"{reports[key]['wall_time_s']:.1f}s",
            flush=True,
        )
    return outputs["pretrain"][0], outputs["dev"][0], outputs["test"][0], reports


def _corpus_options(config) -> dict[str, Any]:
    """The options that decide a corpus's rows (not how fast it was made)."""
    keys = ("dataset", "input", "stage", "split", "languages", "mask", "seed", "skip_tests")
    keys += ("max_query_chars", "max_document_chars", "esci_version", "locale")
    payload = config.to_dict()
    return {key: payload[key] for key in keys}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the pipeline; returns the report dict (also written as report.json / .md)."""
    for name in ("storage", "data", "finetune_data", "eval_data", "input"):
        if getattr(args, name, None):
            setattr(args, name, storage.absolute(getattr(args, name)))
    run_uri = storage.join(args.storage, args.name)
    configs = {stage: stage_config(args, stage) for stage in args.stages}  # fail fast
    preflight(args)
    with RunLock(run_uri, force=args.force, description="ray_jobs.pipeline"):
        return _run_locked(args, run_uri, configs)


def preflight(args: argparse.Namespace) -> None:
    """Inputs present, eval data loadable, storage writable: before any Ray work."""
    from santa.preflight import check_beir, check_input, check_pairs, check_writable

    if args.input:
        check_input(args.input, "--input")
    for name in ("data", "finetune_data"):
        if getattr(args, name, None):
            check_pairs(getattr(args, name), "--" + name.replace("_", "-"))
    if args.data and args.eval_data:
        check_beir(args.eval_data, args.eval_split)
    check_writable(args.storage, "--storage")


def _run_locked(args: argparse.Namespace, run_uri: str, configs: dict) -> dict[str, Any]:
    from santa.ray_utils import init_ray

    started = time.time()
    print(init_ray(args.address, verbose=args.verbose), flush=True)
    phases: dict[str, float] = {}
    if args.data:
        train_uri, dev_uri, test_uri, corpus_reports = args.data, "", args.eval_data, {}
    else:
        train_uri, dev_uri, test_uri, corpus_reports = build_corpus(args, run_uri)
    phases["corpus_s"] = time.time() - started

    stages: list[dict[str, Any]] = []
    previous = ""  # the model folder the next stage starts from
    for stage in args.stages:
        data = train_uri if stage == "pretrain" else (args.finetune_data or train_uri)
        negatives = "none"
        if stage == "ance":
            negatives = "async" if args.hard_negatives == "async" else ""
            table = storage.join(run_uri, "negatives", "negatives.parquet")
            if not negatives and storage.exists(table):  # a resumed run mined already
                negatives = f"table:{table}"
            if not negatives:
                mined_at = time.time()
                negatives = "table:" + mine_negatives(
                    previous, data, storage.join(run_uri, "negatives"), configs["ance"]
                )
                phases["mine_s"] = time.time() - mined_at
        config = stage_config(args, stage, negatives) if stage == "ance" else configs[stage]
        stages.append(train_stage(args, stage, config, data, dev_uri, previous, run_uri))
        phases[f"{stage}_s"] = stages[-1]["seconds"]
        previous = storage.join(stages[-1]["checkpoint"], "model")

    print(f"[eval] {test_uri} ({args.eval_split})", flush=True)
    evaluated_at = time.time()
    metrics, evaluated_with = evaluate_systems(
        trained={f"santa ({s['stage']})": storage.join(s["checkpoint"], "model") for s in stages},
        untrained=_initial_model(configs[args.stages[0]], storage.join(run_uri, args.stages[0]))
        if args.stages[0] == "pretrain"
        else None,
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
        "checkpoint": stages[-1]["checkpoint"],
        "data": {"train": train_uri, "dev": dev_uri, "test": test_uri},
        "corpus": {k: _corpus_summary(v) for k, v in corpus_reports.items()},
        "stages": [{k: v for k, v in s.items() if k != "history"} for s in stages],
        "final_metrics": stages[-1]["final_metrics"],
        "metrics": metrics,
        "evaluated_with": evaluated_with,
        "phases": phases,
    }
    storage.write_json(storage.join(run_uri, "report.json"), report)
    plot = plot_history(stages, run_uri)
    markdown = format_report(report, plot)
    storage.write_bytes(storage.join(run_uri, "report.md"), markdown.encode())
    print(markdown)
    if not args.no_index:
        from santa.search.demo import index_and_show

        print(f"[index] the held-out corpus with the final model ({stages[-1]['stage']})")
        indexed_at = time.time()
        report["index"] = index_and_show(
            previous, test_uri, storage.join(run_uri, "index"), split=args.eval_split
        )
        phases["index_s"] = time.time() - indexed_at
        phases["total_s"] = time.time() - started
        storage.write_json(storage.join(run_uri, "report.json"), report)
    print(f"outputs: {run_uri} (report.md, checkpoint {report['checkpoint']})", flush=True)
    print(f"wall time: {phases['total_s']:.0f} s", flush=True)
    return report


def train_stage(
    args: argparse.Namespace,
    stage: str,
    config: SantaConfig,
    data: str,
    dev_uri: str,
    warm_start: str,
    run_uri: str,
) -> dict[str, Any]:
    """One stage as its own Ray Train run ``RUN/<stage>``, warm-started from the last one."""
    from santa.train.trainer import RunSpec, fit

    train = config.train
    print(
        f"[{stage}] {args.recipe}: {train.max_steps or f'{train.epochs} epochs of'} steps, "
        f"lr {train.learning_rate:g}, {train.num_workers} workers, "
        f"hard negatives {train.hard_negatives}" + (f", from {warm_start}" if warm_start else ""),
        flush=True,
    )
    spec = RunSpec(
        data=data,
        storage=run_uri,
        name=stage,
        cpus_per_worker=args.cpus_per_worker,
        eval_data=dev_uri,
        eval_split="valid",
        warm_start=warm_start,
    )
    started = time.time()
    result = fit(config, spec)
    if result.error is not None or result.checkpoint is None:
        raise RuntimeError(f"{stage} training failed: {result.error}")
    final = read_history(spec.run_uri)
    return {
        "stage": stage,
        "checkpoint": _checkpoint_uri(result.checkpoint, args.storage),
        "learning_rate": train.learning_rate,
        "hard_negatives": train.hard_negatives.split(":", 1)[0],
        "final_metrics": {k: v for k, v in (result.metrics or {}).items() if is_number(v)},
        "history": final,
        "seconds": time.time() - started,
    }


def mine_negatives(
    model_uri: str, data: str, output: str, config: SantaConfig, *, label: str = "ance"
) -> str:
    """The ANCE step: top-K with the fine-tuned model, positives removed, ``n`` sampled.

    Also SCodeR's refresh of the top-K negatives (``ray_jobs.scoder``; ``label`` names the
    step in the progress line)."""
    from santa.checkpoints import load_model
    from santa.negatives.miner import MinerSettings, refresh_table
    from santa.negatives.mining import load_mining_corpus

    if not model_uri:
        raise ValueError("the ance stage mines with the previous stage's model: run finetune first")
    model, _ = load_model(model_uri)
    corpus = load_mining_corpus(data)
    settings = MinerSettings.from_config(config)
    print(
        f"[{label}] mining {settings.hard_negatives_per_query} negative(s) per query for "
        f"{len(corpus.queries):,} queries among {len(corpus.documents):,} documents "
        f"(top {settings.negatives_top_k}) with {model_uri}",
        flush=True,
    )
    encoder = None
    if settings.negatives_encoder_actors > 1 or settings.negatives_encoder_gpus > 0:
        from santa.negatives.encoders import EncoderPool

        encoder = EncoderPool(
            model_uri,
            None,
            actors=settings.negatives_encoder_actors,
            num_cpus=settings.negatives_encoder_cpus,
            num_gpus=settings.negatives_encoder_gpus,
            batch_size=settings.batch_size,
        )
    try:
        table = refresh_table(model, corpus, settings, encoder=encoder)
    finally:
        if encoder is not None:
            encoder.shutdown()
    return table.write_parquet(output)


def evaluate_systems(
    *,
    trained: dict[str, str],
    untrained: str | None,
    data: str,
    split: str,
    output: str,
    baseline: str | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every stage's model, the untrained one and the baseline on the same BEIR split."""
    from santa.eval import EvalConfig, evaluate

    systems: dict[str, dict[str, Any]] = {}
    evaluated_with: dict[str, Any] = {}
    if untrained:
        config = EvalConfig(
            split=split,
            output=storage.join(output, "untrained"),
            baseline=None,
            progress=sys.stderr.isatty(),
        )
        systems["untrained"] = evaluate(untrained, data, config)["model"]
    last = list(trained)[-1]
    for name, model in trained.items():
        folder = name.removeprefix("santa (").removesuffix(")")
        config = EvalConfig(
            split=split,
            output=storage.join(output, folder),
            baseline=baseline if name == last else None,
            progress=sys.stderr.isatty(),
        )
        results = evaluate(model, data, config)
        systems[name] = results.pop("model")
        if name == last:
            systems.update(results)  # the baseline, once
            evaluated_with = storage.read_json(storage.join(output, folder, "info.json"))
    return systems, {
        key: evaluated_with.get(key)
        for key in ("similarity", "pooling", "max_query_length", "max_document_length")
    }


def _initial_model(config: SantaConfig, stage_run: str) -> str | None:
    """The untrained model: the tiny init saved in the first stage's run, or the backbone."""
    if config.model.is_tiny:
        return storage.join(stage_run, "init_model")
    return config.model.backbone


def _checkpoint_uri(checkpoint, storage_root: str) -> str:
    path = checkpoint.path
    if storage.is_s3(storage_root) and not path.startswith("s3://"):
        return f"s3://{path}"
    return path


def _corpus_summary(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("rows_read", "rows_written", "dropped", "filtered", "entity_ratio", "wall_time_s")
    return {k: report.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    """Parse → run → print where the outputs are; errors as one line (``--debug``: more)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    return run_job(lambda: run(args) and 0, argv)


if __name__ == "__main__":
    exit_with(main())
