"""The pipeline's stages on a rerun (santa/pipeline/stages.py): a stage that finished with the
same settings is not entered again (it cost a Ray Train start-up to resume "from step 20" of
20), and an interrupted pipeline's line names only what a rerun reuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from santa.pipeline.spec import PipelineSpec, stage_config
from santa.pipeline.stages import resume_hint, train_stage


def _fake_fit(layout_root: str, calls: list):
    """Ray Train's fit as far as train_stage reads it: a finished run with a checkpoint."""
    from pathlib import Path

    def fit(config, run):
        calls.append(run)
        checkpoint = Path(layout_root) / "pretrain" / "checkpoint_000001"
        (checkpoint / "model").mkdir(parents=True, exist_ok=True)
        (checkpoint / "model" / "config.json").write_text("{}")
        (Path(layout_root) / "pretrain" / "metrics.jsonl").write_text('{"step": 4, "loss": 1.5}\n')
        return SimpleNamespace(
            error=None, checkpoint=SimpleNamespace(path=str(checkpoint)), metrics={"step": 4}
        )

    return fit


def test_a_finished_stage_is_skipped_on_rerun(tmp_path, monkeypatch, capsys):
    import santa.train.trainer as trainer

    spec = PipelineSpec(name="r", storage=str(tmp_path), recipe="tiny-ci", max_steps=4)
    config = stage_config(spec, "pretrain")
    calls: list = []
    monkeypatch.setattr(trainer, "fit", _fake_fit(spec.layout.root, calls))
    first = train_stage(spec, "pretrain", config, "/data/pairs", "", "")
    assert len(calls) == 1 and first["final_metrics"] == {"step": 4}
    capsys.readouterr()

    again = train_stage(spec, "pretrain", config, "/data/pairs", "", "")
    assert len(calls) == 1  # not entered again
    assert capsys.readouterr().out == (
        f"[pretrain] finished in an earlier run: skipped (checkpoint {first['checkpoint']})\n"
    )
    assert again["checkpoint"] == first["checkpoint"]
    assert again["history"] == [{"step": 4, "loss": 1.5}]
    assert again["final_metrics"] == first["final_metrics"]

    # Other settings (data, a step budget) or a checkpoint gone: trained again.
    train_stage(spec, "pretrain", config, "/data/other-pairs", "", "")
    assert len(calls) == 2
    longer = stage_config(PipelineSpec(**{**_fields(spec), "max_steps": 6}), "pretrain")
    train_stage(spec, "pretrain", longer, "/data/other-pairs", "", "")
    assert len(calls) == 3


def _fields(spec: PipelineSpec) -> dict:
    import dataclasses

    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


@pytest.mark.parametrize(
    ("options", "hint"),
    [
        ({}, "the corpus and finished stages are reused"),
        (
            {"stages": ("pretrain", "finetune", "ance")},
            "the corpus, the mined table and finished stages are reused",
        ),
        (
            {"stages": ("pretrain", "finetune", "ance"), "hard_negatives": "async"},
            "the corpus and finished stages are reused",
        ),
        ({"data": "/d", "eval_data": "/e"}, "finished stages are reused"),
    ],
)
def test_the_interrupt_line_names_only_what_a_rerun_reuses(options, hint):
    """The default MiniLM run has no ANCE stage: its line said "the mined table ... reused"."""
    spec = PipelineSpec(recipe="minilm", **options)
    assert resume_hint(spec) == f"run the same command to resume ({hint})"


def test_an_in_process_pipeline_trains_its_stages_here_and_refuses_what_needs_ray(tmp_path):
    """``in_process``: each stage's run is the in-process one on one worker; several workers,
    the async miner and S3 storage are refused before anything runs. (That it computes the
    Ray run's losses bit for bit: the three-stage test of tests/test_train.py.)"""
    from santa.pipeline.stages import stage_run

    spec = PipelineSpec(storage=str(tmp_path), recipe="tiny-ci", num_workers=1, in_process=True)
    assert stage_config(spec, "pretrain").train.num_workers == 1
    run = stage_run(spec, spec.layout.stage("pretrain"), "/data/pairs", "", "")
    assert run.in_process and run.layout.root == f"{tmp_path}/default/pretrain"
    assert not stage_run(PipelineSpec(storage=str(tmp_path)), run.layout, "/d", "", "").in_process
    refused = {
        "num_workers=2": {"num_workers": 2},
        "async": {"num_workers": 1, "stages": ("pretrain", "finetune", "ance")}
        | {"hard_negatives": "async"},
        "s3://b/runs": {"num_workers": 1, "storage": "s3://b/runs"},
    }
    for said, options in refused.items():
        with pytest.raises(ValueError, match=said):
            PipelineSpec(recipe="tiny-ci", in_process=True, **options)


def test_the_pipeline_command_checks_its_stages_and_in_process_flags(capsys):
    from ray_jobs.pipeline import parse_args

    common = ["--data", "/d", "--eval-data", "/e"]
    assert parse_args([*common, "--stages", "pretrain, ance"]).stages == ("pretrain", "ance")
    assert parse_args([*common, "--in-process", "--num-workers", "1"]).in_process
    refused = {
        "--stages must be in the order pretrain,finetune,ance": ["--stages", "finetune,pretrain"],
        "--stages must be among pretrain, finetune, ance; got foo": ["--stages", "foo"],
        "--in-process trains on one worker": ["--in-process", "--num-workers", "2"],
        "async needs Ray Train": ["--in-process", "--hard-negatives", "async"],
    }
    for said, argv in refused.items():
        with pytest.raises(SystemExit) as exited:
            parse_args([*common, *argv])
        assert exited.value.code == 2 and said in capsys.readouterr().err, argv
