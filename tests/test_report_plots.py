"""The reports' plots show the run's numbers: each drawn series read back from the figure."""

from __future__ import annotations

import matplotlib.image as plt_image
import pytest

from santa.pipeline.plots import markdown_page, pipeline_figures, sweep_figure, write_figures
from santa.pipeline.report import format_report


def _history(steps: int, mep: float, scale: float) -> list[dict]:
    return [
        {
            "step": step,
            "loss": scale / step + mep,
            "loss_sda": scale / step,
            "loss_mep": mep / step,
            **({"dev_mrr": 0.1 * step / steps} if step % 2 == 0 else {}),
        }
        for step in range(1, steps + 1)
    ]


@pytest.fixture
def pipeline():
    stages = [
        {
            "stage": "pretrain",
            "history": _history(4, 2.0, 3.0),
            "final_metrics": {"step": 4, "run_pairs_per_s": 120.5},
            "learning_rate": 5e-4,
            "hard_negatives": "none",
            "checkpoint": "/r/pretrain/c",
            "seconds": 10.0,
        },
        {
            "stage": "finetune",
            "history": _history(6, 0.0, 1.0),  # DR loss only: no MEP
            "final_metrics": {"step": 6, "pairs_per_s": 80.0},
            "learning_rate": 2e-4,
            "hard_negatives": "none",
            "checkpoint": "/r/finetune/c",
            "seconds": 12.0,
        },
    ]
    metrics = {
        "untrained": {"mrr@100": 0.05, "recall@10": 0.1, "num_queries": 10},
        "santa (pretrain)": {"mrr@100": 0.2, "recall@10": 0.4, "num_queries": 10},
        "santa (finetune)": {"mrr@100": 0.3, "recall@10": 0.5, "num_queries": 10},
        "bm25": {"mrr@100": 0.25, "recall@10": 0.45, "num_queries": 10},
    }
    return stages, metrics


def test_pipeline_figures_draw_the_runs_numbers(pipeline, tmp_path):
    stages, metrics = pipeline
    report = {"metrics": metrics}
    figures = pipeline_figures(report, stages)
    assert set(figures) == {"losses.png", "dev_mrr.png", "metrics.png", "throughput.png"}

    panels = {axis.get_title(): axis for axis in figures["losses.png"].axes}
    assert set(panels) == {"loss", "SDA loss", "MEP loss"}
    sda = {line.get_label(): line for line in panels["SDA loss"].lines}
    assert list(sda["pretrain"].get_ydata()) == [h["loss_sda"] for h in stages[0]["history"]]
    assert list(sda["finetune"].get_xdata()) == [4 + s for s in range(1, 7)]  # end to end
    mep = [line.get_label() for line in panels["MEP loss"].lines]
    assert mep == ["pretrain"]  # fine-tuning's MEP is 0 throughout: not drawn

    (dev,) = figures["dev_mrr.png"].axes
    lines = {line.get_label(): list(line.get_ydata()) for line in dev.lines}
    assert lines["finetune"] == [h["dev_mrr"] for h in stages[1]["history"] if "dev_mrr" in h]

    (bars,) = figures["metrics.png"].axes
    heights = {
        container.get_label(): [patch.get_height() for patch in container.patches]
        for container in bars.containers
    }
    assert heights == {name: [m["mrr@100"], m["recall@10"]] for name, m in metrics.items()}

    (throughput,) = figures["throughput.png"].axes
    assert [p.get_height() for p in throughput.patches] == [120.5, 80.0]

    written = write_figures(figures, str(tmp_path))
    for uri in written:
        assert plt_image.imread(uri).shape[2] in (3, 4)
    markdown = format_report(
        {
            "name": "r",
            "recipe": "tiny",
            "data": {"test": "t"},
            "metrics": metrics,
            "stages": stages,
            "corpus": {},
            "phases": {"total_s": 1.0},
            "run": str(tmp_path),
        },
        written,
    )
    assert "![training losses (SDA and MEP apart)](losses.png)" in markdown
    page = markdown_page(markdown, "r")
    assert '<img src="metrics.png"' in page and "<table>" in page and "http" not in page


def test_sweep_figure_places_each_trial_at_its_lr_and_lambda():
    rows = [
        {"trial": "a", "lr": 1e-4, "lambda": 0.1, "dev_mrr": 0.3, "status": "done"},
        {"trial": "b", "lr": 3e-4, "lambda": 0.5, "dev_mrr": 0.2, "status": "done"},
        {"trial": "c", "lr": 1e-3, "lambda": 0.9, "dev_mrr": None, "status": "error"},
    ]
    figure = sweep_figure(rows, "dev_mrr")
    axis = figure.axes[0]
    (points,) = axis.collections
    assert points.get_offsets().tolist() == [[1e-4, 0.1], [3e-4, 0.5]]
    assert list(points.get_array()) == [0.3, 0.2]
    assert axis.get_xscale() == "log"
    assert sweep_figure([rows[2]], "dev_mrr") is None
    # Without λ (a learning-rate sweep): the metric over the learning rate.
    flat = sweep_figure([{**r, "lambda": None} for r in rows[:2]], "dev_mrr")
    assert list(flat.axes[0].lines[0].get_ydata()) == [0.3, 0.2]
