"""One global order per epoch (santa.train.order) and the rows it reads (santa.train.rows,
santa.train.epochs): the same rows in every global batch on any number of workers, a resize
that neither repeats nor skips a row, a row file built once per node and data version, and
nothing read before the first step but the first batches."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.stats import chisquare

from santa.train.epochs import BackgroundRows, EpochReader
from santa.train.order import EpochPlan, IndexPermutation, buffered_order
from santa.train.rows import RowFile, RowSource, count_rows, open_rows

# ------------------------------------------------------------------------ the order


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 17, 1000, 4097])
def test_the_permutation_is_a_bijection(n: int) -> None:
    rows = IndexPermutation(n, [3, 1])(np.arange(n))
    assert sorted(rows.tolist()) == list(range(n))


def test_the_permutation_depends_on_its_seed_and_is_uniform() -> None:
    first = IndexPermutation(1000, [42, 0])(np.arange(1000))
    again = IndexPermutation(1000, [42, 0])(np.arange(1000))
    other = IndexPermutation(1000, [42, 1])(np.arange(1000))
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()
    # Where one position lands over many seeds: uniform (a biased network fails this).
    counts = np.zeros(10)
    for seed in range(20_000):
        counts[IndexPermutation(10, [seed, 0])(np.array([3]))[0]] += 1
    assert chisquare(counts).pvalue > 1e-3
    with pytest.raises(IndexError):
        IndexPermutation(10, 0)(np.array([10]))


def test_a_shuffle_buffer_keeps_every_row_and_mixes_within_its_reach() -> None:
    order = np.concatenate(list(buffered_order(10_000, 100, [1, 0])))
    assert sorted(order.tolist()) == list(range(10_000))
    assert order.tolist() != list(range(10_000))
    # A row leaves the buffer no earlier than it entered it.
    assert all(position >= row - 100 for position, row in enumerate(order.tolist()) if row > 100)
    assert np.concatenate(list(buffered_order(50, 0, 1))).tolist() == list(range(50))


@pytest.mark.parametrize("shuffle", ["global", "local"])
def test_every_worker_count_sees_the_same_global_batches(shuffle: str) -> None:
    plan = EpochPlan(rows=100, global_batch=8, seed=7, shuffle=shuffle, buffer=16)
    for epoch in range(2):
        order = plan.epoch(epoch)
        seen: list[int] = []
        for batch in range(plan.batches_per_epoch):
            one = order.batch_rows(batch).tolist()
            for world in (2, 4, 8):
                parts = [order.batch_rows(batch, rank, world).tolist() for rank in range(world)]
                assert sum(parts, []) == one
            seen += one
        assert len(set(seen)) == len(seen) == 96  # 12 batches, no row twice
    assert plan.epoch(0).batch_rows(0).tolist() != plan.epoch(1).batch_rows(0).tolist()


def test_without_drop_last_the_last_batch_is_completed_with_the_epochs_first_rows() -> None:
    plan = EpochPlan(rows=10, global_batch=4, seed=1, drop_last=False)
    order = plan.epoch(0)
    assert plan.batches_per_epoch == 3
    rows = [order.batch_rows(b).tolist() for b in range(3)]
    assert sorted(sum(rows, [])[:10]) == list(range(10))
    assert rows[2][2:] == rows[0][:2]
    assert EpochPlan(rows=10, global_batch=4, seed=1).batches_per_epoch == 2


def test_groups_train_one_member_each_epoch_rotating() -> None:
    # Three units: rows {0,1}, {2}, {3,4,5}.
    groups = (np.array([0, 2, 3, 6]), np.array([0, 1, 2, 3, 4, 5]))
    plan = EpochPlan(rows=3, global_batch=3, seed=10, groups=groups)
    for epoch in range(3):
        rows = sorted(plan.epoch(epoch).batch_rows(0).tolist())
        assert rows == sorted([[0, 1][(10 + epoch) % 2], 2, [3, 4, 5][(10 + epoch) % 3]])


# ------------------------------------------------------------------------ the row file


def write_rows(folder: Path, count: int, files: int = 2, extra: str = "") -> tuple[str, ...]:
    folder.mkdir(parents=True, exist_ok=True)
    uris = []
    per_file = count // files
    for part in range(files):
        ids = range(part * per_file, (part + 1) * per_file)
        table = pa.table(
            {
                "query_id": [f"q{i}" for i in ids],
                "text": [f"text {i}{extra}" for i in ids],
                "label": [i % 3 for i in ids],
            }
        )
        path = folder / f"part-{part}.parquet"
        pq.write_table(table, path, row_group_size=37)
        uris.append(str(path))
    return tuple(uris)


def label_filter(batch) -> np.ndarray:
    return np.asarray(batch.column("label").to_numpy(zero_copy_only=False)) != 0


def test_a_row_file_holds_the_training_rows_by_number_and_is_built_once(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 30_000)
    source = RowSource(files, ("query_id", "text"), ("kind",), "nonzero", label_filter, ("label",))
    assert count_rows(source) == 20_000
    rows = open_rows(source, str(tmp_path / "cache"))
    assert rows.built and rows.num_rows == 20_000
    kept = [i for i in range(30_000) if i % 3]
    wanted = [5, 0, 19_999, 8192, 8191, 5, 16_384]  # across the file's record batches
    taken = rows.take(np.array(wanted))
    assert taken.column("query_id").to_pylist() == [f"q{kept[i]}" for i in wanted]
    assert taken.column("kind").to_pylist() == [None] * len(wanted)  # optional, absent
    again = open_rows(source, str(tmp_path / "cache"))
    assert not again.built and again.num_rows == 20_000
    # Another data version (a file rewritten), columns or filter: another file.
    write_rows(tmp_path / "data", 3000, extra="!")
    changed = open_rows(source, str(tmp_path / "cache"))
    assert changed.built and changed.take(np.array([0])).column("text")[0].as_py() == "text 1!"
    other = RowSource(files, ("text",), (), "nonzero", label_filter, ("label",))
    assert open_rows(other, str(tmp_path / "cache")).built
    assert len(list((tmp_path / "cache").glob("*.arrow"))) == 3


def _build_in_process(args) -> tuple[bool, int]:
    files, cache = args
    rows = open_rows(RowSource(tuple(files), ("query_id", "text")), cache)
    return rows.built, rows.num_rows


def test_the_workers_of_a_node_build_one_row_file_between_them(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 20_000, files=4)
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        results = pool.map(_build_in_process, [(files, str(tmp_path / "cache"))] * 3)
    assert sorted(results) == [(False, 20_000), (False, 20_000), (True, 20_000)]
    assert not [p for p in os.listdir(tmp_path / "cache") if ".tmp-" in p]


def test_a_row_file_keeps_the_newest_and_a_broken_build_leaves_nothing(tmp_path: Path) -> None:
    from santa.train import rows as rows_module

    cache = str(tmp_path / "cache")
    for version in range(rows_module.KEEP_ROW_FILES + 2):
        files = write_rows(tmp_path / f"data{version}", 100)
        open_rows(RowSource(files, ("text",)), cache)
    assert len(list(Path(cache).glob("*.arrow"))) == rows_module.KEEP_ROW_FILES
    with pytest.raises(ValueError, match="has no column"):
        open_rows(RowSource(files, ("text", "missing")), cache)
    assert not [p for p in os.listdir(cache) if ".tmp-" in p]
    with pytest.raises(ValueError, match="no training rows"):
        open_rows(
            RowSource(files, ("text",), (), "none", lambda b: np.zeros(b.num_rows, bool)), cache
        )


def test_reading_rows_gives_their_pages_back(tmp_path: Path) -> None:
    """A worker that has read many batches holds no more of the file than one batch's."""
    folder = tmp_path / "big"
    folder.mkdir()
    text = "x" * 2000
    pq.write_table(pa.table({"text": [text] * 40_000}), folder / "part-0.parquet")
    rows = open_rows(RowSource((str(folder / "part-0.parquet"),), ("text",)), str(tmp_path / "c"))

    def resident_file_kb() -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("RssFile"))

    before = resident_file_kb()
    generator = np.random.default_rng(0)
    for _ in range(200):
        rows.take(generator.integers(0, rows.num_rows, 64))
    # 12,800 random rows of an 80 MB file: mapped and never given back, the process would
    # hold most of it.
    assert resident_file_kb() - before < 16_000


# ------------------------------------------------------------------------ the reader


def test_the_first_batches_come_before_the_set_is_read(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 4000)
    rows = BackgroundRows(RowSource(files, ("query_id", "text")), str(tmp_path / "c")).result()
    collated: list[int] = []

    def collate(table):
        collated.append(table.num_rows)
        return table.column("query_id").to_pylist()

    plan = EpochPlan(rows=rows.num_rows, global_batch=16, seed=0)
    reader = EpochReader(rows, plan, collate, rank=1, world_size=2, prefetch=2)
    first = next(reader.epoch())
    assert len(first) == 8
    assert first == [f"q{i}" for i in plan.epoch(0).batch_rows(0, 1, 2)]
    # Only the batches read ahead were collated, not the 4,000 rows.
    assert sum(collated) <= 8 * 5
    reader.close()


def test_a_reader_resumes_at_its_global_batch_and_crosses_epochs(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 40, files=1)
    rows = open_rows(RowSource(files, ("query_id",)), str(tmp_path / "c"))
    plan = EpochPlan(rows=40, global_batch=8, seed=3)

    def collate(table):
        return table.column("query_id").to_pylist()

    whole = EpochReader(rows, plan, collate, threads=2)
    epochs = [list(whole.epoch()) for _ in range(2)]
    whole.close()
    assert [len(e) for e in epochs] == [5, 5]
    resumed = EpochReader(rows, plan, collate, start_epoch=0, skip=3)
    assert list(resumed.epoch()) == epochs[0][3:]
    assert list(resumed.epoch()) == epochs[1]
    resumed.close()


def test_an_error_reading_reaches_the_training_thread(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 40, files=1)
    rows = open_rows(RowSource(files, ("query_id",)), str(tmp_path / "c"))

    def collate(table):
        raise RuntimeError("cannot tokenize")

    reader = EpochReader(rows, EpochPlan(rows=40, global_batch=8, seed=0), collate)
    with pytest.raises(RuntimeError, match="cannot tokenize"):
        list(reader.epoch())
    small = EpochReader(rows, EpochPlan(rows=40, global_batch=64, seed=0), list)
    with pytest.raises(ValueError, match="less than one global batch"):
        list(small.epoch())


def test_row_file_close_unmaps(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 40, files=1)
    rows = open_rows(RowSource(files, ("query_id",)), str(tmp_path / "c"))
    assert isinstance(rows, RowFile)
    rows.close()


def test_the_next_epoch_is_read_before_the_current_one_ends(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 24, files=1)
    rows = open_rows(RowSource(files, ("query_id",)), str(tmp_path / "c"))
    read: list[int] = []

    def collate(table):
        read.append(table.num_rows)
        return table.column("query_id").to_pylist()

    reader = EpochReader(rows, EpochPlan(rows=24, global_batch=8, seed=0), collate, prefetch=2)
    first = reader.epoch()
    assert len([next(first) for _ in range(3)]) == 3
    # Epoch 0 has handed out its 3 batches: epoch 1's first ones are read meanwhile.
    for _ in range(50):
        if len(read) >= 4:
            break
        threading.Event().wait(0.1)
    assert len(read) >= 4
    assert list(first) == []
    assert len(list(reader.epoch())) == 3
    reader.close()


def test_closing_stops_the_reader_thread(tmp_path: Path) -> None:
    files = write_rows(tmp_path / "data", 4000, files=1)
    rows = open_rows(RowSource(files, ("query_id",)), str(tmp_path / "c"))
    reader = EpochReader(rows, EpochPlan(rows=4000, global_batch=8, seed=0), list, prefetch=1)
    next(reader.epoch())
    reader.close()
    reader._thread.join(5)
    assert not reader._thread.is_alive()


def test_an_epoch_of_queries_trains_one_exact_judgment_per_query_rotating(tmp_path: Path) -> None:
    """``train.epoch_unit=query`` (SANTA's released product fine-tuning): each epoch one
    row per query with a judged negative, its Exact judgments taken in turn by seed +
    epoch; a query without a negative judgment is left out, and so are non-Exact rows."""
    from santa.data.schema import PAIR_SCHEMA, rows_to_table
    from santa.train.data import pairs_source, query_groups

    judgments = [  # query, product, label (3 = Exact)
        ("q1", "p1", 3), ("q1", "p2", 3), ("q1", "p3", 0),
        ("q2", "p4", 3), ("q2", "p5", 3), ("q2", "p6", 3),  # no negative: left out
        ("q3", "p7", 1), ("q3", "p8", 3),
    ]  # fmt: skip
    rows = [
        {
            "id": f"{q}-{p}",
            "dataset": "esci",
            "kind": "product_judgment",
            "query_id": q,
            "query": f"query {q}",
            "doc_id": p,
            "title": f"title {p}",
            "document": f"text {p}",
            "label": label,
            "mep_target": "",
        }
        for q, p, label in judgments
    ]
    (tmp_path / "pairs" / "data").mkdir(parents=True)
    pq.write_table(rows_to_table(rows, PAIR_SCHEMA), tmp_path / "pairs/data/part-0.parquet")
    source = pairs_source(str(tmp_path / "pairs"))
    rows_file = open_rows(source, str(tmp_path / "c"))
    assert rows_file.num_rows == 6  # the Exact judgments
    offsets, members = query_groups(source.files)(rows_file)
    grouped = dataclasses.replace(source, filter_name="queries", groups=query_groups(source.files))
    kept = open_rows(grouped, str(tmp_path / "c")).groups  # built once, beside its row file
    assert kept[0].tolist() == offsets.tolist() and kept[1].tolist() == members.tolist()
    plan = EpochPlan(rows=len(offsets) - 1, global_batch=2, seed=42, groups=(offsets, members))
    assert plan.batches_per_epoch == 1
    products = []
    for epoch in range(2):
        taken = rows_file.take(plan.epoch(epoch).batch_rows(0))
        ids = taken.column("query_id").to_pylist(), taken.column("doc_id").to_pylist()
        pairs = sorted(zip(*ids, strict=True))
        products.append(pairs)
    # q1's Exact products p1, p2 in turn: (42 + epoch) % 2; q3 has one.
    assert products == [[("q1", "p1"), ("q3", "p8")], [("q1", "p2"), ("q3", "p8")]]
