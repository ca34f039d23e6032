"""The one reader of preprocessed pairs (santa.data.published): the files every reader reads,
in order, where a publish put them, and one line naming the URI for a bad output."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from santa.data.published import (
    MissingPairs,
    iter_pairs,
    pair_columns,
    pair_files,
    pairs_dataset,
    read_pairs,
    read_parquet,
)
from santa.data.schema import PAIR_SCHEMA
from santa.files import storage
from santa.files.outputs import staged_output
from santa.files.storage import StorageError
from tests.training import stdlib_pair_rows, write_pairs


def _two_file_pairs(root: Path) -> tuple[str, pa.Table]:
    """Pairs in two files (``part-0``, ``part-1``) and all of them in reading order."""
    rows = stdlib_pair_rows()[:10]
    uri = write_pairs(root, rows[:6])
    write_pairs(root / "extra", rows[6:])
    (root / "extra" / "data" / "part-0.parquet").rename(root / "data" / "part-1.parquet")
    (root / "data" / "_ignored.parquet").write_bytes(b"not parquet: skipped, as Ray Data does")
    whole = pa.concat_tables(pq.read_table(root / "data" / f"part-{i}.parquet") for i in (0, 1))
    return uri, whole


def test_in_process_reader_reads_every_file_in_order(tmp_path):
    uri, whole = _two_file_pairs(tmp_path / "pairs")
    assert pair_files(uri) == [
        str(tmp_path / "pairs" / "data" / f"part-{i}.parquet") for i in (0, 1)
    ]
    assert read_pairs(uri).equals(whole)
    assert pair_columns(uri) == PAIR_SCHEMA.names
    tables = list(iter_pairs(uri, ["query", "doc_id"]))
    assert [t.num_rows for t in tables] == [6, 4]
    assert tables[0].column_names == ["query", "doc_id"]
    assert pa.concat_tables(tables).column("query").equals(whole.column("query"))
    # Optional columns come after the required ones, when the files have them.
    (table,) = list(iter_pairs(uri, ["doc_id"], optional=["kind", "not_there"]))[:1]
    assert table.column_names == ["doc_id", "kind"]
    first = whole.column("doc_id")[0].as_py()
    filtered = read_pairs(uri, ["doc_id"], filters=pc.field("doc_id").isin([first]))
    assert filtered.column("doc_id").to_pylist() == [first]


def test_reader_follows_the_manifest_of_a_publish(tmp_path):
    rows = stdlib_pair_rows()[:3]
    with staged_output(str(tmp_path / "out"), tool="preprocess") as staged:
        write_pairs(Path(staged.staging), rows)
        staged.publish({"rows_written": 3})
    assert read_pairs(str(tmp_path / "out")).num_rows == 3


def test_reader_reads_an_s3_publish_where_its_manifest_points(moto_s3):
    bucket = moto_s3.create_bucket("published-pairs")
    uri = f"{bucket}/corpus"
    rows = stdlib_pair_rows()[:4]
    with staged_output(uri, tool="preprocess") as staged:
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows).select(PAIR_SCHEMA.names), sink)
        storage.write_bytes(storage.join(staged.staging, "data", "part-0.parquet"), sink.getvalue())
        staged.publish({"rows_written": 4})
    # A half-written later run's files beside it are never read: the manifest names the run.
    storage.write_bytes(f"{uri}/runs/zzz-unpublished/data/part-0.parquet", b"half")
    (file_uri,) = pair_files(uri)
    assert file_uri.startswith(f"{uri}/runs/{staged.run_id}/data/")
    assert read_pairs(uri, ["doc_id"]).column("doc_id").to_pylist() == [r["doc_id"] for r in rows]


def test_bad_outputs_fail_in_one_line_naming_the_uri(tmp_path):
    missing = str(tmp_path / "missing")
    with pytest.raises(MissingPairs) as caught:
        pair_files(missing, "--data")
    assert str(caught.value) == f"--data {missing}: no such file or folder"
    (tmp_path / "empty" / "data").mkdir(parents=True)
    empty = str(tmp_path / "empty")
    for folder in (empty, str(tmp_path)):  # data/ without Parquet, or no data/ at all
        with pytest.raises(MissingPairs) as caught:
            read_pairs(folder)
        assert str(caught.value) == (
            f"{folder} holds no preprocessed pairs (expected data/*.parquet, as "
            "ray_jobs.preprocess writes them)"
        )
    # A bad input to every caller: FileNotFoundError and santa's StorageError (exit 2).
    assert isinstance(caught.value, FileNotFoundError) and isinstance(caught.value, StorageError)
    assert not caught.value.transient

    uri = write_pairs(tmp_path / "pairs", stdlib_pair_rows()[:2])
    part = f"{uri}/data/part-0.parquet"
    with pytest.raises(ValueError) as caught:
        read_pairs(uri, ["query", "score"])
    message = str(caught.value)
    assert message.startswith(f"{part} has no column(s) ['score'] (its columns: ")
    assert "\n" not in message
    with pytest.raises(ValueError) as caught:  # with optional columns: the schema first
        read_pairs(uri, ["score"], optional=["kind"])
    assert str(caught.value).startswith(f"{part} has no column(s) ['score']")

    Path(part).write_bytes(b"PAR1 cut short")
    with pytest.raises((ValueError, StorageError)) as caught:
        read_pairs(uri)
    assert str(caught.value).startswith(f"cannot read {part}: ") and "\n" not in str(caught.value)

    with pytest.raises(MissingPairs, match=f"no listwise examples under {tmp_path}/none"):
        read_parquet(str(tmp_path / "none"), "listwise examples")


def test_ray_data_reader_reads_the_same_rows(tmp_path, ray_cluster):
    import ray.data

    uri, whole = _two_file_pairs(tmp_path / "pairs")
    before = ray.data.DataContext.get_current().use_datasource_v2
    dataset = pairs_dataset(uri)
    # The project's read: Ray Data's V1 Parquet reader; the caller's context unchanged.
    assert not dataset.context.use_datasource_v2
    assert ray.data.DataContext.get_current().use_datasource_v2 == before
    rows = dataset.select_columns(["doc_id"]).take_all()
    assert sorted(row["doc_id"] for row in rows) == sorted(whole.column("doc_id").to_pylist())
    with pytest.raises(MissingPairs, match="holds no preprocessed pairs"):
        pairs_dataset(str(tmp_path))


def test_the_tokenizer_sample_reads_queries_then_documents_file_by_file(tmp_path):
    from santa.train.initial_model import read_texts

    uri, whole = _two_file_pairs(tmp_path / "pairs")
    first = whole.slice(0, 6)
    expected = first.column("query").to_pylist() + first.column("document").to_pylist()
    assert read_texts(uri, limit=6) == expected  # the first file was enough
    assert len(read_texts(uri, limit=8)) == 16  # and the second was read for more
    with pytest.raises(MissingPairs, match="holds no preprocessed pairs"):
        read_texts(str(tmp_path))
