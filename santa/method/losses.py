"""SANTA's losses as pure functions of embeddings and logits.

Encoding lives in :mod:`santa.models.dual_encoder`; gathering across workers in :mod:`santa.method.distributed`
(passed in as ``gather``, the identity by default). Nothing here knows about processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from santa.method.distributed import Gather, identity_gather
from santa.method.duplicates import duplicate_positive_mask

__all__ = [
    "contrastive_loss",
    "matryoshka_contrastive_loss",
    "matryoshka_loss",
    "mep_loss",
    "similarity_scores",
    "total_loss",
]


def similarity_scores(
    query_embeddings: torch.Tensor,
    candidate_embeddings: torch.Tensor,
    *,
    similarity: str = "dot",
    temperature: float = 1.0,
) -> torch.Tensor:
    """Score every query against every candidate: ``(queries, candidates)``.

    Args:
        query_embeddings: ``(queries, dim)``.
        candidate_embeddings: ``(candidates, dim)``.
        similarity: ``"dot"`` (raw inner product, the paper) or ``"cosine"``.
        temperature: scores are divided by it (1.0 leaves them as they are).
    """
    if similarity not in ("dot", "cosine"):
        raise ValueError(f"similarity must be 'dot' or 'cosine', got {similarity!r}")
    # Scores (and the softmax over them) in fp32 even under bf16/fp16 autocast: raw dot
    # products of 768-d vectors at temperature 1 are in the tens to hundreds, where bf16
    # keeps 2-3 significant digits and ranks near-ties by rounding.
    with torch.autocast(device_type=query_embeddings.device.type, enabled=False):
        dtype = torch.promote_types(query_embeddings.dtype, torch.float32)  # fp64 stays
        query_embeddings = query_embeddings.to(dtype)
        candidate_embeddings = candidate_embeddings.to(dtype)
        if similarity == "cosine":
            query_embeddings = F.normalize(query_embeddings, dim=-1)
            candidate_embeddings = F.normalize(candidate_embeddings, dim=-1)
        scores = query_embeddings @ candidate_embeddings.T  # (queries, candidates)
        return scores / temperature


def contrastive_loss(
    query_embeddings: torch.Tensor,
    doc_embeddings: torch.Tensor,
    hard_negative_embeddings: torch.Tensor | None = None,
    *,
    gather: Gather = identity_gather,
    similarity: str = "dot",
    temperature: float = 1.0,
    doc_keys: torch.Tensor | None = None,
    hard_negative_keys: torch.Tensor | None = None,
) -> torch.Tensor:
    """InfoNCE of each query against its document, all other documents and hard negatives.

    The SDA loss (paper Eq. 5) and the DR loss (Eq. 3) are the same formula: for query
    ``q_i`` with positive document ``d_i`` and candidate set ``C``,
    ``-log( exp(s(q_i, d_i)) / sum_{c in C} exp(s(q_i, c)) )``, averaged over the local
    queries. ``C`` is every document of the **global** batch (gathered from all workers)
    followed by every gathered hard negative, so query ``i`` of worker ``r`` also sees the
    other workers' documents and hard negatives as negatives. Its positive sits at row
    ``offset + i`` of the gathered documents, ``offset`` being what ``gather`` returns.

    With ``gather=santa.method.distributed.all_gather_with_grad`` under DDP, the average over
    workers of this loss and of its gradients equals the single-process loss and gradients
    on the combined batch (see :mod:`santa.method.distributed`); no rescaling by world size.

    Args:
        query_embeddings: the queries ``p`` (docstrings, bullet points, search queries).
        doc_embeddings: their positive documents ``d`` (code, product descriptions), row ``i``
            for query ``i``.
        hard_negative_embeddings: optional extra negatives, e.g. ``n`` per query; any
            number of rows works since every query sees all of them.
        gather: ``local -> (gathered, offset)``; the identity for one process.
        similarity: ``"dot"`` or ``"cosine"``.
        temperature: scores are divided by it before the softmax.
        doc_keys: optional integer keys of each document (:mod:`santa.method.duplicates`:
            its id, its tokens); gathered like the embeddings. A candidate sharing a key
            with query ``i``'s positive, other than that positive itself, is the same
            document seen twice: its score is masked (``-inf``) for query ``i``, so a
            query is never pushed away from a copy of its own positive.
        hard_negative_keys: the same for the hard negatives (needs ``doc_keys``).

    Inputs:
        ``query_embeddings`` ``(batch, dim)``, ``doc_embeddings`` ``(batch, dim)``,
        ``hard_negative_embeddings`` ``(batch * n, dim)`` or ``None``, ``doc_keys``
        ``(batch, kinds)`` and ``hard_negative_keys`` ``(batch * n, kinds)`` int64 or ``None``.

    Returns:
        A scalar: the mean over the local queries.

    References:
        Li et al., *Structure-Aware Language Model Pretraining Improves Dense Retrieval on
        Structured Data* (SANTA), Findings of ACL 2023, Eq. 3 and 5; van den Oord et al.,
        *Representation Learning with Contrastive Predictive Coding* (InfoNCE), 2018.

    Example::

        >>> queries, docs = torch.randn(4, 8), torch.randn(4, 8)
        >>> loss = contrastive_loss(queries, docs)  # in-batch negatives on one process
        >>> loss.shape
        torch.Size([])
    """
    candidates = _paired_candidates(
        query_embeddings, doc_embeddings, hard_negative_embeddings, gather, doc_keys,
        hard_negative_keys,
    )  # fmt: skip
    return _info_nce(query_embeddings, candidates, similarity, temperature)


class _Candidates(NamedTuple):
    """Every candidate of the global batch, gathered once: ``embeddings`` ``(candidates,
    dim)`` (the documents, then the hard negatives), each local query's positive column
    ``positives`` ``(batch,)``, and the ``(batch, candidates)`` mask of its positive's
    copies (or None)."""

    embeddings: torch.Tensor
    positives: torch.Tensor
    duplicates: torch.Tensor | None


def _paired_candidates(
    query_embeddings: torch.Tensor,
    doc_embeddings: torch.Tensor,
    hard_negative_embeddings,
    gather,
    doc_keys,
    hard_negative_keys,
):
    """:func:`_gather_candidates` for queries that pair up row by row with their documents
    (a clear error when they do not)."""
    if query_embeddings.shape != doc_embeddings.shape:
        raise ValueError(
            "query and document embeddings must pair up row by row, got "
            f"{tuple(query_embeddings.shape)} and {tuple(doc_embeddings.shape)}"
        )
    return _gather_candidates(
        len(query_embeddings),
        doc_embeddings,
        hard_negative_embeddings,
        gather,
        doc_keys,
        hard_negative_keys,
    )


def _gather_candidates(
    queries: int,
    doc_embeddings: torch.Tensor,
    hard_negative_embeddings: torch.Tensor | None,
    gather: Gather,
    doc_keys: torch.Tensor | None,
    hard_negative_keys: torch.Tensor | None,
) -> _Candidates:
    all_docs, offset = gather(doc_embeddings)  # (world * batch, dim)
    candidates = [all_docs]
    if hard_negative_embeddings is not None:
        all_hard_negatives, _ = gather(hard_negative_embeddings)  # (world * batch * n, dim)
        candidates.append(all_hard_negatives)
    embeddings = torch.cat(candidates, dim=0)  # (candidates, dim)
    positives = offset + torch.arange(queries, device=embeddings.device)  # (batch,)
    duplicates = None
    if doc_keys is not None:
        duplicates = _duplicate_mask(
            positives,
            len(embeddings),
            doc_keys,
            hard_negative_keys,
            hard_negative_embeddings,
            gather,
        )
    return _Candidates(embeddings, positives, duplicates)


def _info_nce(
    query_embeddings: torch.Tensor, candidates: _Candidates, similarity: str, temperature: float
) -> torch.Tensor:
    scores = similarity_scores(
        query_embeddings, candidates.embeddings, similarity=similarity, temperature=temperature
    )  # (batch, candidates)
    if candidates.duplicates is not None:
        scores = scores.masked_fill(candidates.duplicates.to(scores.device), float("-inf"))
    with torch.autocast(device_type=scores.device.type, enabled=False):
        return F.cross_entropy(scores, candidates.positives.to(scores.device))  # fp32 softmax


def _duplicate_mask(
    positives: torch.Tensor,
    candidates: int,
    doc_keys: torch.Tensor,
    hard_negative_keys: torch.Tensor | None,
    hard_negative_embeddings: torch.Tensor | None,
    gather: Gather,
) -> torch.Tensor:
    """``(batch, candidates)``: True where a candidate is a copy of the query's positive
    (but the positive itself)."""
    if (hard_negative_keys is None) != (hard_negative_embeddings is None):
        raise ValueError("hard_negative_keys must come with hard_negative_embeddings")
    keys = [gather(doc_keys)[0]]  # (world * batch, kinds)
    if hard_negative_keys is not None:
        keys.append(gather(hard_negative_keys)[0])  # (world * batch * n, kinds)
    candidate_keys = torch.cat(keys, dim=0).to(positives.device)  # (candidates, kinds)
    if candidate_keys.shape[0] != candidates:
        raise ValueError(f"{candidate_keys.shape[0]} candidate keys for {candidates} candidates")
    return duplicate_positive_mask(candidate_keys[positives], candidate_keys, positives)


def _check_matryoshka(dims: Sequence[int], weights: Sequence[float] | None, width: int):
    """The ``(dim, weight)`` pairs, checked against the embeddings' ``width``."""
    if not dims:
        raise ValueError("matryoshka needs at least one dimension")
    weights = [1.0] * len(dims) if not weights else list(weights)
    if len(weights) != len(dims):
        raise ValueError(f"{len(weights)} Matryoshka weights for {len(dims)} dimensions")
    too_wide = [dim for dim in dims if not 0 < dim <= width]
    if too_wide:
        raise ValueError(
            f"Matryoshka dimensions {too_wide} do not fit {width}-dimensional embeddings"
        )
    return list(zip(dims, weights, strict=True))


def matryoshka_loss(
    loss: Callable[..., torch.Tensor],
    embeddings: Sequence[torch.Tensor | None],
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
) -> torch.Tensor:
    """``Σ_d w_d · loss(e_1[..., :d], e_2[..., :d], ...)``: any embedding loss over nested
    prefixes of the embeddings (sentence-transformers' ``MatryoshkaLoss`` around a loss).

    Args:
        loss: a loss of the embeddings (each of its arguments cut to ``d`` dimensions;
            ``None`` arguments stay ``None``).
        embeddings: its arguments, ``(rows, dim)`` each.
        dims: the prefix sizes, e.g. ``(768, 256, 64)``; each at most ``dim``.
        weights: one per dimension; ``None``: 1 each.

    Returns:
        A scalar: the weighted sum (not the mean) of the per-dimension losses.

    References:
        Kusupati et al., *Matryoshka Representation Learning*, NeurIPS 2022;
        sentence-transformers' ``MatryoshkaLoss``.
    """
    width = next(e for e in embeddings if e is not None).shape[-1]
    total = None
    for dim, weight in _check_matryoshka(dims, weights, width):
        cut = [None if e is None else e[..., :dim] for e in embeddings]  # (rows, dim) each
        term = weight * loss(*cut)
        total = term if total is None else total + term
    return total


def matryoshka_contrastive_loss(
    query_embeddings: torch.Tensor,
    doc_embeddings: torch.Tensor,
    hard_negative_embeddings: torch.Tensor | None = None,
    *,
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
    gather: Gather = identity_gather,
    similarity: str = "dot",
    temperature: float = 1.0,
    doc_keys: torch.Tensor | None = None,
    hard_negative_keys: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`contrastive_loss` over nested prefixes of the embeddings (Matryoshka):
    ``Σ_d w_d · L_InfoNCE(q[:, :d], C[:, :d])``.

    Each dimension's term is exactly :func:`contrastive_loss` on the embeddings cut to
    ``d`` dimensions (cosine normalises the cut vectors, as a truncated index scores them),
    but the candidates are gathered across workers once, at full width, and cut after: one
    all-gather per step whatever the number of dimensions, the same gradients.

    Args:
        query_embeddings, doc_embeddings, hard_negative_embeddings, gather, similarity,
        temperature, doc_keys, hard_negative_keys: as :func:`contrastive_loss`.
        dims: the prefix sizes (``train.matryoshka_dims``); list the full width too for
            its own term.
        weights: one per dimension (``train.matryoshka_weights``); ``None``: 1 each.

    Inputs:
        As :func:`contrastive_loss`.

    Returns:
        A scalar: the weighted sum of the per-dimension losses (sentence-transformers'
        ``MatryoshkaLoss``), each the mean over the local queries.

    References:
        Kusupati et al., *Matryoshka Representation Learning*, NeurIPS 2022.

    Example::

        >>> queries, docs = torch.randn(4, 8), torch.randn(4, 8)
        >>> matryoshka_contrastive_loss(queries, docs, dims=(8, 4, 2)).shape
        torch.Size([])
    """
    candidates = _paired_candidates(
        query_embeddings, doc_embeddings, hard_negative_embeddings, gather, doc_keys,
        hard_negative_keys,
    )  # fmt: skip
    total = None
    for dim, weight in _check_matryoshka(dims, weights, query_embeddings.shape[-1]):
        cut = candidates._replace(embeddings=candidates.embeddings[:, :dim])  # (candidates, dim)
        term = weight * _info_nce(query_embeddings[:, :dim], cut, similarity, temperature)
        total = term if total is None else total + term
    return total


def mep_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "token_mean",
) -> torch.Tensor:
    """Token-level cross-entropy of the MEP decoder (paper Eq. 7), padding ignored.

    Args:
        logits: decoder scores over the vocabulary.
        labels: target token ids; ``ignore_index`` marks padding (not counted).
        ignore_index: label value to skip.
        reduction: ``"token_mean"``: the mean over the counted target tokens of the batch
            (what SANTA's released code computes, through Hugging Face's T5 loss);
            ``"sum"``: Eq. 7 as printed, each document's loss the *sum* over its target
            tokens, averaged over the documents with at least one counted token.

    Inputs:
        ``logits`` ``(batch, target_length, vocab)``, ``labels`` ``(batch, target_length)``.

    Returns:
        A scalar. Both reductions divide the same sum of token losses, by the number of
        counted tokens or of documents with targets; a batch with nothing to predict
        gives 0.

    References:
        SANTA (Li et al., 2023), Eq. 7; Raffel et al., *Exploring the Limits of Transfer
        Learning with a Unified Text-to-Text Transformer* (T5), 2020.

    Example::

        >>> logits = torch.randn(2, 3, 10)
        >>> labels = torch.tensor([[4, 5, 1], [6, 1, -100]])
        >>> mep_loss(logits, labels).shape
        torch.Size([])
    """
    vocab = logits.shape[-1]
    summed = F.cross_entropy(
        logits.reshape(-1, vocab),  # (batch * target_length, vocab)
        labels.reshape(-1),  # (batch * target_length,)
        ignore_index=ignore_index,
        reduction="sum",
    )
    counted = labels != ignore_index  # (batch, target_length)
    # A batch of pairs with nothing to mask (SDA only) gives 0, not the NaN of an empty
    # mean, and no host sync is needed to find that out.
    if reduction == "token_mean":
        return summed / counted.sum().clamp(min=1)
    if reduction == "sum":
        return summed / counted.any(dim=1).sum().clamp(min=1)
    raise ValueError(f"reduction must be 'token_mean' or 'sum', got {reduction!r}")


def total_loss(
    sda: torch.Tensor | None,
    mep: torch.Tensor | None,
    mep_weight: float,
    sda_weight: float = 1.0,
) -> torch.Tensor:
    """SANTA's pretraining loss ``L = L_SDA + λ · L_MEP`` (λ = ``mep_weight``): the one place
    the terms are weighted.

    ``sda_weight`` scales L_SDA (0: MEP alone, the paper's "w/ MEP" ablation). The SDA
    term stays in the graph even at 0 (its gradients are zeros), so DDP sees every
    parameter used in every step. Either term may be None: GradCache back-propagates them
    apart (the SDA term through the cached embeddings, MEP chunk by chunk), each weighted
    here.
    """
    parts = []
    if sda is not None:
        parts.append(sda if sda_weight == 1 else sda_weight * sda)
    if mep is not None and mep_weight != 0:
        parts.append(mep_weight * mep)
    if not parts:
        raise ValueError("total_loss needs a term: sda, or mep with a non-zero mep_weight")
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


# --------------------------------------------------------------------------------------
# SCodeR: soft-labeled contrastive pretraining (Li et al., 2022, Section 4)
