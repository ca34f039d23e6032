"""Shared helpers of the training tests: a small tiny-T5 config; the pair tables on disk
come from ``bench/corpora.py`` (the benchmarks build the same ones)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.corpora import stdlib_pair_rows, write_beir, write_pairs  # noqa: F401 - re-exported
from santa.config import SantaConfig
from santa.config.recipes import get_recipe


def tiny_config(negatives: dict[str, Any] | None = None, **train: Any) -> SantaConfig:
    """The ``tiny-ci`` recipe (the tiny one at test size: batch 8, short sequences), with
    ``train.*`` overrides and ``negatives.*`` ones (``negatives={"source": "async",
    "per_query": 1}``)."""
    overrides = [f"train.{key}={value}" for key, value in train.items()]
    overrides += [f"negatives.{key}={value}" for key, value in (negatives or {}).items()]
    return get_recipe("tiny-ci").with_overrides(overrides)


@contextmanager
def own_cluster(head: dict[str, Any], *node_cpus: int) -> Iterator[tuple[Any, list[Any]]]:
    """A real Ray cluster of this test's own (``head``: the head's node args, then a
    worker node per CPU count), connected; the test session's cluster (conftest's
    ``ray_cluster``), if connected, is handed back afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    from santa.cluster.ray_utils import _node_start_wait, init_ray

    session = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    if session:
        ray.shutdown()
    with _node_start_wait(120):  # a loaded machine starts a node slowly
        cluster = Cluster(initialize_head=True, head_node_args=head)
        workers = [cluster.add_node(num_cpus=cpus) for cpus in node_cpus]
        cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()
        if session:
            init_ray(session, log_to_driver=False)


def _train_ranks(rank: int, world: int, port: int, runs: list[tuple[dict, str, str]]) -> None:
    """One rank of :func:`train_runs_on_ranks` (a spawned process): each run in turn."""
    import json

    import torch.distributed as dist

    from santa.train.loop import WorkerTrainer, run_worker
    from santa.train.loop_config import LoopConfig
    from santa.train.session import LocalSession

    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    try:
        for loop, root, out in runs:
            session = LocalSession(checkpoint_root=root, rank=rank, world_size=world)
            trainer = WorkerTrainer(LoopConfig.from_dict(loop), session)
            rows: list[list[str]] = []
            step = trainer.train_step

            def recorded_step(batch, rows=rows, step=step):
                rows.append([str(query) for query in batch["query_id"]])
                return step(batch)

            trainer.train_step = recorded_step
            run_worker(trainer)
            with open(f"{out}/rank{rank}.json", "w") as handle:
                json.dump({"reports": session.reports, "rows": rows}, handle)
    finally:
        if world > 1:
            dist.destroy_process_group()


def train_runs_on_ranks(world: int, runs: list[tuple[Any, str, str]]) -> list[list[dict[str, Any]]]:
    """Each ``(loop, root, out)`` run in turn on the same ``world`` gloo processes without
    Ray (``LocalSession``, resumed from ``root``'s newest checkpoint when it has one; one
    spawn: a rank's start-up, its imports, costs seconds): per run, each rank's reports
    and the query ids of every step's batch, rank by rank."""
    import json
    import os

    import torch.multiprocessing as mp

    from tests.conftest import free_port

    for _, _, out in runs:
        os.makedirs(out, exist_ok=True)
    plain = [(loop.to_dict(), root, out) for loop, root, out in runs]
    if world == 1:
        _train_ranks(0, 1, 0, plain)
    else:
        mp.spawn(_train_ranks, args=(world, free_port(), plain), nprocs=world)
    results = []
    for _, _, out in runs:
        ranks = []
        for rank in range(world):
            with open(f"{out}/rank{rank}.json") as handle:
                ranks.append(json.load(handle))
        results.append(ranks)
    return results


def train_on_ranks(world: int, loop: Any, root: str, out: str) -> list[dict[str, Any]]:
    """The worker loop on ``world`` gloo processes without Ray (``LocalSession``, resumed
    from ``root``'s newest checkpoint when it has one): each rank's reports and the query
    ids of every step's batch, rank by rank."""
    return train_runs_on_ranks(world, [(loop, root, out)])[0]


def mining_corpus(
    folder: Any,
    documents: dict[str, str],
    queries: dict[str, str],
    positives: dict[str, set[str]],
):
    """A :class:`~santa.negatives.corpus.MiningCorpus` of these documents (numbered in this
    order), queries and positives, as pair rows on disk: each document a pair of the query
    it is a positive of, or a judged-only row that does not train."""
    from pathlib import Path

    from santa.negatives.corpus import load_mining_corpus

    positive_of = {doc: query for query, docs in positives.items() for doc in sorted(docs)}
    rows = []
    for doc_id, text in documents.items():
        query_id = positive_of.get(doc_id)
        rows.append(
            {
                "id": f"{query_id}-{doc_id}",
                "dataset": "synthetic",
                "kind": "code_pair" if query_id else "product_judgment",
                "query_id": query_id or "unjudged",
                "query": queries.get(query_id or "", "unjudged"),
                "doc_id": doc_id,
                "title": "",
                "document": text,
                "label": 1 if query_id else 0,
                "mep_target": "",
            }
        )
    folder = Path(folder)
    return load_mining_corpus(write_pairs(folder / "pairs", rows), str(folder / "rows"))


def negatives_by_id(table, corpus) -> dict[str, list[str]]:
    """A (small) table as ``{query id: negative ids}``, queries without negatives left out."""
    arrow = table.to_arrow(corpus)
    return dict(
        zip(
            arrow.column("query_id").to_pylist(),
            arrow.column("negative_ids").to_pylist(),
            strict=True,
        )
    )


def tiny_start(folder: Any, rows: list[dict[str, Any]], config: SantaConfig) -> dict[str, str]:
    """Pairs of ``rows`` under ``folder`` and a tiny T5 (its tokenizer trained on them) saved
    as the initial model: what the loop trains from without Ray (``local_loop``)."""
    from pathlib import Path

    from santa.models.dual_encoder import DualEncoder
    from santa.models.tokenizer import train_tokenizer

    folder = Path(folder)
    data = write_pairs(folder / "pairs", rows)
    texts = [row["query"] for row in rows] + [row["document"] for row in rows]
    tokenizer = train_tokenizer(texts, vocab_size=config.model.tiny_vocab_size)
    model = DualEncoder.build_tiny(config.model, tokenizer, seed=0)
    model.save_pretrained(str(folder / "init"), santa_config=config)
    return {"data": data, "init": str(folder / "init"), "rows": str(folder / "rows")}


def local_loop(start: dict[str, str], config: SantaConfig, **fields: Any):
    """The ``LoopConfig`` of the loop over ``tiny_start``'s pairs and model."""
    from santa.train.loop_config import LoopConfig

    return LoopConfig(
        santa=config,
        init_model=start["init"],
        data_uri=start["data"],
        row_cache=start["rows"],
        **fields,
    )
