"""The paper's staged recipe as one call: corpus → pretrain → fine-tune → ANCE → evaluation.

Each stage starts from the previous stage's checkpoint: ``pretrain`` (SDA + MEP, in-batch
negatives only), ``finetune`` (the DR loss, in-batch negatives) and ``ance`` (one hard
negative per query sampled from the top 100 the fine-tuned model retrieves, positives
removed, at a lower learning rate; ``hard_negatives="async"`` re-mines them while training
goes on instead). Stage settings come from the recipe family (``<recipe>``,
``<recipe>-finetune``, ``<recipe>-ance``).

Without preprocessed data it builds the default corpus (a source tree, by default this
interpreter's standard library, as CodeSearchNet-format records): training pairs and the
dev / test BEIR sets, split by file, held-out rows never in the training pairs. Every
stage's model is evaluated on the test split beside the untrained model and BM25. Where
everything lands: :class:`~santa.files.layout.RunLayout`. A rerun with the same run
folder reuses the corpus, the mined table and every finished stage, and resumes training.

    from santa.pipeline import PipelineSpec, run_pipeline
    report = run_pipeline(PipelineSpec(name="csn", recipe="codet5-base-code", data=..., ...))
"""

from __future__ import annotations

import time
from typing import Any

from santa.config import SantaConfig
from santa.files import storage
from santa.files.layout import RunLayout, checkpoint_model
from santa.negatives.offline import mine_negatives
from santa.negatives.table import published_table
from santa.pipeline.report import format_report, is_number, read_history
from santa.pipeline.spec import PipelineSpec, stage_config

__all__ = ["run_pipeline", "train_stage"]


def preflight(spec: PipelineSpec) -> None:
    """Inputs present, eval data loadable: before any lock or Ray work (the storage is
    checked writable by the job, :class:`santa.jobs.lifecycle.Job`)."""
    from santa.jobs.preflight import check_beir, check_input, check_pairs

    if spec.input:
        check_input(spec.input, "--input")
    for name in ("data", "finetune_data"):
        if getattr(spec, name):
            check_pairs(getattr(spec, name), "--" + name.replace("_", "-"))
    if spec.data and spec.eval_data:
        check_beir(spec.eval_data, spec.eval_split)


def run_pipeline(
    spec: PipelineSpec,
    *,
    address: str | None = None,
    verbose: bool = False,
    progress: bool = False,
    force: bool = False,
) -> dict[str, Any]:
    """The pipeline job (from Python as from ``ray_jobs.pipeline``): check, lock the run
    folder, start or join Ray, run the stages; returns the report (also written as
    ``report.json`` / ``report.md``). ``progress``: Ray Data's bars."""
    from santa.jobs.lifecycle import Job

    configs = {stage: stage_config(spec, stage) for stage in spec.stages}  # fail fast
    done: list[str] = []  # the stages finished so far (for an interruption's line)
    job = Job(
        "pipeline",
        run=spec.layout.root,
        storage=spec.storage,
        force=force,
        kept=lambda: (
            f"pipeline {spec.layout.root}: "
            + (f"stages {', '.join(done)} done" if done else "no stage finished yet")
        ),
        hint=resume_hint(spec),
    )
    with job.running(checks=[lambda: preflight(spec)]):
        job.start_ray(address, verbose=verbose, progress=progress)
        check_resources(spec, configs)
        return _run(spec, configs, done)


def _index_holds(spec: PipelineSpec) -> str:
    """Where the demo index's documents come from, for its one line."""
    if spec.data:
        return f"the documents of {spec.eval_data}, its dev set and {spec.data}"
    if spec.input:
        return f"every function with a docstring or doc comment under {spec.input}"
    return (
        "every Python function with a docstring in this Python's standard library "
        "(outside its test suites)"
    )


def resume_hint(spec: PipelineSpec) -> str:
    """What an interrupted pipeline's last line says a rerun reuses: only what this run
    makes (a corpus it builds, a table it mines), and its finished stages."""
    reused = []
    if not spec.data:
        reused.append("the corpus")
    if "ance" in spec.stages and spec.hard_negatives == "table":
        reused.append("the mined table")
    reused.append("finished stages")
    listed = ", ".join(reused[:-1]) + (" and " if len(reused) > 1 else "") + reused[-1]
    return f"run the same command to resume ({listed} are reused)"


def check_resources(spec: PipelineSpec, configs: dict[str, SantaConfig]) -> None:
    """Every stage's resource plan against the cluster, before the corpus (minutes) is
    built: a plan it can never hold fails now, in one line (``santa.cluster.resources``)."""
    from santa.cluster.resources import check_plan
    from santa.train.trainer import run_plan

    announced = False  # what the run waits for is said once
    if spec.in_process:  # the stages ask Ray for nothing
        return
    for stage, config in configs.items():
        if stage == "ance" and spec.hard_negatives == "async":
            config = stage_config(spec, stage, "async")
        plan = run_plan(config, spec.cpus_per_worker)
        outcome = check_plan(plan, job=f"the {stage} stage", announce=not announced)
        announced = announced or outcome == "waits"


def _run(
    spec: PipelineSpec, configs: dict[str, SantaConfig], done: list[str] | None = None
) -> dict[str, Any]:
    layout = spec.layout
    done = [] if done is None else done
    started = time.time()
    phases: dict[str, float] = {}
    if spec.data:
        train_uri, dev_uri, test_uri, corpus_reports = spec.data, "", spec.eval_data, {}
    else:
        train_uri, dev_uri, test_uri, corpus_reports = build_corpus(spec, layout)
    phases["corpus_s"] = time.time() - started

    stages: list[dict[str, Any]] = []
    previous = ""  # the model folder the next stage starts from
    mining: dict[str, Any] = {}
    for stage in spec.stages:
        data = train_uri if stage == "pretrain" else (spec.finetune_data or train_uri)
        negatives = "none"
        if stage == "ance":
            negatives = "async" if spec.hard_negatives == "async" else ""
            mined = published_table(layout.negatives) if not negatives else None
            if mined:  # mined already
                negatives = f"table:{mined}"
            if not negatives:
                mined_at = time.time()
                negatives = "table:" + mine_negatives(
                    previous, data, layout.negatives, configs["ance"]
                )
                phases["mine_s"] = time.time() - mined_at
            if negatives.startswith("table:"):
                mining = _mining_summary(negatives.removeprefix("table:"), configs["ance"])
        config = stage_config(spec, stage, negatives) if stage == "ance" else configs[stage]
        stages.append(train_stage(spec, stage, config, data, dev_uri, previous))
        done.append(stage)
        phases[f"{stage}_s"] = stages[-1]["seconds"]
        previous = checkpoint_model(stages[-1]["checkpoint"])

    print(f"[eval] {test_uri} ({spec.eval_split})", flush=True)
    evaluated_at = time.time()
    first = spec.stages[0]
    metrics, evaluated_with = evaluate_systems(
        trained={f"santa ({s['stage']})": checkpoint_model(s["checkpoint"]) for s in stages},
        untrained=_initial_model(configs[first], layout.stage(first))
        if first == "pretrain"
        else None,
        data=test_uri,
        split=spec.eval_split,
        layout=layout,
        baseline=None if spec.baseline == "none" else spec.baseline,
        lengths=_lengths(configs[spec.stages[-1]]),
    )
    phases["evaluate_s"] = time.time() - evaluated_at
    phases["total_s"] = time.time() - started
    _track_evaluation(spec, stages, metrics)

    report = {
        "name": spec.name,
        "recipe": spec.recipe,
        "run": layout.root,
        "checkpoint": stages[-1]["checkpoint"],
        "data": {"train": train_uri, "dev": dev_uri, "test": test_uri},
        "corpus": {k: _corpus_summary(v) for k, v in corpus_reports.items()},
        "stages": [{k: v for k, v in s.items() if k != "history"} for s in stages],
        "final_metrics": stages[-1]["final_metrics"],
        "metrics": metrics,
        "evaluated_with": evaluated_with,
        "phases": phases,
        "mining": mining,
    }
    storage.write_json(layout.report, report)
    from santa.pipeline.plots import markdown_page, pipeline_figures, write_figures

    plots = write_figures(pipeline_figures(report, stages), layout.root)
    markdown = format_report(report, plots)
    storage.write_bytes(layout.report_markdown, markdown.encode())
    page = markdown_page(markdown, f"santa pipeline: {spec.name}")
    storage.write_bytes(layout.report_html, page.encode())
    print(markdown)
    if spec.index:
        from santa.search.demo import index_and_show

        print(f"[index] the run's corpus with the final model ({stages[-1]['stage']})")
        indexed_at = time.time()
        # Every function the corpus job read, not only the held-out split: an everyday
        # question ("shuffle a list") then finds its function.
        report["index"] = index_and_show(
            previous,
            test_uri,
            layout.index,
            split=spec.eval_split,
            more_corpora=(("dev", dev_uri), ("training", train_uri)),
            holds=_index_holds(spec),
        )
        phases["index_s"] = time.time() - indexed_at
        phases["total_s"] = time.time() - started
        storage.write_json(layout.report, report)
    print(
        f"outputs: {layout.root} (report.md, report.html, checkpoint {report['checkpoint']})",
        flush=True,
    )
    print(f"wall time: {phases['total_s']:.0f} s", flush=True)
    return report


def _track_evaluation(
    spec: PipelineSpec, stages: list[dict[str, Any]], metrics: dict[str, Any]
) -> None:
    """Each stage's tracked run gets its model's held-out metrics, the baseline beside."""
    from santa.train.tracking import Tracking, tracking_warning

    tracking = Tracking.from_dict(spec.tracking)
    if not tracking.active:
        return
    baselines = {k: v for k, v in metrics.items() if not k.startswith(("santa (", "untrained"))}
    for stage in stages:
        layout = spec.layout.stage(stage["stage"])
        try:
            tracked = tracking.begin(run_uri=layout.root, name=layout.name, params={})
        except Exception as error:  # noqa: BLE001 - the report still gets written
            tracking_warning(f"the {stage['stage']} stage's evaluation was not tracked", error)
            continue
        ours = metrics.get(f"santa ({stage['stage']})") or {}
        tracked.finish(evaluation={"model": ours, **baselines})


def _mining_summary(table: str, config: SantaConfig) -> dict[str, Any]:
    """The mined table and what its false-negative filter dropped, for the report."""
    from santa.negatives.table import read_filtered_counts

    negatives = config.negatives
    return {
        "table": table,
        "max_score_ratio": negatives.max_score_ratio,
        "min_margin": negatives.min_margin,
        "filtered": read_filtered_counts(table),
    }


def build_corpus(spec: PipelineSpec, layout: RunLayout) -> tuple[str, str, str, dict]:
    """Preprocess the source tree: training pairs, dev (valid) and test BEIR sets."""
    from santa.data.plan import PreprocessConfig, run_preprocess
    from santa.data.source import default_source_root
    from santa.files.outputs import matching_manifest

    source = spec.input or default_source_root()
    outputs = {
        "pretrain": (layout.data("pretrain"), "pretrain", "train"),
        "dev": (layout.data("dev"), "eval", "valid"),
        "test": (layout.data("test"), "eval", "test"),
    }
    reports = {}
    for key, (output, stage, split) in outputs.items():
        config = PreprocessConfig(
            dataset="source",
            input=source,
            output=output,
            stage=stage,
            split=split,
            languages=("python",) if not spec.input else (),
            # The stdlib's own test suite is a third of its files and few docstrings.
            skip_tests=not spec.input,
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


def train_stage(
    spec: PipelineSpec,
    stage: str,
    config: SantaConfig,
    data: str,
    dev_uri: str,
    warm_start: str,
) -> dict[str, Any]:
    """One stage as its own training run ``RUN/<stage>``, warm-started from the last one;
    a stage that finished in an earlier run with the same settings is not entered again."""
    from santa.train.kept import kept_checkpoint
    from santa.train.trainer import fit

    train = config.train
    stage_layout = spec.layout.stage(stage)
    settings = {"config": config.to_dict(), "data": data, "warm_start": warm_start}
    finished = finished_stage(stage_layout, settings)
    if finished is not None:
        # Re-entering it cost a Ray Train start-up (26 s) to resume "from step 20" of 20.
        print(
            f"[{stage}] finished in an earlier run: skipped (checkpoint {finished['checkpoint']})",
            flush=True,
        )
        return finished
    print(
        f"[{stage}] {spec.recipe}: {train.max_steps or f'{train.epochs} epochs of'} steps, "
        f"lr {train.learning_rate:g}, {train.num_workers} workers, "
        f"hard negatives {config.negatives.source}"
        + (f", from {warm_start}" if warm_start else ""),
        flush=True,
    )
    run = stage_run(spec, stage_layout, data, dev_uri, warm_start)
    started = time.time()
    result = fit(config, run)
    if result.error is not None or result.checkpoint is None:
        raise RuntimeError(f"{stage} training failed: {result.error}")
    # The best dev checkpoint with train.keep_best_by (as the released dev scripts keep
    # theirs), else the latest: what the next stage starts from and evaluation scores.
    kept = kept_checkpoint(result, train)
    print(f"[{stage}] kept {kept.describe()}", flush=True)
    summary = {
        "stage": stage,
        "checkpoint": stage_layout.checkpoint_uri(kept.checkpoint),
        "kept": kept.to_dict(),
        "learning_rate": train.learning_rate,
        # The plots draw a panel per loss a stage trained (a weight of 0 logs it untrained).
        "sda_weight": train.sda_weight,
        "mep_weight": train.mep_weight,
        "hard_negatives": config.negatives.source.split(":", 1)[0],
        "final_metrics": {k: v for k, v in (result.metrics or {}).items() if is_number(v)},
        "history": read_history(stage_layout.root),
        "seconds": time.time() - started,
    }
    record = {k: v for k, v in summary.items() if k != "history"}
    storage.write_json(stage_layout.path(STAGE_DONE), {**record, "settings": settings})
    return summary


STAGE_DONE = "stage.json"
"""Written into a stage's run once it finished: its summary and the settings it ran with."""


def finished_stage(stage_layout: RunLayout, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of a stage that finished with these ``settings`` (config, data, warm
    start) and whose checkpoint is still there; None otherwise (train it)."""
    uri = stage_layout.path(STAGE_DONE)
    try:
        if not storage.exists(uri):
            return None
        record = storage.read_json(uri)
    except (storage.StorageError, ValueError, OSError):
        return None
    if not isinstance(record, dict) or record.get("settings") != _plain(settings):
        return None
    checkpoint = str(record.get("checkpoint") or "")
    if not checkpoint or not storage.exists(
        storage.join(checkpoint_model(checkpoint), "config.json")
    ):
        return None
    summary = {k: v for k, v in record.items() if k != "settings"}
    return {**summary, "history": read_history(stage_layout.root)}


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists)."""
    import json

    return json.loads(json.dumps(value))


def stage_run(
    spec: PipelineSpec, stage_layout: RunLayout, data: str, dev_uri: str, warm_start: str
):
    """The training run of a stage (Ray Train's, or in this process with ``in_process``):
    in the stage's folder of the pipeline run, as is."""
    from santa.train.trainer import RunSpec

    return RunSpec(
        data=data,
        layout=stage_layout,
        cpus_per_worker=spec.cpus_per_worker,
        eval_data=dev_uri,
        eval_split="valid",
        warm_start=warm_start,
        tracking=spec.tracking,
        in_process=spec.in_process,
    )


def evaluate_systems(
    *,
    trained: dict[str, str],
    untrained: str | None,
    data: str,
    split: str,
    layout: RunLayout,
    baseline: str | None,
    lengths: tuple[int, int] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every stage's model, the untrained one and the baseline on the same BEIR split,
    every model encoded at the same ``lengths`` (query, document tokens; None: each model's
    own, :func:`santa.eval.evaluation.evaluation_lengths`)."""
    from santa.eval import EvalConfig, evaluate

    query_length, document_length = lengths or (None, None)

    systems: dict[str, dict[str, Any]] = {}
    evaluated_with: dict[str, Any] = {}
    if untrained:
        config = EvalConfig(
            split=split,
            output=layout.eval("untrained"),
            baseline=None,
            progress=True,  # "[eval] documents: ..." lines every 15 s
            max_query_length=query_length,
            max_document_length=document_length,
        )
        print("[eval] the untrained model", flush=True)
        systems["untrained"] = evaluate(untrained, data, config)["model"]
    last = list(trained)[-1]
    for name, model in trained.items():
        folder = name.removeprefix("santa (").removesuffix(")")
        config = EvalConfig(
            split=split,
            output=layout.eval(folder),
            baseline=baseline if name == last else None,
            progress=True,  # "[eval] documents: ..." lines every 15 s
            max_query_length=query_length,
            max_document_length=document_length,
        )
        print(f"[eval] {name}" + (f" and {baseline}" if config.baseline else ""), flush=True)
        results = evaluate(model, data, config)
        systems[name] = results.pop("model")
        if name == last:
            systems.update(results)  # the baseline, once
            from santa.files.outputs import published_root

            published = published_root(layout.eval(folder))  # S3: the manifest's prefix
            evaluated_with = storage.read_json(storage.join(published, "info.json"))
    return systems, {
        key: evaluated_with.get(key)
        for key in ("similarity", "pooling", "max_query_length", "max_document_length")
    }


def _lengths(config: SantaConfig) -> tuple[int, int]:
    """The lengths the last stage trains with: every model of the report is encoded so."""
    return config.train.max_query_length, config.train.max_document_length


def _initial_model(config: SantaConfig, stage: RunLayout) -> str | None:
    """The untrained model: the tiny init saved in the first stage's run, or the backbone."""
    if config.model.is_tiny:
        return stage.init_model
    return config.model.backbone


def _corpus_summary(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("rows_read", "rows_written", "dropped", "filtered", "entity_ratio", "wall_time_s")
    return {k: report.get(k) for k in keys}
