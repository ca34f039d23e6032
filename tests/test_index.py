"""EmbeddingIndex: exact search equals brute force; approximate kinds have high recall."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from santa.index import faiss_index as index_module
from santa.index.faiss_index import EmbeddingIndex, faiss_has_gpu


def random_data(n: int = 300, nq: int = 40, dim: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = rng.standard_normal((n, dim)).astype(np.float32)
    queries = rng.standard_normal((nq, dim)).astype(np.float32)
    return docs, queries, [f"d{i}" for i in range(n)]


def clustered_data(n: int = 3000, nq: int = 100, dim: int = 32, clusters: int = 40, seed: int = 0):
    """Points around cluster centres, as real embeddings are (random noise is IVF's worst case)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)) * 3
    docs = centres[rng.integers(0, clusters, n)] + rng.standard_normal((n, dim))
    queries = centres[rng.integers(0, clusters, nq)] + rng.standard_normal((nq, dim))
    return docs.astype(np.float32), queries.astype(np.float32), [f"d{i}" for i in range(n)]


def brute_force(docs: np.ndarray, queries: np.ndarray, k: int):
    scores = torch.from_numpy(queries) @ torch.from_numpy(docs).T  # (nq, n)
    top = torch.topk(scores, k)
    return top.indices.numpy(), top.values.numpy()


def test_flat_top_k_equals_brute_force_torch() -> None:
    docs, queries, ids = random_data()
    index = EmbeddingIndex.build(docs, ids, kind="flat")
    hits, scores = index.search(queries, 10)
    expected_rows, expected_scores = brute_force(docs, queries, 10)
    assert hits == [[ids[j] for j in row] for row in expected_rows.tolist()]
    assert scores.dtype == np.float32 and scores.shape == (40, 10)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    assert len(index) == 300 and index.ids == ids


def test_k_is_clipped_to_the_index_size_and_batches_do_not_change_results(monkeypatch) -> None:
    docs, queries, ids = random_data(n=12, nq=25)
    index = EmbeddingIndex.build(docs, ids)
    hits, scores = index.search(queries, 100)
    assert scores.shape == (25, 12) and all(len(row) == 12 for row in hits)
    monkeypatch.setattr(index_module, "SEARCH_BATCH_SIZE", 7)
    batched_hits, batched_scores = index.search(queries, 100)
    assert batched_hits == hits
    np.testing.assert_array_equal(batched_scores, scores)


def test_adding_in_parts_equals_one_build() -> None:
    docs, queries, ids = random_data()
    whole = EmbeddingIndex.build(docs, ids)
    parts = EmbeddingIndex(16)
    parts.add(docs[:100], ids[:100])
    parts.add(docs[100:], ids[100:])
    assert parts.search(queries, 20)[0] == whole.search(queries, 20)[0]


def test_ties_rank_by_insertion_order() -> None:
    vector = np.ones((1, 4), dtype=np.float32)
    docs = np.concatenate([vector * 0.5, vector, vector, vector, vector * 0.1])
    ids = ["low", "b", "a", "c", "lowest"]
    hits, scores = EmbeddingIndex.build(docs, ids).search(vector, 5)
    assert hits == [["b", "a", "c", "low", "lowest"]]
    assert scores[0].tolist() == [4.0, 4.0, 4.0, 2.0, pytest.approx(0.4)]


@pytest.mark.parametrize(
    "kind, options", [("ivf", {"nlist": 64, "nprobe": 8}), ("hnsw", {"hnsw_m": 16})]
)
def test_approximate_indexes_have_high_recall(kind, options) -> None:
    docs, queries, ids = clustered_data()
    exact, _ = EmbeddingIndex.build(docs, ids).search(queries, 10)
    approximate, scores = EmbeddingIndex.build(docs, ids, kind=kind, **options).search(queries, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approximate, exact, strict=True)])
    assert recall >= 0.9, recall
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first


def test_ivf_clamps_nlist_for_small_corpora() -> None:
    docs, queries, ids = random_data(n=50)
    index = EmbeddingIndex.build(docs, ids, kind="ivf", nlist=1024, nprobe=32)
    assert index.nlist == 1 and index.nprobe == 1  # 50 points: one cell, an exact search
    exact, _ = EmbeddingIndex.build(docs, ids).search(queries, 5)
    assert index.search(queries, 5)[0] == exact


def test_ivf_cells_default_to_four_root_n_trained_on_a_sample(monkeypatch) -> None:
    assert [index_module.ivf_cells(n) for n in (0, 1, 10_000, 1_000_000)] == [1, 4, 400, 4000]
    docs, queries, ids = clustered_data(n=40_000, nq=50, clusters=400)
    index = EmbeddingIndex.build(docs, ids, kind="ivf")
    assert index.nlist == 800 and index.nprobe == 32  # 4·√40,000; 40,000 // 39 allows it
    exact, _ = EmbeddingIndex.build(docs, ids).search(queries, 10)
    found, _ = index.search(queries, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(found, exact, strict=True)])
    assert recall >= 0.9, recall
    # k-means sees IVF_TRAIN_POINTS_PER_CELL points per cell: a seeded draw, in row order
    sample = index_module._training_sample(docs, 1_000)
    again = index_module._training_sample(docs, 1_000)
    np.testing.assert_array_equal(sample, again)
    rows = {tuple(row) for row in docs.tolist()}
    assert sample.shape == (1_000, 32) and all(tuple(row) in rows for row in sample.tolist())
    assert len({tuple(row) for row in sample.tolist()}) == 1_000
    assert index_module._training_sample(docs[:500], 1_000).shape == (500, 32)
    trained = []
    sampler = index_module._training_sample
    monkeypatch.setattr(
        index_module,
        "_training_sample",
        lambda vectors, size: (
            trained.append(sampler(vectors, size).shape[0]) or sampler(vectors, size)
        ),
    )
    EmbeddingIndex.build(docs, ids, kind="ivf", nlist=100)
    assert trained == [100 * index_module.IVF_TRAIN_POINTS_PER_CELL]


def test_ivf_cells_with_too_few_vectors_give_shorter_hit_lists() -> None:
    docs, queries, ids = clustered_data(n=400, nq=20, clusters=10)
    index = EmbeddingIndex.build(docs, ids, kind="ivf", nlist=10, nprobe=1)
    hits, scores = index.search(queries, 300)  # one cell holds far fewer than 300
    assert scores.shape == (20, 300)
    for query, row, row_scores in zip(queries, hits, scores, strict=True):
        assert 0 < len(row) < 300 and len(set(row)) == len(row)
        assert np.all(np.isneginf(row_scores[len(row) :]))
        expected = docs[[int(doc[1:]) for doc in row]] @ query  # the hits' own scores
        np.testing.assert_allclose(row_scores[: len(row)], expected, rtol=1e-4, atol=1e-4)
        assert np.all(np.diff(row_scores[: len(row)]) <= 0)


def test_search_rows_are_the_positions_of_the_searched_ids() -> None:
    docs, queries, ids = clustered_data(n=400, nq=20, clusters=10)
    for kind, options in (("flat", {}), ("ivf", {"nlist": 10, "nprobe": 1})):
        index = EmbeddingIndex.build(docs, ids, kind=kind, **options)
        hits, scores = index.search(queries, 300)
        rows, row_scores = index.search_rows(queries, 300)
        assert rows.dtype == np.int64 and rows.shape == scores.shape == (20, 300)
        np.testing.assert_array_equal(row_scores, scores)
        for row, names in zip(rows, hits, strict=True):
            assert [ids[j] for j in row[: len(names)]] == names
            assert np.all(row[len(names) :] == -1)  # missing hits: -1, sorted last


def test_finite_check_tells_overflowing_sums_from_nan_and_inf() -> None:
    big = np.full((4, 8), 3e38, dtype=np.float32)  # finite, but its float32 sum overflows
    index = EmbeddingIndex.build(big, [f"d{i}" for i in range(4)])
    assert len(index) == 4
    for bad in (np.nan, np.inf, -np.inf):
        docs = np.ones((4, 8), dtype=np.float32)
        docs[2, 5] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            EmbeddingIndex.build(docs, [f"d{i}" for i in range(4)])


def test_duplicate_vectors_rank_by_insertion_order_in_every_row() -> None:
    """Runs of equal scores (duplicated documents): faiss returns them in no set order,
    the index returns them by insertion order, exactly as a (score, row) sort would.

    Small integer vectors make every dot product exact in float32, so the expected order
    does not depend on the summation order of numpy's or faiss's BLAS: scores that differ
    differ by at least 1, and equal scores are equal bit for bit."""
    rng = np.random.default_rng(5)
    unique = rng.integers(-4, 5, size=(150, 16)).astype(np.float32)
    docs = np.concatenate([unique, unique, unique[:50]])[rng.permutation(350)]
    queries = rng.integers(-4, 5, size=(40, 16)).astype(np.float32)
    rows, scores = EmbeddingIndex.build(docs, [f"d{i}" for i in range(350)]).search_rows(
        queries, 60
    )
    exact = queries @ docs.T
    for q in range(40):
        expected = np.lexsort((np.arange(350), -exact[q]))[:60]
        # Which of the documents tied at the cut-off make the top 60 is faiss's choice:
        # compare up to that last run, and require the run itself sorted by row.
        cut = int(np.flatnonzero(scores[q] != scores[q][-1]).max(initial=-1)) + 1
        assert rows[q][:cut].tolist() == expected[:cut].tolist()
        assert np.all(np.diff(rows[q][cut:]) > 0)
        np.testing.assert_array_equal(scores[q], exact[q][rows[q]])
    assert (np.diff(scores, axis=1) == 0).any(axis=1).all()  # every row has ties


def test_empty_index_returns_no_hits() -> None:
    index = EmbeddingIndex(8)
    hits, scores = index.search(np.zeros((3, 8), dtype=np.float32), 5)
    assert hits == [[], [], []] and scores.shape == (3, 0) and len(index) == 0


def test_bad_inputs_are_clear_errors() -> None:
    docs, queries, ids = random_data(n=10, nq=2, dim=8)
    with pytest.raises(ValueError, match="kind must be one of"):
        EmbeddingIndex(8, "lsh")
    with pytest.raises(ValueError, match="dim must be a positive integer"):
        EmbeddingIndex(0)
    with pytest.raises(ValueError, match="must be float32"):
        EmbeddingIndex.build(docs.astype(np.float64), ids)
    with pytest.raises(ValueError, match="must be 2-D"):
        EmbeddingIndex.build(docs[0], ids)
    with pytest.raises(ValueError, match="10 embeddings but 9 ids"):
        EmbeddingIndex.build(docs, ids[:9])
    with pytest.raises(ValueError, match="duplicate id 'd0'"):
        EmbeddingIndex.build(docs, ["d0"] * 10)
    index = EmbeddingIndex.build(docs, ids)
    with pytest.raises(ValueError, match="duplicate id 'd3'"):
        index.add(docs[:1], ["d3"])
    with pytest.raises(ValueError, match="dimension 4, the index has 8"):
        index.search(queries[:, :4].copy(), 3)
    with pytest.raises(ValueError, match="NaN"):
        index.search(np.full((1, 8), np.nan, dtype=np.float32), 3)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        index.search(queries, 0)


@pytest.mark.skipif(faiss_has_gpu(), reason="this machine can build GPU indexes")
def test_forcing_a_gpu_without_one_fails_clearly() -> None:
    with pytest.raises(ValueError, match="no GPU index is possible"):
        EmbeddingIndex(8, use_gpu=True)
    assert not EmbeddingIndex(8).on_gpu  # "auto" falls back to the CPU


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_serialized_index_searches_the_same(kind) -> None:
    """to_bytes / from_bytes (what an index folder stores) keep the kind, ids and hits."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, 16)).astype(np.float32)
    ids = [f"doc-{i}" for i in range(2000)]
    index = EmbeddingIndex.build(vectors, ids, kind, nlist=16, nprobe=4, hnsw_m=8, use_gpu=False)
    again = EmbeddingIndex.from_bytes(index.to_bytes(), ids, nprobe=4, use_gpu=False)
    assert (again.kind, len(again), again.dim) == (kind, 2000, 16)
    if kind == "ivf":
        assert (again.nlist, again.nprobe) == (16, 4)
    if kind == "hnsw":
        assert again.hnsw_m == 8
    hits, scores = index.search(vectors[:20], 10)
    hits_again, scores_again = again.search(vectors[:20], 10)
    assert hits == hits_again
    np.testing.assert_array_equal(scores, scores_again)
    with pytest.raises(ValueError, match="2000 vectors but 3 ids"):
        EmbeddingIndex.from_bytes(index.to_bytes(), ids[:3])
