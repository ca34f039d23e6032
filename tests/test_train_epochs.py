"""Epochs of a worker's shard: the training set prepared once, every epoch read ahead."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from santa.train.epochs import EpochReader
from tests.training import stdlib_pair_rows, tiny_config, write_pairs

# The reader's streaming mode (a fake shard's batches are not columns to hold in memory).
STREAMED = tiny_config(shuffle="local").train


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
    reader = EpochReader(lambda: shard, STREAMED, rank=0, prefetch=2)
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
    reader = EpochReader(lambda: shard, STREAMED, rank=0, start_epoch=5, skip=3)
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
    reader = EpochReader(lambda: shard, STREAMED, rank=0, prefetch=1)
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
    init_model = prepare_initial_model(
        config, RunSpec.of(data=data, storage=str(tmp_path), name="r")
    )

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


def _held_rows(rows: int = 2048, file_size: int = 8):
    """Tokenized columns in corpus order: ``file_size`` consecutive rows share a file."""
    from santa.train.epochs import ArrayShard

    index = np.arange(rows)
    return ArrayShard({"row": index, "file": index // file_size, "query_input_ids": index[:, None]})


def _same_file_share(batches: list[dict]) -> float:
    """The share of in-batch pairs (two rows of one batch) that come from the same file."""
    same = pairs = 0
    for batch in batches:
        files = batch["file"]
        equal = files[:, None] == files[None, :]
        same += int(equal.sum() - len(files)) // 2
        pairs += len(files) * (len(files) - 1) // 2
    return same / pairs


def test_a_global_shuffle_permutes_every_row_anew_each_epoch_and_resumes_exactly() -> None:
    """``train.shuffle=global``: each epoch is a new seeded permutation of all the rows (none
    lost, none twice), a resumed reader repeats it from the batch it stopped at, and the
    share of same-file pairs in a batch falls to what a uniform sample gives."""
    train = tiny_config(global_batch_size=128).train
    assert train.shuffle == "global"
    shard = _held_rows()
    reader = EpochReader(lambda: shard, train, rank=0)
    epochs = [list(reader.epoch()) for _ in range(2)]
    reader.close()
    orders = [np.concatenate([batch["row"] for batch in epoch]) for epoch in epochs]
    for order in orders:
        assert sorted(order) == list(range(2048))
    assert not np.array_equal(orders[0], orders[1])
    resumed = EpochReader(lambda: shard, train, rank=0, start_epoch=1, skip=5)
    again = list(resumed.epoch())
    resumed.close()
    assert np.array_equal(np.concatenate([b["row"] for b in again]), orders[1][5 * 128 :])
    uniform = (8 - 1) / (2048 - 1)  # another row of one's file, drawn at random
    assert _same_file_share(epochs[0]) == pytest.approx(uniform, rel=0.35)
    corpus_order = [{"file": shard.columns["file"][i : i + 128]} for i in range(0, 2048, 128)]
    assert _same_file_share(corpus_order) > 10 * uniform


def test_a_streamed_shard_is_held_once_and_permuted_when_the_shuffle_is_global() -> None:
    """A worker's Ray Data shard is read once into memory (``ArrayShard.read``), not once per
    epoch; batches then come from the held rows."""

    class Streamed:
        def __init__(self) -> None:
            self.reads = 0

        def iter_batches(self, **options):
            self.reads += 1
            for start in range(0, 64, 16):
                rows = np.arange(start, start + 16)
                yield {"row": rows, "query_input_ids": rows[:, None]}

    shard = Streamed()
    reader = EpochReader(lambda: shard, tiny_config().train, rank=0)
    epochs = [np.concatenate([b["row"] for b in reader.epoch()]) for _ in range(3)]
    reader.close()
    assert shard.reads == 1
    assert all(sorted(order) == list(range(64)) for order in epochs)
