"""The pipeline's report: ``report.md`` (metrics after every stage, training, corpus, time)
and ``training.png`` (every logged step of every stage, from the runs' own histories)."""

from __future__ import annotations

import io
import math
from typing import Any

from santa.eval import format_markdown
from santa.runtime import storage
from santa.runtime.layout import RunLayout


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


def plot_history(stages: list[dict[str, Any]], run_uri: str) -> str | None:
    """``training.png``: losses and dev MRR over the steps of every stage, end to end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    offset, plotted = 0, False
    for stage in stages:
        points = [
            h for h in stage["history"] if is_number(h.get("step")) and is_number(h.get("loss"))
        ]
        if not points:
            continue
        steps = [offset + h["step"] for h in points]
        for key in ("loss", "loss_sda", "loss_mep"):
            values = [h.get(key, float("nan")) for h in points]
            if any(is_number(v) and v for v in values):
                left.plot(steps, values, label=f"{stage['stage']} {key}")
        dev = [(offset + h["step"], h["dev_mrr"]) for h in points if is_number(h.get("dev_mrr"))]
        if dev:
            right.plot(*zip(*dev, strict=True), marker="o", label=stage["stage"])
        left.axvline(offset, color="grey", linewidth=0.5)
        offset = steps[-1]
        plotted = True
    if not plotted:
        plt.close(figure)
        return None
    left.set_xlabel("step (stages end to end)")
    left.set_title("training losses")
    left.legend(fontsize=7)
    right.set_xlabel("step (stages end to end)")
    right.set_title("dev MRR@100")
    if right.lines:
        right.legend(fontsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    target = RunLayout(run_uri).training_plot
    storage.write_bytes(target, buffer.getvalue())
    return target


# The phases before a stage's first step, in the order they happen (santa.train.trainer's
# on the driver, santa.train.loop's on the workers).
STARTUP_PHASES = (
    ("startup_initial_model_s", "initial model"),
    ("startup_data_plan_s", "data plan"),
    ("startup_miner_s", "miner"),
    ("startup_worker_start_s", "worker start"),
    ("startup_imports_s", "imports"),
    ("startup_model_s", "model"),
    ("startup_resume_s", "resume"),
    ("startup_ddp_s", "DDP"),
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


def format_report(report: dict[str, Any], plot: str | None) -> str:
    """``report.md``: retrieval after every stage, training per stage, corpus and time."""
    evaluated = report.get("evaluated_with", {})
    lines = [
        f"# santa pipeline: {report['name']}",
        "",
        f"Recipe `{report['recipe']}`, stages {' → '.join(s['stage'] for s in report['stages'])};"
        f" evaluated on `{report['data']['test']}`"
        + (
            f" ({evaluated.get('similarity')} similarity, {evaluated.get('pooling')} pooling, "
            f"lengths {evaluated.get('max_query_length')}/{evaluated.get('max_document_length')})."
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
        *(f"- {s['stage']} checkpoint: `{s['checkpoint']}`" for s in report["stages"]),
        f"- metrics and TREC runs: `{RunLayout(report['run']).eval()}`",
        "",
    ]
    return "\n".join(lines)
