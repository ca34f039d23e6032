"""Discriminator scores over ``{x⁺} ∪ X⁻`` for every listwise example, with Ray Data.

``offline`` soft labels (the paper's Limitations: no discriminator in the training worker's
accelerator memory): a pool of actors, each loading the discriminators once, scores the
examples and writes them back as Parquet with a ``scores`` column, which the dual-encoder
stage reads. The same scoring measures the discriminators on held-out examples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from santa.files import storage
from santa.scoder.discriminator import DISCRIMINATOR_KINDS

__all__ = ["score_examples", "summarize_scores", "write_soft_labels"]


class _ScoreActor:
    """Ray Data actor UDF: loads the discriminators once, adds ``scores`` to each batch."""

    def __init__(
        self, discriminators: str, max_first: int, max_length: int, batch_size: int, threads: int
    ) -> None:
        import torch

        from santa.scoder.discriminator import DiscriminatorPair

        torch.set_num_threads(max(1, threads))
        self.pair = DiscriminatorPair.from_pretrained(discriminators).eval()
        self.max_first = max_first
        self.max_length = max_length
        self.batch_size = batch_size

    def __call__(self, batch: pa.Table) -> pa.Table:
        import torch

        rows = batch.select(["kind", "query", "candidates"]).to_pydict()
        scores: list[list[float] | None] = [None] * batch.num_rows
        with torch.inference_mode():
            for kind in sorted(set(rows["kind"])):
                if kind not in self.pair.by_kind:
                    raise ValueError(f"examples of kind {kind!r} but no discriminator for it")
                model = self.pair.by_kind[kind]
                index = [i for i, k in enumerate(rows["kind"]) if k == kind]
                for start in range(0, len(index), self.batch_size):
                    chunk = index[start : start + self.batch_size]
                    values = model.score_lists(
                        [rows["query"][i] for i in chunk],
                        [rows["candidates"][i] for i in chunk],
                        max_first=self.max_first,
                        max_length=self.max_length,
                    )  # (chunk, 1 + n)
                    for i, row in zip(chunk, values.float().tolist(), strict=True):
                        scores[i] = row
        return batch.append_column("scores", pa.array(scores, pa.list_(pa.float32())))


def score_examples(
    examples: str,
    discriminators: str,
    *,
    max_first: int,
    max_length: int,
    batch_size: int = 32,
    heldout_only: bool = False,
    num_actors: int = 0,
):
    """A Ray Dataset of the listwise examples under ``examples`` with their ``scores``."""
    import ray
    import ray.data
    from ray.data.expressions import col

    from santa.scoder.examples import read_listwise_dataset

    dataset = read_listwise_dataset(examples)
    if heldout_only:
        dataset = dataset.filter(expr=col("heldout"))
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    # Leave one CPU to the read tasks: a pool holding every CPU would starve them.
    actors = num_actors or max(1, cpus - 1)
    return dataset.map_batches(
        _ScoreActor,
        fn_constructor_kwargs={
            "discriminators": discriminators,
            "max_first": max_first,
            "max_length": max_length,
            "batch_size": batch_size,
            "threads": 1,
        },
        batch_format="pyarrow",
        batch_size=batch_size * 4,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors),
        num_cpus=1,
    )


def write_soft_labels(examples: str, discriminators: str, output: str, **options: Any) -> str:
    """Score every example of ``examples`` and write them, ``scores`` added, to
    ``output/data`` (overwriting a previous attempt); returns ``output``."""
    path, sink = storage.for_ray_write(storage.join(output, "data"))  # S3: santa's timeouts
    score_examples(examples, discriminators, **options).write_parquet(
        path, mode="overwrite", **sink
    )
    return output


def summarize_scores(table: pa.Table) -> dict[str, float]:
    """Held-out accuracy per discriminator (the positive ranked first) and the soft
    labels' mean entropy (nats; ``log(1 + n)`` is a uniform guess), over ``table``'s rows."""
    rows = table.select(["kind", "heldout", "scores"]).to_pydict()
    summary: dict[str, float] = {}
    entropies = []
    for kind in DISCRIMINATOR_KINDS:
        index = [i for i, k in enumerate(rows["kind"]) if k == kind]
        if not index:
            continue
        scores = np.asarray([rows["scores"][i] for i in index], dtype=np.float64)
        shifted = scores - scores.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        entropy = -(np.exp(log_p) * log_p).sum(axis=1)
        entropies.append(entropy)
        summary[f"soft_label_entropy_{kind}"] = float(entropy.mean())
        heldout = np.asarray([rows["heldout"][i] for i in index], dtype=bool)
        if heldout.any():
            correct = scores[heldout].argmax(axis=1) == 0
            summary[f"heldout_accuracy_{kind}"] = float(correct.mean())
            summary[f"heldout_examples_{kind}"] = float(heldout.sum())
        summary["candidates"] = float(scores.shape[1])
    if entropies:
        summary["soft_label_entropy"] = float(np.concatenate(entropies).mean())
    return summary
