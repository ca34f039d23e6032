"""The ``negatives`` section: hard negatives, their mining and the miner's encoders."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from santa.config.common import (
    NEGATIVE_INDEXES,
    check_positive,
    fail,
    section_from_dict,
)


@dataclass(frozen=True, kw_only=True)
class NegativesConfig:
    """Hard negatives: where they come from, how they are mined, the miner's encoder pool.

    Read by the training loop (``source``, ``per_query``), the asynchronous miner actor and
    the offline miner (``ray_jobs.mine_negatives``, the pipeline's ANCE step, SCodeR's
    refresh) alike. Lengths and the seed are the ``train`` section's.
    """

    source: str = "none"
    """Where hard negatives come from: ``"none"``, ``"table:URI"`` (a table written by
    ``ray_jobs.mine_negatives``) or ``"async"`` (a miner actor re-mines them with the newest
    weights while training goes on)."""

    per_query: int = 0
    """Hard negatives encoded beside each query's positive (0: in-batch negatives only); in
    SCodeR, the X⁻ scored with each positive (the paper's "negative size", 7)."""

    pool: int | None = None
    """Negatives a mined table keeps per query, sampled from the ``top_k`` (None:
    ``per_query``); training samples its ``per_query`` from them (SCodeR: each iteration's
    X⁻, santa's choice; the paper samples at every step)."""

    refresh_every: int = 100
    """``async``: send the miner a weights snapshot every this many steps."""

    top_k: int = 100
    """Hits retrieved per query to sample hard negatives from (the paper: top 100)."""

    skip_top: int = 0
    """Skip this many top hits (after removing positives): fewer false negatives."""

    wait_for_first: bool = False
    """``async``: wait once, before the first step, for the first table."""

    index: str = "flat"
    """faiss index the miner builds: ``flat`` (exact), ``ivf``, ``hnsw`` or ``auto`` (flat,
    IVF from 500,000 documents on: exact search grows as queries × documents)."""

    encoder_actors: int = 1
    """Encoder actors a refresh shards the corpus over (``--miner-actors``): the pool asks for
    this many and starts encoding as soon as one is up, so an autoscaler can add the rest."""

    encoder_gpus: float = 0.0
    """GPUs per encoder actor (``--miner-gpus``; fractions such as 0.25 share a GPU); 0:
    encode on CPU. On a GPU the encoder runs under bf16 (fp16 without bf16) autocast."""

    encoder_cpus: float = 0.0
    """CPUs reserved per encoder actor; a CPU encoder runs that many torch threads (at least
    1). 0 fits beside trainers that hold every CPU but Ray Data's (they share cores)."""

    batch_size: int = 64
    """Texts per encoder batch when mining."""

    max_score_ratio: float | None = None
    """Positive-aware false-negative filter (NV-Retriever's TopK-PercPos, Moreira et al.,
    2024): drop a mined hit scoring above this share of its query's positive score (for a
    negative positive score ``p``: above ``p - (1 - ratio)·|p|``). Scores are the model's
    similarity (dot, or cosine), before any temperature. ``None`` (the default): off.
    NV-Retriever's best setting, 0.95, ranks with a strong separate teacher; santa mines
    with the model being trained, and every hit a weak model scores above the positive is
    dropped: at tiny scale (bench/quality/negative_filtering.py) 0.95, and 0.99 too, left two
    thirds of the queries without a mined negative. Turn it on when mining with a model
    that ranks positives near the top (the counts in the table say what it dropped)."""

    min_margin: float | None = None
    """Absolute false-negative filter (TopK-MarginPos): drop a mined hit scoring above the
    positive's score minus this margin; ``none``: off."""

    def __post_init__(self) -> None:
        if self.per_query < 0:
            fail(f"NegativesConfig.per_query must be >= 0, got {self.per_query}")
        if self.pool is not None and not self.per_query <= self.pool <= self.top_k:
            fail(
                f"NegativesConfig.pool={self.pool} must be at least per_query={self.per_query} "
                f"and at most top_k={self.top_k}"
            )
        source = self.source
        if source not in ("none", "async") and not source.startswith("table:"):
            fail(f"NegativesConfig.source must be 'none', 'async' or 'table:URI', got {source!r}")
        if source == "table:":
            fail("NegativesConfig.source='table:' needs a URI after 'table:'")
        if source != "none" and self.per_query < 1:
            fail(f"NegativesConfig.source={source!r} needs per_query >= 1")
        if self.index not in NEGATIVE_INDEXES:
            fail(f"NegativesConfig.index must be one of {NEGATIVE_INDEXES}, got {self.index!r}")
        check_positive(self, "refresh_every", "top_k", "encoder_actors", "batch_size")
        if self.encoder_gpus < 0 or self.encoder_cpus < 0:
            fail(
                "NegativesConfig.encoder_gpus and encoder_cpus must be >= 0, got "
                f"{self.encoder_gpus} and {self.encoder_cpus}"
            )
        if self.skip_top < 0:
            fail(f"NegativesConfig.skip_top must be >= 0, got {self.skip_top}")
        if self.max_score_ratio is not None and not 0 < self.max_score_ratio <= 1:
            fail(
                "NegativesConfig.max_score_ratio must be in (0, 1] or none, got "
                f"{self.max_score_ratio}"
            )
        if self.min_margin is not None and self.min_margin < 0:
            fail(f"NegativesConfig.min_margin must be >= 0 or none, got {self.min_margin}")

    @property
    def mined_per_query(self) -> int:
        """Negatives mined into a table per query: ``pool``, else ``per_query``."""
        return self.per_query if self.pool is None else self.pool

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> NegativesConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        return section_from_dict(cls, values)


# The hard-negative fields that lived in the train section before the negatives section:
# stored configs (checkpoints, sweeps) are read into the new place, overrides are told it.
MOVED_TO_NEGATIVES = {
    "hard_negatives": "source",
    "hard_negatives_per_query": "per_query",
    "negatives_refresh_every": "refresh_every",
    "negatives_top_k": "top_k",
    "negatives_skip_top": "skip_top",
    "negatives_wait_for_first": "wait_for_first",
    "negatives_index": "index",
    "negatives_encoder_actors": "encoder_actors",
    "negatives_encoder_gpus": "encoder_gpus",
    "negatives_encoder_cpus": "encoder_cpus",
}
# SCodeR's negatives settings, which lived in the scoder section: read into the negatives
# section from stored configs, overrides are told the new name.
MOVED_FROM_SCODER = {
    "negatives_per_query": "per_query",
    "negatives_top_k": "top_k",
    "negatives_pool": "pool",
}
