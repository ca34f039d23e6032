"""The asynchronous hard-negative miner: a Ray actor that re-mines while training goes on.

Rank 0 sends a weights snapshot every ``negatives_refresh_every`` steps
(:meth:`NegativesClient.maybe_send_weights`, fire and forget). The miner keeps only the
newest snapshot; a background thread hands it to a pool of encoder actors
(:mod:`santa.negatives.encoders`, GPU or CPU) that re-encode the corpus and the training
queries in shards, then rebuilds the faiss index from the gathered embeddings, mines, and
publishes a versioned :class:`~santa.negatives.table.NegativesTable`: each training
query's negatives as document numbers of the corpus (integers only). Trainers poll with a
zero-timeout ``ray.wait`` between steps and swap a newer table in; they never block on the
miner (except, optionally, once for the first table), and read the negatives' texts from
their node's row file of the pairs (:class:`~santa.negatives.corpus.MiningCorpus`).

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
from typing import Any

import numpy as np

from santa.config import SantaConfig
from santa.index.faiss_index import EmbeddingIndex, index_kind
from santa.models.encoding import TextEncoder
from santa.negatives.corpus import MiningCorpus, load_mining_corpus
from santa.negatives.encoders import EncoderPool, LocalEncoder
from santa.negatives.rules import (
    FILTER_REASONS,
    FalseNegativeFilter,
    mine_hard_negatives,
    positive_scores,
)
from santa.negatives.table import NO_NEGATIVE, NegativesTable

logger = logging.getLogger(__name__)

__all__ = [
    "DOC_BLOCK",
    "HardNegativeMiner",
    "QUERY_BLOCK",
    "refresh_table",
    "start_miner",
]


QUERY_BLOCK = 65_536
"""Queries encoded, searched and mined at once: the refresh holds one block's vectors,
hits and scores, whatever the number of queries."""
DOC_BLOCK = 65_536
"""Documents whose texts are read from the row file and encoded at once."""


def _encode_blocks(encoder, count: int, texts_of, max_length: int, cosine: bool) -> np.ndarray:
    """``count`` texts (``texts_of(numbers)``) encoded block by block into one
    ``(count, dim)`` float32 array (normalized for cosine)."""
    vectors: np.ndarray | None = None
    for start in range(0, count, DOC_BLOCK):
        block = np.arange(start, min(count, start + DOC_BLOCK))
        (encoded,) = encoder.encode([(texts_of(block), max_length)])
        encoded = _unit(encoded) if cosine else np.asarray(encoded, dtype=np.float32)
        if vectors is None:
            vectors = np.empty((count, encoded.shape[1]), dtype=np.float32)  # (count, dim)
        vectors[block] = encoded
    return vectors if vectors is not None else np.empty((0, 1), dtype=np.float32)


def refresh_table(
    model,
    corpus: MiningCorpus,
    config: SantaConfig,
    *,
    step: int = 0,
    version: int = 0,
    encoder=None,
) -> NegativesTable:
    """Encode the corpus, then per block of queries encode, search top-K and mine: one table
    of document numbers of ``corpus``.

    How it mines is ``config.negatives`` (including the false-negative filter,
    ``max_score_ratio`` / ``min_margin``, against each query's positive score); lengths and
    seed are ``config.train``'s. Scores are the model's similarity: with cosine the vectors
    are normalized first, as evaluation does. ``encoder`` is an
    :class:`~santa.negatives.encoders.EncoderPool` (the sharded refresh) or anything with its
    ``encode(jobs)``; without one, ``model`` encodes in this process. Memory: the documents'
    vectors and the index, one block of queries, and the table's integers; texts are read
    from the corpus's row file block by block. The table counts what was filtered, by
    reason (``table.filtered``).
    """
    started = time.perf_counter()
    settings, train = config.negatives, config.train
    if encoder is None:
        encoder = LocalEncoder(TextEncoder(model, num_gpus=None, threads=0), settings.batch_size)
    similarity = model.model_config.similarity if model is not None else config.model.similarity
    cosine = similarity == "cosine"
    # The model's query/document prefixes (decoders' "query: "/"passage: "), put here:
    # the encoders take texts as given.
    doc_prefix, query_prefix = config.model.prefix("document"), config.model.prefix("query")

    def doc_texts(numbers: np.ndarray) -> list[str]:
        return [doc_prefix + text for text in corpus.doc_texts(numbers)]

    doc_vectors = _encode_blocks(
        encoder, corpus.num_docs, doc_texts, train.max_document_length, cosine
    )
    encoded_s = time.perf_counter() - started
    kind = index_kind(settings.index, corpus.num_docs)
    index = EmbeddingIndex.build(doc_vectors, None, kind=kind)
    score_filter = FalseNegativeFilter(settings.max_score_ratio, settings.min_margin)
    if not score_filter.active:
        # The index holds its own copy: without positive scores to compute, the vectors
        # are not kept twice while the queries are mined (1 GB at 2 M documents of 128).
        doc_vectors = None
    # Positives and duplicates are dropped after the search: ask for enough extra hits.
    depth = settings.top_k + settings.skip_top + corpus.most_positives
    filtered = dict.fromkeys(FILTER_REASONS, 0)
    n = settings.mined_per_query
    negatives = np.full((corpus.num_queries, n), NO_NEGATIVE, dtype=np.int64)
    duplicate_of = corpus.duplicate_of
    for start in range(0, corpus.num_queries, QUERY_BLOCK):
        block = np.arange(start, min(corpus.num_queries, start + QUERY_BLOCK))
        encoding = time.perf_counter()
        texts = [query_prefix + text for text in corpus.query_texts(block)]
        (query_vectors,) = encoder.encode([(texts, train.max_query_length)])
        query_vectors = _unit(query_vectors) if cosine else np.asarray(query_vectors, np.float32)
        encoded_s += time.perf_counter() - encoding
        rows, scores = index.search_rows(query_vectors, depth)  # (block, depth) each
        query_ids = corpus.query_ids(block)
        positives = dict(zip(query_ids, corpus.positive_sets(block).values(), strict=True))
        hits = [row[row >= 0].tolist() for row in rows]
        mined = mine_hard_negatives(
            query_ids,
            hits,
            positives,
            n=n,
            seed=train.seed + step,
            skip_top=settings.skip_top,
            duplicate_of=duplicate_of,
            hit_scores=scores,
            positive_scores=positive_scores(query_ids, query_vectors, positives, None, doc_vectors)
            if score_filter.active
            else None,
            score_filter=score_filter,
            filtered=filtered,
        )
        for query, query_id in zip(block.tolist(), query_ids, strict=True):
            chosen = mined[query_id]
            negatives[query, : len(chosen)] = chosen
    if score_filter.active and corpus.num_queries:
        short = int(((negatives != NO_NEGATIVE).sum(axis=1) < n).sum())
        if short > corpus.num_queries // 2:
            # Trainers fill these with random documents: hard negatives become random ones.
            logger.warning(
                "the false-negative filter left %d of %d queries with fewer than %d mined "
                "negative(s) (%d hits scored above %s x the positive): the model ranks most "
                "positives low; negatives.max_score_ratio=none keeps its hard negatives",
                short,
                corpus.num_queries,
                n,
                filtered["score_ratio"] + filtered["score_margin"],
                settings.max_score_ratio,
            )
    return NegativesTable(
        negatives=negatives,
        corpus_key=corpus.key,
        step=step,
        version=version,
        build_s=time.perf_counter() - started,
        encode_s=encoded_s,
        filtered=filtered,
    )


def _unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (cosine similarity as inner products)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


class HardNegativeMiner:
    """The actor body (run with ``max_concurrency`` > 1: polls answer during a refresh)."""

    def __init__(
        self,
        data_uri: str,
        model_uri: str,
        config: dict,
        encoder_resources: dict[str, float] | None = None,
        row_cache: str = "",
    ) -> None:
        self.incarnation = uuid.uuid4().hex[:12]
        self.config = SantaConfig.from_dict(config)
        self.corpus = load_mining_corpus(data_uri, row_cache)
        negatives = self.config.negatives
        # The encoders are this actor's children: they die and come back with it.
        self.pool = EncoderPool(
            model_uri,
            self.config.model.to_dict(),
            actors=negatives.encoder_actors,
            num_cpus=negatives.encoder_cpus,
            num_gpus=negatives.encoder_gpus,
            batch_size=negatives.batch_size,
            resources=encoder_resources,
        )
        self._lock = threading.Condition()
        self._pending: tuple[int, Any] | None = None
        self._latest: dict[str, Any] | None = None
        self._version = 0
        self._errors: list[str] = []
        self._refresh_started: float | None = None  # monotonic time of the running refresh
        self._last_build_s: float | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="santa-miner", daemon=True)
        self._thread.start()
        logger.info(
            "miner %s up: %d documents, %d queries, %d encoder actor(s)",
            self.incarnation,
            self.corpus.num_docs,
            self.corpus.num_queries,
            len(self.pool.actors),
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
                "encoder_actors": len(self.pool.actors),
                "encoder_actors_used": self.pool.stats["actors_used"],
                # How long refreshes take (for "hard negatives never came" lines).
                "last_build_s": self._last_build_s,
                "refresh_running_s": (
                    None
                    if self._refresh_started is None
                    else time.perf_counter() - self._refresh_started
                ),
            }

    def stop(self) -> None:
        """End the background thread and the encoder actors (the miner is killed by its owner)."""
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        self.pool.shutdown()

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
                self._refresh_started = time.perf_counter()
            try:
                # The snapshot travels once through the object store: each encoder actor
                # fetches rank 0's copy itself (the miner never holds the weights).
                self.pool.set_weights(weights_ref, step)
                table = refresh_table(
                    None,
                    self.corpus,
                    self.config,
                    step=step,
                    version=self._version + 1,
                    encoder=self.pool,
                )
                table_ref = ray.put(table)
            except Exception:  # a failed refresh must not kill the miner: log and go on
                error = traceback.format_exc(limit=3)
                logger.error("hard-negative refresh at step %d failed:\n%s", step, error)
                with self._lock:
                    self._errors.append(error)
                    self._refresh_started = None
                    if self._pending is not None and self._pending[0] == step:
                        self._pending = None
                continue
            with self._lock:
                self._version += 1
                self._refresh_started = None
                self._last_build_s = table.build_s
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
    encoder_resources: dict[str, float] | None = None,
    row_cache: str = "",
):
    """Start (or replace) the named miner actor; returns its handle.

    ``num_gpus``/``resources`` are the miner's own (index build and search: faiss uses a GPU
    when it has one); its encoder actors take ``config.negatives.encoder_*`` and
    ``encoder_resources``.
    """
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name))
    actor_class = ray.remote(HardNegativeMiner)
    return actor_class.options(
        name=name,
        max_restarts=max_restarts,
        max_concurrency=4,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=resources or None,
    ).remote(data_uri, model_uri, config.to_dict(), encoder_resources or None, row_cache)
