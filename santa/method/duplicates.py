"""Telling documents apart: normalized text, 63-bit keys, and the in-batch duplicate mask.

Two places need to know that two documents are "the same": the contrastive loss, where a
document that appears twice in a global batch must not be a negative of the query whose
positive it is (:func:`duplicate_positive_mask`), and hard-negative mining, which drops
negatives whose text equals a positive's after normalization (:func:`normalized_text`).

Keys are integers so that they can be all-gathered across workers with the embeddings:
a document carries one key per way of being equal (its id, its tokens), and two documents
are duplicates when any key agrees. Key 0 means "unknown" and never matches. Keys come from
BLAKE2b, so every process computes the same key for the same text (Python's ``hash`` is
salted per process).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "NO_KEY",
    "document_keys",
    "duplicate_positive_mask",
    "normalized_text",
    "string_keys",
    "text_key",
    "token_keys",
]

NO_KEY = 0
"""The key of an unknown id: never equal to anything."""


def normalized_text(text: str) -> str:
    """``text`` as near-duplicates share it: NFKC, case-folded, whitespace runs collapsed.

    CodeSearchNet holds the same function many times over (forks, vendored copies) with
    only indentation, line breaks or case changed; all of those normalize alike.
    """
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def text_key(text: str) -> int:
    """A non-zero 63-bit key of :func:`normalized_text` (near-duplicates share it)."""
    return _key(normalized_text(text).encode("utf-8"))


def _key(data: bytes) -> int:
    """A non-zero 63-bit key of ``data`` (fits a signed int64)."""
    value = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1
    return value or 1


def string_keys(values: Sequence[str]) -> np.ndarray:
    """One key per string ``(len(values),)`` int64; an empty or missing string gets
    :data:`NO_KEY`."""
    return np.array(
        [_key(str(value).encode("utf-8")) if value else NO_KEY for value in values],
        dtype=np.int64,
    )


def token_keys(input_ids: np.ndarray | torch.Tensor) -> np.ndarray:
    """One key per row of token ids ``(rows, length)`` → ``(rows,)`` int64.

    Rows padded to the same length hash alike exactly when their tokens are equal: equal
    texts, or texts that differ only past the length the model reads (which it cannot tell
    apart either).
    """
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.detach().cpu().numpy()
    rows = np.ascontiguousarray(input_ids, dtype=np.int64)
    return np.array([_key(row.tobytes()) for row in rows], dtype=np.int64)


def document_keys(
    doc_ids: Sequence[str], input_ids: np.ndarray | torch.Tensor, device=None
) -> torch.Tensor:
    """A document's keys ``(rows, 2)`` int64: its id, and the tokens it is embedded from."""
    keys = np.stack([string_keys(doc_ids), token_keys(input_ids)], axis=1)  # (rows, 2)
    return torch.from_numpy(keys).to(device)


def duplicate_positive_mask(
    positive_keys: torch.Tensor, candidate_keys: torch.Tensor, positives: torch.Tensor
) -> torch.Tensor:
    """Which candidates duplicate a query's positive without being it: ``(queries, candidates)``.

    Args:
        positive_keys: the keys of each query's positive document.
        candidate_keys: the keys of every candidate (gathered documents, then hard negatives).
        positives: the column of each query's own positive among the candidates.

    Inputs:
        ``positive_keys`` ``(queries, kinds)``, ``candidate_keys`` ``(candidates, kinds)``,
        ``positives`` ``(queries,)``.

    Returns:
        A bool tensor ``(queries, candidates)``: True where candidate ``j`` shares a non-zero
        key with query ``i``'s positive and ``j`` is not that positive's own column.
    """
    if positive_keys.shape[-1] != candidate_keys.shape[-1]:
        raise ValueError(
            f"positive and candidate keys differ in kinds: {tuple(positive_keys.shape)} and "
            f"{tuple(candidate_keys.shape)}"
        )
    same = (positive_keys[:, None, :] == candidate_keys[None, :, :]) & (
        positive_keys[:, None, :] != NO_KEY
    )  # (queries, candidates, kinds)
    mask = same.any(dim=-1)  # (queries, candidates)
    own = torch.arange(candidate_keys.shape[0], device=mask.device)[None, :] == positives[:, None]
    return mask & ~own
