"""A lost node (issue 33): on a two-node ``ray.cluster_utils.Cluster``, the node holding a
training worker is removed mid-run. At a fixed size the run waits for the workers a bounded
time and ends in one line; with ``--num-workers 1-2`` (elastic) it goes on with the worker
left, at the same global batch, and grows back when a node returns.

Each scenario (``bench/robustness/lost_node.py``) runs in a process of its own (it starts
its own cluster, apart from the test session's), which runs the real ``ray_jobs.pretrain``
command joined to that cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.robustness.lost_node import ELASTIC_STEPS
from tests.training import stdlib_pair_rows, write_pairs

REPO = Path(__file__).resolve().parents[1]


def _run_scenario(mode: str, tmp_path: Path) -> dict:
    data = write_pairs(tmp_path / "pairs", stdlib_pair_rows())
    result_file = tmp_path / "result.json"
    code = (
        "from bench.robustness.lost_node import scenario; "
        f"scenario({mode!r}, {data!r}, {str(tmp_path / 'runs')!r}, {str(result_file)!r})"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=1500,
        check=True,
    )
    return json.loads(result_file.read_text())


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_a_lost_node_at_a_fixed_size_waits_a_bounded_time_then_ends_in_one_line(tmp_path):
    result = _run_scenario("fixed", tmp_path)
    assert result["events"] and result["events"][0][0] == "removed", result["stdout"][-2000:]
    assert result["returncode"] == 1, result["stderr"][-3000:]
    lines = result["stderr"].strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["warning", "error"], lines
    assert lines[0].startswith("santa: warning: a training worker died"), lines[0]
    waits = r"resumes from checkpoint step [24] once 2 workers fit \(waiting up to 40 s\)"
    assert re.search(waits, lines[0]), lines[0]
    assert lines[1].startswith(
        "santa: error: the cluster could not place 2 training workers within 40 s"
    )
    assert "--num-workers MIN-MAX" in lines[1]
    # Bounded: two waits of 20 s (and the job's start and end), not forever.
    assert result["seconds"] - result["events"][0][1] < 240


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_an_elastic_run_goes_on_with_the_worker_left_and_grows_back(tmp_path):
    result = _run_scenario("elastic", tmp_path)
    assert [name for name, _ in result["events"]] == ["removed", "added"], result["stdout"][-2000:]
    assert result["returncode"] == 0, result["stderr"][-3000:]
    lines = result["stderr"].strip().splitlines()
    assert "with the workers that fit (1-2)" in lines[0], lines
    shrunk = [line for line in lines if "training goes on with 1 worker(s) of 1-2" in line]
    grown = [line for line in lines if "training goes on with 2 worker(s) of 1-2" in line]
    assert shrunk and grown, lines
    assert "the global batch stays 8: 8 pairs per worker" in shrunk[0]
    assert "the global batch stays 8: 4 pairs per worker" in grown[0]
    history = [
        json.loads(line)
        for line in (tmp_path / "runs" / "elastic" / "metrics.jsonl").read_text().splitlines()
    ]
    # every step once, to the end
    assert [h["step"] for h in history] == list(range(1, ELASTIC_STEPS + 1))
