"""The scale bench's measuring parts: per-process peaks (RSS and private memory) and the
growth table, on real child processes (no Ray)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.scale.sample import TreeSampler
from bench.scale.scale import flat, growth

HOLD = """
import sys, time
from multiprocessing import shared_memory
size = 200 * 2**20
if sys.argv[1] == "private":
    block = bytearray(size)
    for i in range(0, size, 4096):
        block[i] = 1
else:  # shared memory touched, as a process reading Ray's object store
    shared = shared_memory.SharedMemory(create=True, size=size)
    for i in range(0, size, 4096):
        shared.buf[i] = 1
print("ready", flush=True)
time.sleep(3)
if sys.argv[1] == "shared":
    shared.close()
    shared.unlink()
"""


def peaks_of(kind: str) -> tuple[float, float]:
    """Peak RSS and peak private MB of a child holding 200 MB of ``kind`` memory."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, kind], stdout=subprocess.PIPE, text=True)
    try:
        sampler = TreeSampler(child.pid, interval=0.1)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        sampler.stop()
    finally:
        child.wait(timeout=30)
    seen = sampler.peaks[child.pid]  # (shared memory starts a resource tracker beside it)
    return seen["peak_mb"], seen["private_mb"]


def test_private_memory_leaves_out_shared_pages() -> None:
    rss, private = peaks_of("private")
    assert rss > 190 and private > 190
    rss, private = peaks_of("shared")
    assert rss > 190  # RSS counts the touched shared pages ...
    assert private < 100  # ... the private figure does not


def test_growth_and_the_largest_process_of_each_figure() -> None:
    def result(size: int, driver: float, worker: float) -> dict:
        preprocess = {"seconds": 10.0, "rows_read": size, "peak_mb": {}, "private_mb": {}}
        preprocess["peak_mb"] = {"driver": driver, "worker": worker}
        preprocess["private_mb"] = {"driver": driver / 2, "worker": worker / 20}
        return {
            "size": size,
            "preprocess": {"pretrain": preprocess},
            "cold": {},
            "warm": {"max_rss_mb": 900.0},
        }

    rows = [flat(result(10, 300.0, 200.0)), flat(result(100, 300.0, 2000.0))]
    assert rows[1]["largest_process"] == ("preprocess:worker", 2000.0)
    assert rows[1]["largest_private"] == ("preprocess:driver", 150.0)
    assert growth(rows, "worker_rss_mb") == ["-", "1.00x"]
    assert growth(rows, "preprocess_rows_s") == ["-", "10.00x"]


def test_the_tokenize_rate_reads_a_warm_token_cache(tmp_path) -> None:
    """``scale.py tokenize``: pairs per second per core tokenized and read from the token
    cache, on a small tokenizer (the bench itself builds a T5-sized one)."""
    import argparse

    from bench.corpora import stdlib_pair_rows
    from bench.scale.scale import tokenize_rate
    from santa.models.tokenizer import train_tokenizer

    rows = stdlib_pair_rows()[:200]
    texts = [row["query"] for row in rows] + [row["document"] for row in rows]
    train_tokenizer(texts, vocab_size=400).save_pretrained(tmp_path / "tokenizer")
    folder = str(tmp_path / "tokenizer")
    result = tokenize_rate(argparse.Namespace(tokenizer=folder, seconds=0.5, pairs=300))
    assert result["rows"] == 300 and result["batch"] == 128
    assert result["pairs_per_s_per_core"] > 0 and result["cached_pairs_per_s_per_core"] > 0
    # ids as int32 and masks as bytes: query 50, masked document 240, target 35
    assert result["token_record_bytes"] == 50 * 5 + 240 * 5 + 35 * 4
