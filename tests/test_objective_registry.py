"""Objectives own their data and their start (``santa.train.loop_config.OBJECTIVES``), so
``fit`` trains one it has never heard of; a run's folder reaches Ray Train as the layout
its caller made (``RunSpec.layout``), not split into a storage path and a name and rebuilt."""

from __future__ import annotations

import pytest

from santa.files.layout import RunLayout
from santa.train.loop_config import (
    OBJECTIVES,
    LoopConfig,
    ObjectiveEntry,
    objective_entry,
    training_data,
)
from tests.training import tiny_config

CALLS: list[str] = []


class Reached(Exception):
    """Raised by the toy objective's data function: fit got that far, through it."""


def toy_data(loop: LoopConfig):
    """The toy objective's data function (named in its registry entry)."""
    CALLS.append(loop.data_uri)
    raise Reached


def toy_entry(**kwargs) -> ObjectiveEntry:
    return ObjectiveEntry("tests.nowhere:Toy", "tests.test_objective_registry:toy_data", **kwargs)


def test_fit_asks_a_new_objectives_entry_for_its_data_and_starts_it_from_its_folder(
    tmp_path, monkeypatch
) -> None:
    """A toy objective, registered with one line: fit asks its data function for what it
    trains on (before any Ray work: the function's failure ends fit), and its start is its
    own folder, handed over as is; no branch of fit names it."""
    from santa.train.trainer import RunSpec, fit, prepare_initial_model

    CALLS.clear()
    monkeypatch.setitem(OBJECTIVES, "toy", toy_entry(own_start=True))
    config = tiny_config(num_workers=1, max_steps=1)
    start = tmp_path / "start"  # never read as a model folder
    spec = RunSpec.of(
        data=str(tmp_path / "examples"),
        storage=str(tmp_path / "runs"),
        name="toy",
        objective="toy",
        warm_start=str(start),
        cpus_per_worker=0.5,
    )
    with pytest.raises(Reached):
        fit(config, spec)
    assert [str(tmp_path / "examples")] == CALLS
    assert prepare_initial_model(config, spec) == str(start)


def test_the_configs_objective_is_trained_unless_the_run_names_one(tmp_path, monkeypatch) -> None:
    """``train.objective`` (``--set train.objective=toy``, a recipe) chooses the objective
    of a run that names none, in process as through Ray Train; an unknown name is one line
    before any work; a run that names one (SCodeR's stages) trains that."""
    from santa.train.trainer import RunSpec, fit, fit_in_process

    monkeypatch.setitem(OBJECTIVES, "toy", toy_entry())
    config = tiny_config(num_workers=1, max_steps=1).with_overrides(["train.objective=toy"])
    assert config.train.objective == "toy"
    for train, in_process in ((fit, False), (fit_in_process, True)):
        CALLS.clear()
        spec = RunSpec.of(
            data=str(tmp_path / "examples"),
            storage=str(tmp_path / "runs"),
            name=f"toy-{in_process}",
            cpus_per_worker=0.5,
            in_process=in_process,
        )
        assert spec.objective == "" and spec.for_config(config).objective == "toy"
        with pytest.raises(Reached):
            train(config, spec)
        assert [str(tmp_path / "examples")] == CALLS
    named = RunSpec.of(data=str(tmp_path), storage=str(tmp_path), name="r", objective="santa")
    assert named.for_config(config).objective == "santa"
    unknown = tiny_config().with_overrides(["train.objective=nope"])
    with pytest.raises(ValueError, match=r"^train.objective must be one of .*got 'nope'"):
        fit(unknown, RunSpec.of(data=str(tmp_path), storage=str(tmp_path), name="r"))
    with pytest.raises(ValueError, match="TrainConfig.objective must name an objective"):
        tiny_config().with_overrides(["train.objective=not a name"])


def test_an_objective_with_its_own_start_needs_one_and_names_itself(tmp_path, monkeypatch) -> None:
    from santa.train.trainer import RunSpec, prepare_initial_model

    monkeypatch.setitem(OBJECTIVES, "toy", toy_entry(own_start=True))
    spec = RunSpec.of(data=str(tmp_path), storage=str(tmp_path), name="r", objective="toy")
    with pytest.raises(ValueError, match="training toy needs its starting folder"):
        prepare_initial_model(tiny_config(), spec)


def test_the_registered_objectives_data_and_an_unknown_name(tmp_path) -> None:
    from santa.train.data import PAIR_COLUMNS

    (tmp_path / "data").mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "data" / "part-0.parquet")
    loop = LoopConfig(santa=tiny_config(), init_model="", data_uri=str(tmp_path))
    assert training_data(loop).source.columns == PAIR_COLUMNS
    listwise = training_data(
        LoopConfig(
            santa=tiny_config(), init_model="", objective="dual_encoder", data_uri=str(tmp_path)
        )
    )
    assert "candidates" in listwise.source.columns
    assert objective_entry("discriminators").own_start
    assert not objective_entry("dual_encoder").own_start
    with pytest.raises(ValueError, match="objective must be one of .*got 'nope'"):
        objective_entry("nope")


def test_a_run_spec_keeps_the_layout_it_is_given(tmp_path) -> None:
    from santa.train.trainer import RunSpec

    layout = RunLayout.of(str(tmp_path / "runs"), "parent").child("stage")
    spec = RunSpec(data="pairs", layout=layout)
    assert spec.layout is layout and spec.name == "stage"
    made = RunSpec.of(data="pairs", storage=str(tmp_path / "runs"), name="x")
    assert made.layout == RunLayout(str(tmp_path / "runs" / "x"))
    with pytest.raises(TypeError, match="layout must be a RunLayout"):
        RunSpec(data="pairs", layout=str(tmp_path))  # type: ignore[arg-type]


def test_a_pipeline_stage_trains_in_the_stage_layout_the_pipeline_made(tmp_path) -> None:
    from santa.pipeline.spec import PipelineSpec
    from santa.pipeline.stages import stage_run

    spec = PipelineSpec(storage=str(tmp_path / "runs"), name="p", recipe="tiny")
    for stage in ("pretrain", "finetune", "ance"):
        stage_layout = spec.layout.stage(stage)
        run = stage_run(spec, stage_layout, str(tmp_path / "pairs"), "", "")
        assert run.layout is stage_layout  # no split into storage path and name, no rebuild
        assert run.layout.storage_path == spec.layout.root


def test_a_sweep_trial_trains_in_the_trial_layout(tmp_path) -> None:
    from tuning.trials import trial_layout, trial_run

    run = {"data": str(tmp_path / "pairs"), "cpus_per_worker": 0.5}
    sweep = {
        "name": "s",
        "root": str(tmp_path / "s"),
        "run": {**run, "max_failures": 2, "eval_data": "", "eval_split": "v"},
    }
    layout = trial_layout(sweep, "t1")
    spec = trial_run(sweep, layout)
    assert spec.layout is layout and spec.layout.root == str(tmp_path / "s" / "runs" / "s-t1")
    assert (spec.cpus_per_worker, spec.max_failures, spec.eval_split) == (0.5, 2, "v")


def test_every_registered_objective_gives_the_parts_that_have_no_default() -> None:
    """The base class's build_model, losses, save_model and load_model raise
    NotImplementedError; each registered objective overrides all four."""
    from santa.train.loop_config import OBJECTIVES
    from santa.train.objective import Objective, objective_class

    for name in OBJECTIVES:
        cls = objective_class(name)
        assert issubclass(cls, Objective), name
        for part in ("build_model", "losses", "save_model", "load_model"):
            assert getattr(cls, part) is not getattr(Objective, part), (name, part)
