"""Preprocess outputs are published whole: staged, then renamed (local) or named by a
manifest written last (S3); one run's files per output folder; Ctrl-C keeps the last one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from santa.files import outputs, storage
from santa.files.outputs import matching_manifest, published_root, read_manifest, staged_output
from tests.datagen import stdlib_python_records, write_csn_layout, write_jsonl_gz

REPO = Path(__file__).resolve().parents[1]


def _publish(uri: str, files: dict[str, bytes], **config) -> dict:
    with staged_output(uri) as staged:
        for name, data in files.items():
            storage.write_bytes(storage.join(staged.staging, name), data)
        return staged.publish({"rows_written": len(files), "config": config})


def test_local_publish_replaces_the_whole_folder(tmp_path):
    out = str(tmp_path / "out")
    _publish(out, {"data/a.parquet": b"a", "qrels/train.tsv": b"t"}, stage="pretrain")
    _publish(out, {"corpus.jsonl": b"c"}, stage="eval")
    assert sorted(p.name for p in Path(out).rglob("*") if p.is_file()) == [
        "corpus.jsonl",
        "report.json",
    ]
    assert read_manifest(out)["config"] == {"stage": "eval"}
    assert published_root(out) == out
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging or old folders left


def test_a_failed_run_leaves_the_previous_output_and_no_staging(tmp_path):
    out = str(tmp_path / "out")
    _publish(out, {"data/a.parquet": b"old"})
    with pytest.raises(KeyboardInterrupt), staged_output(out) as staged:
        storage.write_bytes(storage.join(staged.staging, "data/b.parquet"), b"new")
        raise KeyboardInterrupt
    assert (tmp_path / "out" / "data" / "a.parquet").read_bytes() == b"old"
    assert not (tmp_path / "out" / "data" / "b.parquet").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_s3_manifest_names_the_run_prefix_and_older_runs_go(moto_s3):
    bucket = moto_s3.create_bucket("santa-outputs")
    out = f"{bucket}/corpus"
    storage.write_bytes(f"{out}/data/legacy.parquet", b"older layout")
    first = _publish(out, {"data/a.parquet": b"a", "qrels/train.tsv": b"t"})
    root = published_root(out)
    assert root == f"{out}/runs/{first['manifest']['run_id']}"
    assert storage.read_bytes(f"{root}/data/a.parquet") == b"a"
    assert not storage.exists(f"{out}/data/legacy.parquet")

    # A run interrupted before its manifest: never read, the previous run stays published.
    storage.write_bytes(f"{out}/runs/zzz-half/data/b.parquet", b"half")
    assert published_root(out) == root

    second = _publish(out, {"corpus.jsonl": b"c"})
    root = published_root(out)
    assert root.endswith(second["manifest"]["run_id"])
    remaining = storage.list_files(out)
    assert sorted(r.removeprefix(out + "/") for r in remaining) == [
        "report.json",
        f"runs/{second['manifest']['run_id']}/corpus.jsonl",
        f"runs/{second['manifest']['run_id']}/report.json",
    ]


def test_matching_manifest_needs_complete_and_same_options(tmp_path):
    out = str(tmp_path / "out")
    assert matching_manifest(out, {"split": "train"}) is None
    storage.write_json(f"{out}/report.json", {"config": {"split": "train"}})  # no manifest
    assert matching_manifest(out, {"split": "train"}) is None
    _publish(out, {"data/a.parquet": b"a"}, split="train", languages=["python"])
    assert matching_manifest(out, {"split": "train", "languages": ["python"]}) is not None
    assert matching_manifest(out, {"split": "valid"}) is None
    assert matching_manifest(out, {"languages": []}) is None


@pytest.mark.usefixtures("ray_cluster")
def test_rerun_with_another_stage_leaves_no_stale_files(tmp_path):
    from santa.data.plan import PreprocessConfig, run_preprocess

    root = tmp_path / "csn"
    write_csn_layout(root)
    out = str(tmp_path / "out")
    common = {"dataset": "codesearchnet", "input": str(root), "output": out}
    run_preprocess(PreprocessConfig(**common, languages=("go",)))
    assert list((tmp_path / "out" / "data").glob("*.parquet"))
    run_preprocess(PreprocessConfig(**common, languages=("go",), stage="eval", split="valid"))
    files = sorted(str(p.relative_to(out)) for p in Path(out).rglob("*") if p.is_file())
    assert files == ["corpus.jsonl", "qrels/valid.tsv", "queries.jsonl", "report.json"]
    assert read_manifest(out)["config"]["stage"] == "eval"


def _preprocess_cli(source: Path, output: Path, address: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "ray_jobs.preprocess", "--dataset", "codesearchnet"]
        + ["--input", str(source), "--output", str(output), "--address", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO),
    )


@pytest.mark.slow
def test_ctrl_c_mid_preprocess_keeps_the_previous_output(ray_cluster, tmp_path):
    """SIGINT after Ray started (reading and parsing under way): exit 130, the previous
    complete output untouched, no staging folder left; a re-run then publishes.

    Both jobs join the session's cluster: what is published is the job's, whichever Ray it
    runs on (a Ray of its own cost ~8 s a job; Ctrl-C to a job with a Ray of its own is
    tests/test_interrupts_ray.py's)."""
    source = tmp_path / "csn" / "python" / "final" / "jsonl" / "train"
    records = stdlib_python_records(limit=400)
    write_jsonl_gz(source / "python_train_0.jsonl.gz", records)
    out = tmp_path / "out"
    # A preprocess output of an earlier run (its manifest names the dataset).
    _publish(str(out), {"data/part-0.parquet": b"previous run"}, dataset="codesearchnet")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    proc = _preprocess_cli(tmp_path / "csn", out, ray_cluster.address)
    started = time.time()
    for line in proc.stdout:  # the which-Ray line comes before any Ray work
        if line.startswith("Ray:"):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert time.time() - started < 120
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".out.santa-lock") == [
        "csn",
        "out",
    ]  # (beside the output: its one-writer lock)

    proc = _preprocess_cli(tmp_path / "csn", out, ray_cluster.address)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    manifest = read_manifest(str(out))
    assert manifest["config"]["dataset"] == "codesearchnet"
    assert pq.read_table(out / "data").num_rows == manifest["rows_written"] > 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".out.santa-lock") == [
        "csn",
        "out",
    ]  # (beside the output: its one-writer lock)


def test_stage_ids_are_unique_and_sortable():
    first, second = outputs.new_run_id(), outputs.new_run_id()
    assert first != second and len(first) == len(second)


def test_staging_left_by_a_killed_run_is_deleted_by_the_next_run(tmp_path):
    import socket

    from santa.files.outputs import OWNER_FILE

    out = str(tmp_path / "out")
    _publish(out, {"data/a.parquet": b"a"})
    host = socket.gethostname()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: a run killed with -9
    for run, pid in (("dead", gone.pid), ("live", os.getpid())):
        folder = tmp_path / f"out.tmp-{run}"
        (folder / "data").mkdir(parents=True)
        (folder / OWNER_FILE).write_text(f"{host} {pid}\n")
    (tmp_path / "out.tmp-foreign").mkdir()  # no owner file: not known to be dead
    (tmp_path / "out.tmp-elsewhere").mkdir()
    (tmp_path / "out.tmp-elsewhere" / OWNER_FILE).write_text(f"not-{host} {gone.pid}\n")
    (tmp_path / "out.old-finished").mkdir()  # its publish renamed the staging in

    _publish(out, {"data/b.parquet": b"b"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "out",
        "out.tmp-elsewhere",
        "out.tmp-foreign",
        "out.tmp-live",
    ]
    assert not (tmp_path / "out" / OWNER_FILE).exists()
