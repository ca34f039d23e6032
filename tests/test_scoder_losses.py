"""SCodeR's losses (Eq. 6-10) against hand computations on small float64 tensors."""

from __future__ import annotations

import math

import pytest
import torch

from santa.method.scoder_losses import (
    adversarial_loss,
    adversarial_weights,
    discriminator_loss,
    distillation_loss,
    soft_labeled_loss,
)

# Two examples, each with its positive (column 0) and three hard negatives.
ENCODER = [[2.0, 1.0, 0.5, -1.0], [0.3, 0.8, -0.2, 1.5]]
DISCRIMINATOR = [[3.0, 2.5, -1.0, 0.0], [1.0, 1.2, 0.4, -2.0]]


def scores(values: list[list[float]], requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


def softmax(row: list[float]) -> list[float]:
    exps = [math.exp(s) for s in row]
    return [e / sum(exps) for e in exps]


def hand_weights(row: list[float]) -> list[float]:
    """w(x⁻) = -log p(x⁺ | x, {x⁺, x⁻}), the two-way softmax written out."""
    return [-math.log(math.exp(row[0]) / (math.exp(row[0]) + math.exp(s))) for s in row[1:]]


def hand_adversarial(encoder: list[list[float]], discriminator: list[list[float]]) -> float:
    """Eq. 8: -Σ_{x⁻} w(x⁻) log p_θ(x⁻ | x, X⁻), softmax over the negatives only."""
    total = 0.0
    for encoder_row, discriminator_row in zip(encoder, discriminator, strict=True):
        p_negatives = softmax(encoder_row[1:])
        weights = hand_weights(discriminator_row)
        total += -sum(w * math.log(p) for w, p in zip(weights, p_negatives, strict=True))
    return total / len(encoder)


def hand_distillation(encoder: list[list[float]], discriminator: list[list[float]]) -> float:
    """Eq. 9: KL(p_D ‖ p_θ) over {x⁺} ∪ X⁻, summed over candidates, mean over examples."""
    total = 0.0
    for encoder_row, discriminator_row in zip(encoder, discriminator, strict=True):
        p_teacher, p_student = softmax(discriminator_row), softmax(encoder_row)
        total += sum(t * math.log(t / s) for t, s in zip(p_teacher, p_student, strict=True))
    return total / len(encoder)


def test_discriminator_loss_matches_hand_computation() -> None:
    expected = -sum(math.log(softmax(row)[0]) for row in DISCRIMINATOR) / len(DISCRIMINATOR)
    loss = discriminator_loss(scores(DISCRIMINATOR))
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_discriminator_loss_trains_the_discriminator() -> None:
    discriminator = scores(DISCRIMINATOR, requires_grad=True)
    discriminator_loss(discriminator).backward()
    # d/ds_j of -log softmax(s)_0 = p_j - [j = 0], averaged over the batch.
    expected = [
        [(p - (1.0 if j == 0 else 0.0)) / len(DISCRIMINATOR) for j, p in enumerate(softmax(row))]
        for row in DISCRIMINATOR
    ]
    torch.testing.assert_close(discriminator.grad, scores(expected))


def test_adversarial_weights_match_hand_computation_and_are_detached() -> None:
    discriminator = scores(DISCRIMINATOR, requires_grad=True)
    weights = adversarial_weights(discriminator)
    assert weights.shape == (2, 3)
    assert not weights.requires_grad
    torch.testing.assert_close(weights, scores([hand_weights(row) for row in DISCRIMINATOR]))


def test_adversarial_weights_grow_with_the_negatives_relevance() -> None:
    # The discriminator scores negative 1 above the positive, negative 3 far below it.
    weights = adversarial_weights(scores([[0.0, 1.0, -0.5, -5.0]]))[0]
    assert weights[0] > math.log(2) > weights[1] > weights[2] > 0


def test_adversarial_loss_matches_hand_computation() -> None:
    loss = adversarial_loss(scores(ENCODER), scores(DISCRIMINATOR))
    assert loss.item() == pytest.approx(hand_adversarial(ENCODER, DISCRIMINATOR), rel=1e-12)


def test_adversarial_loss_ignores_the_encoders_positive_score() -> None:
    # Eq. 8's p_θ(x⁻ | x, X⁻) is a softmax over the negatives alone.
    shifted = [[row[0] + 10.0, *row[1:]] for row in ENCODER]
    assert adversarial_loss(scores(shifted), scores(DISCRIMINATOR)).item() == pytest.approx(
        adversarial_loss(scores(ENCODER), scores(DISCRIMINATOR)).item(), rel=1e-12
    )


def test_distillation_loss_matches_hand_computation() -> None:
    loss = distillation_loss(scores(ENCODER), scores(DISCRIMINATOR))
    assert loss.item() == pytest.approx(hand_distillation(ENCODER, DISCRIMINATOR), rel=1e-12)


def test_distillation_loss_is_zero_when_the_encoder_matches_the_discriminator() -> None:
    # Softmax is shift-invariant: the same scores plus a constant per row give the same p.
    shifted = [[s + 3.0 * (i + 1) for s in row] for i, row in enumerate(DISCRIMINATOR)]
    loss = distillation_loss(scores(shifted), scores(DISCRIMINATOR))
    assert loss.item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("weight", [0.0, 0.2, 0.5, 1.0])
def test_soft_labeled_loss_combines_the_two_terms(weight: float) -> None:
    expected = weight * hand_adversarial(ENCODER, DISCRIMINATOR) + (1 - weight) * hand_distillation(
        ENCODER, DISCRIMINATOR
    )
    loss = soft_labeled_loss(scores(ENCODER), scores(DISCRIMINATOR), adversarial_weight=weight)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_soft_labeled_loss_at_the_ends_is_one_term_alone() -> None:
    encoder, discriminator = scores(ENCODER), scores(DISCRIMINATOR)
    only_adversarial = soft_labeled_loss(encoder, discriminator, adversarial_weight=1.0)
    only_distillation = soft_labeled_loss(encoder, discriminator, adversarial_weight=0.0)
    assert only_adversarial.item() == adversarial_loss(encoder, discriminator).item()
    assert only_distillation.item() == distillation_loss(encoder, discriminator).item()
    assert only_adversarial.item() != pytest.approx(only_distillation.item())


def test_paper_default_weight_is_table_7s() -> None:
    encoder, discriminator = scores(ENCODER), scores(DISCRIMINATOR)
    assert soft_labeled_loss(encoder, discriminator).item() == pytest.approx(
        soft_labeled_loss(encoder, discriminator, adversarial_weight=0.2).item(), rel=1e-15
    )


@pytest.mark.parametrize("weight", [0.0, 0.2, 1.0])
def test_only_the_dual_encoder_gets_gradients(weight: float) -> None:
    encoder = scores(ENCODER, requires_grad=True)
    discriminator = scores(DISCRIMINATOR, requires_grad=True)
    soft_labeled_loss(encoder, discriminator, adversarial_weight=weight).backward()
    assert discriminator.grad is None
    assert encoder.grad is not None and encoder.grad.abs().sum() > 0


def test_adversarial_gradient_treats_the_weights_as_constants() -> None:
    # d/ds_j of -Σ_k w_k log softmax(s⁻)_k = p_j Σ_k w_k - w_j on the negatives, 0 on x⁺.
    encoder = scores(ENCODER, requires_grad=True)
    adversarial_loss(encoder, scores(DISCRIMINATOR, requires_grad=True)).backward()
    expected = []
    for encoder_row, discriminator_row in zip(ENCODER, DISCRIMINATOR, strict=True):
        p, w = softmax(encoder_row[1:]), hand_weights(discriminator_row)
        expected.append([0.0, *((p[j] * sum(w) - w[j]) / len(ENCODER) for j in range(3))])
    torch.testing.assert_close(encoder.grad, scores(expected))


def test_distillation_gradient_is_student_minus_teacher() -> None:
    encoder = scores(ENCODER, requires_grad=True)
    distillation_loss(encoder, scores(DISCRIMINATOR)).backward()
    expected = [
        [(s - t) / len(ENCODER) for s, t in zip(softmax(e), softmax(d), strict=True)]
        for e, d in zip(ENCODER, DISCRIMINATOR, strict=True)
    ]
    torch.testing.assert_close(encoder.grad, scores(expected))


def test_float32_scores_give_float32_losses() -> None:
    encoder, discriminator = scores(ENCODER).float(), scores(DISCRIMINATOR).float()
    assert soft_labeled_loss(encoder, discriminator).dtype == torch.float32
    assert discriminator_loss(discriminator).dtype == torch.float32


@pytest.mark.parametrize(
    ("encoder_shape", "discriminator_shape"),
    [((2, 4), (2, 3)), ((2, 1), (2, 1)), ((4,), (4,))],
)
def test_mismatched_or_negative_free_scores_are_rejected(
    encoder_shape: tuple[int, ...], discriminator_shape: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError):
        soft_labeled_loss(torch.zeros(encoder_shape), torch.zeros(discriminator_shape))


def test_weight_outside_unit_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="adversarial_weight"):
        soft_labeled_loss(scores(ENCODER), scores(DISCRIMINATOR), adversarial_weight=1.5)
