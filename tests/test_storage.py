import pytest

from santa.files import storage


def test_local_roundtrip_and_listing(tmp_path):
    storage.write_json(str(tmp_path / "a" / "b.json"), {"x": 1})
    storage.write_bytes(str(tmp_path / "a" / "c.jsonl.gz"), b"zz")
    storage.write_bytes(str(tmp_path / "a" / "_hidden.jsonl"), b"")
    assert storage.read_json(str(tmp_path / "a" / "b.json")) == {"x": 1}
    assert storage.list_files(str(tmp_path), suffixes=(".jsonl.gz",)) == [
        str(tmp_path / "a" / "c.jsonl.gz")
    ]
    assert storage.file_sizes([str(tmp_path / "a" / "c.jsonl.gz")]) == [2]
    assert storage.exists(str(tmp_path / "a"))
    storage.delete_dir(str(tmp_path / "a"))
    assert not storage.exists(str(tmp_path / "a"))


def test_s3_roundtrip_on_moto(moto_s3):
    bucket = moto_s3.create_bucket("storage-roundtrip")
    storage.write_json(f"{bucket}/run/report.json", {"rows": 3})
    storage.write_bytes(f"{bucket}/run/data/part-0.jsonl", b"{}\n")
    assert storage.read_json(f"{bucket}/run/report.json") == {"rows": 3}
    assert storage.list_files(f"{bucket}/run", suffixes=(".jsonl",)) == [
        f"{bucket}/run/data/part-0.jsonl"
    ]
    assert storage.file_sizes([f"{bucket}/run/data/part-0.jsonl"]) == [3]
    # Only the files: no empty "folder/" object a level (one request each, and left behind).
    keys = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=bucket[5:])["Contents"]]
    assert sorted(keys) == ["run/data/part-0.jsonl", "run/report.json"]


def test_missing_paths_raise_clear_errors(tmp_path, moto_s3):
    with pytest.raises(storage.StorageError, match="no such file"):
        storage.read_bytes(str(tmp_path / "absent.json"))
    with pytest.raises(storage.StorageError, match="no such file or directory"):
        storage.list_files(str(tmp_path / "absent"))
    with pytest.raises(storage.StorageError):
        storage.read_bytes("s3://no-such-bucket-here/x.json")
    with pytest.raises(storage.StorageError, match="no such file"):
        storage.file_sizes([str(tmp_path / "absent.jsonl")])


def test_bytes_are_verbatim_even_for_gz_names(tmp_path):
    import gzip

    payload = gzip.compress(b'{"a": 1}\n')
    storage.write_bytes(str(tmp_path / "x.jsonl.gz"), payload)
    assert (tmp_path / "x.jsonl.gz").read_bytes() == payload
    assert storage.read_bytes(str(tmp_path / "x.jsonl.gz")) == payload


def test_absolute_makes_local_paths_absolute_and_leaves_uris(tmp_path, monkeypatch):
    from santa.train.trainer import RunSpec

    monkeypatch.chdir(tmp_path)
    assert storage.absolute("runs") == str(tmp_path / "runs")
    assert storage.absolute("s3://bucket/runs") == "s3://bucket/runs"
    assert storage.absolute("") == ""
    spec = RunSpec.of(data="data/pairs", storage="./runs", name="x", eval_data="s3://b/dev")
    assert spec.layout.storage_path == str(tmp_path / "runs")
    assert spec.data == str(tmp_path / "data" / "pairs")
    assert spec.eval_data == "s3://b/dev" and spec.layout.root == str(tmp_path / "runs" / "x")


def test_upload_dir_copies_every_file_keeping_paths_to_a_folder_or_s3(tmp_path, moto_s3):
    """``upload_dir`` (the TensorBoard copy, a model saved to S3): every file, nested paths
    kept, bytes verbatim; a second copy replaces what changed; no directory objects on S3."""
    source = tmp_path / "source"
    (source / "plugins" / "profile").mkdir(parents=True)
    (source / "events.out").write_bytes(b"\x00" * 3 + b"events")
    (source / "plugins" / "profile" / "trace.json.gz").write_bytes(b"not gzipped")
    (source / "empty").mkdir()
    bucket = moto_s3.create_bucket("upload-dir")
    for target in (str(tmp_path / "copy"), f"{bucket}/runs/r/tensorboard"):
        storage.upload_dir(str(source), target)
        (source / "events.out").write_bytes(b"more events")
        storage.upload_dir(str(source), target)
        (source / "events.out").write_bytes(b"\x00" * 3 + b"events")
        files = sorted(uri[len(target) + 1 :] for uri in storage.list_files(target))
        assert files == ["events.out", "plugins/profile/trace.json.gz"]
        assert storage.read_bytes(storage.join(target, "events.out")) == b"more events"
        trace = storage.join(target, "plugins/profile/trace.json.gz")
        assert storage.read_bytes(trace) == b"not gzipped"
    keys = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket="upload-dir")["Contents"]]
    assert sorted(keys) == [
        "runs/r/tensorboard/events.out",
        "runs/r/tensorboard/plugins/profile/trace.json.gz",
    ]


def test_download_dir_of_a_flat_s3_folder_makes_the_local_folder(tmp_path, moto_s3):
    """A folder of files only (a model's ``init_model``) lists no directories on S3, so
    Arrow made none: the copy failed with 'Failed to open local file'."""
    bucket = moto_s3.create_bucket("download-dir")
    storage.write_bytes(f"{bucket}/model/config.json", b"{}")
    storage.write_bytes(f"{bucket}/model/model.safetensors", b"weights")
    target = tmp_path / "not" / "yet" / "there"
    storage.download_dir(f"{bucket}/model", str(target))
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == b"weights"


def _chunks_then_fault():
    yield b"first block\n"
    raise RuntimeError("the writer failed mid-file")


def test_write_chunks_is_whole_or_nothing_locally_and_on_s3(tmp_path, moto_s3):
    local = tmp_path / "out" / "run.trec"
    storage.write_chunks(str(local), [b"a\n", b"b\n"])
    assert local.read_bytes() == b"a\nb\n"
    with pytest.raises(RuntimeError, match="mid-file"):
        storage.write_chunks(str(local), _chunks_then_fault())
    assert local.read_bytes() == b"a\nb\n"  # the old file, and no hidden part left
    assert [p.name for p in local.parent.iterdir()] == ["run.trec"]

    bucket = moto_s3.create_bucket("write-chunks")
    uri = storage.join(bucket, "eval", "run.trec")
    storage.write_chunks(uri, iter([b"x\n", b"y\n"]))
    assert storage.read_bytes(uri) == b"x\ny\n"
    failed = storage.join(bucket, "eval", "failed.trec")
    with pytest.raises(RuntimeError, match="mid-file"):
        storage.write_chunks(failed, _chunks_then_fault())
    assert not storage.exists(failed)  # the cut upload is deleted, not left half
