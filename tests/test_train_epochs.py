"""Epochs of a worker's shard: the training set prepared once, every epoch read ahead."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from santa.train.epochs import EpochReader
from tests.training import stdlib_pair_rows, tiny_config, write_pairs


class FakeShard:
    """A shard with ``iter_batches`` as Ray's DataIterator has it, recording each call."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.epochs_started: list[int] = []
        self.started = threading.Event()

    def iter_batches(self, **options):
        epoch = len(self.epochs_started)
        self.epochs_started.append(epoch)
        self.started.set()
        for i in range(self.batches):
            yield {"epoch": epoch, "i": i}


def test_epochs_come_in_order_and_the_next_is_read_before_the_current_ends() -> None:
    shard = FakeShard(batches=3)
    reader = EpochReader(lambda: shard, tiny_config().train, rank=0, prefetch=2)
    first = reader.epoch()
    assert [next(first)["i"] for _ in range(3)] == [0, 1, 2]
    # The last batch of epoch 0 is out; epoch 1 is already being read (its first batches
    # queued) before the training thread asks for it.
    deadline = threading.Event()
    for _ in range(50):
        if len(shard.epochs_started) == 2:
            break
        deadline.wait(0.1)
    assert shard.epochs_started == [0, 1]
    assert list(first) == []
    assert [(b["epoch"], b["i"]) for b in reader.epoch()] == [(1, 0), (1, 1), (1, 2)]
    reader.close()


def test_a_resumed_reader_starts_at_its_epoch_past_the_trained_batches() -> None:
    shard = FakeShard(batches=4)
    reader = EpochReader(lambda: shard, tiny_config().train, rank=0, start_epoch=5, skip=3)
    assert [b["i"] for b in reader.epoch()] == [3]
    assert [b["i"] for b in reader.epoch()] == [0, 1, 2, 3]
    reader.close()


def test_the_pipelines_error_reaches_the_training_thread() -> None:
    def broken():
        raise OSError("s3://bucket/pairs/data/part-0.parquet: connection reset")

    reader = EpochReader(broken, tiny_config().train, rank=0)
    with pytest.raises(OSError, match="connection reset"):
        list(reader.epoch())


def test_closing_stops_the_reader_thread() -> None:
    shard = FakeShard(batches=1000)
    reader = EpochReader(lambda: shard, tiny_config().train, rank=0, prefetch=1)
    assert shard.started.wait(10)
    reader.close()
    reader._thread.join(5)
    assert not reader._thread.is_alive()


@pytest.mark.usefixtures("ray_cluster")
def test_the_tokenize_task_runs_once_however_many_epochs(tmp_path) -> None:
    """The training set Ray Train hands the workers (santa.train.ingest): three epochs of
    two workers' splits re-read the prepared blocks; the tokenizer ran once per row."""
    import ray

    from santa.train.data import build_train_dataset, tokenization_settings
    from santa.train.ingest import PreparedSplits
    from santa.train.trainer import RunSpec, prepare_initial_model

    rows = stdlib_pair_rows()[:96]
    data = write_pairs(tmp_path / "pairs", rows)
    config = tiny_config(num_workers=2, max_steps=30)
    init_model = prepare_initial_model(config, RunSpec(data=data, storage=str(tmp_path), name="r"))

    @ray.remote(num_cpus=0)
    class Counter:
        def __init__(self) -> None:
            self.rows = 0

        def add(self, rows: int) -> int:
            self.rows += rows
            return self.rows

        def total(self) -> int:
            return self.rows

    counter = Counter.remote()

    def count(batch):
        ray.get(counter.add.remote(len(batch["query_id"])))
        return batch

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    dataset = build_train_dataset(data, init_model, tokenization_settings(config))
    dataset = dataset.map_batches(count, batch_format="numpy", num_cpus=0.5)
    splits = PreparedSplits().configure(
        {"train": dataset}, world_size=2, worker_handles=None, worker_node_ids=None
    )
    assert ray.get(counter.total.remote()) == len(rows)  # prepared: tokenized once

    def three_epochs(rank: int) -> list[list[str]]:
        # The workers' splits stream together (one coordinator), as in training.
        reader = EpochReader(lambda: splits[rank]["train"], config.train, rank)
        epochs = [sorted(q for batch in reader.epoch() for q in batch["query_id"]) for _ in "abc"]
        reader.close()
        return epochs

    with ThreadPoolExecutor(max_workers=2) as pool:
        seen = [epoch for epochs in pool.map(three_epochs, range(2)) for epoch in epochs]
    assert ray.get(counter.total.remote()) == len(rows)  # three epochs later: still once
    assert seen[0] == seen[1] == seen[2] and seen[3] == seen[4] == seen[5]
    # The two workers' splits are disjoint and of equal size (drop_last batches aside).
    assert not set(seen[0]) & set(seen[3])
    assert len(seen[0]) == len(seen[3]) == 48
    assert np.all([isinstance(q, str) for q in seen[0]])
