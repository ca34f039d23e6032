"""What a run pays before its first step: a tiny tokenizer trained once per corpus and kept
in the storage's cache folder; the phases in the pipeline report's Time section."""

from __future__ import annotations

import pytest

import santa.models.tokenizer as tokenizer_module
from santa.files import storage
from santa.files.layout import RunLayout
from santa.pipeline.report import startup_table
from santa.train.initial_model import tokenizer_key
from santa.train.trainer import RunSpec, prepare_initial_model
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


def test_a_ray_run_leaves_the_tiny_model_to_its_rank_0_worker(pairs, tmp_path) -> None:
    """The driver only names the tiny model's folder (importing the model's libraries for
    it cost ~7 s of every job's start on 2 cores); rank 0 of the workers builds it there
    once, and another worker group (a restart) finds it built."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from santa.train.loop import build_initial_model
    from santa.train.loop_config import LoopConfig
    from santa.train.session import LocalSession
    from santa.train.trainer import initial_model

    probe = (
        "import json, sys\n"
        "from santa.train.trainer import RunSpec, initial_model\n"
        "from tests.training import tiny_config\n"
        f"spec = RunSpec.of(data={pairs!r}, storage={str(tmp_path)!r}, name='r')\n"
        "uri, missing = initial_model(tiny_config(), spec)\n"
        "print(json.dumps([uri, missing, 'transformers' in sys.modules]))\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    uri, missing, imported = json.loads(done.stdout)
    assert (uri, missing, imported) == (f"{tmp_path}/r/init_model", True, False)
    assert not storage.exists(uri)  # named, not built

    spec = RunSpec.of(data=pairs, storage=str(tmp_path), name="r")
    loop = LoopConfig(
        santa=tiny_config(),
        init_model=uri,
        build_init_model=True,
        data_uri=pairs,
        cache_root=spec.cache_layout.root,
    )
    build_initial_model(loop, LocalSession(rank=1))  # not rank 0: builds nothing
    assert not storage.exists(uri)
    build_initial_model(loop, LocalSession())
    built = storage.read_bytes(storage.join(uri, "model.safetensors"))
    assert initial_model(tiny_config(), spec) == (uri, False)
    build_initial_model(loop, LocalSession())  # built already: left as it is
    assert storage.read_bytes(storage.join(uri, "model.safetensors")) == built
    # The driver's build (in-process runs, the async miner's start) makes the same model.
    again = prepare_initial_model(
        tiny_config(), RunSpec.of(data=pairs, storage=str(tmp_path), name="d")
    )
    assert storage.read_bytes(storage.join(again, "model.safetensors")) == built
