"""The plots of the run reports (matplotlib, PNG) and the reports' HTML page.

A pipeline's report draws, from the runs' own ``metrics.jsonl`` and evaluation:

- ``losses.png``: one panel per loss the recipe trains (SDA; MEP on a T5 recipe, with the
  total beside them), every stage's steps end to end;
- ``dev_mrr.png``: dev MRR@100 over the steps (where dev evaluation ran);
- ``metrics.png``: each stage's model, the untrained one and BM25 on the held-out split,
  as bars per metric, each bar labelled with its value;
- ``throughput.png``: pairs per second, per stage.

Every plot labels its y axis. A stage with few logged steps (the demo logs 2 per stage)
is drawn as points with their values, not as a line that suggests a trend between them;
losses start at 0 and MRR spans 0 to 1, so a change in the third decimal looks as small as
it is.

A sweep's report draws ``sweep.png``: dev MRR of each trial over learning rate × λ.

The figures are built apart from writing (:func:`pipeline_figures`, :func:`sweep_figure`)
so that what they show can be read back from them.
"""

from __future__ import annotations

import io
import math
from typing import Any

from santa.files import storage

__all__ = [
    "LOSS_KEYS",
    "markdown_page",
    "pipeline_figures",
    "sweep_figure",
    "write_figures",
]

LOSS_KEYS = (("loss", "loss"), ("loss_sda", "SDA loss"), ("loss_mep", "MEP loss"))
COMPONENT_WEIGHTS = {"loss_sda": "sda_weight", "loss_mep": "mep_weight"}
"""A stage's weight of each loss it may log (a stage trained with weight 0 logs the loss
without training it: not drawn)."""
BAR_METRICS = ("mrr@100", "ndcg@100", "recall@1", "recall@10", "recall@100")
FEW_POINTS = 5
"""A stage's series with at most this many points is drawn as labelled points."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _stage_series(stages: list[dict[str, Any]], key: str) -> list[tuple[str, list, list]]:
    """``(stage, steps end to end, values)`` of one logged key, per stage that logged it
    (and trained it: a loss whose weight is 0, or that is 0 throughout, is left out)."""
    series, offset = [], 0
    for stage in stages:
        points = [h for h in stage.get("history", []) if _number(h.get("step"))]
        if not points:
            continue
        weight = stage.get(COMPONENT_WEIGHTS.get(key, ""), 1.0)
        valued = [(offset + h["step"], h[key]) for h in points if _number(h.get(key))]
        if valued and weight != 0 and any(value for _, value in valued):
            steps, values = zip(*valued, strict=True)
            series.append((stage["stage"], list(steps), list(values)))
        offset += points[-1]["step"]
    return series


def _draw_series(axis, stage: str, steps: list, values: list, color) -> None:
    """A stage's series: a line where it has many points; a few points as points, each
    with its value (a line between two logged steps reads as a trend it does not show)."""
    if len(steps) > FEW_POINTS:
        axis.plot(steps, values, label=stage, color=color)
        return
    axis.plot(steps, values, label=stage, color=color, marker="o", linestyle="none")
    for step, value in zip(steps, values, strict=True):
        axis.annotate(
            f"{value:.3f}",
            (step, value),
            xytext=(0, 6),
            textcoords="offset points",
            ha="center",
            fontsize=7,
        )


def _loss_panels(stages: list[dict[str, Any]]) -> list[tuple[str, str, list]]:
    """``(key, title, series)`` per loss the stages trained: SDA, MEP where a stage trained
    it, and the total only beside both (alone it is the SDA loss again)."""
    panels = [(key, title, _stage_series(stages, key)) for key, title in LOSS_KEYS]
    components = [panel for panel in panels[1:] if panel[2]]
    if len(components) > 1:
        return [panels[0], *components] if panels[0][2] else components
    if components:
        return components
    return [panels[0]] if panels[0][2] else []  # a history without the components


def _losses(stages: list[dict[str, Any]]):
    panels = _loss_panels(stages)
    if not panels:
        return None
    plt = _pyplot()
    colors = _stage_colors(stages)
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for axis, (_, title, series) in zip(axes[0], panels, strict=True):
        for stage, steps, values in series:
            _draw_series(axis, stage, steps, values, colors.get(stage))
        axis.set_title(title)
        axis.set_xlabel("step (stages end to end)")
        axis.set_ylabel(f"{title} (nats)")
        axis.set_ylim(bottom=0, top=max(v for *_, values in series for v in values) * 1.15)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def _stage_colors(stages: list[dict[str, Any]]) -> dict[str, Any]:
    """One color per stage, the same in every panel."""
    plt = _pyplot()
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {stage["stage"]: cycle[i % len(cycle)] for i, stage in enumerate(stages)}


def _dev_mrr(stages: list[dict[str, Any]]):
    series = _stage_series(stages, "dev_mrr")
    if not series:
        return None
    plt = _pyplot()
    colors = _stage_colors(stages)
    figure, axis = plt.subplots(figsize=(6, 3.6))
    for stage, steps, values in series:
        _draw_series(axis, stage, steps, values, colors.get(stage))
    axis.set_title("dev MRR@100")
    axis.set_xlabel("step (stages end to end)")
    axis.set_ylabel("MRR@100")
    axis.set_ylim(0, 1)  # MRR's whole range: a change in the third decimal looks small
    axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def _metrics(systems: dict[str, dict[str, Any]]):
    names = [name for name, values in systems.items() if isinstance(values, dict)]
    metrics = [m for m in BAR_METRICS if any(_number(systems[n].get(m)) for n in names)]
    if not names or not metrics:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(max(6, 1.3 * len(metrics) * len(names) / 2), 3.8))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        values = [
            systems[name].get(m, 0.0) if _number(systems[name].get(m)) else 0.0 for m in metrics
        ]
        positions = [m + (index - (len(names) - 1) / 2) * width for m in range(len(metrics))]
        bars = axis.bar(positions, values, width, label=name)
        axis.bar_label(bars, fmt="%.3f", fontsize=6, rotation=90, padding=2)
    axis.set_xticks(range(len(metrics)), metrics)
    axis.set_ylim(0, 1.15)  # room for the labels above bars near 1
    axis.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    axis.set_ylabel("score (held-out split)")
    axis.set_title("held-out retrieval, after every stage")
    axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def _throughput(stages: list[dict[str, Any]]):
    rows = []
    for stage in stages:
        final = stage.get("final_metrics") or {}
        value = final.get("run_pairs_per_s", final.get("pairs_per_s"))
        if _number(value):
            rows.append((stage["stage"], value))
    if not rows:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5, 3.4))
    labels, values = zip(*rows, strict=True)
    axis.bar(labels, values, color="tab:green")
    for position, value in enumerate(values):
        axis.annotate(f"{value:.0f}", (position, value), ha="center", va="bottom", fontsize=8)
    axis.set_ylabel("pairs/s")
    axis.set_title("training throughput per stage")
    figure.tight_layout()
    return figure


def pipeline_figures(report: dict[str, Any], stages: list[dict[str, Any]]) -> dict[str, Any]:
    """``{file name: matplotlib Figure}`` for a pipeline report; ``stages`` carry their
    ``history`` (every logged step)."""
    figures = {
        "losses.png": _losses(stages),
        "dev_mrr.png": _dev_mrr(stages),
        "metrics.png": _metrics(report.get("metrics") or {}),
        "throughput.png": _throughput(stages),
    }
    return {name: figure for name, figure in figures.items() if figure is not None}


def sweep_figure(rows: list[dict[str, Any]], metric: str):
    """Dev MRR of each trial over learning rate × λ (λ on the y axis where the sweep has
    one, else the metric over the learning rate); None without a finished trial."""
    done = [r for r in rows if _number(r.get(metric)) and _number(r.get("lr"))]
    if not done:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    if any(_number(r.get("lambda")) for r in done):
        lam = [r["lambda"] if _number(r.get("lambda")) else 0.0 for r in done]
        points = axis.scatter(
            [r["lr"] for r in done], lam, c=[r[metric] for r in done], s=120, cmap="viridis"
        )
        for row, y in zip(done, lam, strict=True):
            axis.annotate(
                f"{row[metric]:.3f}",
                (row["lr"], y),
                xytext=(6, 6),
                fontsize=7,
                textcoords="offset points",
            )
        figure.colorbar(points, label=metric)
        axis.set_ylabel("λ")
    else:
        ordered = sorted(done, key=lambda r: r["lr"])
        axis.plot([r["lr"] for r in ordered], [r[metric] for r in ordered], marker="o")
        axis.set_ylabel(metric)
    axis.set_xscale("log")
    axis.set_xlabel("learning rate")
    axis.set_title(f"{metric} of each trial")
    figure.tight_layout()
    return figure


def write_figures(figures: dict[str, Any], folder: str) -> list[str]:
    """Each figure as ``folder/<name>`` (local or S3), whole; returns the URIs written."""
    plt = _pyplot()
    written = []
    for name, figure in figures.items():
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        plt.close(figure)
        uri = storage.join(folder, name)
        storage.write_bytes(uri, buffer.getvalue())
        written.append(uri)
    return written


_PAGE_STYLE = """
body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1rem}
th,td{border:1px solid #ccc;padding:.25rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}
code{background:#f4f4f4;padding:0 .2rem}
img{max-width:100%}
"""


def markdown_page(markdown: str, title: str) -> str:
    """A report's Markdown as one self-contained HTML page (its images side by side)."""
    import html

    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_PAGE_STYLE}</style></head><body>"
        f"{body}</body></html>\n"
    )
