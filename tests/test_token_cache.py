"""The node's token cache (santa.train.tokens): the same batches as collating, rows
tokenized once per data version, tokenizer and lengths, shared by a node's processes, another
file when any of those change, and a run that goes on when the cache cannot be written."""

from __future__ import annotations

import dataclasses
import errno
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

from santa.train.data import PairCollator, pair_data
from santa.train.rows import open_rows
from santa.train.tokens import KEEP_TOKEN_FILES, open_token_cache
from tests.training import local_loop, stdlib_pair_rows, tiny_config, tiny_start


@pytest.fixture(scope="module")
def start(tmp_path_factory) -> dict[str, str]:
    """Pairs with MEP targets, a tiny T5 and its tokenizer (the tiny-ci recipe)."""
    folder = tmp_path_factory.mktemp("tokens")
    return tiny_start(folder, stdlib_pair_rows()[:300], tiny_config())


def _collator_and_rows(start: dict[str, str], cache: str, **train):
    loop = local_loop({**start, "rows": cache}, tiny_config(**train))
    data = pair_data(loop)
    return data.collate, open_rows(data.source, cache)


def _assert_same(batch: dict, expected: dict) -> None:
    assert sorted(batch) == sorted(expected)
    for name, values in expected.items():
        assert batch[name].dtype == values.dtype, name
        np.testing.assert_array_equal(batch[name], values, err_msg=name)


def test_cached_batches_equal_collated_ones_and_a_second_run_tokenizes_nothing(
    start, tmp_path
) -> None:
    collate, rows = _collator_and_rows(start, str(tmp_path / "c"))
    tokens = open_token_cache(rows, collate, str(tmp_path / "c"))
    generator = np.random.default_rng(0)
    batches = [generator.choice(rows.num_rows, 16, replace=False) for _ in range(40)]
    for batch in batches:  # first seen, then cached, then a mix of both
        _assert_same(tokens.collate(rows, batch, collate), collate(rows.take(batch)))
    seen = len(np.unique(np.concatenate(batches)))
    assert tokens.rows_collated == seen and tokens.filled() == seen
    assert tokens.rows_cached == 40 * 16 - seen
    tokens.close()
    # Another run on the node (same data, tokenizer and lengths): the same file, and every
    # row it trained on before is read, not tokenized.
    again = open_token_cache(rows, collate, str(tmp_path / "c"))
    assert again.path == tokens.path
    for batch in batches:
        _assert_same(again.collate(rows, batch, collate), collate(rows.take(batch)))
    assert again.rows_collated == 0 and again.rows_cached == 40 * 16
    again.close()
    assert len(list((tmp_path / "c").glob("*.tokens"))) == 1


def test_other_lengths_tokenizer_or_data_make_another_cache(start, tmp_path) -> None:
    cache = str(tmp_path / "c")
    collate, rows = _collator_and_rows(start, cache)
    path = open_token_cache(rows, collate, cache).path
    longer, _ = _collator_and_rows(start, cache, max_document_length=48)
    assert open_token_cache(rows, longer, cache).path != path
    assert PairCollator(collate.tokenizer_path, dict(collate.settings)).cache_key() == (
        collate.cache_key()
    )
    # Another tokenizer in the same folder (a vocabulary trained on other texts).
    from santa.models.tokenizer import train_tokenizer

    other = tmp_path / "other-tokenizer"
    train_tokenizer(["something else entirely"] * 50, vocab_size=400).save_pretrained(other)
    assert PairCollator(str(other), dict(collate.settings)).cache_key() != collate.cache_key()
    # The same vocabulary padded on the other side.
    import json
    import shutil

    left = tmp_path / "left-padded"
    shutil.copytree(start["init"], left)
    settings = json.loads((left / "tokenizer_config.json").read_text())
    (left / "tokenizer_config.json").write_text(json.dumps({**settings, "padding_side": "left"}))
    assert PairCollator(str(left), dict(collate.settings)).cache_key() != collate.cache_key()
    # Another data version: another row file, so another cache.
    data = Path(start["data"], "data", "part-0.parquet")
    fewer = tiny_start(tmp_path / "fewer", stdlib_pair_rows()[:200], tiny_config())
    _, fewer_rows = _collator_and_rows({**start, "data": fewer["data"]}, cache)
    assert fewer_rows.path != rows.path and data.exists()
    assert open_token_cache(fewer_rows, collate, cache).path != path


def test_a_row_whose_flag_is_not_set_is_collated_again(start, tmp_path) -> None:
    """A writer killed between a record and its flag: the row is tokenized again."""
    collate, rows = _collator_and_rows(start, str(tmp_path / "c"))
    tokens = open_token_cache(rows, collate, str(tmp_path / "c"))
    tokens.collate(rows, np.arange(8), collate)  # fixes the layout, rows 0-7 written
    size = tokens._record_dtype.itemsize
    with open(tokens.path, "r+b") as handle:  # row 9's record half written, no flag
        handle.seek(tokens._records_at + 9 * size)
        handle.write(b"\x7f" * (size // 2))
    batch = np.array([3, 9, 1])
    _assert_same(tokens.collate(rows, batch, collate), collate(rows.take(batch)))
    assert tokens.rows_collated == 8 + 1 and tokens.rows_cached == 2
    tokens.close()


def test_a_full_disk_leaves_the_cache_and_the_run_goes_on(start, tmp_path, monkeypatch) -> None:
    collate, rows = _collator_and_rows(start, str(tmp_path / "c"))
    tokens = open_token_cache(rows, collate, str(tmp_path / "c"))
    tokens.collate(rows, np.arange(8), collate)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    batch = np.arange(4, 20)
    _assert_same(tokens.collate(rows, batch, collate), collate(rows.take(batch)))
    assert not tokens.writable and tokens.filled() == 8
    monkeypatch.undo()
    _assert_same(tokens.collate(rows, batch, collate), collate(rows.take(batch)))
    assert tokens.filled() == 8  # nothing more is written in this process
    tokens.close()


def _fill(args) -> tuple[int, int]:
    start, cache, rows_wanted = args
    collate, rows = _collator_and_rows(start, cache)
    tokens = open_token_cache(rows, collate, cache)
    for part in np.array_split(np.asarray(rows_wanted), 4):
        tokens.collate(rows, part, collate)
    tokens.close()
    return tokens.rows_collated, tokens.rows_cached


def test_the_processes_of_a_node_share_one_cache(start, tmp_path) -> None:
    cache = str(tmp_path / "c")
    halves = [list(range(0, 48)), list(range(48, 96))]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        done = pool.map(_fill, [(start, cache, half) for half in halves])
    assert done == [(48, 0), (48, 0)]
    collated, cached = _fill((start, cache, list(range(96))))
    assert (collated, cached) == (0, 96)
    assert not [p for p in os.listdir(cache) if ".tmp-" in p]


def test_a_cache_folder_keeps_the_newest_token_files(start, tmp_path) -> None:
    cache = str(tmp_path / "c")
    for length in range(KEEP_TOKEN_FILES + 2):
        collate, rows = _collator_and_rows(start, cache, max_query_length=8 + length)
        tokens = open_token_cache(rows, collate, cache)
        tokens.collate(rows, np.arange(4), collate)
        tokens.close()
    assert len(list(Path(cache).glob("*.tokens"))) == KEEP_TOKEN_FILES


def test_a_tokenizer_without_a_serialized_form_is_not_cached(start, tmp_path) -> None:
    collate, rows = _collator_and_rows(start, str(tmp_path / "c"))

    class Unnamed(PairCollator):
        def cache_key(self) -> None:
            return None

    plain = Unnamed(collate.tokenizer_path, collate.settings)
    assert open_token_cache(rows, plain, str(tmp_path / "c")) is None
    assert open_token_cache(rows, lambda table: {}, str(tmp_path / "c")) is None


def test_the_loop_trains_the_same_with_and_without_the_cache_and_reuses_it(tmp_path) -> None:
    """The worker loop (no Ray) over 6 global batches an epoch, for 2 epochs: the same
    losses and batches with the cache as without it; its second epoch, and a second run,
    read every row from the cache."""
    from tests.training import train_on_ranks

    config = tiny_config(max_steps=12, log_every=6, global_batch_size=8)
    small = tiny_start(tmp_path / "small", stdlib_pair_rows()[:48], config)

    def run(name: str, token_cache: bool = True) -> dict:
        train = dataclasses.replace(config.train, token_cache=token_cache)
        loop = local_loop(small, dataclasses.replace(config, train=train))
        return train_on_ranks(1, loop, str(tmp_path / name), str(tmp_path / f"{name}-out"))[0]

    plain, cached, again = run("plain", token_cache=False), run("cached"), run("again")
    assert "token_cache_misses" not in plain["reports"][-1]
    for result in (cached, again):
        assert result["rows"] == plain["rows"]
        np.testing.assert_allclose(
            [r["loss"] for r in result["reports"]], [r["loss"] for r in plain["reports"]], rtol=1e-6
        )
    # Epoch 1 of the first run tokenized its 48 rows; epoch 2 and the second run, none (the
    # counts include the batches read ahead of the step).
    last = cached["reports"][-1]
    assert last["token_cache_misses"] == 48 and last["token_cache_hits"] >= 48
    last = again["reports"][-1]
    assert last["token_cache_misses"] == 0 and last["token_cache_hits"] >= 96
