"""Shared test fixtures: ../shared samples, NLTK data, a moto S3 server and a Ray cluster.

Order matters: the S3 endpoint and NLTK_DATA are put into the environment before the Ray
cluster starts, so every Ray worker process inherits them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared (real samples, NLTK's tagger) where the checkout has it. SANTA_TEST_SHARED=none
# runs the tests as on a fresh clone without it (CI does, for the tests marked ``shared``).
_SHARED_SETTING = os.environ.get("SANTA_TEST_SHARED", "")
SHARED = (
    REPO / ".no-shared"
    if _SHARED_SETTING == "none"
    else Path(_SHARED_SETTING or REPO.parent / "shared")
)
SHARED_FIXTURES = SHARED / "fixtures"

# ../shared's tagger unless NLTK_DATA names one; with SANTA_TEST_SHARED=none a folder that
# is not there, so that the bench scripts do not fall back to ../shared's either.
_NO_TAGGER_SET = not os.environ.get("NLTK_DATA") and (SHARED / "nltk_data").is_dir()
if _SHARED_SETTING == "none" or _NO_TAGGER_SET:
    os.environ["NLTK_DATA"] = str(SHARED / "nltk_data")
# Ray Data prints per-operator progress lines; keep test logs readable.
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")


def pos_tagger_available() -> bool:
    """Whether NLTK's English POS tagger can be loaded here."""
    try:
        from santa.method.entities import ensure_pos_tagger

        ensure_pos_tagger()
    except (ImportError, LookupError):  # no NLTK or tree-sitter here (e.g. a bare GPU box)
        return False
    return True


TAGGER_MISSING = (
    "NLTK tagger missing: set NLTK_DATA or run "
    "`python -m nltk.downloader averaged_perceptron_tagger_eng`"
)


def needs_tagger(test):
    """A test that needs NLTK's POS tagger: skipped without it (with the install hint), and
    marked ``shared`` (a fresh clone may not have the tagger)."""
    skip = pytest.mark.skipif(not pos_tagger_available(), reason=TAGGER_MISSING)
    return pytest.mark.shared(skip(test))


# Fixtures whose use means a test reads ../shared (or its stand-ins).
SHARED_FIXTURE_NAMES = ("shared_fixtures", "pos_tagger_data")


def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``shared`` every test that reads ../shared: the ones CI runs once more as on a
    clone without it (``SANTA_TEST_SHARED=none``); under CI's deadline, order the long tests."""
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SHARED_FIXTURE_NAMES):
            item.add_marker(pytest.mark.shared)
    if CI_DEADLINE:  # the long tests last, in the day's order (deselection keeps the order)
        import datetime

        items[:] = budget_order(items, datetime.date.today().toordinal())


# CI's time budget (issue 39). `.ci/run` sets SANTA_CI_DEADLINE (seconds since the epoch) to
# its start plus SANTA_CI_BUDGET_MIN; the ``long`` tests, which CI runs last, each say how
# long they took on a quiet 2-core machine (``@pytest.mark.long(seconds=N)``). Under a
# deadline they run in an order drawn from the day's date, and a test that would not end in
# time is skipped with the reason: each CI run runs as many as fit, a different share each
# day. "In time" is at twice its seconds until one has run here, then at 1.25 times the
# slowest ratio of taken to declared seconds seen. Without a deadline (a developer's
# ``pytest -m long``) every test runs, in file order.
CI_DEADLINE = float(os.environ.get("SANTA_CI_DEADLINE") or 0)
_LONG_DECLARED: dict[str, float] = {}  # nodeid -> declared seconds, of the tests started
_LONG_RATIOS: list[float] = []  # taken / declared seconds, of the tests run here


def budget_slack(ratios: list[float]) -> float:
    """How many times its declared seconds a long test is given, after ``ratios`` (taken /
    declared) of those run so far on this machine."""
    return 2.0 if not ratios else max(1.0, 1.25 * max(ratios))


def long_seconds(item) -> float | None:
    """The seconds a ``long`` test took on a quiet 2-core machine, or None if not long."""
    marker = item.get_closest_marker("long")
    return None if marker is None else float(marker.kwargs.get("seconds", 180))


def budget_order(items: list, day: int) -> list:
    """The ``long`` tests after the others, in an order drawn from ``day`` (a date's
    ordinal), so that the share a deadline leaves out is a different one each day."""
    import random

    long = sorted((i for i in items if long_seconds(i) is not None), key=lambda i: i.nodeid)
    random.Random(day).shuffle(long)
    return [i for i in items if long_seconds(i) is None] + long


def budget_skip_reason(
    name: str, seconds: float, now: float, deadline: float, slack: float = 2.0
) -> str | None:
    """Why long test ``name`` of ``seconds`` is skipped at ``now`` under ``deadline``, given
    ``slack`` times its seconds, or None."""
    left = deadline - now
    if now + slack * seconds <= deadline:
        return None
    return (
        f"CI's time budget: {max(left, 0) / 60:.1f} min left, {name} takes ~{seconds:.0f} s "
        f"on a quiet 2-core machine; another day's order runs it (`python -m pytest -m long` "
        f"runs them all)"
    )


def pytest_runtest_setup(item) -> None:
    """Skip a long test that would not end before CI's deadline."""
    seconds = long_seconds(item)
    if CI_DEADLINE and seconds is not None:
        slack = budget_slack(_LONG_RATIOS)
        reason = budget_skip_reason(item.name, seconds, time.time(), CI_DEADLINE, slack)
        if reason:
            pytest.skip(reason)
        _LONG_DECLARED[item.nodeid] = seconds


def pytest_runtest_logreport(report) -> None:
    """The ratio of taken to declared seconds of each long test run under CI's deadline."""
    if report.when == "call" and report.nodeid in _LONG_DECLARED:
        _LONG_RATIOS.append(report.duration / _LONG_DECLARED[report.nodeid])


def pytest_report_header(config) -> str:
    """Say which samples the shared-fixture tests read, in every run's header."""
    lines = []
    if CI_DEADLINE:
        left = (CI_DEADLINE - time.time()) / 60
        lines.append(
            f"CI's time budget: {left:.1f} min left for the long tests (SANTA_CI_DEADLINE)"
        )
    if SHARED_FIXTURES.is_dir():
        lines.append(f"shared fixtures: {SHARED_FIXTURES} (real samples)")
    else:
        lines.append(
            f"shared fixtures: generated by tests/datagen.py ({SHARED_FIXTURES} is not here); "
            f"NLTK tagger: {'found' if pos_tagger_available() else 'missing'}"
        )
    return lines


@pytest.fixture(scope="session")
def shared_fixtures(tmp_path_factory) -> Path:
    """../shared/fixtures (real samples; CI has them), else stand-ins of the same layout and
    sizes that tests/datagen.py writes, so these tests run on any clone and never skip."""
    if SHARED_FIXTURES.is_dir():
        return SHARED_FIXTURES
    from tests.datagen import write_shared_fixtures

    return write_shared_fixtures(tmp_path_factory.mktemp("shared_fixtures"))


# The checkpoint a job interrupted once "[train] step 5/" is seen resumes from (a checkpoint
# every 2 steps): 2 if step 4's was still being written, 4, or 6 or 8 where the steps went on
# while the line travelled to the test through Ray's log forwarding and the fault landed (a
# tiny step takes ~0.15 s on 2 cores since Ray Train's poll is 0.1 s).
CHECKPOINT_NEAR_STEP_5 = r"[2468]"

# The job the fault tests interrupt (a killed worker, Ctrl-C): 8 steps of the tiny recipe on
# one worker, a checkpoint every 2, with its own local Ray as a user's command has.
TINY_PRETRAIN = [
    "ray_jobs.pretrain", "--recipe", "tiny-ci", "--num-workers", "1",
    "--cpus-per-worker", "0.5", "--set", "train.log_every=1",
    "--set", "train.checkpoint_every=2", "--max-steps", "8", "--address", "local",
]  # fmt: skip


def job_env() -> dict[str, str]:
    """This process's environment for a santa job in a process of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SANTA_DEBUG")}
    env["PYTHONPATH"] = str(REPO)
    env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 asks for a database otherwise
    return env


def start_job(args: list[str], cwd: Path) -> subprocess.Popen:
    """``python -m *args`` as a user's command: ``job_env()``, pipes, and its own process
    group, as a terminal's foreground job (a Ctrl-C goes to the whole group)."""
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=job_env(),
        cwd=cwd,
        start_new_session=True,
    )


@pytest.fixture(scope="session")
def pretrain_reference(tmp_path_factory) -> dict:
    """``TINY_PRETRAIN`` run once, uninterrupted: its data (``--data``) and losses by step,
    what an interrupted and resumed run of the same command must repeat exactly."""
    import json

    from tests.training import stdlib_pair_rows, write_pairs

    root = tmp_path_factory.mktemp("pretrain-reference")
    data = write_pairs(root / "pairs", stdlib_pair_rows()[:-24])
    args = [*TINY_PRETRAIN, "--data", data, "--storage", str(root / "runs"), "--name", "reference"]
    proc = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, env=job_env(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not proc.stderr.strip(), proc.stderr  # a successful run: santa's lines, on stdout
    lines = (root / "runs" / "reference" / "metrics.jsonl").read_text().splitlines()
    losses = {int(m["step"]): m["loss"] for m in map(json.loads, lines)}
    return {"data": data, "losses": losses}


def free_port() -> int:
    """A TCP port that is free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MotoServer:
    """A real S3 API (moto's server) on loopback, in its own process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # The server of this environment's moto first: another one on PATH (a global
        # install) can be a version whose multipart uploads fail under pyarrow.
        beside = Path(sys.executable).parent / "moto_server"
        executable = str(beside) if beside.is_file() else shutil.which("moto_server")
        if executable is None:
            raise RuntimeError("moto_server not found: pip install 'moto[server]'")
        self.process = subprocess.Popen(
            [executable, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("moto_server did not start")

    def client(self):
        """A boto3 S3 client on this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def create_bucket(self, name: str) -> str:
        """Create a bucket and return its s3:// URI."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def stop(self) -> None:
        """Stop the server process."""
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def moto_s3():
    """A moto S3 server whose endpoint every process (Ray workers too) sees."""
    server = MotoServer()
    os.environ.update(
        AWS_ENDPOINT_URL=server.endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ray_cluster(moto_s3):
    """A local two-node Ray cluster (head + one worker node, one CPU each)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"head": 1}},
    )
    cluster.add_node(num_cpus=1, resources={"worker_node": 1})
    cluster.wait_for_nodes()
    from santa.runtime.ray_utils import init_ray

    init_ray(cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
