"""The ``scoder`` section: SCodeR's soft-labeled training (Algorithm 2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from santa.config.common import (
    SOFT_LABEL_MODES,
    check_positive,
    fail,
    section_from_dict,
)


@dataclass(frozen=True, kw_only=True)
class ScoderConfig:
    """SCodeR's soft-labeled training (Algorithm 2): iterations, discriminators, λ.

    Used by ``ray_jobs.scoder`` only; the dual encoder's own settings (backbone, batch,
    learning rate, lengths, similarity) are the ``model`` and ``train`` sections, its hard
    negatives the ``negatives`` section's (``per_query`` X⁻, ``pool`` mined per query from
    the ``top_k``). The
    discriminators share the backbone and the global batch size of the dual encoder.
    """

    iterations: int = 4
    """I in Algorithm 2: rounds of mine → train discriminators → train the dual encoder."""

    adversarial_weight: float = 0.2
    """λ in ``L = λ·L_adv + (1 − λ)·L_distill`` (Eq. 10; 0.2 in the paper's Table 7)."""

    discriminator_learning_rate: float = 1e-5
    """Peak learning rate of the discriminators (optimizer: ``train.optimizer``)."""

    discriminator_steps: int | None = None
    """Discriminator steps per iteration; ``None``: one pass over the examples."""

    dual_encoder_steps: int | None = None
    """Dual-encoder steps per iteration; ``None``: one pass over the examples."""

    warmup_steps: int | None = None
    """Steps of the in-batch-negative warm-up; ``None``: ``train.max_steps`` or its epochs."""

    max_pair_length: int | None = None
    """Tokens of a discriminator's ``[x; y]`` input; ``None``: query + document lengths."""

    soft_labels: str = "offline"
    """``offline``: discriminator scores precomputed into Parquet with Ray Data (saves
    accelerator memory, the paper's Limitations); ``online``: the training workers run the
    discriminators, without gradient, on every batch."""

    heldout_fraction: float = 0.1
    """Share of the examples the discriminators never train on (their held-out accuracy).
    santa's choice, not the paper's (which trains the discriminators on every example):
    it buys a measure of the discriminators; 0 trains them on everything."""

    discriminator_gradient_checkpointing: bool = False
    """Recompute the discriminators' activations in backward (also on with
    ``model.gradient_checkpointing``): a cross-encoder sees every query with each of its
    1 + n candidates at ``max_pair_length`` tokens, the stage's memory peak."""

    def __post_init__(self) -> None:
        check_positive(
            self,
            "iterations",
            "discriminator_learning_rate",
            "discriminator_steps",
            "dual_encoder_steps",
            "warmup_steps",
            "max_pair_length",
        )
        if not 0.0 <= self.adversarial_weight <= 1.0:
            fail(
                f"ScoderConfig.adversarial_weight must be in [0, 1], got {self.adversarial_weight}"
            )
        if self.soft_labels not in SOFT_LABEL_MODES:
            fail(
                f"ScoderConfig.soft_labels must be one of {SOFT_LABEL_MODES}, "
                f"got {self.soft_labels!r}"
            )
        if not 0.0 <= self.heldout_fraction < 1.0:
            fail(f"ScoderConfig.heldout_fraction must be in [0, 1), got {self.heldout_fraction}")

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ScoderConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return section_from_dict(cls, values)
