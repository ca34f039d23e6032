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
SHARED = REPO.parent / "shared"
SHARED_FIXTURES = SHARED / "fixtures"

if not os.environ.get("NLTK_DATA") and (SHARED / "nltk_data").is_dir():
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


needs_tagger = pytest.mark.skipif(
    not pos_tagger_available(),
    reason="NLTK tagger missing: set NLTK_DATA or run "
    "`python -m nltk.downloader averaged_perceptron_tagger_eng`",
)


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    """../shared/fixtures, or skip when this clone has none beside it."""
    if not SHARED_FIXTURES.is_dir():
        pytest.skip("../shared/fixtures is not present")
    return SHARED_FIXTURES


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
