"""Sharded encoding for the hard-negative refresh: a plain batch encoder and an actor pool.

:class:`~santa.models.encoding.TextEncoder` (santa's one encoder, plain PyTorch) holds one
model on one device (CUDA with bf16/fp16 autocast when it has a GPU, else CPU), takes a
weights snapshot and embeds lists of pre-planned batches. :class:`EncoderPool` runs it as
Ray actors: the refresh's texts are cut into fixed batches
(:func:`~santa.models.encoding.plan_batches`, longest first), the batches are grouped into chunks,
and each chunk goes to whichever actor is free. Because the batches are the same whatever
the number of actors, 1 or N actors give the same embeddings (bit for bit on CPU with the
same thread count), hence the same table.

The pool asks for ``actors`` actors and starts as soon as one is up; actors the cluster
cannot place yet stay pending (that demand is what an autoscaler adds nodes for) and join
the work when they start. Each actor loads the snapshot once per refresh, from the one
object-store copy rank 0 put.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from santa.models.encoding import TextEncoder, plan_batches

logger = logging.getLogger(__name__)

__all__ = ["EncoderActor", "EncoderPool", "LocalEncoder", "encoder_actor_options"]

# Chunks per actor a refresh is cut into (load balance vs round trips), and chunks an actor
# holds at once (the next one is queued while it encodes the current one).
CHUNKS_PER_ACTOR = 8
MAX_BATCHES_PER_CHUNK = 16
IN_FLIGHT_PER_ACTOR = 2
# How long a refresh waits for its first encoder actor before failing.
START_TIMEOUT_S = 600.0


class EncoderActor(TextEncoder):
    """The Ray actor body: a :class:`~santa.models.encoding.TextEncoder` with a readiness
    probe."""

    def ready(self) -> str:
        """The device it encodes on (answers once the model is loaded)."""
        return self.device

    def encode_chunk(
        self, batches: Sequence[Sequence[str]], max_length: int, step: int | None
    ) -> np.ndarray:
        """:meth:`encode_batches` with the snapshot of ``step``, or a clear error."""
        if step != self.weights_step:
            raise RuntimeError(
                f"encoder holds the weights of step {self.weights_step}, the refresh wants {step}"
            )
        return self.encode_batches(batches, max_length)


class LocalEncoder:
    """The pool's interface in-process: encode jobs with one
    :class:`~santa.models.encoding.TextEncoder`."""

    def __init__(self, encoder: TextEncoder, batch_size: int = 64) -> None:
        self.encoder = encoder
        self.batch_size = batch_size

    def encode(self, jobs: Sequence[tuple[Sequence[str], int]]) -> list[np.ndarray]:
        """One ``(len(texts), dim)`` array per ``(texts, max_length)`` job."""
        return [self.encoder.encode(texts, length, self.batch_size) for texts, length in jobs]


def encoder_actor_options(
    *, num_cpus: float, num_gpus: float, resources: dict[str, float] | None = None
) -> dict[str, Any]:
    """The ``.options(...)`` of one encoder actor (restarted by Ray if it dies)."""
    return {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "resources": resources or None,
        "max_restarts": 2,
    }


class EncoderPool:
    """``actors`` Ray encoder actors that share the refresh's batches (see module docstring)."""

    def __init__(
        self,
        model_uri: str,
        model_config: dict | None,
        *,
        actors: int = 1,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        batch_size: int = 64,
        resources: dict[str, float] | None = None,
    ) -> None:
        import ray

        if actors < 1:
            raise ValueError(f"an encoder pool needs at least one actor, got {actors}")
        self.batch_size = batch_size
        self.options = encoder_actor_options(
            num_cpus=num_cpus, num_gpus=num_gpus, resources=resources
        )
        threads = 0 if num_gpus > 0 else max(1, int(num_cpus))
        actor_class = ray.remote(EncoderActor).options(**self.options)
        self.actors = [
            actor_class.remote(model_uri, model_config, num_gpus=num_gpus, threads=threads)
            for _ in range(actors)
        ]
        self._probes = {actor.ready.remote(): actor for actor in self.actors}
        self._ready: list = []
        self._weights: tuple[int | None, Any] | None = None
        self._loaded: dict[int, int | None] = {}  # id(actor) → step of the weights sent to it
        self.stats = {"chunks": 0, "actors_used": 0}

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> int:
        """Block until every actor has started (or ``timeout``); returns how many are up."""
        deadline = time.perf_counter() + timeout
        while self._probes and time.perf_counter() < deadline:
            self._take_ready(timeout=min(1.0, max(0.0, deadline - time.perf_counter())))
        return len(self._ready)

    def set_weights(self, weights_ref, step: int | None = None) -> None:
        """Use this snapshot (an ``ObjectRef`` of a state dict) from the next encode on."""
        self._weights = (step, weights_ref)

    def _take_ready(self, timeout: float) -> None:
        """Move started actors from the probes to the ready list (dead ones are dropped)."""
        import ray

        if not self._probes:
            return
        done, _ = ray.wait(list(self._probes), num_returns=len(self._probes), timeout=timeout)
        for probe in done:
            actor = self._probes.pop(probe)
            try:
                ray.get(probe)
            except ray.exceptions.RayActorError as error:
                logger.warning("an encoder actor failed to start: %s", error)
                continue
            self._ready.append(actor)

    def _send_weights(self, actor) -> None:
        if self._weights is None:
            return
        step, weights_ref = self._weights
        if self._loaded.get(id(actor), "unset") != step:
            actor.load_weights.remote(weights_ref, step)  # runs before the chunk sent next
            self._loaded[id(actor)] = step

    def encode(self, jobs: Sequence[tuple[Sequence[str], int]]) -> list[np.ndarray]:
        """One ``(len(texts), dim)`` array per ``(texts, max_length)`` job, in input order."""
        import ray

        chunks: deque = deque()  # (job, rows, batches of texts)
        total_batches = sum(math.ceil(len(texts) / self.batch_size) for texts, _ in jobs)
        per_chunk = max(
            1,
            min(
                MAX_BATCHES_PER_CHUNK,
                math.ceil(total_batches / (CHUNKS_PER_ACTOR * len(self.actors))),
            ),
        )
        for job, (texts, _) in enumerate(jobs):
            batches = plan_batches(texts, self.batch_size)
            for start in range(0, len(batches), per_chunk):
                group = batches[start : start + per_chunk]
                chunks.append((job, np.concatenate(group), [[texts[i] for i in b] for b in group]))
        outputs: list[np.ndarray | None] = [None] * len(jobs)
        in_flight: dict = {}  # ObjectRef → (actor, chunk)
        busy: dict[int, int] = {}
        used: set[int] = set()
        started = time.perf_counter()
        while chunks or in_flight:
            self._take_ready(timeout=0)
            for actor in list(self._ready):
                while chunks and busy.get(id(actor), 0) < IN_FLIGHT_PER_ACTOR:
                    chunk = chunks.popleft()
                    self._send_weights(actor)
                    step = None if self._weights is None else self._weights[0]
                    ref = actor.encode_chunk.remote(chunk[2], jobs[chunk[0]][1], step)
                    in_flight[ref] = (actor, chunk)
                    busy[id(actor)] = busy.get(id(actor), 0) + 1
                    used.add(id(actor))
            if not in_flight:
                if not self._probes:
                    raise RuntimeError("no encoder actor is alive to encode the refresh")
                if time.perf_counter() - started > START_TIMEOUT_S:
                    raise TimeoutError(f"no encoder actor started within {START_TIMEOUT_S:.0f}s")
            # Wake on a finished chunk or on an actor that just started.
            waitable = list(in_flight) + list(self._probes)
            done, _ = ray.wait(waitable, num_returns=1, timeout=10.0)
            for ref in done:
                if ref not in in_flight:
                    continue
                actor, chunk = in_flight.pop(ref)
                busy[id(actor)] -= 1
                try:
                    embeddings = ray.get(ref)
                except ray.exceptions.RayActorError as error:  # died: redo the chunk elsewhere
                    logger.warning("an encoder actor died mid-refresh (%s); re-queued", error)
                    chunks.appendleft(chunk)
                    self._restart_probe(actor)
                    continue
                job, rows, _ = chunk
                if outputs[job] is None:
                    outputs[job] = np.empty(
                        (len(jobs[job][0]), embeddings.shape[1]), dtype=np.float32
                    )
                outputs[job][rows] = embeddings
                self.stats["chunks"] += 1
        self.stats["actors_used"] = len(used)
        return [out if out is not None else np.empty((0, 0), dtype=np.float32) for out in outputs]

    def _restart_probe(self, actor) -> None:
        """A failed actor goes back to the probes (Ray may be restarting it): weights resent."""
        if actor in self._ready:
            self._ready.remove(actor)
            self._loaded.pop(id(actor), None)
            self._probes[actor.ready.remote()] = actor

    def shutdown(self) -> None:
        """Kill the actors."""
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
