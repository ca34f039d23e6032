"""What every paper protocol shares: the model's encoder with the evaluator's lengths and
similarity, a protocol's result, and its markdown table (:mod:`santa.eval.protocols`
dispatches; :mod:`santa.eval.codesearch`, :mod:`santa.eval.advtest` and
:mod:`santa.eval.esci` run one each)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from santa.eval.evaluation import EvalConfig, _encode, evaluation_lengths, load_encoder

if TYPE_CHECKING:
    from santa.models.dual_encoder import DualEncoder

__all__ = ["Encoder", "ProtocolResult", "markdown_table"]


@dataclass
class Encoder:
    """A loaded model with the lengths and encoding route every protocol uses."""

    model: DualEncoder
    model_uri: str | None
    query_length: int
    document_length: int
    config: EvalConfig
    lengths_from: str = "asked"
    """Where the lengths came from (:class:`~santa.eval.evaluation.Lengths`)."""
    ray_started: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, model: str | DualEncoder, config: EvalConfig) -> Encoder:
        """Load ``model`` as :func:`santa.eval.evaluate` does (device, lengths)."""
        encoder, model_uri, train_config = load_encoder(model, config)
        lengths = evaluation_lengths(encoder, train_config, config)
        return cls(encoder, model_uri, lengths.query, lengths.document, config, lengths.source)

    @property
    def similarity(self) -> str:
        """``dot`` or ``cosine``: how the model's embeddings are compared."""
        return self.model.model_config.similarity

    def documents(self, texts: Sequence[str], desc: str = "documents") -> np.ndarray:
        """Document embeddings ``(len(texts), dim)``."""
        return self._encode(list(texts), self.document_length, desc, "document")

    def queries(self, texts: Sequence[str], desc: str = "queries") -> np.ndarray:
        """Query embeddings ``(len(texts), dim)``."""
        return self._encode(list(texts), self.query_length, desc, "query")

    def _encode(self, texts: list[str], max_length: int, desc: str, role: str) -> np.ndarray:
        config = self.config
        on_ray = config.use_ray is True or (
            config.use_ray is None and len(texts) > config.ray_threshold
        )
        if on_ray and not self.ray_started:
            from santa.cluster.ray_utils import init_ray

            init_ray(config.ray_address)
            self.ray_started = True
        started = time.perf_counter()
        embeddings = _encode(
            self.model,
            self.model_uri,
            texts,
            max_length=max_length,
            batch_size=config.batch_size,
            on_ray=on_ray,
            desc=desc,
            progress=config.progress,
            ray_options=config.ray_options,
            role=role,
            dim=config.dim,
        )
        key = f"encode_{desc.split()[-1]}_s"
        self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - started
        return embeddings

    def info(self) -> dict[str, Any]:
        """How the model was run, for ``info.json``."""
        return {
            "model": self.model_uri if self.model_uri is not None else type(self.model).__name__,
            "max_query_length": self.query_length,
            "max_document_length": self.document_length,
            "lengths_from": self.lengths_from,
            "similarity": self.model.model_config.similarity,
            "pooling": self.model.model_config.pooling,
            "dim": self.config.dim or self.model.embedding_dim,
            "ray": self.ray_started,
        }


@dataclass
class ProtocolResult:
    """What a protocol produced: metrics per system, rankings to write, a table, info."""

    results: dict[str, dict[str, Any]]
    rankings: dict[str, Mapping[str, Sequence[tuple[str, float]]]]
    markdown: str
    info: dict[str, Any]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; floats with 4 decimals."""

    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
