"""The asynchronous hard-negative miner: a Ray actor that re-mines while training goes on.

Rank 0 sends a weights snapshot every ``negatives_refresh_every`` steps
(:meth:`NegativesClient.maybe_send_weights`, fire and forget). The miner keeps only the
newest snapshot; a background thread loads it, re-encodes the corpus and the training
queries, rebuilds the faiss index, mines, and publishes a versioned
:class:`~santa.negatives.mining.NegativesTable`. Trainers poll with a zero-timeout
``ray.wait`` between steps and swap a newer table in; they never block on the miner
(except, optionally, once for the first table).

All workers must agree, at every step, on whether hard negatives are in the batch (the
all-gather of their embeddings is a collective): each rank offers the newest table step it
holds, an all-reduce MIN picks the step every rank has, and each uses its newest table at or
below it.

If the miner dies, Ray restarts it (``max_restarts``); trainers keep training with the last
table they copied (tables are ordered by the training step they were mined at, so a
restarted miner's tables are still "newer"), count the restart, and swap in the next table
when it comes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from santa.config import ModelConfig, SantaConfig
from santa.distributed import all_reduce_min
from santa.encoding import encode_texts
from santa.index import NegativeIndex
from santa.model import DualEncoder
from santa.negatives.mining import (
    MiningCorpus,
    NegativesTable,
    load_mining_corpus,
    mine_hard_negatives,
    read_negatives_table,
)

logger = logging.getLogger(__name__)

__all__ = ["HardNegativeMiner", "MinerSettings", "NegativesClient", "refresh_table", "start_miner"]

# Tables a trainer keeps, so the all-reduced step is (practically always) one it holds.
KEPT_TABLES = 4


@dataclass(frozen=True, kw_only=True)
class MinerSettings:
    """How the miner mines; the fields shared with ``TrainConfig`` carry its names."""

    hard_negatives_per_query: int = 1
    """Negatives kept per query."""
    negatives_top_k: int = 100
    """Hits retrieved per query, before positives and skipped hits are dropped."""
    negatives_skip_top: int = 0
    """Top hits skipped after the positives (likely unlabelled positives)."""
    seed: int = 42
    negatives_index: str = "flat"
    """The faiss index kind: flat, ivf or hnsw."""
    max_query_length: int = 50
    max_document_length: int = 240
    batch_size: int = 64
    """Texts per encoder batch."""
    torch_threads: int = 1

    @classmethod
    def from_config(cls, config: SantaConfig) -> MinerSettings:
        """Settings from a :class:`~santa.config.SantaConfig` (its same-named fields)."""
        shared = {f.name for f in fields(cls)} & {f.name for f in fields(config.train)}
        return cls(**{name: getattr(config.train, name) for name in shared})


def refresh_table(
    model, corpus: MiningCorpus, settings: MinerSettings, *, step: int = 0, version: int = 0
) -> NegativesTable:
    """Encode corpus and queries with ``model``, search top-K, mine: one table."""
    started = time.perf_counter()
    doc_ids = list(corpus.documents)
    query_ids = list(corpus.queries)
    doc_vectors = encode_texts(
        model,
        [corpus.documents[d] for d in doc_ids],
        max_length=settings.max_document_length,
        batch_size=settings.batch_size,
        desc="miner: documents",
        progress=False,
    )
    query_vectors = encode_texts(
        model,
        [corpus.queries[q] for q in query_ids],
        max_length=settings.max_query_length,
        batch_size=settings.batch_size,
        desc="miner: queries",
        progress=False,
    )
    index = NegativeIndex.build(doc_vectors, doc_ids, kind=settings.negatives_index)
    # Positives and duplicates are dropped after the search: ask for enough extra hits.
    extra = settings.negatives_skip_top + max(
        (len(p) for p in corpus.positives.values()), default=1
    )
    hits, _ = index.search(query_vectors, settings.negatives_top_k + extra)
    negatives = mine_hard_negatives(
        query_ids,
        hits,
        corpus.positives,
        n=settings.hard_negatives_per_query,
        seed=settings.seed + step,
        skip_top=settings.negatives_skip_top,
        duplicate_of=corpus.duplicate_of,
    )
    return NegativesTable(
        negatives=negatives,
        step=step,
        version=version,
        build_s=time.perf_counter() - started,
    )


class HardNegativeMiner:
    """The actor body (run with ``max_concurrency`` > 1: polls answer during a refresh)."""

    def __init__(self, data_uri: str, model_uri: str, model_config: dict, settings: dict) -> None:
        import torch

        self.incarnation = uuid.uuid4().hex[:12]
        self.settings = MinerSettings(**settings)
        torch.set_num_threads(max(1, self.settings.torch_threads))
        self.corpus = load_mining_corpus(data_uri)
        self.model = DualEncoder.from_pretrained(model_uri, ModelConfig.from_dict(model_config))
        self.model.eval()
        self._lock = threading.Condition()
        self._pending: tuple[int, Any] | None = None
        self._latest: dict[str, Any] | None = None
        self._version = 0
        self._errors: list[str] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="santa-miner", daemon=True)
        self._thread.start()
        logger.info(
            "miner %s up: %d documents, %d queries",
            self.incarnation,
            len(self.corpus.documents),
            len(self.corpus.queries),
        )

    # ------------------------------------------------------------ called by trainers

    def submit(self, step: int, weights: list) -> None:
        """Take a weights snapshot (``[ObjectRef]`` of a state dict); keeps the newest."""
        with self._lock:
            if self._pending is None or step > self._pending[0]:
                self._pending = (step, weights[0])
                self._lock.notify_all()

    def latest(self, after_step: int) -> dict[str, Any] | None:
        """The newest table's description if it was mined after ``after_step``, else None."""
        with self._lock:
            if self._latest is None or self._latest["step"] <= after_step:
                return None
            return dict(self._latest)

    def info(self) -> dict[str, Any]:
        """Incarnation, tables built, the newest table's step and any refresh errors."""
        with self._lock:
            return {
                "incarnation": self.incarnation,
                "version": self._version,
                "step": None if self._latest is None else self._latest["step"],
                "errors": list(self._errors),
                "busy": self._pending is not None,
            }

    def stop(self) -> None:
        """End the background thread (the actor itself is killed by its owner)."""
        with self._lock:
            self._stopped = True
            self._lock.notify_all()

    # ------------------------------------------------------------ background thread

    def _run(self) -> None:
        import ray

        while True:
            with self._lock:
                while self._pending is None and not self._stopped:
                    self._lock.wait()
                if self._stopped:
                    return
                step, weights_ref = self._pending
            try:
                state = ray.get(weights_ref)
                self.model.load_state_dict(state)
                table = refresh_table(
                    self.model, self.corpus, self.settings, step=step, version=self._version + 1
                )
                table_ref = ray.put(table)
            except Exception:  # a failed refresh must not kill the miner: log and go on
                error = traceback.format_exc(limit=3)
                logger.error("hard-negative refresh at step %d failed:\n%s", step, error)
                with self._lock:
                    self._errors.append(error)
                    if self._pending is not None and self._pending[0] == step:
                        self._pending = None
                continue
            with self._lock:
                self._version += 1
                self._latest = {
                    "step": table.step,
                    "version": table.version,
                    "built_at": table.built_at,
                    "build_s": table.build_s,
                    "incarnation": self.incarnation,
                    "table": [table_ref],  # nested: fetching the description stays cheap
                }
                if self._pending is not None and self._pending[0] == step:
                    self._pending = None
            logger.info(
                "hard negatives v%d from step %d in %.1fs", table.version, step, table.build_s
            )


def start_miner(
    name: str,
    *,
    data_uri: str,
    model_uri: str,
    config,
    num_cpus: float = 0.0,
    num_gpus: float = 0.0,
    max_restarts: int = 3,
    resources: dict[str, float] | None = None,
):
    """Start (or replace) the named miner actor; returns its handle."""
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name))
    settings = MinerSettings.from_config(config)
    actor_class = ray.remote(HardNegativeMiner)
    return actor_class.options(
        name=name,
        max_restarts=max_restarts,
        max_concurrency=4,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=resources or None,
    ).remote(data_uri, model_uri, config.model.to_dict(), asdict(settings))


class NegativesClient:
    """A training worker's side: polls tables, keeps the newest few, fills batches.

    ``source`` is ``"table:URI"`` (one static table) or ``"async"`` (the named miner).
    """

    def __init__(
        self,
        source: str,
        *,
        data_uri: str,
        n: int,
        seed: int,
        rank: int,
        world_size: int,
        miner_name: str = "",
        refresh_every: int = 100,
    ) -> None:
        self.source = source
        self.n = n
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.refresh_every = refresh_every
        self.documents = load_mining_corpus(data_uri).documents
        self.doc_ids = list(self.documents)
        self.tables: dict[int, NegativesTable] = {}
        self.stats = {
            "swaps": 0,
            "miner_restarts": 0,
            "miner_errors": 0,
            "wait_s": 0.0,
            "wait_first_s": 0.0,
            "poll_s": 0.0,
            "filled": 0,
            "refresh_s": 0.0,
        }
        self._incarnation: str | None = None
        self._miner = None
        self._poll = None
        self._miner_name = miner_name
        if source.startswith("table:"):
            table = read_negatives_table(source.removeprefix("table:"))
            self.tables[table.step] = table
        elif source != "async":
            raise ValueError(f"unknown hard-negatives source {source!r}")

    # ------------------------------------------------------------ async plumbing

    @property
    def is_async(self) -> bool:
        """Whether tables come from the miner actor."""
        return self.source == "async"

    def _handle(self):
        import ray

        if self._miner is None:
            self._miner = ray.get_actor(self._miner_name)
        return self._miner

    def newest_step(self) -> int:
        """The training step of the newest table held (-1: none)."""
        return max(self.tables, default=-1)

    def maybe_send_weights(self, step: int, model, force: bool = False) -> None:
        """Rank 0: every ``refresh_every`` steps, hand the miner a weights snapshot."""
        if not self.is_async or self.rank != 0:
            return
        if not force and step % self.refresh_every:
            return
        import ray

        state = {key: value.detach().cpu() for key, value in model.state_dict().items()}
        try:
            self._handle().submit.remote(step, [ray.put(state)])
        except Exception as error:  # the miner is restarting: next snapshot goes through
            self.stats["miner_errors"] += 1
            logger.warning("could not send weights to the miner: %s", error)

    def poll(self) -> bool:
        """Non-blocking: swap a newer table in if the miner has one. True if swapped."""
        if not self.is_async:
            return False
        import ray

        started = time.perf_counter()
        swapped = False
        try:
            if self._poll is None:
                self._poll = self._handle().latest.remote(self.newest_step())
            ready, _ = ray.wait([self._poll], timeout=0)
            if ready:
                poll, self._poll = self._poll, None
                description = ray.get(poll)
                if description is not None:
                    swapped = self._take(description)
        except (
            ray.exceptions.RayActorError,  # died (and maybe being restarted)
            ray.exceptions.ActorUnavailableError,  # restarting right now
            ray.exceptions.ObjectLostError,  # the table went with its dead owner
        ) as error:
            self._poll = None
            self.stats["miner_errors"] += 1
            logger.warning("hard-negative miner unavailable (%s); keeping the last table", error)
        self.stats["poll_s"] += time.perf_counter() - started
        return swapped

    def wait_for_first(self, timeout_s: float = 600.0) -> None:
        """Block until a first table arrives (``negatives_wait_for_first``)."""
        started = time.perf_counter()
        while self.newest_step() < 0:
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"no hard-negatives table within {timeout_s:.0f}s")
            if not self.poll():
                time.sleep(0.2)
        self.stats["wait_first_s"] += time.perf_counter() - started

    def _take(self, description: dict[str, Any]) -> bool:
        import ray

        incarnation = description["incarnation"]
        if self._incarnation is not None and incarnation != self._incarnation:
            self.stats["miner_restarts"] += 1
            logger.warning("the hard-negative miner was restarted (%s)", incarnation)
        self._incarnation = incarnation
        if description["step"] <= self.newest_step():
            return False
        table: NegativesTable = ray.get(description["table"][0])
        self.tables[table.step] = table
        for old in sorted(self.tables)[:-KEPT_TABLES]:
            del self.tables[old]
        self.stats["swaps"] += 1
        self.stats["refresh_s"] = table.build_s
        return True

    def agreed_table(self, device) -> NegativesTable | None:
        """The table every rank uses this step (collective when distributed)."""
        step = self.newest_step()
        if self.is_async and self.world_size > 1:
            step = all_reduce_min(step, device)
        if step < 0:
            return None
        usable = [s for s in self.tables if s <= step]
        return self.tables[max(usable)] if usable else self.tables[min(self.tables)]

    # ------------------------------------------------------------ batches

    def negatives_for(self, table: NegativesTable, query_ids, doc_ids, step: int) -> list[str]:
        """``n`` negative texts per query, in query order (``len(query_ids) * n`` texts).

        Missing ones (a query the table does not know, or with fewer than ``n``) are filled
        with random documents other than the query's own (seeded by step and rank), and
        counted in ``stats["filled"]``.
        """
        rng = np.random.default_rng([self.seed, step, self.rank])
        texts: list[str] = []
        for query_id, own in zip(query_ids, doc_ids, strict=True):
            chosen = list(table.negatives.get(str(query_id), []))[: self.n]
            while len(chosen) < self.n:
                candidate = self.doc_ids[int(rng.integers(len(self.doc_ids)))]
                if candidate != own or len(self.doc_ids) == 1:
                    chosen.append(candidate)
                    self.stats["filled"] += 1
            texts.extend(self.documents[doc] for doc in chosen)
        return texts

    def metrics(self, step: int, table: NegativesTable | None) -> dict[str, float]:
        """What the trainer reports about negatives at ``step``."""
        return {
            "negatives_step": float(table.step) if table is not None else -1.0,
            "negatives_staleness": float(step - table.step) if table is not None else -1.0,
            "negatives_swaps": float(self.stats["swaps"]),
            "negatives_wait_s": float(self.stats["wait_s"]),
            "negatives_wait_first_s": float(self.stats["wait_first_s"]),
            "negatives_poll_s": float(self.stats["poll_s"]),
            "negatives_refresh_s": float(self.stats["refresh_s"]),
            "negatives_filled": float(self.stats["filled"]),
            "miner_restarts": float(self.stats["miner_restarts"]),
            "miner_errors": float(self.stats["miner_errors"]),
        }
