"""The workers' entry point: light to import, and the node's row file opened (built)
while the worker imports the loop and builds the model."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from santa.train.epochs import BackgroundRows
from santa.train.rows import RowSource

ROOT = Path(__file__).resolve().parents[1]


def test_driver_side_of_training_imports_neither_torch_models_nor_the_loop() -> None:
    """The driver and Ray Train's controller unpickle the entry point and build the trainer:
    transformers and santa's model stay out of them (seconds on a small head node)."""
    probe = (
        "import sys, santa.train.trainer, santa.train.entry\n"
        "print(sorted(m for m in ('transformers', 'santa.models.dual_encoder', 'santa.train.loop', 'faiss')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_row_file_opens_in_the_background_and_hands_its_error_over(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "part-0.parquet")
    rows = BackgroundRows(RowSource((str(tmp_path / "part-0.parquet"),), ("text",)), str(tmp_path))
    assert threading.current_thread() is threading.main_thread()
    assert rows.result().num_rows == 2 and rows.ready_at is not None
    broken = BackgroundRows(
        RowSource((str(tmp_path / "missing.parquet"),), ("text",)), str(tmp_path)
    )
    with pytest.raises(Exception, match="missing.parquet"):
        broken.result()


def test_ray_train_polls_every_tenth_of_a_second_unless_the_user_says_otherwise(
    monkeypatch,
) -> None:
    from santa.train.trainer import POLL_INTERVAL_ENV, set_poll_interval

    monkeypatch.delenv(POLL_INTERVAL_ENV, raising=False)
    assert set_poll_interval() == "0.1"
    monkeypatch.setenv(POLL_INTERVAL_ENV, "3")
    assert set_poll_interval() == "3"
