"""Evaluation in blocks of queries: the same metrics and TREC runs whatever the block size,
and neither ranx's arrays nor a run file's text ever held for the whole query set."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from santa import eval as ev
from santa.eval import EvalConfig
from santa.eval.runfiles import trec_blocks

BLOCK_SIZES = (1, 3, 7, 10**6)


def random_ranking(queries: int, docs: int, depth: int, seed: int = 0) -> ev.RankedLists:
    """A :class:`RankedLists` of ``queries`` queries, ``depth`` hits each (some missing)."""
    rng = np.random.default_rng(seed)
    rows = np.stack([rng.choice(docs, size=depth, replace=False) for _ in range(queries)])
    scores = -np.sort(-rng.standard_normal((queries, depth)).astype(np.float32), axis=1)
    rows[::5, depth // 2 :] = -1  # some queries found fewer hits
    scores[::5, depth // 2 :] = -np.inf
    doc_ids = [f"https://example.org/repo/blob/file{i}.py#L{i}" for i in range(docs)]
    return ev.RankedLists([f"q{i}" for i in range(queries)], doc_ids, rows, scores)


def random_qrels(ranking: ev.RankedLists, graded: bool, seed: int = 1) -> dict:
    """Judgments of the ranked queries (in shuffled order), a judged document outside the
    corpus, an unranked query, and queries with no relevant document."""
    rng = np.random.default_rng(seed)
    qrels: dict[str, dict[str, int]] = {}
    for q in rng.permutation(len(ranking)).tolist():
        qid = ranking.query_ids[q]
        hits = [doc for doc, _ in ranking[qid]]
        judged = rng.choice(len(hits), size=min(len(hits), int(rng.integers(1, 6))), replace=False)
        qrels[qid] = {hits[j]: int(rng.integers(0, 4 if graded else 2)) for j in judged}
    qrels["q0"]["not-in-corpus"] = 3 if graded else 1
    qrels["unranked"] = {ranking.doc_ids[0]: 3 if graded else 1}
    return qrels


def old_trec_text(ranking, tag: str) -> str:
    """What write_trec wrote before it wrote in blocks (the whole file as one string)."""
    lines = []
    for qid, hits in ranking.items():
        for rank, (doc, score) in enumerate(hits, start=1):
            lines.append(f"{qid} Q0 {doc} {rank} {score:.6f} {tag}")
    return "\n".join(lines) + "\n" if lines else ""


@pytest.mark.parametrize("graded", [False, True])
def test_blocked_metrics_equal_one_block_exactly(graded) -> None:
    ranking = random_ranking(40, 300, 30)
    qrels = random_qrels(ranking, graded)
    languages = {q: ("go" if len(q) % 2 else "ruby") for q in qrels}
    as_lists = {qid: list(hits) for qid, hits in ranking.items()}
    results = [
        ev.compute_metrics(
            qrels, run, graded=graded, query_languages=languages, block_size=block_size
        )
        for run in (ranking, as_lists)
        for block_size in BLOCK_SIZES
    ]
    assert all(result == results[0] for result in results)  # exactly, not approximately
    assert results[0]["by_language"].keys() == {"go", "ruby"}
    assert ("ndcg@100_4class" in results[0]) == graded
    with pytest.raises(ValueError, match="block_size"):
        ev.compute_metrics(qrels, ranking, block_size=0)


def test_trec_blocks_hold_block_size_queries_and_write_the_same_file(tmp_path) -> None:
    ranking = random_ranking(23, 100, 8)
    expected = old_trec_text(ranking, "model")
    for block_size in BLOCK_SIZES:
        chunks = list(trec_blocks(ranking, "model", block_size=block_size))
        assert len(chunks) == math.ceil(23 / block_size)
        for chunk in chunks:
            assert len({line.split()[0] for line in chunk.decode().splitlines()}) <= block_size
        assert b"".join(chunks).decode() == expected
        path = tmp_path / f"run.{block_size}.trec"
        ev.write_trec(str(path), ranking, tag="model", block_size=block_size)
        assert path.read_text() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"run.{block_size}.trec" for block_size in BLOCK_SIZES
    )  # no temporary file left beside them
    assert ev.read_trec(str(tmp_path / "run.1.trec")) == {
        qid: [(doc, pytest.approx(score, abs=1e-6)) for doc, score in hits]
        for qid, hits in ranking.items()
        if hits
    }
    empty = tmp_path / "empty" / "run.trec"
    ev.write_trec(str(empty), {}, tag="model")
    assert empty.read_bytes() == b""


def test_an_interrupted_trec_write_leaves_the_old_file(tmp_path) -> None:
    path = tmp_path / "run.model.trec"
    path.write_text("old\n")

    class Broken(dict):
        def __getitem__(self, qid):
            if qid == "q3":
                raise KeyboardInterrupt
            return super().__getitem__(qid)

    ranking = Broken({f"q{i}": [("d", 1.0)] for i in range(5)})
    with pytest.raises(KeyboardInterrupt):
        ev.write_trec(str(path), ranking, tag="model", block_size=1)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run.model.trec"]


def traced_peak(function) -> int:
    """Bytes ``function()`` allocates at its peak (tracemalloc: Python objects and numpy)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        function()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_writing_a_run_holds_a_block_not_the_file(tmp_path) -> None:
    ranking = random_ranking(3000, 5000, 50)
    path = tmp_path / "run.model.trec"
    peak = traced_peak(lambda: ev.write_trec(str(path), ranking, tag="model", block_size=64))
    size = path.stat().st_size
    assert size > 8_000_000
    # Held whole, the text alone (str and bytes) is twice the file, its lines more again.
    assert peak < size / 8, (peak, size)


def test_scoring_holds_a_block_of_ranx_arrays() -> None:
    queries, depth = 20_000, 100
    rng = np.random.default_rng(3)
    rows = np.tile(np.arange(depth), (queries, 1))
    scores = np.tile(np.linspace(1, 0, depth, dtype=np.float32), (queries, 1))
    doc_ids = [f"d{i}" for i in range(depth)]
    ranking = ev.RankedLists([f"q{i}" for i in range(queries)], doc_ids, rows, scores)
    qrels = {f"q{i}": {f"d{int(rng.integers(depth))}": 1} for i in range(queries)}
    ev.compute_metrics(qrels, ranking, block_size=256)  # ranx compiled outside the trace
    whole_run = queries * depth * 2 * 8  # what ranx was given in one piece: 32 MB
    peak = traced_peak(lambda: ev.compute_metrics(qrels, ranking, block_size=256))
    assert peak < whole_run / 4, (peak, whole_run)


def test_block_size_is_checked() -> None:
    assert EvalConfig().block_size == ev.metrics.DEFAULT_BLOCK_SIZE
    with pytest.raises(ValueError, match="block_size"):
        EvalConfig(block_size=0)
    with pytest.raises(ValueError, match="block_size"):
        list(trec_blocks({"q": [("d", 1.0)]}, "model", block_size=0))
