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
whole (:mod:`santa.files.outputs`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from santa.eval.evaluation import EvalConfig, Lengths, evaluate, lengths_line, record_lengths
from santa.eval.protocol_parts import Encoder, ProtocolResult
from santa.eval.runfiles import check_trec_ids, format_markdown, write_trec
from santa.files import storage

if TYPE_CHECKING:
    from santa.models.dual_encoder import DualEncoder

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
        markdown = format_markdown(results) + f"\n{lengths_line(results)}\n"
        return ProtocolResult(results, {}, markdown, {"protocol": protocol})
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
    lengths = Lengths(encoder.query_length, encoder.document_length, encoder.lengths_from)
    record_lengths(outcome.results, lengths)
    outcome.markdown = outcome.markdown.rstrip("\n") + f"\n\n{lengths_line(outcome.results)}\n"
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


def run_and_publish(
    protocol: str,
    model: str,
    data: str,
    config: EvalConfig,
    *,
    output: str | None = None,
    languages: Sequence[str] = (),
) -> ProtocolResult:
    """:func:`run_protocol`, its files published whole into ``output`` when there is one.

    The files are written into a staging folder and renamed in (S3: named by the manifest
    ``report.json`` written last), so an interrupted run leaves ``output`` as it was. The
    caller holds the output (the evaluate job's lock, :class:`santa.jobs.lifecycle.Job`).
    """
    if not output:
        return run_protocol(protocol, model, data, config, languages=languages)
    from santa.files.outputs import staged_output

    with staged_output(output, tool="evaluate") as staged:
        staging = dataclasses.replace(config, output=staged.staging, publish_whole=False)
        outcome = run_protocol(protocol, model, data, staging, languages=languages)
        options = {"protocol": protocol, "checkpoint": model, "data": data}
        staged.publish({"config": {**options, "split": config.split}, "metrics": outcome.results})
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
