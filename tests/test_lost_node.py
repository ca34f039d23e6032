"""A lost node (issue 33): on a two-node ``ray.cluster_utils.Cluster``, the node holding a
training worker is removed mid-run. At a fixed size the run names the lost node, waits for
the workers a bounded time and ends in one line; with ``--num-workers 1-2`` (elastic) the
node's processes are killed outright (a crashed host, as Ray sees it) and the run goes on
with the worker left, at the same global batch, within seconds of Ray marking the node
DEAD, and grows back when a node returns: one line for each resize.

Both scenarios (``bench/robustness/lost_node.py``) run once, one after the other, in a
process of their own on one cluster of their own (apart from the test session's), each the
real ``ray_jobs.pretrain`` command joined to it: the elastic one first (the node it adds back
is the one the fixed-size run then loses), with the GCS's health checks every 1 s instead of
3 s (a killed node is DEAD after ~5 s, not ~15 s).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.robustness.lost_node import ELASTIC_STEPS, goes_on_after
from tests.conftest import CHECKPOINT_NEAR_STEP_5
from tests.training import stdlib_pair_rows, write_pairs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lost_node(tmp_path_factory) -> dict[str, dict]:
    """Each scenario's result by mode (``elastic-kill``, then ``fixed``), and the runs' folder."""
    root = tmp_path_factory.mktemp("lost-node")
    data = write_pairs(root / "pairs", stdlib_pair_rows())
    result_file = root / "results.json"
    # Waits of 8 s at a fixed size (the first placement, on a cluster with room, takes
    # ~1 s): the run waits 16 s for the workers, not the bench's 40, before its line.
    modes = {"elastic-kill": 20.0, "fixed": 8.0}
    code = (
        "from bench.robustness.lost_node import scenarios; "
        f"scenarios({modes!r}, {data!r}, {str(root / 'runs')!r}, {str(result_file)!r})"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=2400,
    )
    # What ran is checked by each test (a scenario that never ran fails its own test).
    results = json.loads(result_file.read_text()) if result_file.exists() else {}
    return {"results": results, "runs": root / "runs"}


@pytest.mark.long(seconds=70)  # after the elastic scenario, on its cluster
@pytest.mark.timeout(2500)
def test_a_lost_node_at_a_fixed_size_waits_a_bounded_time_then_ends_in_one_line(lost_node):
    assert "fixed" in lost_node["results"], lost_node["results"].keys()
    result = lost_node["results"]["fixed"]
    assert result["events"] and result["events"][0][0] == "removed", result["stdout"][-2000:]
    assert result["returncode"] == 1, result["stderr"][-3000:]
    lines = result["stderr"].strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["warning", "error"], lines
    # The lost node and the rank on it, not the survivor's gloo error.
    lost = (
        r"^santa: warning: node [\d.]+ lost \(Ray node [0-9a-f]{8}: DEAD\) with training "
        rf"worker rank [01]; training resumes from checkpoint step {CHECKPOINT_NEAR_STEP_5} "
        r"once 2 workers fit "
        r"\(waiting up to 16 s\) \(retry 1 of 2\)$"
    )
    assert re.search(lost, lines[0]), lines[0]
    assert "Connection reset" not in result["stderr"] and "gloo" not in result["stderr"]
    assert lines[1].startswith(
        "santa: error: the cluster could not place 2 training workers within 16 s"
    )
    assert "--num-workers MIN-MAX" in lines[1]
    # Bounded: two waits of 8 s (and the job's start and end), not forever.
    assert result["seconds"] - result["events"][0][1] < 240


@pytest.mark.long(seconds=150)  # the cluster's start, then the elastic scenario
@pytest.mark.timeout(2500)
def test_an_elastic_run_goes_on_with_the_worker_left_and_grows_back(lost_node):
    assert "elastic-kill" in lost_node["results"], lost_node["results"].keys()
    result = lost_node["results"]["elastic-kill"]
    assert [name for name, _ in result["events"]] == ["removed", "added"], result["stdout"][-2000:]
    assert result["returncode"] == 0, result["stderr"][-3000:]
    # (The killed group's checkpoint upload, cut short, is removed at the end: a line too.)
    lines = [line for line in result["stderr"].strip().splitlines() if "checkpoint_" not in line]
    shrunk = (
        rf"^santa: training goes on with 1 of 1-2 workers from step {CHECKPOINT_NEAR_STEP_5}: "
        r"node [\d.]+ lost "
        r"\(Ray node [0-9a-f]{8}: DEAD\) with training worker rank [01] \(retry 1 of 2\)$"
    )
    grown = r"^santa: training is back to 2 of 1-2 workers from step \d+$"
    # One line per resize, and nothing else (no failure line quoting gloo).
    assert len(lines) == 2 and re.search(shrunk, lines[0]) and re.search(grown, lines[1]), lines
    # The shrink is decided within seconds of the kill: Ray's health checks mark the node
    # DEAD (about 5 s with the checks every 1 s here, 15 s with Ray's defaults: 13.5 s
    # measured at load 22 on 2 cores), not a placement timeout (20 s here, 60 s by default)
    # for a node that is gone.
    assert goes_on_after(result)["said"] < 45, goes_on_after(result)
    metrics = lost_node["runs"] / "elastic-kill" / "metrics.jsonl"
    history = [json.loads(line) for line in metrics.read_text().splitlines()]
    # every step once, to the end
    assert [h["step"] for h in history] == list(range(1, ELASTIC_STEPS + 1))
