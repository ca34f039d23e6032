"""The papers' evaluation protocols beside santa's BEIR retrieval, behind one entry point.

=============  ==========================================  ======================================
protocol       data and what is ranked                     metrics
=============  ==========================================  ======================================
``retrieval``  a BEIR folder; every query against the      MRR@100, NDCG@100, Recall@{1,10,100}
               split's whole corpus (santa's default)      (:func:`santa.eval.evaluate`)
``codesearch`` GraphCodeBERT / CodeRetriever layout:       MRR per language (cut-off 1000, as
               ``{lang}/codebase.jsonl`` and               GraphCodeBERT's evaluator) and their
               ``{lang}/{split}.jsonl``; each language's   macro average, as SANTA's Table 6
               queries against its own codebase only       (:mod:`santa.eval.codesearch`)
``advtest``    a CodeXGLUE AdvTest file; each query        MRR over the full ranking, ties
               against every function of the file, its     counted against the answer, as
               answer the function on its own line         CodeXGLUE (:mod:`santa.eval.advtest`)
``esci``       an ESCI BEIR folder (``ray_jobs.preprocess  MRR@100, NDCG@100 with two- and
               --dataset esci --stage eval --split         four-class gains over every query of
               valid|test``); each query's judged          the split, as SANTA's Table 2
               products only (SANTA's candidate set)       (:mod:`santa.eval.esci`)
=============  ==========================================  ======================================

Every protocol returns ``{system: metrics}`` and, given ``EvalConfig.output``, writes what
:func:`santa.eval.evaluate` writes: ``metrics.json``, ``metrics.md``, ``run.<system>.trec``
(the top ``top_k`` of each query) and ``info.json``. The evaluation job publishes the folder
whole (:mod:`santa.data.outputs`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from santa import storage
from santa.eval.evaluation import EvalConfig, _encode, evaluate, evaluation_lengths, load_encoder
from santa.eval.report import check_trec_ids, format_markdown, write_trec

if TYPE_CHECKING:
    from santa.model import DualEncoder

__all__ = [
    "PROTOCOLS",
    "Encoder",
    "ProtocolResult",
    "evaluate_protocol",
    "run_protocol",
    "write_outputs",
]

logger = logging.getLogger(__name__)

PROTOCOLS = ("retrieval", "codesearch", "advtest", "esci")


@dataclass
class Encoder:
    """A loaded model with the lengths and encoding route every protocol uses."""

    model: DualEncoder
    model_uri: str | None
    query_length: int
    document_length: int
    config: EvalConfig
    ray_started: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, model: str | DualEncoder, config: EvalConfig) -> Encoder:
        """Load ``model`` as :func:`santa.eval.evaluate` does (device, lengths)."""
        encoder, model_uri, train_config = load_encoder(model, config)
        query_length, document_length = evaluation_lengths(encoder, train_config, config)
        return cls(encoder, model_uri, query_length, document_length, config)

    @property
    def similarity(self) -> str:
        """``dot`` or ``cosine``: how the model's embeddings are compared."""
        return self.model.model_config.similarity

    def documents(self, texts: Sequence[str], desc: str = "documents") -> np.ndarray:
        """Document embeddings ``(len(texts), dim)``."""
        return self._encode(list(texts), self.document_length, desc)

    def queries(self, texts: Sequence[str], desc: str = "queries") -> np.ndarray:
        """Query embeddings ``(len(texts), dim)``."""
        return self._encode(list(texts), self.query_length, desc)

    def _encode(self, texts: list[str], max_length: int, desc: str) -> np.ndarray:
        config = self.config
        on_ray = config.use_ray is True or (
            config.use_ray is None and len(texts) > config.ray_threshold
        )
        if on_ray and not self.ray_started:
            from santa.ray_utils import init_ray

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
            "similarity": self.model.model_config.similarity,
            "pooling": self.model.model_config.pooling,
            "ray": self.ray_started,
        }


@dataclass
class ProtocolResult:
    """What a protocol produced: metrics per system, rankings to write, a table, info."""

    results: dict[str, dict[str, Any]]
    rankings: dict[str, Mapping[str, Sequence[tuple[str, float]]]]
    markdown: str
    info: dict[str, Any]


def evaluate_protocol(
    protocol: str,
    model: str | DualEncoder,
    data: str,
    config: EvalConfig | None = None,
    *,
    languages: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    """Run one protocol (see the module doc); return ``{system: metrics}``.

    ``retrieval`` is :func:`santa.eval.evaluate` (its ``config.protocol`` variants
    included); ``languages`` selects CodeSearch languages (default: every one found).
    """
    return run_protocol(protocol, model, data, config, languages=languages).results


def run_protocol(
    protocol: str,
    model: str | DualEncoder,
    data: str,
    config: EvalConfig | None = None,
    *,
    languages: Sequence[str] = (),
) -> ProtocolResult:
    """:func:`evaluate_protocol`, returning the metrics with the table and run info."""
    config = config or EvalConfig()
    if protocol == "retrieval":
        results = evaluate(model, data, config)
        return ProtocolResult(results, {}, format_markdown(results), {"protocol": protocol})
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    started = time.perf_counter()
    encoder = Encoder.load(model, config)
    if protocol == "codesearch":
        from santa.eval.codesearch import run_codesearch

        outcome = run_codesearch(encoder, data, config, languages=languages)
    elif protocol == "advtest":
        from santa.eval.advtest import run_advtest

        outcome = run_advtest(encoder, data, config)
    else:
        from santa.eval.esci import run_esci

        outcome = run_esci(encoder, data, config)
    outcome.info = {
        "protocol": protocol,
        "data": data,
        "split": config.split,
        **encoder.info(),
        **outcome.info,
        "baseline": "bm25" if config.with_bm25 else None,
        "top_k": config.top_k,
        "timings_s": {
            **{name: round(value, 3) for name, value in encoder.timings.items()},
            **outcome.info.get("timings_s", {}),
            "total_s": round(time.perf_counter() - started, 3),
        },
    }
    logger.info("evaluation info: %s", json.dumps(outcome.info))
    if config.output is not None:
        write_outputs(config.output, outcome, config.top_k)
    return outcome


def write_outputs(output: str, outcome: ProtocolResult, top_k: int) -> None:
    """``metrics.json``, ``metrics.md``, ``run.<system>.trec`` (top ``top_k``), ``info.json``."""
    for system, ranking in outcome.rankings.items():
        check_trec_ids(ranking, "query")
        truncated = {qid: list(hits)[:top_k] for qid, hits in ranking.items()}
        check_trec_ids((doc for hits in truncated.values() for doc, _ in hits), "document")
        write_trec(storage.join(output, f"run.{system}.trec"), truncated, tag=system)
    storage.write_json(storage.join(output, "metrics.json"), outcome.results)
    storage.write_bytes(storage.join(output, "metrics.md"), outcome.markdown.encode("utf-8"))
    storage.write_json(storage.join(output, "info.json"), outcome.info)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; floats with 4 decimals."""

    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
