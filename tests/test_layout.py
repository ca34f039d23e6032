"""RunLayout: every path of a run, the same for local folders and S3."""

from __future__ import annotations

import os
from types import SimpleNamespace

from santa.files.layout import RunLayout, checkpoint_model, checkpoint_uri


def test_a_local_run_names_its_files_under_its_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    layout = RunLayout.of("runs", "demo")
    root = str(tmp_path / "runs" / "demo")
    assert layout.root == root and layout.name == "demo"
    assert layout.storage_path == str(tmp_path / "runs")
    assert layout.metrics == os.path.join(root, "metrics.jsonl")
    assert layout.init_model == os.path.join(root, "init_model")
    assert layout.tensorboard_dir == layout.tensorboard == os.path.join(root, "tensorboard")
    assert layout.tensorboard_copy == ""  # written in the run already
    assert layout.stage("ance").root == os.path.join(root, "ance")
    assert layout.stage("ance").metrics == os.path.join(root, "ance", "metrics.jsonl")
    assert layout.negatives_table == os.path.join(root, "negatives", "negatives.parquet")
    assert layout.eval("bm25") == os.path.join(root, "eval", "bm25")
    assert layout.data("dev") == os.path.join(root, "data", "dev")
    assert layout.local_lock == os.path.join(root, ".santa-lock")


def test_an_s3_run_keeps_its_scheme_and_writes_events_locally_first() -> None:
    layout = RunLayout.of("s3://bucket/runs", "csn")
    assert layout.root == "s3://bucket/runs/csn" and layout.is_s3
    assert (layout.name, layout.storage_path) == ("csn", "s3://bucket/runs")
    assert layout.s3_lease == "s3://bucket/runs/csn/.santa-lock.json"
    assert layout.tensorboard_copy == "s3://bucket/runs/csn/tensorboard"
    assert layout.tensorboard_dir == os.path.expanduser("~/santa-runs/csn/tensorboard")
    # Ray's checkpoint paths of an S3 run lack the scheme: the layout gives it back.
    checkpoint = SimpleNamespace(path="bucket/runs/csn/checkpoint_000001")
    assert layout.checkpoint_uri(checkpoint) == "s3://bucket/runs/csn/checkpoint_000001"
    assert checkpoint_uri("s3://b/x", "s3://b") == "s3://b/x"
    assert checkpoint_uri("/local/x", "/local") == "/local/x"
    assert checkpoint_model("s3://b/c") == "s3://b/c/model"


def test_scoder_and_sweep_folders() -> None:
    layout = RunLayout("s3://b/runs/s1")
    iteration = layout.iteration(2)
    assert iteration.manifest == "s3://b/runs/s1/iter-2/manifest.json"
    assert iteration.examples("dual_encoder") == "s3://b/runs/s1/iter-2/examples/dual_encoder"
    assert iteration.stage("discriminators").name == "discriminators"
    assert iteration.stage("discriminators").storage_path == "s3://b/runs/s1/iter-2"
    assert layout.warmup.init_model == "s3://b/runs/s1/warmup/init_model"
    assert layout.warmup_record == "s3://b/runs/s1/warmup/warmup.json"
    sweep = RunLayout("s3://b/sweeps/lr")
    assert sweep.best == "s3://b/sweeps/lr/best.json"
    assert sweep.trial("abc_00001").root == "s3://b/sweeps/lr/runs/lr-abc_00001"
