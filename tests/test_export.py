"""Checkpoint retrieval: santa.models.checkpoints, santa.load and ``python -m ray_jobs.export``.

Runs against a real S3 API (moto's server on loopback). Checkpoint folders are laid out as
santa's training loop and Ray Train V2 write them: ``checkpoint_<timestamp>/`` with
``model/`` (a real ``DualEncoder.save_pretrained`` folder) and ``trainer_state.json``, plus
``checkpoint_manager_snapshot.json`` (Ray's record of committed checkpoints) for some runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pyarrow.fs as pafs
import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import santa
from santa.config import ModelConfig
from santa.files import storage
from santa.files.storage import StorageError
from santa.models import checkpoints
from santa.models.checkpoints import CheckpointError
from santa.models.dual_encoder import DualEncoder
from santa.models.tokenizer import train_tokenizer
from tests.conftest import REPO, free_port

CORPUS = [
    'def add_one(value):\n    """Add one to a value."""\n    return value + 1\n',
    "class HttpClient:\n    def get(self, key):\n        return self.cache[key]\n",
    "A stainless steel water bottle that keeps drinks cold.",
]
TEXTS = ["def add_one(value): return value + 1", "steel water bottle"]
BUCKET = "santa-export"
# Names as Ray writes them (StorageContext.make_default_checkpoint_dir_name).
CKPT_10 = "checkpoint_2026-01-01_00-00-10.000001"
CKPT_20 = "checkpoint_2026-01-01_00-00-20.000002"
CKPT_30 = "checkpoint_2026-01-01_00-00-30.000003"  # no weights: an interrupted upload
CKPT_40 = "checkpoint_2026-01-01_00-00-40.000004"  # complete but never committed by Ray
# Distinctive credentials for the subprocess runs, to prove they are never printed.
SECRET_ID = "AKIASANTAEXPORTTEST1"
SECRET_KEY = "santa-export-secret-never-printed-0123456789"


def embed(model: DualEncoder) -> torch.Tensor:
    tokens = model.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.eval().encode(tokens["input_ids"], tokens["attention_mask"])


def write_checkpoint(root: Path, name: str, model: DualEncoder, step: int, weights=True) -> None:
    """A checkpoint folder as the training loop lays it out (the objective's ``model/``,
    then ``santa.train.state.save_loop_state``'s files)."""
    folder = root / name
    model.save_pretrained(str(folder / checkpoints.MODEL_DIR))
    if not weights:
        (folder / checkpoints.MODEL_DIR / "model.safetensors").unlink()
    for state_file in ("optimizer.pt", "scheduler.pt", "rng_state.pt"):
        torch.save({"step": step}, folder / state_file)
    state = {"step": step, "epoch": 0, "batches_in_epoch": step, "resumed_at": []}
    (folder / checkpoints.STATE_FILE).write_text(json.dumps(state))


def snapshot(*entries: tuple[str, int], latest: str) -> dict:
    """checkpoint_manager_snapshot.json as Ray 2.60 writes it."""
    results = [
        {"version": 0, "checkpoint_dir_name": name, "metrics": {"step": step, "loss": 1.0}}
        for name, step in entries
    ]
    return {
        "ray_version": "2.60.0",
        "checkpoint_results": results,
        "checkpoint_report_indices": list(range(len(results))),
        "latest_checkpoint_result": next(r for r in results if r["checkpoint_dir_name"] == latest),
        "pending_training_results": [],
        "pending_validation_specs": [],
        "current_report_index": len(results),
        "validated_checkpoint_dir_names": [],
        "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": [],
    }


def upload(local: Path, uri: str) -> None:
    filesystem, path = storage.resolve(uri)
    pafs.copy_files(
        str(local),
        path,
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=filesystem,
    )


@pytest.fixture(scope="module")
def models() -> dict[int, DualEncoder]:
    tokenizer = train_tokenizer(CORPUS * 30, vocab_size=600)
    return {step: DualEncoder.build_tiny(ModelConfig(), tokenizer, seed=step) for step in (10, 20)}


@pytest.fixture(scope="module")
def store(moto_s3, models, tmp_path_factory) -> dict[str, str]:
    """Runs on S3 (and one local copy): ``plain`` (no snapshot), ``recorded``, ``sweep``."""
    bucket = moto_s3.create_bucket(BUCKET)
    local = tmp_path_factory.mktemp("store")
    plain = local / "plain"
    write_checkpoint(plain, CKPT_10, models[10], 10)
    write_checkpoint(plain, CKPT_20, models[20], 20)
    write_checkpoint(plain, CKPT_30, models[20], 30, weights=False)
    recorded = local / "recorded"
    shutil.copytree(plain, recorded)
    write_checkpoint(recorded, CKPT_40, models[10], 40)
    (recorded / checkpoints.RUN_SNAPSHOT_FILE).write_text(
        json.dumps(snapshot((CKPT_10, 10), (CKPT_20, 20), latest=CKPT_20))
    )
    broken = local / "broken-latest"  # Ray's latest lost its weights: the older one serves
    write_checkpoint(broken, CKPT_10, models[10], 10)
    write_checkpoint(broken, CKPT_30, models[20], 30, weights=False)
    (broken / checkpoints.RUN_SNAPSHOT_FILE).write_text(
        json.dumps(snapshot((CKPT_10, 10), (CKPT_30, 30), latest=CKPT_30))
    )
    for name in ("plain", "recorded", "broken-latest"):
        upload(local / name, f"{bucket}/runs/{name}")
    best = {
        "checkpoint": f"{bucket}/runs/plain/{CKPT_10}",
        "config": {"train.learning_rate": 1e-4},
        "metric": 0.42,
        "metric_name": "mrr@100",
    }
    storage.write_json(f"{bucket}/sweeps/lr/best.json", best)
    scheme_less = {**best, "checkpoint": f"{BUCKET}/runs/plain/{CKPT_20}"}
    storage.write_json(f"{bucket}/sweeps/ray-style/best.json", scheme_less)
    return {
        "bucket": bucket,
        "runs": f"{bucket}/runs",
        "sweeps": f"{bucket}/sweeps",
        "local": str(local),
    }


# --------------------------------------------------------------------------- resolution


def test_snapshot_name_matches_ray() -> None:
    """Checkpoint file names are defined once (santa.models.checkpoints); Ray's own must match."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    assert checkpoints.RUN_SNAPSHOT_FILE == CHECKPOINT_MANAGER_SNAPSHOT_FILENAME


def test_checkpoint_export_is_a_plain_hf_folder(store, models, tmp_path) -> None:
    uri = f"{store['runs']}/plain/{CKPT_20}"
    resolved = checkpoints.resolve_checkpoint(uri)
    assert (resolved.checkpoint_uri, resolved.step) == (uri, 20)
    assert resolved.model_uri == f"{uri}/model"
    target = checkpoints.download(resolved, tmp_path / "exported")
    names = {path.name for path in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "santa_config.json"} <= names
    assert not names & {"optimizer.pt", "trainer_state.json", "model"}
    assert [path.name for path in tmp_path.iterdir()] == ["exported"]  # no staging left over

    backbone = AutoModelForSeq2SeqLM.from_pretrained(target)  # plain transformers
    assert backbone.config.d_model == models[20].embedding_dim
    expected = embed(models[20])
    assert torch.equal(embed(santa.load(str(target))), expected)
    assert torch.equal(embed(santa.load(uri)), expected)  # straight from S3
    assert not torch.equal(embed(models[10]), expected)


def test_latest_is_the_highest_complete_step(store) -> None:
    resolved = checkpoints.latest_checkpoint(f"{store['runs']}/plain")
    assert resolved.step == 20  # step 30 has no weights
    assert resolved.checkpoint_uri == f"{store['runs']}/plain/{CKPT_20}"


def test_latest_follows_rays_record(store) -> None:
    recorded = checkpoints.latest_checkpoint(f"{store['runs']}/recorded")
    assert recorded.step == 20  # step 40 is complete on disk, but Ray never committed it
    assert recorded.details["metrics"]["step"] == 20
    fallback = checkpoints.latest_checkpoint(f"{store['runs']}/broken-latest")
    assert (fallback.step, fallback.checkpoint_uri) == (
        10,
        f"{store['runs']}/broken-latest/{CKPT_10}",
    )


def test_latest_works_on_local_runs(store) -> None:
    assert checkpoints.latest_checkpoint(Path(store["local"]) / "plain").step == 20
    assert checkpoints.latest_checkpoint(Path(store["local"]) / "recorded").step == 20


def test_best_follows_best_json(store) -> None:
    best = checkpoints.best_checkpoint(f"{store['sweeps']}/lr")
    assert (best.step, best.checkpoint_uri) == (10, f"{store['runs']}/plain/{CKPT_10}")
    assert best.details["metric"] == 0.42 and "checkpoint" not in best.details
    ray_style = checkpoints.best_checkpoint(f"{store['sweeps']}/ray-style/best.json")
    assert ray_style.step == 20


def test_load_resolves_runs_sweeps_and_ray_checkpoints(store, models) -> None:
    import ray.train

    assert torch.equal(embed(santa.load(f"{store['runs']}/plain")), embed(models[20]))
    assert torch.equal(embed(santa.load(f"{store['sweeps']}/lr")), embed(models[10]))
    local = Path(store["local"]) / "plain" / CKPT_10
    checkpoint = ray.train.Checkpoint.from_directory(str(local))
    assert torch.equal(embed(santa.load(checkpoint)), embed(models[10]))
    assert torch.equal(embed(santa.load(local / "model")), embed(models[10]))


def test_resolve_model_reads_the_saved_config_and_keeps_hub_names(store) -> None:
    resolved = checkpoints.resolve_model(Path(store["local"]) / "plain" / CKPT_10)
    assert resolved.step == 10 and resolved.santa_config["model"]["kind"] == "t5"
    assert resolved.train == {} and not resolved.is_hub_name
    for name in ("t5-small", "Salesforce/codet5-base"):
        hub = checkpoints.resolve_model(name)
        assert hub.is_hub_name and hub.model_uri == name and hub.train == {}


def test_missing_local_path_is_an_error_not_a_hub_name(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    missing = ("./nope", str(tmp_path / "nope" / "model"), "runs/ckpt/foo", "runs/foo", "~/x/y")
    for path in missing:
        with pytest.raises(
            CheckpointError, match=f"^no such file or directory: {re.escape(path)}$"
        ):
            checkpoints.resolve_model(path)
    with pytest.raises(CheckpointError, match="^no such file or directory: runs/foo$"):
        santa.load("runs/foo")


def test_incomplete_checkpoint_is_never_taken(store) -> None:
    with pytest.raises(CheckpointError, match="no complete model"):
        checkpoints.resolve_checkpoint(f"{store['runs']}/plain/{CKPT_30}")
    with pytest.raises(CheckpointError, match="no complete model"):
        santa.load(f"{store['runs']}/plain/{CKPT_30}")


# --------------------------------------------------------------------------- errors


def test_missing_bucket_checkpoint_run_and_sweep(store) -> None:
    with pytest.raises(CheckpointError, match=r"^no such bucket: s3://santa-nope$"):
        checkpoints.resolve_checkpoint("s3://santa-nope/runs/x/checkpoint_1")
    with pytest.raises(CheckpointError, match=r"^no checkpoint at s3://santa-export/runs/none$"):
        checkpoints.resolve_checkpoint(f"{store['runs']}/none")
    with pytest.raises(CheckpointError, match="^no run at"):
        checkpoints.latest_checkpoint(f"{store['runs']}/none")
    with pytest.raises(CheckpointError, match="no best.json in"):
        checkpoints.best_checkpoint(f"{store['runs']}/plain")
    with pytest.raises(StorageError):  # CheckpointError is a StorageError
        santa.load(f"{store['runs']}/none")


def test_unreachable_endpoint_fails_fast(store, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # closed port
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="^cannot reach the S3 endpoint http://127.0.0.1:"):
        checkpoints.latest_checkpoint(f"{store['runs']}/plain")
    assert time.monotonic() - started < 10


class AuthMotoServer:
    """A moto server that enforces IAM: only a key created through its IAM API works."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        executable = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        # The first 3 requests (create user, access key, policy) go unchecked; then all are.
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
        self.process = subprocess.Popen(
            [executable, "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import socket

        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.time() > deadline:
                    self.stop()
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="santa")
        key = iam.create_access_key(UserName="santa")["AccessKey"]
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="santa", PolicyName="all", PolicyDocument=json.dumps(policy))
        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )
        s3.create_bucket(Bucket="santa-auth")
        s3.put_object(Bucket="santa-auth", Key="run/best.json", Body=b"{}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def auth_s3():
    server = AuthMotoServer()
    yield server
    server.stop()


def test_bad_credentials(auth_s3, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", auth_s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", auth_s3.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", auth_s3.secret)
    # Good credentials pass (so the rejections below are about the credentials).
    with pytest.raises(CheckpointError, match="names no checkpoint"):
        checkpoints.best_checkpoint("s3://santa-auth/run")
    for key_id, secret in ((auth_s3.key_id, "wrong-secret"), ("AKIAUNKNOWNKEY000000", "x")):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        with pytest.raises(CheckpointError, match="^access denied to s3://santa-auth") as caught:
            checkpoints.best_checkpoint("s3://santa-auth/run")
        assert "credentials" in str(caught.value) and secret not in str(caught.value)
        assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- atomic writes


def test_existing_folder_is_kept_unless_overwrite(store, tmp_path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    resolved = checkpoints.resolve_checkpoint(Path(store["local"]) / "plain" / CKPT_10)
    with pytest.raises(CheckpointError, match="already exists"):
        checkpoints.download(resolved, target)
    assert (target / "keep.txt").read_text() == "mine"
    checkpoints.download(resolved, target, overwrite=True)
    assert not (target / "keep.txt").exists() and (target / "model.safetensors").is_file()
    assert [path.name for path in tmp_path.iterdir()] == ["model"]


def test_failed_download_leaves_nothing(store, tmp_path, monkeypatch) -> None:
    def fail_halfway(source, destination, **kwargs):
        Path(destination, "config.json").write_text("{}")
        raise OSError("connection reset")

    monkeypatch.setattr(checkpoints.pafs, "copy_files", fail_halfway)
    resolved = checkpoints.resolve_checkpoint(f"{store['runs']}/plain/{CKPT_10}")
    with pytest.raises(CheckpointError, match="cannot download .*connection reset"):
        checkpoints.download(resolved, tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- CLI


def run_cli(*args: str, endpoint: str, key_id=SECRET_ID, secret=SECRET_KEY):
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key_id,
        "AWS_SECRET_ACCESS_KEY": secret,
    }
    return subprocess.run(
        [sys.executable, "-m", "ray_jobs.export", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli(store, moto_s3, auth_s3, tmp_path) -> None:
    done = run_cli(
        "--latest", f"{store['runs']}/plain", "--to", str(tmp_path / "m"), endpoint=moto_s3.endpoint
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"wrote {tmp_path / 'm'} (step 20) from {store['runs']}/plain/{CKPT_20}/model"
    )
    assert (tmp_path / "m" / "model.safetensors").is_file()

    missing = run_cli(
        "--checkpoint",
        f"{store['runs']}/none",
        "--to",
        str(tmp_path / "x"),
        endpoint=moto_s3.endpoint,
    )
    denied = run_cli(
        "--best", "s3://santa-auth/run", "--to", str(tmp_path / "y"), endpoint=auth_s3.endpoint
    )
    for failed, message in ((missing, "no checkpoint at"), (denied, "access denied to")):
        assert failed.returncode == 2
        assert failed.stdout == ""
        assert failed.stderr.startswith(f"santa: error: {message}")
        assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    for output in (done, missing, denied):
        assert SECRET_ID not in output.stdout + output.stderr
        assert SECRET_KEY not in output.stdout + output.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_import_santa_stays_cheap() -> None:
    code = (
        "import santa, sys; print(sorted({'torch', 'pyarrow', 'transformers'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr
