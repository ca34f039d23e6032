"""ESCI as SANTA's scripts prepare it: the dev split they carve, the pairs they pretrain on.

SANTA's released code (github.com/OpenMatch/SANTA, ``processing/Product/``) reads the two
ESCI parquet files, joins judgments to products on (``product_locale``, ``product_id``) and:

- **dev split** (``build_product.py``): the US judgments of the small version's ``train``
  split; their query ids, in order of first appearance, go through scikit-learn's
  ``train_test_split(test_size=0.125, random_state=10)``. That gives Table 1's 18,277
  train and 2,611 dev queries. :func:`carve_dev` is that split, computed the way
  scikit-learn computes it (``RandomState(seed).permutation(n)``, the first
  ``ceil(fraction * n)`` positions are dev), so santa's dev queries are the scripts' own.
- **pretraining pairs** (``build_product_entity.py``, Table 5's 331,590 product pairs): the
  large version's US judgments of every split (test included), the same query split with
  5 % dev (``random_state=10``); each *Exact* judgment of a train-side query whose product
  has a description and bullet points gives one pair, a randomly drawn line of its bullet
  points ↔ its description, and only descriptions that hold HTML markup are kept (the
  scripts keep a pair when BeautifulSoup's text differs from the raw description).

santa's own pretraining rule (``esci_pretrain="product"``, the default) is one pair per
product of the locale with a description and bullet points, leaving out every product
judged by a test query: no test document is seen before evaluation. The
``paper`` rule reproduces the scripts' pairs, test products included, and says so in the
report.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from santa.data.cleaning import has_markup
from santa.data.records import Reason

__all__ = [
    "DEV_FRACTION",
    "DEV_SEED",
    "PAPER_PRETRAIN_DEV_FRACTION",
    "PRETRAIN_RULES",
    "TABLE1",
    "TABLE5_PRODUCT_PAIRS",
    "carve_dev",
    "has_markup",
    "paper_pretrain_examples",
    "select_judgments",
]

# build_product.py: split_data(dev_size=0.125), train_test_split(..., random_state=10).
DEV_FRACTION = 0.125
DEV_SEED = 10
# build_product_entity.py: split_data(dev_size=0.05), the same random_state.
PAPER_PRETRAIN_DEV_FRACTION = 0.05
PRETRAIN_RULES = ("product", "paper")
# SANTA Table 1 (ESCI small, US) and Table 5 (pretraining pairs), for the report.
TABLE1 = {
    "train": {"queries": 18_277, "judgments": 367_946},
    "valid": {"queries": 2_611, "judgments": 51_706},
    "test": {"queries": 8_956, "judgments": 181_701},
}
TABLE5_PRODUCT_PAIRS = 331_590


def carve_dev(query_ids: Sequence[Any], fraction: float, seed: int) -> list[Any]:
    """The dev queries scikit-learn's ``train_test_split(ids, test_size=fraction,
    random_state=seed)`` picks: the first ``ceil(fraction * n)`` of a seeded permutation."""
    if not 0 < fraction < 1:
        raise ValueError(f"the dev fraction must be in (0, 1), got {fraction}")
    count = len(query_ids)
    permutation = np.random.RandomState(seed).permutation(count)
    return [query_ids[i] for i in permutation[: math.ceil(fraction * count)]]


def _in_file_order(frame: pd.DataFrame) -> list[Any]:
    """The query ids of ``frame`` in order of first appearance (``Series.unique``)."""
    return list(frame["query_id"].unique())


def select_judgments(
    examples: pd.DataFrame,
    *,
    version: str,
    locale: str,
    split: str,
    dev_fraction: float = DEV_FRACTION,
    dev_seed: int = DEV_SEED,
) -> tuple[pd.DataFrame, Counter, dict[str, Any]]:
    """The judgments of ``split`` (train, valid or test), what was filtered, the counts.

    ``valid`` is carved from the version's ``train`` split as SANTA's ``build_product.py``
    carves it; ``train`` is the rest.
    """
    filtered: Counter = Counter()
    in_version = examples[f"{version}_version"].astype(int) == 1
    filtered[Reason.OTHER_VERSION] += int((~in_version).sum())
    frame = examples[in_version]
    in_locale = frame["product_locale"] == locale
    filtered[Reason.OTHER_LOCALE] += int((~in_locale).sum())
    frame = frame[in_locale]
    train, test = frame[frame["split"] == "train"], frame[frame["split"] == "test"]
    dev_queries = set(carve_dev(_in_file_order(train), dev_fraction, dev_seed))
    in_dev = train["query_id"].isin(dev_queries)
    parts = {"train": train[~in_dev], "valid": train[in_dev], "test": test}
    chosen = parts[split]
    filtered[Reason.OTHER_SPLIT] += len(frame) - len(chosen)
    counts = {
        "rule": (
            f"dev: SANTA's build_product.py, train_test_split(train query ids, "
            f"test_size={dev_fraction}, random_state={dev_seed})"
        ),
        "dev_fraction": dev_fraction,
        "dev_seed": dev_seed,
        "queries": {name: int(part["query_id"].nunique()) for name, part in parts.items()},
        "judgments": {name: len(part) for name, part in parts.items()},
        "paper_table1": TABLE1,
    }
    return chosen, filtered, counts


def paper_pretrain_examples(
    examples: pd.DataFrame,
    *,
    version: str,
    locale: str,
    dev_fraction: float = PAPER_PRETRAIN_DEV_FRACTION,
    dev_seed: int = DEV_SEED,
) -> tuple[pd.DataFrame, Counter, dict[str, Any]]:
    """The judgments SANTA's ``build_product_entity.py`` makes pretraining pairs of.

    Exact judgments of the version (large in the paper) and locale, every split, of the
    queries its 5 % dev split leaves on the train side; returns them, what was filtered and
    the counts (``test_judgments``: pairs whose query is a test query, kept as the scripts
    keep them).
    """
    filtered: Counter = Counter()
    in_version = examples[f"{version}_version"].astype(int) == 1
    filtered[Reason.OTHER_VERSION] += int((~in_version).sum())
    frame = examples[in_version]
    in_locale = frame["product_locale"] == locale
    filtered[Reason.OTHER_LOCALE] += int((~in_locale).sum())
    frame = frame[in_locale]
    dev_queries = set(carve_dev(_in_file_order(frame), dev_fraction, dev_seed))
    in_dev = frame["query_id"].isin(dev_queries)
    filtered[Reason.OTHER_SPLIT] += int(in_dev.sum())
    frame = frame[~in_dev]
    exact = frame["esci_label"] == "E"
    filtered[Reason.OTHER_LABEL] += int((~exact).sum())
    frame = frame[exact]
    counts = {
        "rule": (
            "SANTA's build_product_entity.py: one pair per Exact judgment, every split, "
            f"queries outside train_test_split(test_size={dev_fraction}, "
            f"random_state={dev_seed}); descriptions with HTML markup only"
        ),
        "dev_fraction": dev_fraction,
        "dev_seed": dev_seed,
        "exact_judgments": len(frame),
        "test_judgments": int((frame["split"] == "test").sum()),
        "paper_table5_pairs": TABLE5_PRODUCT_PAIRS,
        "comparable_to_table5": version == "large" and locale == "us",
    }
    return frame, filtered, counts
