"""How Ray Train hands the training set to its workers: prepared once, split, re-read.

Ray Train's default (``DataConfig``) gives each worker a streaming split of the dataset:
every epoch runs the whole plan again — read the Parquet pairs, tokenize them — and every
epoch boundary waited for that pipeline to start over (a window at a fraction of the
steady rate, once per epoch). :class:`PreparedSplits` runs the plan once per run
(``Dataset.materialize``: the tokenize tasks run once, the blocks stay in the object
store, spilled to disk if it is full) and hands the workers an equal streaming split of
those blocks: each epoch streams them again without reading or tokenizing anything, and
:class:`~santa.train.epochs.EpochReader` reads it ahead across epoch boundaries.

The split is ``streaming_split(equal=True)``: it cuts blocks in tasks that ask for no CPU.
``Dataset.split(equal=True)`` cuts them in tasks that ask for a whole CPU, which never run
on a cluster whose trainers leave each node less than one (two 1.5-CPU trainers on two
2-CPU nodes): training would wait forever for its first batch.

It runs in Ray Train's dataset manager when rank 0 first asks for its shard, so the
tokenization overlaps the workers' start (imports, model loading).
"""

from __future__ import annotations

from ray.train import DataConfig

__all__ = ["PreparedSplits"]


class PreparedSplits(DataConfig):
    """A ``DataConfig`` that materializes each dataset once and splits it equally."""

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        """One equal streaming split of each materialized dataset per worker."""
        output: list[dict] = [{} for _ in range(world_size)]
        for name, dataset in datasets.items():
            dataset = dataset.copy(dataset)
            dataset.context.execution_options = self._resolve_execution_options(name)
            prepared = dataset.materialize()  # the plan runs here, once
            splits = prepared.streaming_split(
                world_size, equal=True, locality_hints=worker_node_ids
            )
            for rank, split in enumerate(splits):
                output[rank][name] = split
        return output
