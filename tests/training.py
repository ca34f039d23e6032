"""Shared helpers of the training tests: a small tiny-T5 config; the pair tables on disk
come from ``bench/corpora.py`` (the benchmarks build the same ones)."""

from __future__ import annotations

from typing import Any

from bench.corpora import stdlib_pair_rows, write_beir, write_pairs  # noqa: F401 - re-exported
from santa.config import SantaConfig
from santa.recipes import get_recipe


def tiny_config(negatives: dict[str, Any] | None = None, **train: Any) -> SantaConfig:
    """The ``tiny-ci`` recipe (the tiny one at test size: batch 8, short sequences), with
    ``train.*`` overrides and ``negatives.*`` ones (``negatives={"source": "async",
    "per_query": 1}``)."""
    overrides = [f"train.{key}={value}" for key, value in train.items()]
    overrides += [f"negatives.{key}={value}" for key, value in (negatives or {}).items()]
    return get_recipe("tiny-ci").with_overrides(overrides)
