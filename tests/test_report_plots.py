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
    assert "![training losses, one panel per loss the recipe trains](losses.png)" in markdown
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


def _minilm_stage(name: str, steps: tuple[int, ...], start: float) -> dict:
    """A stage of the minilm recipe as its metrics.jsonl has it: SDA only (the total loss
    is the SDA loss, MEP logged as 0), two logged steps."""
    history = [
        {"step": step, "loss": start - 0.01 * step, "loss_sda": start - 0.01 * step}
        | {"loss_mep": 0.0, "dev_mrr": 0.664 + 0.003 * i}
        for i, step in enumerate(steps)
    ]
    return {
        "stage": name,
        "history": history,
        "final_metrics": {"step": steps[-1], "run_pairs_per_s": 50.0},
        "learning_rate": 1e-5,
        "sda_weight": 1.0,
        "mep_weight": 1.0,
        "hard_negatives": "none",
        "checkpoint": f"/r/{name}/c",
        "seconds": 30.0,
    }


def test_a_recipe_without_mep_draws_one_panel_per_loss_it_trains_as_points_with_labels():
    """The minilm demo: one "SDA loss" panel (no copy of it as "loss", no MEP panel), two
    logged steps per stage drawn as points with their values (no line suggesting a rise),
    the dev MRR on 0..1 so that a 0.003 change looks small, a y label on every plot and
    each bar of metrics.png labelled with its value."""
    stages = [_minilm_stage("pretrain", (10, 20), 0.9), _minilm_stage("finetune", (5, 10), 1.2)]
    metrics = {
        "untrained": {"mrr@100": 0.637, "recall@10": 0.8},
        "santa (finetune)": {"mrr@100": 0.684, "recall@10": 0.85},
    }
    figures = pipeline_figures({"metrics": metrics}, stages)

    (losses,) = figures["losses.png"].axes
    assert losses.get_title() == "SDA loss"
    for line in losses.lines:
        assert line.get_linestyle() == "None" and line.get_marker() == "o"
    labels = sorted(text.get_text() for text in losses.texts)
    assert labels == sorted(f"{h['loss_sda']:.3f}" for s in stages for h in s["history"])
    assert losses.get_ylim()[0] == 0

    (dev,) = figures["dev_mrr.png"].axes
    assert dev.get_ylim() == (0, 1)
    assert {line.get_linestyle() for line in dev.lines} == {"None"}
    assert "0.667" in [text.get_text() for text in dev.texts]

    (bars,) = figures["metrics.png"].axes
    shown = [text.get_text() for text in bars.texts]
    assert sorted(shown) == sorted(f"{v:.3f}" for m in metrics.values() for v in m.values())

    for name, figure in figures.items():
        for axis in figure.axes:
            assert axis.get_ylabel(), f"{name}: {axis.get_title()} has no y label"


def test_a_stage_that_does_not_train_a_loss_draws_no_panel_of_it(pipeline):
    """``train.mep_weight=0`` logs the MEP loss without training it: no MEP panel, and no
    total beside SDA alone; a stage with many logged steps is a line."""
    stages, metrics = pipeline
    unweighted = [{**stage, "mep_weight": 0.0} for stage in stages]
    (axis,) = pipeline_figures({"metrics": metrics}, unweighted)["losses.png"].axes
    assert axis.get_title() == "SDA loss"
    finetune = next(line for line in axis.lines if line.get_label() == "finetune")
    assert finetune.get_linestyle() == "-"  # 6 logged steps


def test_report_captions_every_plot(pipeline, tmp_path):
    """Each plot of report.md has a caption line under it saying how to read it."""
    from santa.pipeline.report import PLOT_NOTES

    stages, metrics = pipeline
    written = write_figures(pipeline_figures({"metrics": metrics}, stages), str(tmp_path))
    report = {
        "name": "r",
        "recipe": "tiny",
        "data": {"test": "t"},
        "metrics": metrics,
        "stages": stages,
        "corpus": {},
        "phases": {"total_s": 1.0},
        "run": str(tmp_path),
    }
    lines = format_report(report, written).splitlines()
    for uri in written:
        name = uri.rsplit("/", 1)[-1]
        at = next(i for i, line in enumerate(lines) if line.endswith(f"]({name})"))
        assert lines[at + 2] == f"*{PLOT_NOTES[name]}*"
