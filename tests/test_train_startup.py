"""What a run pays before its first step: a tiny tokenizer trained once per corpus and kept
in the storage's cache folder; the phases in the pipeline report's Time section."""

from __future__ import annotations

import pytest

import santa.models.tokenizer as tokenizer_module
from santa.files import storage
from santa.files.layout import RunLayout
from santa.pipeline.report import startup_table
from santa.train.trainer import RunSpec, prepare_initial_model, tokenizer_key
from tests.training import stdlib_pair_rows, tiny_config, write_pairs


def test_caches_sit_beside_the_runs_that_share_them() -> None:
    run = RunLayout.of("s3://bucket/runs", "demo")
    assert run.cache.root == "s3://bucket/runs/.santa-cache"
    assert run.shared_cache.root == "s3://bucket/runs/demo/.santa-cache"
    # a pipeline's stages share their pipeline run's folder
    assert run.stage("pretrain").cache == run.stage("ance").cache == run.shared_cache
    assert run.cache.compile("k") == "s3://bucket/runs/.santa-cache/compile/k"
    assert run.cache.tokenizer("v1") == "s3://bucket/runs/.santa-cache/tokenizers/v1"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> str:
    return write_pairs(tmp_path_factory.mktemp("pairs"), stdlib_pair_rows()[:120])


def test_a_tiny_tokenizer_is_trained_once_per_corpus(pairs, tmp_path, monkeypatch) -> None:
    config = tiny_config()
    first = prepare_initial_model(config, RunSpec.of(data=pairs, storage=str(tmp_path), name="a"))
    cache = RunLayout.of(str(tmp_path), "a").cache
    key = tokenizer_key(pairs, config.model.tiny_vocab_size)
    assert storage.exists(storage.join(cache.tokenizer(key), "tokenizer.json"))

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again")

    monkeypatch.setattr(tokenizer_module, "train_tokenizer", no_training)
    second = prepare_initial_model(config, RunSpec.of(data=pairs, storage=str(tmp_path), name="b"))
    assert first != second  # each run keeps its own initial model ...
    for name in ("tokenizer.json", "config.json"):  # ... built from the same tokenizer
        assert storage.read_bytes(storage.join(first, name)) == storage.read_bytes(
            storage.join(second, name)
        )
    # Another corpus (or vocabulary) is another tokenizer.
    other = write_pairs(tmp_path / "other", stdlib_pair_rows()[120:200])
    assert tokenizer_key(other, config.model.tiny_vocab_size) != key
    assert tokenizer_key(pairs, 500) != key


def test_a_tokenizer_cache_on_s3_is_reused(moto_s3, pairs, monkeypatch) -> None:
    bucket = moto_s3.create_bucket("santa-tokenizer-cache")
    config = tiny_config()
    prepare_initial_model(config, RunSpec.of(data=pairs, storage=f"{bucket}/runs", name="a"))
    monkeypatch.setattr(tokenizer_module, "train_tokenizer", None)  # calling it would fail
    second = prepare_initial_model(
        config, RunSpec.of(data=pairs, storage=f"{bucket}/runs", name="b")
    )
    assert storage.exists(storage.join(second, "tokenizer.json"))


def test_the_time_section_names_each_stages_phases_before_its_first_step() -> None:
    stages = [
        {
            "stage": "pretrain",
            "seconds": 95.0,
            "final_metrics": {
                "startup_total_s": 61.2,
                "startup_initial_model_s": 10.0,
                "startup_worker_start_s": 20.5,
                "startup_first_step_s": 12.0,
                "startup_compile_s": 9.5,
            },
        },
        {"stage": "finetune", "seconds": 40.0, "final_metrics": {"startup_total_s": 30.0}},
    ]
    lines = startup_table(stages)
    assert lines[2] == (
        "| stage | stage s | before the first step | initial model | worker start | "
        "first step | of it compile |"
    )
    assert lines[4] == "| pretrain | 95 | 61.2 | 10.0 | 20.5 | 12.0 | 9.5 |"
    assert lines[5] == "| finetune | 40 | 30.0 | - | - | - | - |"
    assert startup_table([{"stage": "x", "final_metrics": {}}]) == []
