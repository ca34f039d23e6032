"""Reproducible from process to process (issue 33): the same pipeline command with the same seed
gives the same losses at every stage (pretrain, finetune, ANCE with its mined table), on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training import stdlib_pair_rows, write_beir, write_pairs

REPO = Path(__file__).resolve().parents[1]
STAGES = ("pretrain", "finetune", "ance")


def _pipeline(name: str, data: str, beir: str, storage: Path, seed: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    # Each run in a process of its own, with its own hash seed: nothing may depend on it.
    env.update(PYTHONPATH=str(REPO), PYTHONHASHSEED=seed)
    args = [
        "ray_jobs.pipeline", "--data", data, "--eval-data", beir, "--storage", str(storage),
        "--name", name, "--max-steps", "4", "--num-workers", "2", "--cpus-per-worker", "0.5",
        "--baseline", "none", "--address", "local", "--recipe", "tiny-ci",
        "--set", "train.log_every=1",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=1500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _losses(run: Path) -> dict[str, list[float]]:
    losses = {}
    for stage in STAGES:
        lines = (run / stage / "metrics.jsonl").read_text().splitlines()
        losses[stage] = [json.loads(line)["loss"] for line in lines]
    return losses


@pytest.mark.long(seconds=175)
@pytest.mark.timeout(3000)
def test_two_pipeline_runs_with_the_same_seed_give_the_same_losses_at_every_stage(tmp_path):
    rows = stdlib_pair_rows()
    data = write_pairs(tmp_path / "pairs", rows[:-24])
    beir = write_beir(tmp_path / "beir", rows[-24:])
    _pipeline("first", data, beir, tmp_path / "runs", seed="1")
    _pipeline("second", data, beir, tmp_path / "runs", seed="2")
    first, second = _losses(tmp_path / "runs" / "first"), _losses(tmp_path / "runs" / "second")
    for stage in STAGES:
        assert len(first[stage]) == 4, (stage, first[stage])
        assert first[stage] == second[stage], stage  # bit for bit
    tables = [
        (tmp_path / "runs" / name / "negatives" / "negatives.parquet").read_bytes()
        for name in ("first", "second")
    ]
    import io

    import pyarrow.parquet as pq

    first_table, second_table = (pq.read_table(io.BytesIO(t)) for t in tables)
    assert first_table.select(["query_id", "negative_ids"]).equals(
        second_table.select(["query_id", "negative_ids"])
    )
