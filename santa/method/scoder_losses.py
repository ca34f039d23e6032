"""SCodeR's losses (Eq. 4-10) as pure functions of listwise scores: the discriminators',
the adversarial weights, distillation and the soft-labeled dual encoder's loss.

Every SCodeR loss works on one list of candidates per example, the positive ``x⁺`` in
column 0 and its ``n`` hard negatives ``X⁻`` after it: scores are ``(batch, 1 + n)``,
from the dual-encoder ``G_θ`` (Eq. 1, dot products) or from a discriminator ``D_φ`` /
``D_ψ`` (Eq. 2-3, a cross-encoder). The candidate lists are per example, so there is
nothing to gather across workers: each worker's mean is DDP-averaged like any local loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "SCODER_ADVERSARIAL_WEIGHT",
    "adversarial_loss",
    "adversarial_weights",
    "discriminator_loss",
    "distillation_loss",
    "soft_labeled_loss",
]


SCODER_ADVERSARIAL_WEIGHT = 0.2  # λ of Eq. 10 (paper Table 7)


def _check_listwise_scores(name: str, scores: torch.Tensor) -> None:
    if scores.dim() != 2 or scores.shape[1] < 2:
        raise ValueError(
            f"{name} must be (batch, 1 + negatives) with at least one negative, "
            f"got {tuple(scores.shape)}"
        )


def _log_softmax_fp32(scores: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` over the last dimension in fp32 (fp64 stays) even under autocast."""
    with torch.autocast(device_type=scores.device.type, enabled=False):
        dtype = torch.promote_types(scores.dtype, torch.float32)
        return F.log_softmax(scores.to(dtype), dim=-1)


def discriminator_loss(discriminator_scores: torch.Tensor) -> torch.Tensor:
    """Listwise loss of a discriminator: ``-log p_φ(x⁺ | x, X)`` (SCodeR Eq. 6-7).

    ``p_φ`` is the softmax of the discriminator's scores over ``X = {x⁺} ∪ X⁻``.

    Args:
        discriminator_scores: ``D_φ(x, x')`` (text-code) or ``D_ψ(x, x')`` (code-code) for
            every candidate, the positive first.

    Inputs:
        ``discriminator_scores`` ``(batch, 1 + n)``.

    Returns:
        A scalar: the mean over the batch.

    References:
        Li et al., *Soft-Labeled Contrastive Pre-training for Function-level Code
        Representation* (SCodeR), Findings of EMNLP 2022, Eq. 6 and 7.

    Example::

        >>> scores = torch.randn(4, 1 + 7)  # positive, then 7 hard negatives
        >>> discriminator_loss(scores).shape
        torch.Size([])
    """
    _check_listwise_scores("discriminator_scores", discriminator_scores)
    log_probabilities = _log_softmax_fp32(discriminator_scores)  # (batch, 1 + n)
    return -log_probabilities[:, 0].mean()


def adversarial_weights(discriminator_scores: torch.Tensor) -> torch.Tensor:
    """``w(x⁻) = -log p_φ(x⁺ | x, {x⁺, x⁻})`` for each negative, detached (SCodeR Eq. 8).

    The two-candidate softmax gives ``p = sigmoid(D(x, x⁺) - D(x, x⁻))``, so
    ``w = softplus(D(x, x⁻) - D(x, x⁺))``: large when the discriminator finds ``x⁻`` as
    relevant as (or more than) ``x⁺``. The paper treats ``w`` as a constant when optimizing
    the dual-encoder, hence no gradient flows to the discriminator.

    Inputs:
        ``discriminator_scores`` ``(batch, 1 + n)``, the positive first.

    Returns:
        ``(batch, n)``, non-negative, without gradient.
    """
    _check_listwise_scores("discriminator_scores", discriminator_scores)
    scores = discriminator_scores.detach()
    with torch.autocast(device_type=scores.device.type, enabled=False):
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        return F.softplus(scores[:, 1:] - scores[:, :1])  # (batch, n)


def adversarial_loss(
    encoder_scores: torch.Tensor, discriminator_scores: torch.Tensor
) -> torch.Tensor:
    """``L_adv = -Σ_{x⁻ ∈ X⁻} w(x⁻) · log p_θ(x⁻ | x, X⁻)`` (SCodeR Eq. 8).

    As written in Eq. 8, ``p_θ(· | x, X⁻)`` is the dual-encoder's softmax over the negatives
    only, so column 0 of ``encoder_scores`` (the positive) takes no part; ``w`` comes from
    :func:`adversarial_weights` (a constant). Minimizing it raises ``p_θ`` most for the
    negatives the discriminator finds relevant (large ``w``), drawing them closer to ``x``
    than the negatives it finds unrelated. (The paper's prose says "when ``-log p_φ`` is
    small ... ``w`` will be a high weight"; the equation, followed here, gives the high
    weight when ``p_φ(x⁺ | ·)`` is small, i.e. ``-log p_φ`` is large.)

    Args:
        encoder_scores: ``G_θ(x, x')`` for the same candidates, the positive first.
        discriminator_scores: ``D_φ(x, x')`` / ``D_ψ(x, x')``, the positive first.

    Inputs:
        ``encoder_scores`` ``(batch, 1 + n)``, ``discriminator_scores`` ``(batch, 1 + n)``.

    Returns:
        A scalar: the sum over negatives, averaged over the batch. Gradients reach
        ``encoder_scores`` only.

    References:
        SCodeR (Li et al., 2022), Eq. 8; Zhang et al., *Adversarial Retriever-Ranker for
        Dense Text Retrieval* (AR2), ICLR 2022.

    Example::

        >>> encoder, discriminator = torch.randn(4, 8), torch.randn(4, 8)
        >>> adversarial_loss(encoder, discriminator).shape
        torch.Size([])
    """
    _check_pair(encoder_scores, discriminator_scores)
    weights = adversarial_weights(discriminator_scores)  # (batch, n)
    log_probabilities = _log_softmax_fp32(encoder_scores[:, 1:])  # (batch, n), over X⁻
    return -(weights * log_probabilities).sum(dim=1).mean()


def distillation_loss(
    encoder_scores: torch.Tensor, discriminator_scores: torch.Tensor
) -> torch.Tensor:
    """``L_distill = KL(p_φ(· | x, X) ‖ p_θ(· | x, X))`` over ``X = {x⁺} ∪ X⁻`` (SCodeR Eq. 9).

    The discriminator's distribution is the soft label (detached: the teacher is not
    trained by this loss). KL and the cross-entropy ``H(p_φ, p_θ)`` differ by the entropy
    of ``p_φ``, a constant here, so their gradients agree; KL is 0 when the two match.

    Inputs:
        ``encoder_scores`` ``(batch, 1 + n)``, ``discriminator_scores`` ``(batch, 1 + n)``,
        the positive first in both.

    Returns:
        A scalar: the KL divergence summed over candidates, averaged over the batch.

    References:
        SCodeR (Li et al., 2022), Eq. 9; Hinton et al., *Distilling the Knowledge in a
        Neural Network*, 2015.
    """
    _check_pair(encoder_scores, discriminator_scores)
    teacher_log_probabilities = _log_softmax_fp32(discriminator_scores.detach())  # (batch, 1+n)
    student_log_probabilities = _log_softmax_fp32(encoder_scores)  # (batch, 1 + n)
    with torch.autocast(device_type=encoder_scores.device.type, enabled=False):
        return F.kl_div(
            student_log_probabilities,
            teacher_log_probabilities.to(student_log_probabilities.dtype),
            reduction="batchmean",
            log_target=True,
        )


def soft_labeled_loss(
    encoder_scores: torch.Tensor,
    discriminator_scores: torch.Tensor,
    *,
    adversarial_weight: float = SCODER_ADVERSARIAL_WEIGHT,
) -> torch.Tensor:
    """The dual-encoder's loss ``L = λ · L_adv + (1 − λ) · L_distill`` (SCodeR Eq. 10).

    A term whose weight is 0 is not computed (λ = 1 is :func:`adversarial_loss`, λ = 0 is
    :func:`distillation_loss`).

    Args:
        encoder_scores: dual-encoder scores, the positive first.
        discriminator_scores: discriminator scores for the same candidates.
        adversarial_weight: λ in ``[0, 1]``; 0.2 in the paper (Table 7).

    Inputs:
        ``encoder_scores`` ``(batch, 1 + n)``, ``discriminator_scores`` ``(batch, 1 + n)``.

    Returns:
        A scalar. Gradients reach ``encoder_scores`` only.

    References:
        SCodeR (Li et al., 2022), Eq. 8-10 and Table 7.

    Example::

        >>> encoder, discriminator = torch.randn(4, 8), torch.randn(4, 8)
        >>> soft_labeled_loss(encoder, discriminator, adversarial_weight=0.2).shape
        torch.Size([])
    """
    if not 0.0 <= adversarial_weight <= 1.0:
        raise ValueError(f"adversarial_weight must be in [0, 1], got {adversarial_weight}")
    _check_pair(encoder_scores, discriminator_scores)
    if adversarial_weight == 1.0:
        return adversarial_loss(encoder_scores, discriminator_scores)
    if adversarial_weight == 0.0:
        return distillation_loss(encoder_scores, discriminator_scores)
    return adversarial_weight * adversarial_loss(encoder_scores, discriminator_scores) + (
        1.0 - adversarial_weight
    ) * distillation_loss(encoder_scores, discriminator_scores)


def _check_pair(encoder_scores: torch.Tensor, discriminator_scores: torch.Tensor) -> None:
    _check_listwise_scores("encoder_scores", encoder_scores)
    _check_listwise_scores("discriminator_scores", discriminator_scores)
    if encoder_scores.shape != discriminator_scores.shape:
        raise ValueError(
            "encoder and discriminator must score the same candidates, got "
            f"{tuple(encoder_scores.shape)} and {tuple(discriminator_scores.shape)}"
        )
