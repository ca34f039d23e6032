"""A training worker's side of hard negatives (:class:`NegativesClient`): polls the miner's
tables (or reads one mined table), keeps the newest few, agrees with the other ranks on the
table every rank holds, and fills batches with their negatives' texts read from the node's
row file."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np

from santa.method.distributed import all_reduce_min
from santa.negatives.corpus import MiningCorpus, load_mining_corpus
from santa.negatives.rules import (
    FILTER_REASONS,
)
from santa.negatives.table import NegativesTable, read_negatives_table

logger = logging.getLogger(__name__)

# Tables a trainer keeps, so the all-reduced step is (practically always) one it holds.
KEPT_TABLES = 4

AGREE_EVERY = 10
"""Steps between the ranks' agreements on the asynchronous miner's newest table."""

__all__ = [
    "KEPT_TABLES",
    "AGREE_EVERY",
    "NegativesClient",
]


class NegativesClient:
    """A training worker's side: polls tables, keeps the newest few, fills batches.

    ``source`` is ``"table:URI"`` (one static table, read by id into this corpus's numbers)
    or ``"async"`` (the named miner, whose tables carry numbers). The worker reads the
    negatives' texts and ids from its node's row file of every pair
    (:class:`~santa.negatives.corpus.MiningCorpus`, ``row_cache``): tables carry integers
    only, and no process holds the corpus's text.
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
        row_cache: str = "",
    ) -> None:
        self.source = source
        self.n = n
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.refresh_every = refresh_every
        self.data_uri = data_uri
        self._row_cache = row_cache
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
        self._agreed: int | None = None  # the table step the ranks last agreed on
        self._outage = False  # the miner has been unreachable since the last table
        self._miner = None
        self._poll = None
        self._miner_name = miner_name
        if source.startswith("table:"):
            table = read_negatives_table(source.removeprefix("table:"), self.corpus)
            self.tables[table.step] = table
        elif source != "async":
            raise ValueError(f"unknown hard-negatives source {source!r}")

    @functools.cached_property
    def corpus(self) -> MiningCorpus:
        """The node's row file of every pair, numbered (opened on first need: a static
        table at once, the miner's first table when it comes)."""
        return load_mining_corpus(self.data_uri, self._row_cache)

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
            if self.rank == 0 and not self._outage:
                # One line per outage on the terminal (Ray restarts the actor; its
                # traceback stays in the log folder).
                from santa.jobs.console import say

                newest = self.newest_step()
                kept = f"the table of step {newest}" if newest >= 0 else "in-batch negatives"
                restarts = self.stats["miner_restarts"]
                say(
                    f"warning: the hard-negative miner died (restarts so far: {restarts}); "
                    f"Ray restarts it and training goes on with {kept} meanwhile"
                )
            self._outage = True
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
        self._outage = False
        if description["step"] <= self.newest_step():
            return False
        table: NegativesTable = ray.get(description["table"][0])
        if table.corpus_key and table.corpus_key != self.corpus.key:
            raise ValueError(
                "the miner's table numbers another corpus than this worker's "
                f"({table.corpus_key} vs {self.corpus.key})"
            )
        self.tables[table.step] = table
        for old in sorted(self.tables)[:-KEPT_TABLES]:
            del self.tables[old]
        self.stats["swaps"] += 1
        self.stats["refresh_s"] = table.build_s
        return True

    def agreed_table(self, device, step: int | None = None) -> NegativesTable | None:
        """The table every rank uses at training step ``step``.

        With several ranks and the asynchronous miner the ranks agree on the newest table
        they all hold: a collective whose result is read on the host, so on a GPU it waits
        for the device. It runs at every :data:`AGREE_EVERY`-th step (every rank counts the
        same steps, so they meet), at the first call, and whenever ``step`` is not given;
        between those the last agreement holds, so a new table is taken up to
        ``AGREE_EVERY - 1`` steps later than it arrived.
        """
        newest = self.newest_step()
        if self.is_async and self.world_size > 1:
            if step is None or self._agreed is None or step % AGREE_EVERY == 0:
                self._agreed = all_reduce_min(newest, device)
            newest = self._agreed
        if newest < 0:
            return None
        usable = [s for s in self.tables if s <= newest]
        return self.tables[max(usable)] if usable else self.tables[min(self.tables)]

    # ------------------------------------------------------------ batches

    def negatives_of_rows(self, table: NegativesTable, rows, step: int) -> list[int]:
        """``n`` negatives (document numbers) for each training row of ``rows``, row by row
        (``len(rows) * n``).

        Missing ones (a query the table does not know, or with fewer than ``n``) are random
        documents of the corpus other than the row's own, drawn by (seed, step, row), so a
        row gets the same ones on any number of workers; they are counted in
        ``stats["filled"]``.
        """
        rows = np.asarray(rows, dtype=np.int64)
        queries = self.corpus.query_of_training_row[rows]
        owns = self.corpus.doc_of_training_row[rows]
        documents = self.corpus.num_docs
        chosen: list[int] = []
        for row, query, own in zip(rows.tolist(), queries.tolist(), owns.tolist(), strict=True):
            picked = table.of(query)[: self.n]
            if len(picked) < self.n:
                if documents < 2:
                    raise ValueError("the corpus has too few documents to fill a batch with")
                rng = np.random.default_rng([self.seed, step, row])
                while len(picked) < self.n:
                    candidate = int(rng.integers(documents))
                    if candidate != own:
                        picked.append(candidate)
                        self.stats["filled"] += 1
            chosen.extend(picked)
        return chosen

    def texts_of(self, table: NegativesTable, docs: list[int]) -> list[str]:
        """The texts negatives ``docs`` are embedded as."""
        return self._by_source(table, docs, self.corpus.doc_texts, table.extra_texts)

    def ids_of(self, table: NegativesTable, docs: list[int]) -> list[str]:
        """The ids of negatives ``docs``."""
        return self._by_source(table, docs, self.corpus.doc_ids, table.extra_ids)

    @staticmethod
    def _by_source(table: NegativesTable, docs: list[int], read, extra: list[str]) -> list[str]:
        inside = [d for d in docs if d >= 0]
        found = iter(read(inside) if inside else [])
        return [next(found) if d >= 0 else extra[-2 - d] for d in docs]

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
            # What mining dropped for the table in use (false-negative filtering).
            **{
                f"negatives_filtered_{reason}": float(table.filtered.get(reason, 0))
                for reason in FILTER_REASONS
                if table is not None
            },
        }
