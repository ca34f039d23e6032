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
    learning rate, lengths, similarity) are the ``model`` and ``train`` sections. The
    discriminators share the backbone and the global batch size of the dual encoder.
    """

    iterations: int = 4
    """I in Algorithm 2: rounds of mine → train discriminators → train the dual encoder."""

    adversarial_weight: float = 0.2
    """λ in ``L = λ·L_adv + (1 − λ)·L_distill`` (Eq. 10; 0.2 in the paper's Table 7)."""

    negatives_per_query: int = 7
    """Hard negatives X⁻ scored with each positive (the paper's "negative size")."""

    negatives_top_k: int = 100
    """K: the dual encoder's top-K hits (positives removed) the negatives come from."""

    negatives_pool: int = 30
    """Negatives kept per query from the top K; every stage samples its X⁻ from them.

    santa's choice: each query's X⁻ is sampled from this pool once per iteration (the
    ``examples/`` of ``iter-<i>``), and both the discriminators and the dual encoder train
    on those examples, so that offline soft labels can be scored once for exactly what the
    dual encoder sees. The paper's Algorithm 2 samples X⁻ at every training step (lines 6
    and 10); across iterations santa re-mines and re-samples, as Algorithm 2's line 13."""

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
            "negatives_per_query",
            "negatives_top_k",
            "negatives_pool",
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
        if self.negatives_pool < self.negatives_per_query:
            fail(
                f"ScoderConfig.negatives_pool={self.negatives_pool} must be at least "
                f"negatives_per_query={self.negatives_per_query}"
            )
        if self.negatives_top_k < self.negatives_pool:
            fail(
                f"ScoderConfig.negatives_top_k={self.negatives_top_k} must be at least "
                f"negatives_pool={self.negatives_pool}"
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
