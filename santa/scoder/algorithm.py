"""SCodeR's Algorithm 2 (soft-labeled contrastive training), callable from Python.

1. warm-up: the dual encoder G_θ with in-batch negatives (santa's trainer, ``RUN/warmup``);
2. for each of ``scoder.iterations`` iterations ``i`` (``RUN/iter-<i>/``): mine top-K
   negatives with the current G_θ (``negatives/``), sample listwise examples
   (``examples/``), train D_φ and D_ψ (``discriminators/``, a Ray Train run of the one
   worker loop), score the examples with them (``soft_labels/``, Ray Data; ``online``: in the
   training workers instead) and train G_θ with ``λ·L_adv + (1 − λ)·L_distill``
   (``dual_encoder/``). ``manifest.json`` is written last: a rerun skips the iterations that
   have one and resumes an unfinished stage from its latest checkpoint.

Per-iteration metrics (discriminators' held-out accuracy, soft-label entropy, losses, dev
MRR, seconds per phase) go to ``RUN/scoder_metrics.jsonl``. Paths: :class:`RunLayout`.

SCodeR samples the hard negatives X⁻ of a query at each step; santa mines a pool of
``negatives.pool`` per query once per iteration and samples each stage's X⁻ from it
(seeded), santa's choice for a cluster (one mining pass per iteration instead of one per
step). The held-out share of discriminator examples (``scoder.heldout_fraction``) is
santa's too: it measures the discriminators on pairs they never saw.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from santa.config import SantaConfig
from santa.files import storage
from santa.files.layout import RunLayout, checkpoint_model
from santa.jobs import interrupts
from santa.negatives.offline import mine_negatives

__all__ = ["format_table", "progress_line", "run_algorithm", "run_iteration"]


def run_algorithm(
    config: SantaConfig,
    *,
    data: str,
    layout: RunLayout,
    recipe: str = "",
    eval_data: str = "",
    eval_split: str = "test",
    cpus_per_worker: float = 0.0,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,  # gets the manifest
    tracking: dict[str, Any] | None = None,
    in_process: bool = False,
) -> dict[str, Any]:
    """Algorithm 2 on the current Ray cluster, resuming what the run folder ``layout``
    holds already (``in_process``: each training stage in this process on one worker,
    :attr:`santa.train.trainer.RunSpec.in_process`)."""
    started = time.time()
    # Before the warm-up: a dual encoder the cluster can never hold fails in one line.
    from santa.cluster.resources import check_plan
    from santa.train.trainer import run_plan

    check_plan(run_plan(config, cpus_per_worker), job="SCodeR's dual encoder")

    finished: list[str] = []  # for an interruption's line

    def describe() -> str:
        return f"SCodeR run {layout.root}: " + (
            f"{', '.join(finished)} done" if finished else "the warm-up is not finished"
        )

    with interrupts.keeping(describe, hint="run the same command to resume"):
        return _run_algorithm(
            config,
            layout=layout,
            finished=finished,
            started=started,
            data=data,
            recipe=recipe,
            eval_data=eval_data,
            eval_split=eval_split,
            cpus_per_worker=cpus_per_worker,
            on_iteration=on_iteration,
            tracking=tracking or {},
            in_process=in_process,
        )


def _run_algorithm(
    config: SantaConfig,
    *,
    layout: RunLayout,
    finished: list[str],
    started: float,
    data: str,
    recipe: str,
    eval_data: str,
    eval_split: str,
    cpus_per_worker: float,
    on_iteration: Callable[[dict[str, Any]], None] | None,
    tracking: dict[str, Any],
    in_process: bool,
) -> dict[str, Any]:
    warmup = _warmup(
        config, data, layout, eval_data, eval_split, cpus_per_worker, tracking, in_process
    )
    finished.append("the warm-up")
    dual_encoder = warmup["model"]
    discriminators = _initial_discriminators(config, data, layout)
    history: list[dict[str, Any]] = []
    for iteration in range(1, config.scoder.iterations + 1):
        manifest_uri = layout.iteration(iteration).manifest
        if storage.exists(manifest_uri):
            manifest = storage.read_json(manifest_uri)
            print(f"[iter {iteration}] done in an earlier run: skipped", flush=True)
        else:
            manifest = run_iteration(
                config,
                iteration=iteration,
                layout=layout,
                data=data,
                dual_encoder=dual_encoder,
                discriminators=discriminators,
                eval_data=eval_data,
                eval_split=eval_split,
                cpus_per_worker=cpus_per_worker,
                tracking=tracking,
                in_process=in_process,
            )
            storage.write_json(manifest_uri, manifest)  # last: the iteration is done
        dual_encoder, discriminators = manifest["dual_encoder"], manifest["discriminators"]
        finished.append(f"iteration {iteration}")
        history.append(manifest["metrics"])
        lines = "".join(json.dumps(m, sort_keys=True) + "\n" for m in history)
        storage.write_bytes(layout.scoder_metrics, lines.encode())
        print(progress_line(manifest["metrics"], config.scoder.iterations), flush=True)
        if on_iteration is not None:
            on_iteration(manifest)
    report = {
        "run": layout.root,
        "recipe": recipe,
        "warmup": warmup,
        "dual_encoder": dual_encoder,
        "discriminators": discriminators,
        "iterations": history,
        "total_s": time.time() - started,
    }
    storage.write_json(layout.report, report)
    print(format_table(history))
    print(f"outputs: {layout.root} (dual encoder {dual_encoder})", flush=True)
    return report


def _warmup(
    config,
    data,
    layout: RunLayout,
    eval_data,
    eval_split,
    cpus_per_worker,
    tracking=None,
    in_process: bool = False,
) -> dict[str, Any]:
    """Line 2 of Algorithm 2: the in-batch-negative warm-up (done once, then recorded)."""
    record_uri = layout.warmup_record
    if storage.exists(record_uri):
        print("[warmup] done in an earlier run: skipped", flush=True)
        return storage.read_json(record_uri)
    steps = config.scoder.warmup_steps
    warm_config = config.with_overrides(
        [f"train.max_steps={steps}", f"train.checkpoint_every={steps}"] if steps else []
    )
    from santa.train.trainer import RunSpec, fit

    print(f"[warmup] in-batch negatives: {steps or 'the recipe'} steps", flush=True)
    started = time.time()
    spec = RunSpec(
        data=data,
        layout=layout.warmup,
        cpus_per_worker=cpus_per_worker,
        eval_data=eval_data,
        eval_split=eval_split,
        tracking=tracking or {},
        in_process=in_process,
    )
    result = fit(warm_config, spec)
    final = _checked(result, "the warm-up")
    record = {
        "model": checkpoint_model(layout.checkpoint_uri(result.checkpoint)),
        "seconds": time.time() - started,
        "final_metrics": {k: v for k, v in final.items() if isinstance(v, int | float)},
    }
    storage.write_json(record_uri, record)
    return record


def _initial_discriminators(config: SantaConfig, data: str, layout: RunLayout) -> str:
    """Line 1: D_φ (and D_ψ when there are ASST pairs) on the backbone, new heads."""
    from santa.data.kinds import CODE_QUERY_KINDS
    from santa.scoder.discriminator import (
        CODE_CODE,
        HEAD_FILE,
        TEXT_CODE,
        Discriminator,
        DiscriminatorPair,
    )
    from santa.scoder.examples import pair_kinds

    folder = layout.initial_discriminators
    if storage.exists(storage.join(folder, TEXT_CODE, HEAD_FILE)):
        return folder
    # The tiny recipe's backbone is the warm-up's random init (its tokenizer is trained there).
    backbone = layout.warmup.init_model if config.model.is_tiny else config.model.backbone
    kinds = [TEXT_CODE]
    if set(pair_kinds(data)) & set(CODE_QUERY_KINDS):
        kinds.append(CODE_CODE)
    seed = config.train.seed
    pair = DiscriminatorPair(
        {
            kind: Discriminator.from_backbone(backbone, config.model.tokenizer, seed=seed + i)
            for i, kind in enumerate(kinds)
        }
    )
    pair.save_pretrained(folder)
    print(f"[discriminators] {', '.join(kinds)} from {backbone}", flush=True)
    return folder


def run_iteration(
    config: SantaConfig,
    *,
    iteration: int,
    layout: RunLayout,
    data: str,
    dual_encoder: str,
    discriminators: str,
    eval_data: str,
    eval_split: str,
    cpus_per_worker: float,
    tracking: dict[str, Any] | None = None,
    in_process: bool = False,
) -> dict[str, Any]:
    """One iteration (lines 5-13): mine, discriminators, soft labels, dual encoder."""
    from santa.negatives.corpus import load_mining_corpus
    from santa.negatives.table import read_negatives_table
    from santa.scoder.examples import build_listwise_rows, read_listwise, write_listwise
    from santa.scoder.objectives import DISCRIMINATORS_DIR, pair_length
    from santa.scoder.soft_labels import score_examples, summarize_scores, write_soft_labels

    scoder, train = config.scoder, config.train
    folder = layout.iteration(iteration)
    label = f"iter {iteration}"
    seconds: dict[str, float] = {}
    clock = time.time()
    mining_config = config.with_overrides([f"train.seed={train.seed + iteration}"])
    table_uri = mine_negatives(dual_encoder, data, folder.negatives, mining_config, label=label)
    seconds["mine_s"] = time.time() - clock

    clock = time.time()
    corpus = load_mining_corpus(data)
    table = read_negatives_table(table_uri, corpus)
    common = {"n": config.negatives.per_query, "heldout_fraction": scoder.heldout_fraction}
    seed = train.seed * 1000 + 10 * iteration
    counts = {
        "discriminators": write_listwise(
            build_listwise_rows(corpus, table, seed=seed, include="train", **common),
            folder.examples("discriminators"),
        ),
        "dual_encoder": write_listwise(
            build_listwise_rows(corpus, table, seed=seed + 1, **common),
            folder.examples("dual_encoder"),
        ),
    }
    seconds["examples_s"] = time.time() - clock

    def steps(given: int | None, rows: int) -> int:
        return given or max(1, math.ceil(rows / train.global_batch_size))

    clock = time.time()
    print(f"[{label}] discriminators on {counts['discriminators']:,} examples", flush=True)
    stage = folder.stage("discriminators")
    result = _fit_stage(
        config,
        "discriminators",
        stage,
        steps=steps(scoder.discriminator_steps, counts["discriminators"]),
        data=folder.examples("discriminators"),
        init=discriminators,
        cpus_per_worker=cpus_per_worker,
        cache=layout.shared_cache.root,
        tracking=tracking,
        in_process=in_process,
    )
    trained = _checked(result, "discriminator training")
    new_discriminators = storage.join(stage.checkpoint_uri(result.checkpoint), DISCRIMINATORS_DIR)
    seconds["discriminators_s"] = time.time() - clock

    clock = time.time()
    scoring = {"max_first": train.max_query_length, "max_length": pair_length(config)}
    dual_data = folder.examples("dual_encoder")
    if scoder.soft_labels == "offline":
        dual_data = write_soft_labels(dual_data, new_discriminators, folder.soft_labels, **scoring)
        scored = read_listwise(dual_data)
    else:  # online: only the held-out examples are scored here, for the accuracy
        import pyarrow as pa
        import ray

        dataset = score_examples(dual_data, new_discriminators, heldout_only=True, **scoring)
        scored = pa.concat_tables([ray.get(ref) for ref in dataset.to_arrow_refs()])
    summary = summarize_scores(scored) if scored.num_rows else {}
    seconds["soft_labels_s"] = time.time() - clock

    clock = time.time()
    print(f"[{label}] dual encoder on {counts['dual_encoder']:,} examples", flush=True)
    stage = folder.stage("dual_encoder")
    result = _fit_stage(
        config,
        "dual_encoder",
        stage,
        steps=steps(scoder.dual_encoder_steps, counts["dual_encoder"]),
        data=dual_data,
        init=dual_encoder,
        cpus_per_worker=cpus_per_worker,
        cache=layout.shared_cache.root,
        tracking=tracking,
        in_process=in_process,
        discriminators=new_discriminators if scoder.soft_labels == "online" else "",
        eval_data=eval_data,
        eval_split=eval_split,
    )
    dual = _checked(result, "dual-encoder training")
    seconds["dual_encoder_s"] = time.time() - clock

    metrics: dict[str, Any] = {
        "iteration": iteration,
        "examples": counts["dual_encoder"],
        "negatives_mined": table.queries_with_negatives,
        "discriminator_loss": trained.get("loss"),
        "discriminator_train_accuracy": trained.get("accuracy"),
        **summary,
        "dual_encoder_loss": dual.get("loss"),
        "loss_adv": dual.get("loss_adv"),
        "loss_distill": dual.get("loss_distill"),
        "dual_encoder_step": dual.get("step"),
        **{key: dual[key] for key in ("dev_mrr", "dev_ndcg", "dev_recall@10") if key in dual},
        **seconds,
        "iteration_s": sum(seconds.values()),
    }
    return {
        "iteration": iteration,
        "negatives": table_uri,
        "discriminators": new_discriminators,
        "dual_encoder": checkpoint_model(stage.checkpoint_uri(result.checkpoint)),
        "soft_labels": scoder.soft_labels,
        "metrics": metrics,
    }


def _fit_stage(
    config: SantaConfig,
    objective: str,
    stage: RunLayout,
    *,
    steps: int,
    data: str,
    init: str,
    cpus_per_worker: float,
    discriminators: str = "",
    eval_data: str = "",
    eval_split: str = "test",
    cache: str = "",
    tracking: dict[str, Any] | None = None,
    in_process: bool = False,
):
    """One stage of an iteration as a run of santa's one worker loop (resumed when its run
    folder holds checkpoints); dev metrics, when asked for, at the end only."""
    from santa.train.trainer import RunSpec, fit

    stage_config = config.with_overrides(
        [f"train.max_steps={steps}", *([f"train.eval_every={steps}"] if eval_data else [])]
    )
    spec = RunSpec(
        data=data,
        layout=stage,
        objective=objective,
        warm_start=init,
        discriminators=discriminators,
        cpus_per_worker=cpus_per_worker,
        num_to_keep=1,
        eval_data=eval_data,
        eval_split=eval_split,
        cache=cache,  # the run's: Algorithm 2's stages share compiled graphs
        tracking=tracking or {},
        in_process=in_process,
    )
    return fit(stage_config, spec)


def _checked(result, what: str) -> dict[str, Any]:
    """The final metrics of a finished stage, or an error naming it."""
    if result.error is not None or result.checkpoint is None:
        raise RuntimeError(f"{what} failed: {result.error}")
    return dict(result.metrics or {})


def progress_line(metrics: dict[str, Any], iterations: int) -> str:
    """One line per finished iteration."""
    parts = [f"[iter {metrics['iteration']}/{iterations}]"]
    for key, name in (
        ("heldout_accuracy_text_code", "D_φ acc"),
        ("heldout_accuracy_code_code", "D_ψ acc"),
        ("soft_label_entropy", "entropy"),
        ("dual_encoder_loss", "G loss"),
        ("dev_mrr", "dev MRR"),
    ):
        if metrics.get(key) is not None:
            parts.append(f"{name} {metrics[key]:.4f}")
    parts.append(f"{metrics['iteration_s']:.0f}s")
    return " ".join(parts)


TABLE_COLUMNS = (
    ("iteration", "iter", "d"),
    ("heldout_accuracy_text_code", "D_φ acc", ".3f"),
    ("heldout_accuracy_code_code", "D_ψ acc", ".3f"),
    ("soft_label_entropy", "entropy", ".3f"),
    ("discriminator_loss", "D loss", ".3f"),
    ("loss_adv", "L_adv", ".3f"),
    ("loss_distill", "L_distill", ".3f"),
    ("dev_mrr", "dev MRR", ".4f"),
    ("mine_s", "mine s", ".0f"),
    ("discriminators_s", "D s", ".0f"),
    ("soft_labels_s", "labels s", ".0f"),
    ("dual_encoder_s", "G s", ".0f"),
)


def format_table(history: list[dict[str, Any]]) -> str:
    """The per-iteration metrics as an aligned text table."""
    header = [title for _, title, _ in TABLE_COLUMNS]
    rows = [
        [
            "-" if metrics.get(key) is None else format(metrics[key], spec)
            for key, _, spec in TABLE_COLUMNS
        ]
        for metrics in history
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    )
