"""Duplicates: keys, the in-batch mask of the contrastive loss, and the batch's keys.

A document that appears twice in a global batch is not a negative of the query whose
positive it is: the loss with the repeat's column masked by hand is the loss santa
computes from the documents' keys. (Across two workers, with the keys all-gathered:
tests/test_grad_cache.py's two-process MiniLM case against one process.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from santa.method.duplicates import (
    NO_KEY,
    document_keys,
    duplicate_positive_mask,
    normalized_text,
    string_keys,
    text_key,
    token_keys,
)
from santa.method.losses import contrastive_loss

DIM = 6


def test_normalized_text_joins_near_duplicates_only() -> None:
    one = "def add(a, b):\n    return a + b\n"
    assert normalized_text(one) == normalized_text("def  add(a, b):\r\n\treturn A + B")
    assert normalized_text("ﬁle") == normalized_text("FILE")  # NFKC ligature, case
    assert normalized_text(one) != normalized_text("def add(a, b):\n    return a - b\n")
    assert text_key(one) == text_key(" DEF add(a, b): return a + b ") != text_key("def sub")


def test_keys_are_stable_nonzero_and_zero_for_missing_ids() -> None:
    keys = string_keys(["d1", "", "d1", "d2"])
    assert keys.dtype == np.int64 and keys[1] == NO_KEY
    assert keys[0] == keys[2] != keys[3] and keys[0] != NO_KEY
    # BLAKE2b, not Python's salted hash: the same in every process (workers compare them).
    code = "from santa.method.duplicates import string_keys; print(string_keys(['d1'])[0])"
    other = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(other.stdout) == keys[0]
    tokens = np.array([[5, 6, 0], [5, 6, 0], [5, 7, 0]])
    assert list(token_keys(tokens) == token_keys(torch.from_numpy(tokens))) == [True] * 3
    rows = token_keys(tokens)
    assert rows[0] == rows[1] != rows[2]
    assert document_keys(["a", "b", "c"], tokens).shape == (3, 2)


def test_duplicate_positive_mask() -> None:
    # candidates 0..3; query i's positive is column i; column 3 repeats 1 (same id),
    # column 2 shares its tokens with 0; key 0 (unknown) never matches.
    keys = torch.tensor([[10, 100], [11, 101], [12, 100], [11, 103]])
    positives = torch.arange(3)
    mask = duplicate_positive_mask(keys[positives], keys, positives)
    assert mask.tolist() == [
        [False, False, True, False],
        [False, False, False, True],
        [True, False, False, False],
    ]
    unknown = torch.tensor([[NO_KEY, 1], [NO_KEY, 2]])
    assert not duplicate_positive_mask(unknown, unknown, torch.arange(2)).any()
    with pytest.raises(ValueError, match="kinds"):
        duplicate_positive_mask(keys[:, :1], keys, positives)


def hand_loss(scores: torch.Tensor, masked: list[tuple[int, int]]) -> torch.Tensor:
    """Cross-entropy with the listed (query, column) scores set to -inf by hand."""
    scores = scores.clone()
    for row, column in masked:
        scores[row, column] = float("-inf")
    return F.cross_entropy(scores, torch.arange(len(scores)))


def test_a_repeated_document_is_masked_for_the_query_it_belongs_to() -> None:
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(4, DIM, generator=generator, dtype=torch.float64, requires_grad=True)
    docs = torch.randn(4, DIM, generator=generator, dtype=torch.float64)
    docs[3] = docs[1]  # the same document twice: pairs 1 and 3 share their positive
    docs.requires_grad_(True)
    ids = ["a", "b", "c", "b"]
    keys = document_keys(ids, torch.tensor([[1, 2], [3, 4], [5, 6], [3, 4]]))
    loss = contrastive_loss(queries, docs, doc_keys=keys)
    scores = queries @ docs.T
    expected = hand_loss(scores, [(1, 3), (3, 1)])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    # The unmasked loss counts the copy as a negative of its own query: larger.
    assert contrastive_loss(queries, docs).item() > loss.item() + 0.01
    loss.backward()
    grad_queries = queries.grad.clone()
    queries.grad = None
    expected_queries = torch.autograd.grad(hand_loss(queries @ docs.T, [(1, 3), (3, 1)]), queries)
    torch.testing.assert_close(grad_queries, expected_queries[0])


def test_same_text_under_another_id_and_a_hard_negative_copy_are_masked() -> None:
    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(3, DIM, generator=generator, dtype=torch.float64)
    docs = torch.randn(3, DIM, generator=generator, dtype=torch.float64)
    hard = torch.randn(6, DIM, generator=generator, dtype=torch.float64)  # 2 per query
    tokens = torch.tensor([[1, 1], [2, 2], [1, 1]])  # doc 2 has doc 0's text, another id
    hard_tokens = torch.tensor([[7, 7], [8, 8], [9, 9], [2, 2], [6, 6], [5, 5]])
    keys = document_keys(["x", "y", "z"], tokens)
    hard_keys = document_keys(["h0", "h1", "h2", "y", "h4", "h5"], hard_tokens)  # h3 = doc 1
    loss = contrastive_loss(queries, docs, hard, doc_keys=keys, hard_negative_keys=hard_keys)
    scores = queries @ torch.cat([docs, hard]).T  # (3, 9)
    expected = hand_loss(scores, [(0, 2), (2, 0), (1, 3 + 3)])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    with pytest.raises(ValueError, match="hard_negative_keys"):
        contrastive_loss(queries, docs, hard, doc_keys=keys)


def test_batch_keys_follow_the_tokens_the_document_is_embedded_from() -> None:
    """Single-pass MEP embeds the masked document; otherwise the document itself."""
    from types import SimpleNamespace

    from santa.train.santa_objective import _duplicate_keys

    masked = torch.tensor([[1, 2], [1, 2]])
    plain = torch.tensor([[3, 4], [5, 6]])
    tensors = {
        "query_input_ids": torch.zeros(2, 3, dtype=torch.long),
        "masked_input_ids": masked,
        "document_input_ids": plain,
        "labels": torch.zeros(2, 2, dtype=torch.long),
    }
    batch = {"doc_id": np.array(["p", "q"], dtype=object)}
    single = _duplicate_keys(SimpleNamespace(embed_unmasked_document=False), batch, tensors, [])
    assert single["doc_keys"][0, 1] == single["doc_keys"][1, 1]  # equal masked tokens
    two_pass = _duplicate_keys(SimpleNamespace(embed_unmasked_document=True), batch, tensors, [])
    assert two_pass["doc_keys"][0, 1] != two_pass["doc_keys"][1, 1]
    assert "hard_negative_keys" not in two_pass
