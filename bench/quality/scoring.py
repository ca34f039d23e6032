"""Per-query scores and bootstrap intervals, shared by the quality benchmarks."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["bootstrap", "format_interval", "per_query_rr"]


def per_query_rr(beir: str, trec: str, split: str) -> dict[str, float]:
    """RR@100 of every judged query (ranx's kernel, through santa's metrics), 0 for a
    query the run does not rank; the run is read in the order of its rank column."""
    from santa.data.beir import load_beir
    from santa.eval.metrics import per_query_scores
    from santa.eval.runfiles import read_trec

    return per_query_scores(load_beir(beir, split).qrels, read_trec(trec), "mrr@100")


def bootstrap(
    scores: Mapping[str, Mapping[str, float]],
    resamples: int,
    seed: int,
    pairs: tuple[tuple[str, str], ...] = (),
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Means with 95 % CIs per system, and paired CIs of the differences ``a - b`` of
    ``pairs`` (on the same resampled queries)."""
    systems = list(scores)
    queries = sorted(scores[systems[0]])
    for system in systems:
        if sorted(scores[system]) != queries:
            raise ValueError(f"{system} was scored on other queries than {systems[0]}")
    matrix = np.array([[scores[s][q] for q in queries] for s in systems])  # systems × queries
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(queries), size=(resamples, len(queries)))
    means = matrix[:, picks].mean(axis=2)  # systems × resamples

    def interval(row: np.ndarray, point: float) -> dict[str, float]:
        low, high = np.percentile(row, [2.5, 97.5])
        return {"mean": point, "ci_low": float(low), "ci_high": float(high)}

    per_system = {s: interval(means[i], float(matrix[i].mean())) for i, s in enumerate(systems)}
    differences = {}
    for a, b in pairs:
        if a in systems and b in systems:
            i, j = systems.index(a), systems.index(b)
            row = interval(means[i] - means[j], float(matrix[i].mean() - matrix[j].mean()))
            row["p_below_zero"] = float((means[i] - means[j] < 0).mean())
            differences[f"{a} - {b}"] = row
    return per_system, differences


def format_interval(row: Mapping[str, float], *, signed: bool = False, digits: int = 4) -> str:
    """``0.8553 [0.8237, 0.8851]``; ``signed``: ``+0.0205 [+0.0035, +0.0385]``."""
    spec = f"{'+' if signed else ''}.{digits}f"
    return (
        f"{format(row['mean'], spec)} [{format(row['ci_low'], spec)}, "
        f"{format(row['ci_high'], spec)}]"
    )
