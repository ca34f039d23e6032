"""MLflow and Weights & Biases: a real local MLflow file store and W&B in offline mode, what
santa logged read back and compared with the run's own metrics.jsonl."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from santa.train.tracking import Tracking, TrackingError
from tests.training import stdlib_pair_rows, write_pairs

mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")
wandb = pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")

BLOCK = 32 * 1024
HEADER = 7  # ":W&B" + magic (2 bytes) + version


def wandb_records(path: Path) -> list:
    """The records of an offline W&B run file (its LevelDB-log framing: 32 KiB blocks of
    [crc32, length, type] + payload, FULL/FIRST/MIDDLE/LAST), as protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pending, offset = [], b"", HEADER
    while offset + 7 <= len(data):
        left = BLOCK - offset % BLOCK
        if left < 7:  # the block's tail is padding
            offset += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        if kind == 0 and length == 0:  # zero padding
            offset += left
            continue
        payload = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        pending += payload
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(root: Path) -> dict[str, list[tuple[int, float]]]:
    """Every key's ``(step, value)`` across the offline runs under ``root``."""
    history: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(root.rglob("run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            items = {
                item.key or "/".join(item.nested_key): item.value_json
                for item in record.history.item
            }
            step = int(json.loads(items.get("_step", "0")))
            for key, value in items.items():
                if not key.startswith("_"):
                    history.setdefault(key, []).append((step, json.loads(value)))
    return history


def wandb_kinds(root: Path) -> set[str]:
    return {
        record.WhichOneof("record_type")
        for path in root.rglob("run-*.wandb")
        for record in wandb_records(path)
    }


def wandb_config(root: Path) -> dict:
    """The config of the offline runs under ``root`` (their run and config records)."""
    config: dict = {}
    for path in sorted(root.rglob("run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            items = record.run.config.update if kind == "run" else record.config.update
            if kind in ("run", "config"):
                config.update({item.key: json.loads(item.value_json) for item in items})
    return config


def use_offline_wandb(monkeypatch, folder: Path) -> None:
    """W&B offline into ``folder`` for this test (the variables santa hands to the workers).
    Ray's ``setup_wandb`` sets ``WANDB_START_METHOD=fork`` in the process it runs in (this
    one, in process): set here too, so that it is undone after the test."""
    folder.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(folder))
    monkeypatch.setenv("WANDB_START_METHOD", "fork")


def test_missing_package_is_one_line(monkeypatch):
    import argparse
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(TrackingError, match=r"pip install 'santa\[tracking\]'"):
        Tracking.from_args(argparse.Namespace(mlflow=None, wandb="p"))
    with pytest.raises(TrackingError, match="needs a URI"):
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        Tracking.from_args(argparse.Namespace(mlflow="env", wandb=None))


def test_pretrain_logs_to_mlflow_and_wandb(tmp_path, monkeypatch, capsys):
    """A tiny pretrain with --mlflow FILE-STORE --wandb PROJECT (offline): the config as
    parameters, every logged step, the final metrics and the model folder, as santa's own
    metrics.jsonl has them. Trained in this process (``--in-process``): that the settings
    reach Ray Train workers (rank 0 logs, on another node, of a run on S3) is the two-node
    S3 run's, tests/test_train.py."""
    from mlflow.tracking import MlflowClient

    from ray_jobs import pretrain

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a database
    use_offline_wandb(monkeypatch, tmp_path / "wandb")
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:48])
    store = f"file://{tmp_path / 'mlruns'}"
    argv = ["--data", data, "--storage", str(tmp_path / "runs"), "--name", "tracked"]
    argv += ["--recipe", "tiny", "--max-steps", "4", "--in-process"]
    argv += ["--set", "train.log_every=2"]
    argv += ["--set", "train.global_batch_size=8", "--mlflow", store, "--wandb", "santa-test"]
    assert pretrain.main(argv) == 0
    logged = [
        json.loads(line)
        for line in (tmp_path / "runs" / "tracked" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [h["step"] for h in logged] == [2, 4]

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("santa")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.tags["santa.run"] == str(tmp_path / "runs" / "tracked")
    assert run.data.params["train.global_batch_size"] == "8"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(h["step"], h["loss"]) for h in logged]
    assert run.data.metrics["final/loss"] == pytest.approx(logged[-1]["loss"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors"} <= artifacts

    offline = tmp_path / "wandb"
    history = wandb_history(offline)
    assert history["loss"] == [(h["step"], pytest.approx(h["loss"])) for h in logged]
    assert "artifact" in wandb_kinds(offline)  # the model folder
    assert wandb_config(offline)["train"]["global_batch_size"] == 8


def test_a_resumed_run_logs_each_step_once_and_an_interrupt_marks_it_killed(tmp_path, monkeypatch):
    """Steps repeated after a resume (those after the last checkpoint) are not logged twice
    into MLflow's history, and a job ended by Ctrl-C leaves its run KILLED, not RUNNING;
    the resume reopens it."""
    from mlflow.tracking import MlflowClient

    from santa.train.tracking import WorkerTracker

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = f"file://{tmp_path / 'mlruns'}"
    run_uri = str(tmp_path / "runs" / "cut")
    first = Tracking(mlflow_uri=store).begin(run_uri=run_uri, name="cut", params={"a": 1})
    worker = WorkerTracker(first)
    for step in range(1, 6):
        worker.log({"loss": 10.0 - step, "step": step}, step)
    first.end_early("KILLED")
    client = MlflowClient(tracking_uri=store)
    assert client.get_run(first.mlflow_run_id).info.status == "KILLED"

    # The same command again: the checkpoint was at step 3, so steps 4 and 5 come again.
    again = Tracking(mlflow_uri=store).begin(run_uri=run_uri, name="cut", params={"a": 1})
    assert again.mlflow_run_id == first.mlflow_run_id
    assert client.get_run(again.mlflow_run_id).info.status == "RUNNING"
    worker = WorkerTracker(again)
    for step in range(4, 8):
        worker.log({"loss": 10.0 - step, "step": step}, step)
    history = client.get_metric_history(again.mlflow_run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6, 7]
    again.finish(metrics={"loss": 3.0})
    assert client.get_run(again.mlflow_run_id).info.status == "FINISHED"


SQLITE_JOB = """
import argparse, os, sys
from santa.jobs.errors import run_job
from santa.train.tracking import Tracking, WorkerTracker


def main():
    tracking = Tracking.from_args(argparse.Namespace(mlflow=sys.argv[1], wandb=None))
    print(tracking.mlflow_uri)
    tracked = tracking.begin(run_uri=sys.argv[2], name="stored", params={"train.lr": 0.1})
    os.chdir(sys.argv[3])  # as a Ray Train worker does: relative paths would move
    worker = WorkerTracker(tracked)
    for step in (1, 2):
        worker.log({"loss": 3.0 - step}, step)
    tracked.finish(metrics={"loss": 1.0}, model_dir=sys.argv[4])
    return 0


sys.exit(run_job(main))
"""


def test_a_sqlite_store_works_as_the_readme_says(tmp_path):
    """``--mlflow sqlite:///mlflow.db`` (relative, as the README writes it) from a job run
    on the command line: the store opens (SQLAlchemy and alembic come with the tracking
    extra), the workers' other working folder logs into the same database, MLflow's INFO
    lines go to the job's log file and not the terminal, and the artifacts land beside the
    database, not in ``./mlruns`` of the folder the job ran from."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    here, worker_dir, model = tmp_path / "here", tmp_path / "worker", tmp_path / "model"
    for folder in (here, worker_dir, model):
        folder.mkdir()
    (model / "config.json").write_text("{}")
    log = tmp_path / "job.log"
    script = tmp_path / "job.py"
    script.write_text(SQLITE_JOB)
    env = {**__import__("os").environ, "SANTA_LOG_FILE": str(log)}
    env.pop("MLFLOW_CONFIGURE_LOGGING", None)
    run_uri = str(tmp_path / "runs" / "stored")
    done = subprocess.run(
        [sys.executable, str(script), "sqlite:///store/mlflow.db", run_uri, str(worker_dir)]
        + [str(model)],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    database = here / "store" / "mlflow.db"
    assert done.stdout.strip() == f"sqlite:///{database}"
    assert done.stderr == ""  # no "INFO mlflow.store.db.utils: Creating initial ..."
    assert "mlflow.store.db.utils" in log.read_text()

    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("santa")
    assert experiment.artifact_location == str(here / "store" / "mlartifacts")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["train.lr"] == "0.1"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.0)]
    stored = here / "store" / "mlartifacts" / run.info.run_id / "artifacts" / "model"
    assert (stored / "config.json").read_text() == "{}"
    assert not (here / "mlruns").exists() and not (worker_dir / "mlruns").exists()
    assert not (worker_dir / "store").exists()


def test_mlflow_artifacts_flag_sets_where_a_new_experiment_keeps_them(tmp_path, monkeypatch):
    """``--mlflow-artifacts DIR`` is the new experiment's artifact location."""
    import argparse

    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(mlflow="sqlite:///db/m.db", mlflow_artifacts="arts", wandb=None)
    tracking = Tracking.from_args(args)
    assert tracking.mlflow_artifacts == str(tmp_path / "arts")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking.mlflow_uri)
    assert client.get_experiment_by_name("santa").artifact_location == str(tmp_path / "arts")
    with pytest.raises(TrackingError, match="needs --mlflow"):
        Tracking.from_args(argparse.Namespace(mlflow=None, mlflow_artifacts="x", wandb=None))


def test_a_database_store_without_its_packages_is_one_line_before_ray(
    tmp_path, monkeypatch, capsys
):
    """mlflow-skinny alone cannot open a ``sqlite:`` store: the training job says so in one
    line and exit 2 before Ray starts (it failed after Ray started, 130 s in)."""
    import importlib.util

    from ray_jobs import pretrain
    from santa.cluster import ray_utils

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("sqlalchemy", "alembic") else real(name, *a),
    )
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:16])
    store = f"sqlite:///{tmp_path / 'x' / 'mlflow.db'}"
    argv = ["--data", data, "--storage", str(tmp_path / "runs"), "--name", "r"]
    started = []
    monkeypatch.setattr(ray_utils, "init_ray", lambda *a, **k: started.append(a) or "")
    assert pretrain.main([*argv, "--mlflow", store]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"santa: error: --mlflow {store} needs SQLAlchemy and alembic (MLflow's database "
        "store): pip install 'santa[tracking]' (or pip install sqlalchemy alembic)"
    ]
    assert started == [] and not (tmp_path / "x").exists()
