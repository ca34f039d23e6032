"""Evaluate a model (and BM25) on a BEIR split: encode, retrieve, score, write reports.

Protocols: ``full`` retrieves from the whole corpus; ``rerank`` ranks each query's judged
candidates only (ESCI's re-ranking task). Metrics are :mod:`santa.eval.metrics`'s.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from santa.data.beir import BeirData, load_beir
from santa.eval.bm25 import bm25_rerank, bm25_retrieve
from santa.eval.metrics import DEFAULT_BLOCK_SIZE, compute_metrics, esci_gain_map
from santa.eval.retrieval import DEFAULT_TOP_K, Ranking, dense_rerank, dense_retrieve
from santa.eval.runfiles import check_trec_ids, format_markdown, write_trec
from santa.files import storage
from santa.index.faiss_index import INDEX_KINDS
from santa.models.checkpoints import load_model, resolve_model
from santa.models.encoding import (
    DEFAULT_MAX_DOCUMENT_LENGTH,
    DEFAULT_MAX_QUERY_LENGTH,
    encode_corpus_ray,
    encode_texts,
)

if TYPE_CHECKING:
    from santa.models.dual_encoder import DualEncoder

__all__ = [
    "DEFAULT_RAY_THRESHOLD",
    "PROTOCOLS",
    "EvalConfig",
    "Lengths",
    "evaluate",
    "evaluate_model",
    "load_encoder",
    "system_name",
]

logger = logging.getLogger(__name__)

DEFAULT_RAY_THRESHOLD = 50_000
PROTOCOLS = ("full", "rerank")
CODE_TEXTS = ("released", "graphcodebert", "training")
BASELINES = (None, "none", "bm25")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How :func:`evaluate` runs: split, protocols, lengths, encoding and outputs."""

    split: str = "test"
    """Which ``qrels/{split}.tsv`` of the BEIR folder to evaluate."""
    output: str | None = None
    """Folder (local or ``s3://``) for metrics, tables, TREC runs and info; None: none."""
    baseline: str | None = "bm25"
    """``"bm25"`` evaluates BM25 beside the model; None (or ``"none"``) skips it."""
    protocol: str | Sequence[str] = "full"
    """``full`` (alias ``retrieval``), ``rerank``, ``both`` or a list of them. The papers'
    own protocols (``codesearch``, ``advtest``, ``esci``) are :mod:`santa.eval.protocols`'."""
    max_query_length: int | None = None
    """Query tokens; None: :func:`evaluation_lengths` (the lengths the model was trained
    with, else a sentence-transformers folder's ``max_seq_length``, else 50)."""
    max_document_length: int | None = None
    """Document tokens; None: as ``max_query_length`` (else 240)."""
    esci_gains: str = "released"
    """Four-class ESCI gains: ``released`` (SANTA's evaluation script: Substitute 0.01,
    Complement 0.1) or ``paper`` (Table 2's caption: Substitute 0.1, Complement 0.01);
    :data:`santa.eval.metrics.ESCI_GAINS`."""
    code_text: str = "released"
    """A CodeSearch/AdvTest candidate's text (:data:`CODE_TEXTS`):
    ``released`` (the space-joined ``code_tokens``, as SANTA's released
    ``evaluate_code/build_test_code.py``), ``graphcodebert`` (the source without comments
    and docstrings, as GraphCodeBERT's ``run.py``) or ``training`` (the source without its
    docstring, comments kept, as santa's preprocessing gives training documents)."""
    top_k: int = DEFAULT_TOP_K
    """Documents retrieved per query (the full protocol)."""
    batch_size: int = 64
    """Texts per encoder forward pass."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Queries scored by ranx, and written to a TREC run, at a time (bounds the memory
    those take; the metrics and files do not depend on it)."""
    use_ray: bool | None = None
    """True: encode on a Ray Data actor pool; False: never; None: above ``ray_threshold``."""
    ray_threshold: int = DEFAULT_RAY_THRESHOLD
    """With ``use_ray=None``, texts (documents or queries) above this go through Ray."""
    ray_address: str | None = None
    """Ray cluster to connect to when Ray is used (None: local or the job's cluster)."""
    ray_options: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of :func:`~santa.models.encoding.encode_corpus_ray`."""
    index_kind: str = "flat"
    """The :class:`~santa.index.faiss_index.EmbeddingIndex` kind for full retrieval."""
    device: str = "auto"
    """Where a model loaded from a URI runs: ``auto`` (CUDA when available), ``cpu``, ..."""
    dim: int | None = None
    """Score with the first ``dim`` dimensions of every embedding only (a Matryoshka model's
    truncated vectors; cosine normalises after cutting); None: whole vectors."""
    progress: bool = True
    """Show encoding progress: an ``[eval]`` line every 15 s of a long encoding."""

    publish_whole: bool = True
    """Write ``output`` as a whole (staged, then published; an interrupted run leaves it as
    it was). ``False``: write into ``output`` directly, for a caller that already staged it
    (``ray_jobs.evaluate`` publishes every protocol's folder itself)."""

    def __post_init__(self) -> None:
        protocols = _protocols(self.protocol)
        if not isinstance(self.protocol, str):
            object.__setattr__(self, "protocol", tuple(protocols))
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be 'bm25' or None, got {self.baseline!r}")
        positive = ("max_query_length", "max_document_length", "top_k", "batch_size")
        for name in (*positive, "block_size", "dim"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"EvalConfig.{name} must be positive, got {value}")
        if self.ray_threshold < 0:
            raise ValueError(f"EvalConfig.ray_threshold must be >= 0, got {self.ray_threshold}")
        esci_gain_map(self.esci_gains)  # raises on an unknown name
        if self.code_text not in CODE_TEXTS:
            raise ValueError(f"code_text must be one of {CODE_TEXTS}, got {self.code_text!r}")
        if self.index_kind not in INDEX_KINDS:
            raise ValueError(f"index_kind must be one of {INDEX_KINDS}, got {self.index_kind!r}")
        object.__setattr__(self, "ray_options", dict(self.ray_options))

    @property
    def protocols(self) -> list[str]:
        """The protocols to run, in order."""
        return _protocols(self.protocol)

    @property
    def with_bm25(self) -> bool:
        """Whether BM25 is evaluated too."""
        return self.baseline == "bm25"


def _protocols(protocol: str | Sequence[str]) -> list[str]:
    if isinstance(protocol, str):
        protocol = list(PROTOCOLS) if protocol == "both" else [protocol]
    # "retrieval" (the evaluation job's name for the BEIR protocol) is full retrieval.
    protocol = ["full" if p == "retrieval" else p for p in protocol]
    unknown = [p for p in protocol if p not in PROTOCOLS]
    if unknown or not protocol:
        raise ValueError(
            f"protocol must be full (retrieval), rerank, both or a list of them; got {protocol}"
        )
    return list(protocol)


def system_name(system: str, protocol: str) -> str:
    """``model``/``bm25`` for the full protocol, ``model-rerank``/``bm25-rerank`` else."""
    return system if protocol == "full" else f"{system}-{protocol}"


def truncate_embeddings(embeddings: np.ndarray, dim: int | None) -> np.ndarray:
    """The first ``dim`` dimensions of each row ``(n, full)`` → ``(n, dim)`` (None: all);
    a ``dim`` wider than the vectors is one line."""
    if dim is None:
        return embeddings
    if dim > embeddings.shape[1]:
        raise ValueError(f"--dim {dim} is wider than the model's {embeddings.shape[1]} dimensions")
    return np.ascontiguousarray(embeddings[:, :dim])


def _encode(
    model: DualEncoder | None,
    model_uri: str | None,
    texts: list[str],
    *,
    max_length: int,
    batch_size: int,
    on_ray: bool,
    desc: str,
    progress: bool,
    ray_options: Mapping[str, Any],
    role: str | None = None,
    dim: int | None = None,
) -> np.ndarray:
    """Embed ``texts`` as ``role`` (``query``/``document``), in-process or on Ray, cut to
    ``dim`` dimensions; progress as santa's "[eval] documents: 2,048/5,427 texts ..." lines
    every 15 s."""
    if on_ray:
        embeddings = encode_corpus_ray(
            model_uri if model_uri is not None else model,
            texts,
            max_length=max_length,
            batch_size=batch_size,
            progress=progress,
            desc=desc,
            tag="eval",
            role=role,
            **ray_options,
        )
    else:
        embeddings = encode_texts(
            model,
            texts,
            max_length=max_length,
            batch_size=batch_size,
            role=role,
            desc=desc,
            progress=progress,
            tag="eval",
        )
    return truncate_embeddings(embeddings, dim)


def evaluate_model(
    model: DualEncoder,
    beir: BeirData,
    *,
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH,
    max_document_length: int = DEFAULT_MAX_DOCUMENT_LENGTH,
    top_k: int = DEFAULT_TOP_K,
    batch_size: int = 64,
    protocol: str = "full",
    progress: bool = False,
) -> dict[str, Any]:
    """Encode, retrieve and score in-process; no files, no Ray. One system's metrics.

    For the trainer's dev evaluation and pipeline jobs. ``timings`` (seconds) holds the
    encoding, retrieval and metric phases.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    doc_ids, query_ids = beir.doc_ids, list(beir.queries)
    inputs = {
        "documents": (beir.document_texts(), max_document_length, "document"),
        "queries": ([beir.queries[q] for q in query_ids], max_query_length, "query"),
    }
    embeddings: dict[str, np.ndarray] = {}
    timings: dict[str, float] = {}
    for name, (texts, max_length, role) in inputs.items():
        mark = time.perf_counter()
        embeddings[name] = encode_texts(
            model,
            texts,
            max_length=max_length,
            batch_size=batch_size,
            role=role,
            desc=name,
            progress=progress,
        )
        timings[f"encode_{name}_s"] = time.perf_counter() - mark
    doc_embeddings, query_embeddings = embeddings["documents"], embeddings["queries"]
    encoded = time.perf_counter()
    ranking = _dense_ranking(
        model, beir, query_embeddings, query_ids, doc_embeddings, doc_ids, protocol, top_k
    )
    retrieved = time.perf_counter()
    metrics = compute_metrics(
        beir.qrels, ranking, graded=beir.graded, query_languages=beir.query_languages
    )
    metrics.update(max_query_length=max_query_length, max_document_length=max_document_length)
    done = time.perf_counter()
    metrics["timings"] = {
        **timings,
        "retrieval_s": retrieved - encoded,
        "metrics_s": done - retrieved,
    }
    return metrics


def _dense_ranking(
    model: DualEncoder,
    beir: BeirData,
    query_embeddings: np.ndarray,
    query_ids: list[str],
    doc_embeddings: np.ndarray,
    doc_ids: list[str],
    protocol: str,
    top_k: int,
    index_kind: str = "flat",
) -> Ranking:
    similarity = model.model_config.similarity
    if protocol == "rerank":
        return dense_rerank(
            query_embeddings,
            query_ids,
            doc_embeddings,
            doc_ids,
            beir.candidates(),
            similarity=similarity,
        )
    return dense_retrieve(
        query_embeddings,
        query_ids,
        doc_embeddings,
        doc_ids,
        top_k=top_k,
        similarity=similarity,
        index_kind=index_kind,
    )


class Lengths(NamedTuple):
    """The token lengths a model is encoded at, and where they came from."""

    query: int
    document: int
    source: str
    """``asked``, ``trained``, ``sentence-transformers`` or ``default`` (one word where both
    lengths came from the same place, else ``query <word>, document <word>``)."""

    def text(self) -> str:
        """``50/240 query/document tokens (trained)``: for a line of output."""
        return f"{self.query}/{self.document} query/document tokens ({self.source})"


def record_lengths(results: dict[str, dict[str, Any]], lengths: Lengths) -> None:
    """Write the lengths into every model system's metrics (BM25 reads whole texts)."""
    for system, metrics in results.items():
        if system.startswith("model"):
            metrics.update(
                max_query_length=lengths.query,
                max_document_length=lengths.document,
                lengths_from=lengths.source,
            )


def lengths_line(results: dict[str, dict[str, Any]]) -> str:
    """``model encoded at 50/240 query/document tokens (trained)``, from the metrics."""
    model = results.get("model") or next(
        (m for s, m in results.items() if s.startswith("model")), {}
    )
    if "max_query_length" not in model:
        return ""
    lengths = Lengths(
        model["max_query_length"], model["max_document_length"], model["lengths_from"]
    )
    return f"model encoded at {lengths.text()}"


def evaluation_lengths(
    model: DualEncoder, train_config: dict[str, Any], config: EvalConfig
) -> Lengths:
    """Query and document lengths: asked for, else trained with, else the backbone's own.

    In that order: ``config``'s lengths (``asked``); the lengths a santa checkpoint records
    it was trained with (``trained``); a sentence-transformers folder's one
    ``max_seq_length`` for every text, which is how its authors encode
    (``sentence-transformers``); else 50/240 (``default``: SANTA's scripts' q_max_len and
    p_max_len; the paper states none). The backbone's limit caps them all. A comparison of
    several models passes one pair of lengths for all of them (``config``).
    """
    limit = model.model_config.max_seq_length
    fallback = "sentence-transformers" if limit else "default"
    defaults = (limit, limit) if limit else (DEFAULT_MAX_QUERY_LENGTH, DEFAULT_MAX_DOCUMENT_LENGTH)
    chosen = []
    for asked, key, default in (
        (config.max_query_length, "max_query_length", defaults[0]),
        (config.max_document_length, "max_document_length", defaults[1]),
    ):
        if asked:
            chosen.append((asked, "asked"))
        elif key in train_config:
            chosen.append((int(train_config[key]), "trained"))
        else:
            chosen.append((default, fallback))
    (query, query_source), (document, document_source) = chosen
    source = (
        query_source
        if query_source == document_source
        else f"query {query_source}, document {document_source}"
    )
    return Lengths(model.token_limit(query), model.token_limit(document), source)


def load_encoder(
    model: str | DualEncoder, config: EvalConfig
) -> tuple[DualEncoder, str | None, dict[str, Any]]:
    """``(encoder on its device, model URI or None, the saved train config)`` of ``model``.

    ``model`` is a :class:`DualEncoder` (used as it is) or anything
    :func:`santa.models.checkpoints.resolve_model` accepts, loaded onto ``config.device``.
    """
    if not isinstance(model, str):
        return model, None, {}
    import torch

    resolved = resolve_model(model)
    encoder, train_config = load_model(resolved)
    if encoder.tokenizer is None:
        raise ValueError(f"{model}: the model folder has no tokenizer; evaluation needs one")
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return encoder.to(device), resolved.model_uri, train_config


def evaluate(
    model: str | DualEncoder, data: str | BeirData, config: EvalConfig | None = None
) -> dict[str, dict[str, Any]]:
    """Evaluate a model (and BM25) on a BEIR split; return ``{system: metrics}``.

    ``model``: a :class:`DualEncoder`, or anything :func:`santa.models.checkpoints.resolve_model`
    accepts (a model folder, santa/Ray checkpoint, Ray Train run or sweep ``best.json``,
    local or ``s3://``; or a hub name). Lengths default to the model's saved
    ``santa_config.json`` (``train.max_query_length`` / ``max_document_length``), else
    50/240. Systems are named ``model``, ``bm25`` (full) and ``model-rerank``,
    ``bm25-rerank``.

    Encoding runs in-process, or through a Ray Data actor pool (:func:`encode_corpus_ray`)
    when the texts outnumber ``config.ray_threshold`` or ``config.use_ray`` is True.

    With ``config.output`` (local or ``s3://``): ``metrics.json`` (the returned dict),
    ``metrics.md`` (the table), ``run.<system>.trec`` and ``info.json`` (what ran, counts,
    timings).
    """
    config = config or EvalConfig()
    started = time.perf_counter()
    protocols = config.protocols
    beir = data if isinstance(data, BeirData) else load_beir(data, config.split)
    doc_ids, query_ids = beir.doc_ids, list(beir.queries)
    if not doc_ids:
        raise ValueError(f"{beir.uri}: the corpus is empty")
    if config.output is not None:
        check_trec_ids(doc_ids, "document")
        check_trec_ids(query_ids, "query")

    encoder, model_uri, train_config = load_encoder(model, config)
    lengths = evaluation_lengths(encoder, train_config, config)
    query_length, document_length = lengths.query, lengths.document

    use_ray, threshold = config.use_ray, config.ray_threshold
    docs_on_ray = use_ray is True or (use_ray is None and len(doc_ids) > threshold)
    queries_on_ray = use_ray is True or (use_ray is None and len(query_ids) > threshold)
    if docs_on_ray or queries_on_ray:
        from santa.cluster.ray_utils import init_ray

        init_ray(config.ray_address)
    timings: dict[str, float] = {"load_s": time.perf_counter() - started}
    common = {
        "batch_size": config.batch_size,
        "progress": config.progress,
        "ray_options": config.ray_options,
    }
    doc_texts = beir.document_texts()
    query_texts = [beir.queries[q] for q in query_ids]
    embeddings: dict[str, np.ndarray] = {}
    for name, texts, max_length, on_ray, role in (
        ("documents", doc_texts, document_length, docs_on_ray, "document"),
        ("queries", query_texts, query_length, queries_on_ray, "query"),
    ):
        mark = time.perf_counter()
        embeddings[name] = _encode(
            encoder,
            model_uri,
            texts,
            max_length=max_length,
            on_ray=on_ray,
            desc=name,
            role=role,
            dim=config.dim,
            **common,
        )
        timings[f"encode_{name}_s"] = time.perf_counter() - mark
    doc_embeddings, query_embeddings = embeddings["documents"], embeddings["queries"]

    rankings: dict[str, Ranking] = {}
    for proto in protocols:
        mark = time.perf_counter()
        rankings[system_name("model", proto)] = _dense_ranking(
            encoder,
            beir,
            query_embeddings,
            query_ids,
            doc_embeddings,
            doc_ids,
            proto,
            config.top_k,
            config.index_kind,
        )
        timings[f"retrieve_model_{proto}_s"] = time.perf_counter() - mark
        if config.with_bm25:
            mark = time.perf_counter()
            if proto == "rerank":
                bm25_ranking = bm25_rerank(
                    doc_texts, doc_ids, query_texts, query_ids, beir.candidates()
                )
            else:
                bm25_ranking = bm25_retrieve(
                    doc_texts, doc_ids, query_texts, query_ids, top_k=config.top_k
                )
            rankings[system_name("bm25", proto)] = bm25_ranking
            timings[f"retrieve_bm25_{proto}_s"] = time.perf_counter() - mark

    mark = time.perf_counter()
    results = {
        system: compute_metrics(
            beir.qrels,
            ranking,
            graded=beir.graded,
            query_languages=beir.query_languages,
            esci_gains=config.esci_gains,
            block_size=config.block_size,
        )
        for system, ranking in rankings.items()
    }
    timings["metrics_s"] = time.perf_counter() - mark
    timings["total_s"] = time.perf_counter() - started
    record_lengths(results, lengths)
    info = {
        "model": model_uri if model_uri is not None else type(model).__name__,
        "data": beir.uri,
        "split": beir.split,
        "protocols": protocols,
        "baseline": "bm25" if config.with_bm25 else None,
        "graded": beir.graded,
        "num_documents": len(doc_ids),
        "num_queries": len(query_ids),
        "max_query_length": query_length,
        "max_document_length": document_length,
        "lengths_from": lengths.source,
        # How the model was scored, so numbers from different tools can be compared.
        "similarity": encoder.model_config.similarity,
        "pooling": encoder.model_config.pooling,
        "dim": config.dim or encoder.embedding_dim,
        "top_k": config.top_k,
        "index_kind": config.index_kind,
        "ray": {"documents": docs_on_ray, "queries": queries_on_ray},
        "timings_s": {name: round(value, 3) for name, value in timings.items()},
    }
    logger.info("evaluation info: %s", json.dumps(info))
    if config.output is not None and not config.publish_whole:
        _write_outputs(config.output, rankings, results, info, config.block_size)
    elif config.output is not None:
        # Published whole: a re-run replaces the folder (no TREC run of an earlier
        # baseline left beside new metrics), an interrupted one leaves it as it was.
        from santa.files.outputs import staged_output

        with staged_output(config.output, tool="evaluate") as staged:
            _write_outputs(staged.staging, rankings, results, info, config.block_size)
            staged.publish({"info": info, "systems": sorted(results)})
    return results


def _write_outputs(
    output: str,
    rankings: Mapping[str, Any],
    results: dict[str, Any],
    info: dict[str, Any],
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> None:
    """The TREC runs, metrics (JSON and markdown) and info of one evaluation into ``output``."""
    for system, ranking in rankings.items():
        path = storage.join(output, f"run.{system}.trec")
        write_trec(path, ranking, tag=system, block_size=block_size)
    storage.write_json(storage.join(output, "metrics.json"), results)
    storage.write_bytes(
        storage.join(output, "metrics.md"), format_markdown(results).encode("utf-8")
    )
    storage.write_json(storage.join(output, "info.json"), info)
