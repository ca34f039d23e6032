"""SANTA's losses as pure functions of embeddings and logits.

Encoding lives in :mod:`santa.model`; gathering across workers in :mod:`santa.distributed`
(passed in as ``gather``, the identity by default). Nothing here knows about processes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from santa.distributed import Gather, identity_gather

__all__ = ["contrastive_loss", "mep_loss", "similarity_scores", "total_loss"]


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
) -> torch.Tensor:
    """InfoNCE of each query against its document, all other documents and hard negatives.

    The SDA loss (paper Eq. 5) and the DR loss (Eq. 3) are the same formula: for query
    ``q_i`` with positive document ``d_i`` and candidate set ``C``,
    ``-log( exp(s(q_i, d_i)) / sum_{c in C} exp(s(q_i, c)) )``, averaged over the local
    queries. ``C`` is every document of the **global** batch (gathered from all workers)
    followed by every gathered hard negative, so query ``i`` of worker ``r`` also sees the
    other workers' documents and hard negatives as negatives. Its positive sits at row
    ``offset + i`` of the gathered documents, ``offset`` being what ``gather`` returns.

    With ``gather=santa.distributed.all_gather_with_grad`` under DDP, the average over
    workers of this loss and of its gradients equals the single-process loss and gradients
    on the combined batch (see :mod:`santa.distributed`); no rescaling by world size.

    Args:
        query_embeddings: the queries ``p`` (docstrings, bullet points, search queries).
        doc_embeddings: their positive documents ``d`` (code, product descriptions), row ``i``
            for query ``i``.
        hard_negative_embeddings: optional extra negatives, e.g. ``n`` per query; any
            number of rows works since every query sees all of them.
        gather: ``local -> (gathered, offset)``; the identity for one process.
        similarity: ``"dot"`` or ``"cosine"``.
        temperature: scores are divided by it before the softmax.

    Inputs:
        ``query_embeddings`` ``(batch, dim)``, ``doc_embeddings`` ``(batch, dim)``,
        ``hard_negative_embeddings`` ``(batch * n, dim)`` or ``None``.

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
    if query_embeddings.shape != doc_embeddings.shape:
        raise ValueError(
            "query and document embeddings must pair up row by row, got "
            f"{tuple(query_embeddings.shape)} and {tuple(doc_embeddings.shape)}"
        )
    all_docs, offset = gather(doc_embeddings)  # (world * batch, dim)
    candidates = [all_docs]
    if hard_negative_embeddings is not None:
        all_hard_negatives, _ = gather(hard_negative_embeddings)  # (world * batch * n, dim)
        candidates.append(all_hard_negatives)
    candidate_embeddings = torch.cat(candidates, dim=0)  # (candidates, dim)
    scores = similarity_scores(
        query_embeddings, candidate_embeddings, similarity=similarity, temperature=temperature
    )  # (batch, candidates)
    positives = offset + torch.arange(len(query_embeddings), device=scores.device)  # (batch,)
    with torch.autocast(device_type=scores.device.type, enabled=False):
        return F.cross_entropy(scores, positives)  # fp32 scores → fp32 softmax


def mep_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Token-level cross-entropy of the MEP decoder (paper Eq. 7), padding ignored.

    Args:
        logits: decoder scores over the vocabulary.
        labels: target token ids; ``ignore_index`` marks padding (not counted).
        ignore_index: label value to skip.

    Inputs:
        ``logits`` ``(batch, target_length, vocab)``, ``labels`` ``(batch, target_length)``.

    Returns:
        A scalar: the mean over the non-ignored target tokens of this batch.

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
    return F.cross_entropy(
        logits.reshape(-1, vocab),  # (batch * target_length, vocab)
        labels.reshape(-1),  # (batch * target_length,)
        ignore_index=ignore_index,
    )


def total_loss(sda: torch.Tensor, mep: torch.Tensor | None, mep_weight: float) -> torch.Tensor:
    """SANTA's pretraining loss ``L = L_SDA + λ · L_MEP`` (λ = ``mep_weight``)."""
    if mep is None or mep_weight == 0:
        return sda
    return sda + mep_weight * mep
