"""The pipeline's report: ``report.md`` and ``report.html`` (metrics after every stage,
training, corpus, time) with the plots of :mod:`santa.pipeline.plots` beside them."""

from __future__ import annotations

import math
from typing import Any

from santa.eval import format_markdown
from santa.files import storage
from santa.files.layout import RunLayout


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_history(run_uri: str) -> list[dict[str, Any]]:
    """Every logged step of one training run (``RUN/metrics.jsonl``), oldest first."""
    import json

    uri = RunLayout(run_uri).metrics
    if not storage.exists(uri):
        return []
    lines = storage.read_bytes(uri).decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


# The phases before a stage's first step, in the order they happen (santa.train.trainer's
# on the driver, santa.train.loop's on the workers).
STARTUP_PHASES = (
    ("startup_initial_model_s", "initial model"),
    ("startup_miner_s", "miner"),
    ("startup_worker_start_s", "worker start"),
    ("startup_imports_s", "imports"),
    ("startup_model_s", "model"),
    ("startup_resume_s", "resume"),
    ("startup_ddp_s", "DDP"),
    ("startup_rows_build_s", "row file built (beside the above)"),
    ("startup_first_batch_wait_s", "wait for data"),
    ("startup_first_step_s", "first step"),
    ("startup_compile_s", "of it compile"),
)


def startup_table(stages: list[dict[str, Any]]) -> list[str]:
    """Lines of a table: each stage's seconds before its first step, phase by phase."""
    rows = [s for s in stages if "startup_total_s" in s.get("final_metrics", {})]
    if not rows:
        return []
    present = [
        (key, label)
        for key, label in STARTUP_PHASES
        if any(key in s["final_metrics"] for s in rows)
    ]
    lines = [
        "Before each stage's first step (seconds):",
        "",
        "| stage | stage s | before the first step | "
        + " | ".join(label for _, label in present)
        + " |",
        "|---|---:|---:|" + "---:|" * len(present),
    ]
    for stage in rows:
        final = stage["final_metrics"]
        cells = [f"{final[key]:.1f}" if key in final else "-" for key, _ in present]
        lines.append(
            f"| {stage['stage']} | {stage.get('seconds', 0.0):.0f} | "
            f"{final['startup_total_s']:.1f} | " + " | ".join(cells) + " |"
        )
    return [*lines, ""]


PLOT_CAPTIONS = {
    "metrics.png": "held-out retrieval after every stage, BM25 beside",
    "losses.png": "training losses, one panel per loss the recipe trains",
    "dev_mrr.png": "dev MRR@100 over the steps",
    "throughput.png": "training throughput per stage",
}
PLOT_NOTES = {
    "metrics.png": "Each stage's model, the untrained model and BM25 on the held-out split: "
    "one bar per system and metric, its value above it (the numbers of the table above).",
    "losses.png": "The training loss at each logged step, the stages end to end (a stage's "
    "steps follow the previous stage's): one panel per loss the recipe trains, SDA (each "
    "docstring against its code and the batch's other documents) and, on a T5 recipe, MEP "
    "with the total beside them. A stage with few logged steps is drawn as points with "
    "their values. Stages train on different batches and negatives: their losses are not "
    "comparable across stages.",
    "dev_mrr.png": "Dev MRR@100 where dev evaluation ran, on MRR's whole range (0 to 1), "
    "each point's value beside it.",
    "throughput.png": "Training pairs per second of each stage, over its whole run.",
}
"""One line under each plot of ``report.md``: what it shows and how to read it."""


def format_report(report: dict[str, Any], plots: list[str] | None = None) -> str:
    """``report.md``: retrieval after every stage, training per stage, corpus and time."""
    evaluated = report.get("evaluated_with", {})
    lines = [
        f"# santa pipeline: {report['name']}",
        "",
        f"Recipe `{report['recipe']}`, stages {' → '.join(s['stage'] for s in report['stages'])};"
        f" evaluated on `{report['data']['test']}`"
        + (
            f" ({evaluated.get('similarity')} similarity, {evaluated.get('pooling')} pooling, "
            f"every model at {evaluated.get('max_query_length')}/"
            f"{evaluated.get('max_document_length')} query/document tokens)."
            if evaluated
            else "."
        ),
        "",
        "## Retrieval (held-out split), after every stage",
        "",
        format_markdown(report["metrics"]).strip(),
        "",
        "## Training",
        "",
        "| stage | steps | lr | loss | loss_sda | loss_mep | dev_mrr | pairs/s | hard negatives |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for stage in report["stages"]:
        final = stage["final_metrics"]
        lines.append(
            "| {} | {} | {:.1e} | {:.4f} | {:.4f} | {:.4f} | {} | {:.1f} | {} |".format(
                stage["stage"],
                int(final.get("step", 0)),
                stage["learning_rate"],
                final.get("loss", float("nan")),
                final.get("loss_sda", float("nan")),
                final.get("loss_mep", float("nan")),
                f"{final['dev_mrr']:.4f}" if "dev_mrr" in final else "-",
                final.get("run_pairs_per_s", final.get("pairs_per_s", 0.0)),
                stage["hard_negatives"],
            )
        )
    lines.append("")
    names = [uri.rsplit("/", 1)[-1] for uri in plots or []]
    if names:
        lines += ["## Plots", ""]
        for name in names:
            lines += [f"![{PLOT_CAPTIONS.get(name, name)}]({name})", ""]
            if name in PLOT_NOTES:
                lines += [f"*{PLOT_NOTES[name]}*", ""]
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
    mining = report.get("mining") or {}
    if mining.get("filtered"):
        filtered = mining["filtered"]
        lines += [
            "## Hard-negative mining",
            "",
            f"Table `{mining['table']}`; false-negative filter: score ratio "
            f"{mining['max_score_ratio'] or 'off'}, margin {mining['min_margin'] or 'off'} "
            "(`negatives.max_score_ratio`, `negatives.min_margin`).",
            "",
            "| hits dropped as | count |",
            "|---|---:|",
            *(f"| {reason} | {count:,} |" for reason, count in filtered.items()),
            "",
        ]
    lines += [
        "## Time",
        "",
        " · ".join(f"{k.removesuffix('_s')} {v:.0f}s" for k, v in report["phases"].items()),
        "",
        *startup_table(report["stages"]),
        "## Where things are",
        "",
        f"- run: `{report['run']}` (TensorBoard: `tensorboard --logdir {report['run']}`)",
        *(
            f"- {s['stage']} checkpoint: `{s['checkpoint']}`" + _kept_note(s.get("kept"))
            for s in report["stages"]
        ),
        f"- metrics and TREC runs: `{RunLayout(report['run']).eval()}`",
        "",
    ]
    return "\n".join(lines)


def write_sweep_report(rows: list[dict[str, Any]], root: str, metric: str) -> str:
    """A sweep's ``report.md`` and ``report.html`` at its root, with ``sweep.png`` (the
    metric of each trial over learning rate × λ); returns the Markdown's URI."""
    from santa.pipeline.plots import markdown_page, sweep_figure, write_figures

    def cell(value: Any, digits: str) -> str:
        return "-" if value is None else format(value, digits) if is_number(value) else str(value)

    lines = [
        f"# santa sweep: {root.rstrip('/').rsplit('/', 1)[-1]}",
        "",
        f"| trial | lr | λ | {metric} | step | status |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['trial']} | {cell(row.get('lr'), '.3g')} | {cell(row.get('lambda'), '.3f')} "
            f"| {cell(row.get(metric), '.4f')} | {cell(row.get('step'), '')} | {row['status']} |"
        )
    figure = sweep_figure(rows, metric)
    if figure is not None:
        write_figures({"sweep.png": figure}, root)
        lines += ["", f"![{metric} over learning rate × λ](sweep.png)"]
    markdown = "\n".join([*lines, ""])
    target = storage.join(root, "report.md")
    storage.write_bytes(target, markdown.encode())
    page = markdown_page(markdown, lines[0].removeprefix("# "))
    storage.write_bytes(storage.join(root, "report.html"), page.encode())
    return target


def _kept_note(kept: dict | None) -> str:
    """`` (kept: the best dev_mrr 0.4312, step 40)`` for a stage that kept its best."""
    if not kept or not kept.get("by"):
        return ""
    return f" (kept: the best {kept['by']} {kept['value']:.4f}, step {kept['step']})"
