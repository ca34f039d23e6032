"""The trainer through Ray Train on a local two-node Ray cluster: what only Ray does (where
the workers run, a run's storage on S3, the three-stage pipeline). What the loop does
(learning, resume, compile) is tested without Ray: tests/test_train_step.py,
tests/test_train_ranks.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from santa.config.recipes import get_recipe
from santa.files import storage
from santa.models.dual_encoder import DualEncoder
from santa.train.trainer import RunSpec, fit
from tests.conftest import job_env
from tests.training import stdlib_pair_rows, write_pairs

pytestmark = pytest.mark.usefixtures("ray_cluster")

STDLIB_MAX_BYTES = 60_000  # top-level stdlib modules under this size feed the pipeline
MRR_GAIN = 0.03  # held-out MRR@100 the short tiny run must add (it adds 0.07-0.10)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Pretraining pairs (train) and held-out dev pairs built from real stdlib functions."""
    rows = stdlib_pair_rows()
    train, dev = rows[:-48], rows[-48:]
    return {"train": write_pairs(tmp_path_factory.mktemp("pairs") / "train", train), "dev": dev}


@pytest.fixture(scope="module")
def stdlib_splits(tmp_path_factory):
    """The data pipeline run on the standard library's top-level modules.

    Pretraining pairs of the train split and a BEIR folder of the dev (``valid``) split:
    the pipeline splits by file, so no dev function's module is trained on.
    """
    from santa.data.plan import PreprocessConfig, run_preprocess
    from santa.data.source import default_source_root

    root = tmp_path_factory.mktemp("stdlib")
    tree = root / "tree"
    tree.mkdir()
    for path in sorted(Path(default_source_root()).glob("*.py")):
        if path.stat().st_size < STDLIB_MAX_BYTES:
            shutil.copy(path, tree)
    common = {"dataset": "source", "input": str(tree)}
    run_preprocess(PreprocessConfig(output=str(root / "train"), stage="pretrain", **common))
    run_preprocess(
        PreprocessConfig(output=str(root / "dev"), stage="eval", split="valid", **common)
    )
    return {"train": str(root / "train"), "dev": str(root / "dev")}


def test_two_workers_on_two_nodes_train_the_plain_loops_model_into_s3(
    pairs, moto_s3, tmp_path, monkeypatch
):
    """One Ray Train run, a worker on each node of the two-node cluster, its run on S3: the
    same losses step by step as the run in one process without Ray (one global order, MEP the
    global batch's mean: where the workers run changes nothing), every logged step in the
    run's history on S3, its TensorBoard curves copied there, and a checkpoint that loads
    back from S3. Tracked in MLflow and W&B (offline): the driver's ``MLFLOW_*`` and
    ``WANDB_*`` settings reach the rank-0 worker, which the session's cluster started
    without them, and every step it logged is there; the final model, downloaded from S3,
    is the tracked runs' artifact (what is tracked: tests/test_tracking.py, in process)."""
    import argparse

    from mlflow.tracking import MlflowClient

    from santa.train.tracking import Tracking
    from santa.train.trainer import fit_in_process
    from tests.test_tracking import use_offline_wandb, wandb_history, wandb_kinds

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a database
    use_offline_wandb(monkeypatch, tmp_path / "wandb")
    store = f"file://{tmp_path / 'mlruns'}"
    tracking = Tracking.from_args(argparse.Namespace(mlflow=store, wandb="santa-test"))
    bucket = moto_s3.create_bucket("santa-train")
    overrides = ["model.tiny_dropout=0", "train.max_steps=4", "train.log_every=1"]
    overrides += ["train.checkpoint_every=4", "train.num_workers=2"]  # one S3 upload
    config = get_recipe("tiny-ci").with_overrides(overrides)
    spec = RunSpec.of(
        data=pairs["train"],
        storage=f"{bucket}/runs",
        name="s3run",
        cpus_per_worker=1,
        tracking=tracking.to_dict(),
    )
    result = fit(config, spec)  # 1 CPU each on two 1-CPU nodes: one worker per node
    assert result.error is None and result.metrics["step"] == 4
    history = [
        json.loads(line)
        for line in storage.read_bytes(f"{bucket}/runs/s3run/metrics.jsonl").decode().splitlines()
    ]
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    events = storage.list_files(f"{bucket}/runs/s3run/tensorboard")
    assert any("events.out.tfevents" in uri for uri in events)
    client = MlflowClient(tracking_uri=store)
    (tracked,) = client.search_runs([client.get_experiment_by_name("santa").experiment_id])
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == "s3run"
    logged = client.get_metric_history(tracked.info.run_id, "loss")
    assert [(m.step, m.value) for m in logged] == [(h["step"], h["loss"]) for h in history]
    artifacts = {a.path for a in client.list_artifacts(tracked.info.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors"} <= artifacts
    offline = tmp_path / "wandb"
    assert wandb_history(offline)["loss"] == [
        (h["step"], pytest.approx(h["loss"])) for h in history
    ]
    assert "artifact" in wandb_kinds(offline)  # the model folder
    # The same run in one process without Ray (what the quality benches train with), from
    # the Ray run's own initial model.
    init = tmp_path / "init"
    storage.download_dir(f"{bucket}/runs/s3run/init_model", str(init))
    local = fit_in_process(
        config.with_overrides(["train.num_workers=1"]),
        RunSpec.of(data=pairs["train"], storage=str(tmp_path), name="local", warm_start=str(init)),
    )
    plain = [json.loads(line) for line in (tmp_path / "local" / "metrics.jsonl").open()]
    assert local.metrics["step"] == 4 and [h["step"] for h in plain] == [1, 2, 3, 4]
    for key in ("loss_sda", "loss_mep"):
        assert [h[key] for h in history] == pytest.approx([r[key] for r in plain], rel=1e-4), key
    path = result.checkpoint.path
    uri = path if path.startswith("s3://") else f"s3://{path}"
    model = DualEncoder.from_pretrained(storage.join(uri, "model"))
    tokens = model.tokenizer(["def f(): pass"], return_tensors="pt")
    embedding = model.encode(tokens["input_ids"], tokens["attention_mask"])
    assert torch.isfinite(embedding).all()
    assert np.asarray(embedding.detach()).shape[1] == model.embedding_dim


def history_losses(run: Path) -> dict[int, float]:
    """Every logged step's loss from the run's ``metrics.jsonl``."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {row["step"]: row["loss"] for row in map(json.loads, lines)}


def step_losses(result) -> dict[int, float]:
    return {metrics["step"]: metrics["loss"] for _, metrics in result.best_checkpoints}


def test_each_process_reads_an_s3_checkpoint_from_its_own_copy(moto_s3, tmp_path):
    """Ranks resuming from S3 must not share a download directory: Ray's
    ``as_directory`` lets a second process re-download into it while the first reads."""
    import ray.train

    from santa.train.state import local_checkpoint

    bucket = moto_s3.create_bucket("resume-copies")
    storage.write_bytes(f"{bucket}/ckpt/optimizer.pt", b"x" * 1000)
    remote = ray.train.Checkpoint(f"{bucket}/ckpt")
    with local_checkpoint(remote) as first, local_checkpoint(remote) as second:
        assert first != second
        for directory in (first, second):
            assert Path(directory, "optimizer.pt").read_bytes() == b"x" * 1000
    assert not Path(first).exists() and not Path(second).exists()
    local = ray.train.Checkpoint.from_directory(str(tmp_path))
    with local_checkpoint(local) as directory:
        assert directory == str(tmp_path)


@pytest.mark.slow
def test_pipeline_runs_the_three_stages_of_the_paper_and_repeats_them(
    pairs, tmp_path, ray_cluster, monkeypatch, capsys
):
    """--stages pretrain,finetune,ance: each stage warm-starts from the last, ANCE mines with
    the fine-tuned model, and the report shows every stage's metrics and whole history.

    Reproducible from process to process (issue 33), and the same in process as through Ray
    Train: the same command run again in another process, with another hash seed and
    ``--in-process`` (each stage in that process, no Ray Train), gives the same losses at
    every stage bit for bit and the same mined table."""
    from ray_jobs import pipeline
    from tests.training import write_beir

    test_set = write_beir(tmp_path / "beir", pairs["dev"])
    command = (
        ["--storage", str(tmp_path / "runs"), "--data", pairs["train"], "--recipe", "tiny"]
        + ["--eval-data", test_set, "--max-steps", "4", "--num-workers", "1"]
        + ["--address", ray_cluster.address, "--set", "train.log_every=1"]
    )
    args = pipeline.parse_args(
        [*command, "--cpus-per-worker", "0.5", "--name", "staged"]
        + ["--mlflow", f"file://{tmp_path / 'mlruns'}"]
    )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a database
    report = pipeline.run(args)
    # The same command in a process of its own, with its own hash seed, in process: nothing
    # may depend on either (started now, checked last). One torch thread, as the Ray
    # worker of 0.5 CPU has. Without the BM25 baseline and the held-out index, which the
    # losses and the mined table do not read.
    again_command = [*command, "--in-process", "--cpus-per-worker", "1", "--name", "again"]
    again_command += ["--baseline", "none", "--no-index"]
    again = subprocess.Popen(
        [sys.executable, "-m", "ray_jobs.pipeline", *again_command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**job_env(), "PYTHONHASHSEED": "2"},
    )
    try:
        check_staged_run(report, tmp_path)
        # Each stage started from the one before it.
        said = capsys.readouterr().out.splitlines()
        for stage, before in zip(report["stages"][1:], report["stages"], strict=False):
            (line,) = [x for x in said if x.startswith(f"[{stage['stage']}] tiny: 4 steps")]
            assert line.endswith(f", from {before['checkpoint']}/model"), line
    except BaseException:
        again.kill()  # not left running on the session's cluster
        raise
    _, stderr = again.communicate(timeout=1500)
    assert again.returncode == 0, stderr[-3000:]
    for stage in ("pretrain", "finetune", "ance"):
        losses = [
            [
                json.loads(line)["loss"]
                for line in (tmp_path / "runs" / name / stage / "metrics.jsonl").open()
            ]
            for name in ("staged", "again")
        ]
        assert len(losses[0]) == 4 and losses[0] == losses[1], stage  # bit for bit
    first, second = (
        pq.read_table(tmp_path / "runs" / name / "negatives" / "negatives.parquet")
        for name in ("staged", "again")
    )
    columns = ["query_id", "negative_ids"]
    assert first.select(columns).equals(second.select(columns))


def check_staged_run(report: dict, tmp_path: Path) -> None:
    """What the staged run of the three-stage test wrote: report, history, plots, MLflow."""
    assert [s["stage"] for s in report["stages"]] == ["pretrain", "finetune", "ance"]
    assert [s["hard_negatives"] for s in report["stages"]] == ["none", "none", "table"]
    assert [s["learning_rate"] for s in report["stages"]] == [5e-4, 2e-4, 5e-5]
    assert set(report["metrics"]) == {
        "untrained",
        "santa (pretrain)",
        "santa (finetune)",
        "santa (ance)",
        "bm25",
    }
    run = tmp_path / "runs" / "staged"
    assert (run / "negatives" / "negatives.parquet").is_file()
    for stage in ("pretrain", "finetune", "ance"):
        steps = [json.loads(line)["step"] for line in (run / stage / "metrics.jsonl").open()]
        assert steps == [1, 2, 3, 4]
    finetune_state = json.loads((run / "finetune" / "metrics.jsonl").read_text().splitlines()[0])
    assert finetune_state["loss_mep"] == 0  # DR loss only after pretraining
    markdown = (run / "report.md").read_text()
    assert "| santa (ance) |" in markdown and "| ance | 4 |" in markdown
    # One length rule: the untrained and every stage's model at the last stage's lengths.
    encoded = {
        system: (m["max_query_length"], m["max_document_length"], m["lengths_from"])
        for system, m in report["metrics"].items()
        if system != "bm25"
    }
    tiny = get_recipe("tiny").train
    assert set(encoded.values()) == {(tiny.max_query_length, tiny.max_document_length, "asked")}
    assert f"every model at {tiny.max_query_length}/{tiny.max_document_length}" in markdown
    # What the false-negative filter dropped from the mined table, by reason.
    filtered = report["mining"]["filtered"]
    assert filtered["positive"] > 0 and set(filtered) >= {"same_text", "score_ratio"}
    assert "## Hard-negative mining" in markdown and "| positive |" in markdown
    # The report's plots, drawn from the stages' own metrics.jsonl and the evaluation.
    for name in ("losses.png", "metrics.png", "throughput.png"):
        assert (run / name).stat().st_size > 10_000, name
        assert f"]({name})" in markdown
    assert '<img src="losses.png"' in (run / "report.html").read_text()
    from santa.pipeline.plots import pipeline_figures
    from santa.pipeline.report import read_history

    stages = [{**s, "history": read_history(str(run / s["stage"]))} for s in report["stages"]]
    figures = pipeline_figures(report, stages)
    panels = {axis.get_title(): axis for axis in figures["losses.png"].axes}
    drawn = {line.get_label(): list(line.get_ydata()) for line in panels["loss"].lines}
    for stage in ("pretrain", "finetune", "ance"):
        logged = [json.loads(line)["loss"] for line in (run / stage / "metrics.jsonl").open()]
        assert drawn[stage] == logged, stage
    (bars,) = figures["metrics.png"].axes
    heights = {c.get_label(): c.patches[0].get_height() for c in bars.containers}
    assert heights == {name: values["mrr@100"] for name, values in report["metrics"].items()}
    # MLflow: a run per stage, with its steps and its model's held-out metrics beside BM25.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file://{tmp_path / 'mlruns'}")
    experiment = client.get_experiment_by_name("santa")
    tracked = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(tracked) == {"pretrain", "finetune", "ance"}
    for stage, run in tracked.items():
        assert run.info.status == "FINISHED"
        ours = report["metrics"][f"santa ({stage})"]["mrr@100"]
        assert run.data.metrics["test/model/mrr_at_100"] == pytest.approx(ours)
        assert run.data.metrics["test/bm25/mrr_at_100"] == pytest.approx(
            report["metrics"]["bm25"]["mrr@100"]
        )
        assert len(client.get_metric_history(run.info.run_id, "loss")) == 4
