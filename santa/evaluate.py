"""Evaluation: encode a BEIR corpus and its queries, retrieve, and score with ranx.

Data is a BEIR folder (local or ``s3://``) as ``ray_jobs.preprocess --stage eval`` writes
it: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/{split}.tsv``. Only queries judged in
the split are evaluated.

Metrics come from ranx (never hand-written formulas), at cut-off 100 over the top-100
retrieved:

- ``mrr@100``, ``recall@1``, ``recall@10``, ``recall@100`` and ``ndcg@100`` on binary
  relevance. For code (labels 1) every judged document is relevant. For graded ESCI
  qrels (E/S/C/I stored as 3/2/1/0) only Exact is relevant: ``ndcg@100`` is the paper's
  two-class NDCG (Exact = 1, else 0).
- ``ndcg@100_4class`` (graded qrels only): four-class NDCG with gains Exact 1.0,
  Substitute 0.1, Complement 0.01, Irrelevant 0, mapped from the labels at evaluation
  time. ranx keeps judgments as integers, so the gains are passed scaled by 100
  (100/10/1/0); ranx's ``ndcg`` is Järvelin & Kekäläinen's linear-gain NDCG
  (``rel / log2(rank + 1)``, not Burges' ``2^rel - 1``, which is ``ndcg_burges``), and a
  ratio of linear sums does not change when every gain is multiplied by the same number.
- A query with no relevant document under a scheme is left out of that scheme's means
  (its NDCG and recall are undefined); ``num_queries`` / ``num_queries_4class`` say how
  many were averaged.
- ``by_language``: the same metrics per query language (``language`` of queries.jsonl,
  else of the query's judged documents), e.g. per programming language for CodeSearchNet.

Protocols: ``full`` retrieves from the whole corpus; ``rerank`` ranks each query's judged
candidates only (ESCI's re-ranking task).

The document text is ``title + " " + text`` for products; code documents (whose language
is a code language) use the code alone: their BEIR title is the function name, and for
AdvTest that is the *de-obfuscated* name, which would leak the answer.

Rankings are ordered by score, ties by corpus order, and ranx is given rank-derived
scores so it evaluates exactly the ranking written to the TREC run files.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from santa import storage
from santa.data.records import product_document
from santa.entities import SUPPORTED_LANGUAGES as CODE_LANGUAGES

if TYPE_CHECKING:
    from santa.model import DualEncoder

__all__ = [
    "DEFAULT_MAX_DOCUMENT_LENGTH",
    "DEFAULT_MAX_QUERY_LENGTH",
    "DEFAULT_RAY_THRESHOLD",
    "ESCI_GAINS",
    "METRICS",
    "NDCG_4CLASS",
    "PROTOCOLS",
    "BeirData",
    "RankedLists",
    "Ranking",
    "bm25_rerank",
    "bm25_retrieve",
    "bm25_tokenize",
    "compute_metrics",
    "dense_rerank",
    "dense_retrieve",
    "document_text",
    "encode_corpus_ray",
    "encode_texts",
    "evaluate",
    "evaluate_model",
    "format_markdown",
    "load_beir",
    "load_model",
    "read_trec",
    "resolve_model_uri",
    "write_trec",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_QUERY_LENGTH = 50
DEFAULT_MAX_DOCUMENT_LENGTH = 240
DEFAULT_RAY_THRESHOLD = 50_000
DEFAULT_TOP_K = 100
CUTOFF = 100
METRICS = ("mrr@100", "ndcg@100", "recall@1", "recall@10", "recall@100")
NDCG_4CLASS = "ndcg@100_4class"
PROTOCOLS = ("full", "rerank")
# ESCI labels as the preprocessing stores them (E/S/C/I → 3/2/1/0) and their NDCG gains.
EXACT = 3
ESCI_GAINS = {3: 1.0, 2: 0.1, 1: 0.01, 0: 0.0}
# ranx stores judgments as int64: gains go in scaled by this (NDCG is scale-invariant).
GAIN_SCALE = 100

# query id → [(doc id, score), ...], best first.
Ranking = dict[str, list[tuple[str, float]]]


class RankedLists(Mapping[str, list[tuple[str, float]]]):
    """Dense retrieval's rankings kept as arrays; reads as a :data:`Ranking` mapping.

    Row ``i`` of ``rows`` ``(nq, k)`` holds the hits of ``query_ids[i]`` as positions in
    ``doc_ids``, best first, ``-1`` for a missing hit (sorted last); ``scores`` ``(nq, k)``
    are their scores. :func:`compute_metrics` reads the arrays directly, so evaluation
    never builds a Python object per hit; indexing by a query id gives the usual
    ``[(doc id, score), ...]`` list (TREC files, callers that want lists).
    ``doc_position`` (doc id → position in ``doc_ids``, e.g. the index's own) saves
    building that map when metrics are computed.
    """

    def __init__(
        self,
        query_ids: Sequence[str],
        doc_ids: Sequence[str],
        rows: np.ndarray,
        scores: np.ndarray,
        doc_position: Mapping[str, int] | None = None,
    ) -> None:
        self.query_ids = list(query_ids)
        self.doc_ids = doc_ids
        self.rows = rows
        self.scores = scores
        if rows.shape != scores.shape or rows.shape[0] != len(self.query_ids):
            raise ValueError(
                f"rows {rows.shape} and scores {scores.shape} for {len(self.query_ids)} queries"
            )
        self.query_row = {qid: i for i, qid in enumerate(self.query_ids)}
        if len(self.query_row) != len(self.query_ids):
            raise ValueError("query ids must be unique")
        self._doc_position = doc_position

    @property
    def doc_position(self) -> Mapping[str, int]:
        """doc id → its position in ``doc_ids`` (built once, on first use)."""
        if self._doc_position is None:
            self._doc_position = {doc: i for i, doc in enumerate(self.doc_ids)}
        return self._doc_position

    def __getitem__(self, qid: str) -> list[tuple[str, float]]:
        row = self.query_row[qid]
        hits = self.rows[row]
        found = int(np.count_nonzero(hits >= 0))
        doc_ids = self.doc_ids
        return [
            (doc_ids[j], score)
            for j, score in zip(
                hits[:found].tolist(), self.scores[row, :found].tolist(), strict=True
            )
        ]

    def __iter__(self):
        return iter(self.query_ids)

    def __len__(self) -> int:
        return len(self.query_ids)


# ============================================================================ data


@dataclass
class BeirData:
    """One BEIR split: the corpus, the judged queries and their qrels."""

    corpus: dict[str, dict[str, str]]
    """doc id → ``{"title", "text"}`` (and ``"language"`` when known)."""
    queries: dict[str, str]
    """query id → text, only queries judged in the split."""
    qrels: dict[str, dict[str, int]]
    """query id → {doc id: label}; labels 1 for code, 3/2/1/0 (E/S/C/I) for ESCI."""
    query_languages: dict[str, str] = field(default_factory=dict)
    """query id → language (programming language, product locale); may be empty."""
    uri: str = ""
    split: str = "test"

    @property
    def graded(self) -> bool:
        """Whether the qrels are ESCI-graded (any label above 1)."""
        return any(label > 1 for docs in self.qrels.values() for label in docs.values())

    @property
    def doc_ids(self) -> list[str]:
        """Corpus ids in file order."""
        return list(self.corpus)

    def document_texts(self) -> list[str]:
        """What the encoders see for each document, in :attr:`doc_ids` order."""
        return [document_text(doc) for doc in self.corpus.values()]

    def candidates(self) -> dict[str, list[str]]:
        """Each query's judged documents that are in the corpus (the rerank protocol)."""
        return {
            qid: [doc for doc in docs if doc in self.corpus] for qid, docs in self.qrels.items()
        }


def document_text(doc: Mapping[str, Any]) -> str:
    """``title + " " + text`` for products; the text alone for code (see module doc).

    Training embeds ESCI judgment pairs the same way (``records.embedded_document``).
    """
    text = doc.get("text") or ""
    if doc.get("language") not in CODE_LANGUAGES:
        return product_document(doc.get("title") or "", text)
    return text


def load_beir(uri: str, split: str = "test") -> BeirData:
    """Read a BEIR folder (local path or ``s3://``); keep the queries judged in ``split``."""
    corpus: dict[str, dict[str, str]] = {}
    for line_no, row in _read_jsonl(uri, "corpus.jsonl"):
        doc_id = _row_id(row, "corpus.jsonl", line_no)
        if doc_id in corpus:
            continue  # BEIR files are de-duplicated by writers; keep the first copy
        doc = {"title": str(row.get("title") or ""), "text": str(row.get("text") or "")}
        if row.get("language"):
            doc["language"] = str(row["language"])
        corpus[doc_id] = doc
    all_queries: dict[str, str] = {}
    languages: dict[str, str] = {}
    for line_no, row in _read_jsonl(uri, "queries.jsonl"):
        query_id = _row_id(row, "queries.jsonl", line_no)
        all_queries[query_id] = str(row.get("text") or "")
        if row.get("language"):
            languages[query_id] = str(row["language"])
    qrels = _read_qrels(uri, split)
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        raise ValueError(
            f"{uri}: qrels/{split}.tsv judges {len(missing)} queries that queries.jsonl lacks "
            f"(e.g. {missing[0]!r})"
        )
    unknown_docs = sum(doc not in corpus for docs in qrels.values() for doc in docs)
    if unknown_docs:
        logger.warning(
            "%s: %d judged documents are not in corpus.jsonl (they count as unretrievable)",
            uri,
            unknown_docs,
        )
    queries = {qid: all_queries[qid] for qid in qrels}
    query_languages = {}
    for qid, docs in qrels.items():
        language = languages.get(qid)
        if language is None:
            # The language of the query's best-judged document that has one.
            judged = sorted(docs.items(), key=lambda item: -item[1])
            language = next(
                (corpus[d]["language"] for d, _ in judged if "language" in corpus.get(d, {})),
                None,
            )
        if language:
            query_languages[qid] = language
    return BeirData(corpus, queries, qrels, query_languages, uri=uri, split=split)


def _read_jsonl(uri: str, name: str) -> Iterable[tuple[int, dict[str, Any]]]:
    file_uri = storage.join(uri, name)
    if not storage.exists(file_uri):
        raise storage.StorageError(f"not a BEIR folder: {uri} has no {name}")
    text = storage.read_bytes(file_uri).decode("utf-8")
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file_uri} line {line_no}: invalid JSON ({error})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{file_uri} line {line_no}: expected a JSON object")
        yield line_no, row


def _row_id(row: dict[str, Any], name: str, line_no: int) -> str:
    value = row.get("_id")
    if value is None or value == "":
        raise ValueError(f"{name} line {line_no}: missing '_id'")
    return str(value)


def _read_qrels(uri: str, split: str) -> dict[str, dict[str, int]]:
    qrels_uri = storage.join(uri, "qrels", f"{split}.tsv")
    if not storage.exists(qrels_uri):
        folder = storage.join(uri, "qrels")
        found = []
        if storage.exists(folder):
            found = [os.path.basename(p)[:-4] for p in storage.list_files(folder, (".tsv",))]
        raise storage.StorageError(
            f"{uri} has no qrels/{split}.tsv (splits present: {found or 'none'})"
        )
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    lines = storage.read_bytes(qrels_uri).decode("utf-8").splitlines()
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if line_no == 1 and parts[0].strip().lower() in ("query-id", "query_id", "qid"):
            continue  # header
        if len(parts) != 3:
            raise ValueError(f"{qrels_uri} line {line_no}: expected query-id, corpus-id, score")
        try:
            label = int(float(parts[2]))
        except ValueError:
            raise ValueError(f"{qrels_uri} line {line_no}: score {parts[2]!r}") from None
        qrels[parts[0].strip()][parts[1].strip()] = label
    if not qrels:
        raise ValueError(f"{qrels_uri} has no judgments")
    return dict(qrels)


# ============================================================================ models


def resolve_model_uri(uri: str) -> str:
    """The model folder ``uri`` names, through :func:`santa.checkpoints.resolve`.

    A model folder, a santa/Ray checkpoint folder (its ``model/``), a Ray Train run folder
    (its newest complete checkpoint) or a sweep root / ``best.json`` (the best one), local
    or ``s3://``; anything that is not a path is returned as is (a hub name).
    """
    from santa.checkpoints import resolve

    if not (storage.is_s3(uri) or os.path.exists(uri)):
        return uri
    return resolve(uri).model_uri


def load_model(uri: str) -> tuple[DualEncoder, dict[str, Any]]:
    """Load a model from anything :func:`resolve_model_uri` accepts, or a hub name.

    Returns the model and the ``train`` section of its ``santa_config.json`` (empty when
    the folder has none), which holds the lengths it was trained with.
    """
    from santa.checkpoints import load
    from santa.model import SANTA_CONFIG_FILE

    location = resolve_model_uri(uri)
    train: dict[str, Any] = {}
    config_uri = storage.join(location, SANTA_CONFIG_FILE)
    if (storage.is_s3(location) or os.path.isdir(location)) and storage.exists(config_uri):
        train = dict(storage.read_json(config_uri).get("train") or {})
    model = load(location)
    if model.tokenizer is None:
        raise ValueError(f"{uri}: the model folder has no tokenizer; evaluation needs one")
    return model, train


# ============================================================================ encoding


def encode_texts(
    model: DualEncoder,
    texts: list[str],
    *,
    max_length: int,
    batch_size: int = 64,
    desc: str = "",
    progress: bool = True,
) -> np.ndarray:
    """Embed ``texts`` in-process: ``(len(texts), dim)`` float32, in input order.

    Texts are batched longest first (less padding); the model is put in eval mode and
    its previous mode restored afterwards.
    """
    import torch
    from tqdm.auto import tqdm

    if model.tokenizer is None:
        raise ValueError("the model has no tokenizer: load it from a folder that has one")
    if batch_size < 1 or max_length < 1:
        raise ValueError("batch_size and max_length must be positive")
    texts = list(texts)
    out = np.empty((len(texts), model.embedding_dim), dtype=np.float32)
    if not texts:
        return out
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with (
            torch.inference_mode(),
            tqdm(total=len(texts), desc=desc or None, disable=not progress, unit="text") as bar,
        ):
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                encoded = model.tokenizer(
                    [texts[i] for i in rows],
                    max_length=max_length,
                    truncation=True,
                    padding=True,
                    return_tensors="pt",
                )
                embeddings = model.encode(
                    encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
                )  # (batch, dim)
                out[rows] = embeddings.float().cpu().numpy()
                bar.update(len(rows))
    finally:
        model.train(was_training)
    return out


class _EncodeActor:
    """Ray Data actor UDF: loads the model once, embeds batches of ``text`` rows."""

    def __init__(
        self, model: Any, max_length: int, batch_size: int, use_gpu: bool, threads: int
    ) -> None:
        import ray
        import torch

        from santa.model import DualEncoder

        if threads > 0:
            torch.set_num_threads(threads)
        if isinstance(model, ray.ObjectRef):
            model = ray.get(model)
        if isinstance(model, str):
            model = DualEncoder.from_pretrained(model)
        if use_gpu:
            model = model.to("cuda")
        self.model = model.eval()
        self.max_length = max_length
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        embeddings = encode_texts(
            self.model,
            [str(text) for text in batch["text"]],
            max_length=self.max_length,
            batch_size=self.batch_size,
            progress=False,
        )
        return {"row": batch["row"], "embedding": embeddings}


def encode_corpus_ray(
    model: str | DualEncoder,
    texts: Sequence[str],
    *,
    max_length: int,
    batch_size: int = 64,
    use_gpu: str | bool = "auto",
    num_actors: int = 0,
    num_cpus_per_actor: float = 1.0,
) -> np.ndarray:
    """Embed ``texts`` with a Ray Data actor pool; same result as :func:`encode_texts`.

    ``model`` is a URI every node can read (local folder on one machine, ``s3://`` on a
    cluster; a Ray checkpoint folder works too) or a model object, shipped once through
    the object store. Each actor loads the model once. With GPUs (``use_gpu="auto"``: the
    cluster has some) every actor takes one; otherwise CPU actors of
    ``num_cpus_per_actor``. ``num_actors=0``: one per GPU, or enough CPU actors to leave
    one cluster CPU free (at least one), so a 2-CPU machine never deadlocks.
    Needs Ray initialised (:func:`santa.ray_utils.init_ray`).
    """
    import pyarrow as pa
    import ray
    import ray.data

    texts = [str(text) for text in texts]
    if not texts:
        raise ValueError("no texts to encode")
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if use_gpu == "auto":
        use_gpu = gpus > 0
    if use_gpu and gpus < 1:
        raise ValueError("use_gpu=True but the Ray cluster has no GPU")
    cpus = float(resources.get("CPU", 1))
    if num_actors <= 0:
        # One per GPU, or CPU actors that leave one CPU free for the rest of Ray Data.
        cpu_actors = max(1, int((cpus - 1) // max(num_cpus_per_actor, 1e-3)))
        num_actors = gpus if use_gpu else cpu_actors
    if isinstance(model, str):
        payload: Any = resolve_model_uri(model)
    else:
        if next(model.parameters()).device.type != "cpu":
            import copy

            model = copy.deepcopy(model).to("cpu")
        payload = ray.put(model)
    # Blocks small enough to spread over the actors, big enough to batch well.
    rows_per_block = min(8192, max(batch_size, math.ceil(len(texts) / (4 * num_actors))))
    blocks = [
        pa.table(
            {
                "row": pa.array(range(start, min(start + rows_per_block, len(texts))), pa.int64()),
                "text": pa.array(texts[start : start + rows_per_block], pa.string()),
            }
        )
        for start in range(0, len(texts), rows_per_block)
    ]
    dataset = ray.data.from_arrow(blocks).map_batches(
        _EncodeActor,
        fn_constructor_kwargs={
            "model": payload,
            "max_length": max_length,
            "batch_size": batch_size,
            "use_gpu": bool(use_gpu),
            "threads": 0 if use_gpu else max(1, int(num_cpus_per_actor)),
        },
        batch_size=batch_size * 8,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=num_actors),
        num_gpus=1 if use_gpu else 0,
        num_cpus=0 if use_gpu else num_cpus_per_actor,
    )
    out: np.ndarray | None = None
    seen = 0
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        embeddings = np.asarray(batch["embedding"], dtype=np.float32)
        if out is None:
            out = np.empty((len(texts), embeddings.shape[1]), dtype=np.float32)
        out[batch["row"]] = embeddings
        seen += len(batch["row"])
    if out is None or seen != len(texts):
        raise RuntimeError(f"Ray encoding returned {seen} of {len(texts)} embeddings")
    return out


# ============================================================================ retrieval


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first, ties by lower index (exactly)."""
    n = scores.shape[0]
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        kth = np.partition(scores, n - k)[n - k]  # the k-th largest value
        above = np.flatnonzero(scores > kth)
        ties = np.flatnonzero(scores == kth)[: k - len(above)]
        index = np.concatenate([above, ties])
    else:
        index = np.arange(n)
    return index[np.lexsort((index, -scores[index]))]


def _prepare(embeddings: np.ndarray, similarity: str) -> np.ndarray:
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    if similarity == "cosine":
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        embeddings = embeddings / np.maximum(norms, 1e-12)
    return embeddings


def dense_retrieve(
    query_embeddings: np.ndarray,
    query_ids: Sequence[str],
    doc_embeddings: np.ndarray,
    doc_ids: Sequence[str],
    *,
    top_k: int = DEFAULT_TOP_K,
    similarity: str = "dot",
    index_kind: str = "flat",
    **index_options: Any,
) -> RankedLists:
    """Top-``k`` documents per query through :class:`~santa.index.NegativeIndex`.

    The result stays in array form (:class:`RankedLists`): no Python object per hit.
    """
    from santa.index import NegativeIndex

    if len(query_ids) != len(query_embeddings):
        raise ValueError(f"{len(query_embeddings)} query embeddings for {len(query_ids)} ids")
    index = NegativeIndex.build(
        _prepare(doc_embeddings, similarity), doc_ids, kind=index_kind, **index_options
    )
    rows, scores = index.search_rows(_prepare(query_embeddings, similarity), top_k)
    return RankedLists(query_ids, doc_ids, rows, scores, doc_position=index.positions)


def dense_rerank(
    query_embeddings: np.ndarray,
    query_ids: Sequence[str],
    doc_embeddings: np.ndarray,
    doc_ids: Sequence[str],
    candidates: Mapping[str, Sequence[str]],
    *,
    similarity: str = "dot",
) -> Ranking:
    """Each query's ``candidates`` ranked by the model's score (ties by corpus order)."""
    queries = _prepare(query_embeddings, similarity)
    docs = _prepare(doc_embeddings, similarity)
    position = {doc: i for i, doc in enumerate(doc_ids)}
    ranking: Ranking = {}
    for row, qid in enumerate(query_ids):
        rows = np.array(sorted(position[d] for d in candidates.get(qid, ()) if d in position))
        if not len(rows):
            ranking[qid] = []
            continue
        scores = docs[rows] @ queries[row]  # (candidates,)
        order = _top_k(scores, len(rows))
        ranking[qid] = [(doc_ids[rows[i]], float(scores[i])) for i in order]
    return ranking


# ============================================================================ BM25

_CAMEL_BOUNDARIES = (
    re.compile(r"([a-z0-9])([A-Z])"),  # getValue → get Value
    re.compile(r"([A-Z]+)([A-Z][a-z])"),  # HTTPServer → HTTP Server
)
_WORD = re.compile(r"[a-z0-9]+")


def bm25_tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric runs, splitting camelCase and snake_case identifiers."""
    for boundary in _CAMEL_BOUNDARIES:
        text = boundary.sub(r"\1 \2", text)
    return _WORD.findall(text.lower())


class _BM25:
    """bm25s (Lucene's BM25, k1=1.5, b=0.75) over the corpus; dense scores per query."""

    def __init__(self, doc_texts: Sequence[str]) -> None:
        import bm25s

        self.num_docs = len(doc_texts)
        self.retriever = bm25s.BM25()
        tokens = [bm25_tokenize(text) for text in doc_texts]
        self.retriever.index(tokens, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        token_ids = self.retriever.get_tokens_ids(bm25_tokenize(query))
        if not token_ids:
            return np.zeros(self.num_docs, dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(token_ids), dtype=np.float32)


def bm25_retrieve(
    doc_texts: Sequence[str],
    doc_ids: Sequence[str],
    query_texts: Sequence[str],
    query_ids: Sequence[str],
    *,
    top_k: int = DEFAULT_TOP_K,
) -> Ranking:
    """BM25 top-``k`` per query over the whole corpus (ties by corpus order)."""
    bm25 = _BM25(doc_texts)
    ranking: Ranking = {}
    for qid, query in zip(query_ids, query_texts, strict=True):
        scores = bm25.scores(query)
        ranking[qid] = [(doc_ids[i], float(scores[i])) for i in _top_k(scores, top_k)]
    return ranking


def bm25_rerank(
    doc_texts: Sequence[str],
    doc_ids: Sequence[str],
    query_texts: Sequence[str],
    query_ids: Sequence[str],
    candidates: Mapping[str, Sequence[str]],
) -> Ranking:
    """Each query's ``candidates`` ranked by BM25 (statistics of the whole corpus)."""
    bm25 = _BM25(doc_texts)
    position = {doc: i for i, doc in enumerate(doc_ids)}
    ranking: Ranking = {}
    for qid, query in zip(query_ids, query_texts, strict=True):
        rows = np.array(sorted(position[d] for d in candidates.get(qid, ()) if d in position))
        if not len(rows):
            ranking[qid] = []
            continue
        scores = bm25.scores(query)[rows]
        ranking[qid] = [(doc_ids[rows[i]], float(scores[i])) for i in _top_k(scores, len(rows))]
    return ranking


# ============================================================================ metrics


def compute_metrics(
    qrels: Mapping[str, Mapping[str, int]],
    ranking: Mapping[str, Sequence[tuple[str, float]] | Sequence[str]],
    *,
    graded: bool | None = None,
    query_languages: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """ranx metrics of ``ranking`` (ranked lists, best first) against ``qrels``.

    ``ranking`` is a :class:`RankedLists` (read as arrays) or any mapping of query id to
    ``[(doc id, score), ...]`` or ``[doc id, ...]``. ``graded=None`` detects ESCI grading
    (a label above 1). Binary metrics take labels ``>= 1`` as relevant, or Exact (3) only
    when graded; graded qrels add ``ndcg@100_4class``. See the module doc.
    """
    runs = _RunArrays(ranking)
    judgments = _Judgments(qrels, runs)
    labels = judgments.labels
    if graded is None:
        graded = bool(len(labels)) and int(labels.max()) > 1
    if graded:
        bad = set(np.unique(labels).tolist()) - set(ESCI_GAINS)
        if bad:
            raise ValueError(f"graded qrels must use ESCI labels 0-3, got {sorted(bad)}")
    threshold = EXACT if graded else 1
    # suffix → (per-judgment relevance for ranx, metrics)
    tables = [("", (labels >= threshold).astype(np.int64), METRICS)]
    if graded:
        gain_of = np.array([round(ESCI_GAINS[label] * GAIN_SCALE) for label in range(4)])
        tables.append(("_4class", gain_of[labels], ("ndcg@100",)))

    # suffix → (rows of the judged queries in qrels order, {metric: per-query values})
    scored: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    for suffix, relevance, metrics in tables:
        scored[suffix] = judgments.score(relevance, metrics)

    result = _means(scored, None)
    if query_languages:
        language_of = np.array([query_languages.get(q) for q in judgments.qids], dtype=object)
        by_language: dict[str, Any] = {}
        for language in sorted(set(query_languages.values())):
            by_language[language] = _means(scored, language_of == language)
        result["by_language"] = by_language
    return result


def _means(
    scored: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]], keep: np.ndarray | None
) -> dict[str, Any]:
    """Metric means over the judged queries, or those whose qrels row ``keep`` marks."""
    out: dict[str, Any] = {}
    for suffix, (rows, per_metric) in scored.items():
        mask = None if keep is None else keep[rows]
        for metric, values in per_metric.items():
            chosen = values if mask is None else values[mask]
            out[metric + suffix] = float(chosen.mean()) if len(chosen) else 0.0
        out["num_queries" + suffix] = len(rows) if mask is None else int(mask.sum())
    return out


class _RunArrays:
    """A ranking as integer doc ids per query: what ranx's kernels read.

    A :class:`RankedLists` already is one (ids are corpus positions); any other mapping is
    numbered here once, whatever the number of qrels tables scored against it.
    """

    def __init__(self, ranking: Mapping[str, Sequence[tuple[str, float]] | Sequence[str]]):
        if isinstance(ranking, RankedLists):
            self.query_row = ranking.query_row
            self.rows = ranking.rows
            self.doc_number: Mapping[str, int] = ranking.doc_position
            return
        numbers: dict[str, int] = {}
        number = numbers.setdefault
        self.query_row = {}
        lists = []
        for qid, ranked in ranking.items():
            ids = [number(doc, len(numbers)) for doc in _doc_ids(ranked)]
            if len(set(ids)) != len(ids):
                raise ValueError(f"the ranking of query {qid!r} lists a document twice")
            self.query_row[qid] = len(lists)
            lists.append(ids)
        self.rows = np.full((len(lists), max((len(ids) for ids in lists), default=0)), -1)
        for row, ids in enumerate(lists):
            self.rows[row, : len(ids)] = ids
        self.doc_number = numbers

    def select(self, qids: Sequence[str]) -> np.ndarray:
        """Rows ``(len(qids), depth)`` of ``qids`` in order; an unranked query is all ``-1``."""
        at = np.fromiter(map(self.query_row.get, qids, itertools.repeat(-1)), np.int64, len(qids))
        depth = max(1, self.rows.shape[1])
        out = np.full((len(qids), depth), -1, dtype=np.int64)
        present = at >= 0
        out[present, : self.rows.shape[1]] = self.rows[at[present]]
        return out


class _Judgments:
    """Qrels flattened to arrays, documents numbered as the ranking numbers them.

    A judged document the ranking never names gets an id of its own, above every id the
    ranking uses, so it counts in recall and the ideal DCG but is never retrieved.
    """

    def __init__(self, qrels: Mapping[str, Mapping[str, int]], runs: _RunArrays) -> None:
        self.qids = list(qrels)
        self.runs = runs
        counts = [len(docs) for docs in qrels.values()]
        docs = [doc for judged in qrels.values() for doc in judged]
        self.query_of = np.repeat(np.arange(len(self.qids)), counts)
        self.labels = np.fromiter(
            (label for judged in qrels.values() for label in judged.values()), np.int64, len(docs)
        )
        self.doc_of = np.fromiter(
            map(runs.doc_number.get, docs, itertools.repeat(-1)), np.int64, len(docs)
        )
        unknown = np.flatnonzero(self.doc_of < 0)
        if len(unknown):
            base = max(len(runs.doc_number), int(runs.rows.max(initial=-1)) + 1)
            extra: dict[str, int] = {}
            for position in unknown.tolist():
                self.doc_of[position] = extra.setdefault(docs[position], base + len(extra))
        self._ranked: np.ndarray | None = None

    def score(
        self, relevance: np.ndarray, metrics: Sequence[str]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """ranx's per-query ``metrics`` for the queries with a judgment of ``relevance > 0``.

        Calls ranx's metric functions (``ranx.metrics``, what ``ranx.evaluate`` runs) on
        padded arrays: each query's ranked list is a row of integer doc ids in our order
        (ranx's kernels read the run as sorted; it gets strictly decreasing rank scores),
        qrels rows are sorted by relevance (what ranx's ideal DCG expects). Padding has id
        -1 and relevance 0, below ranx's relevance level 1, so it never counts. This
        skips building ranx's Qrels/Run dictionaries, whose conversion cost dominated the
        evaluation of small and medium corpora.
        """
        keep = relevance > 0
        query_of, doc_of, relevance = self.query_of[keep], self.doc_of[keep], relevance[keep]
        rows = np.unique(query_of)  # judged queries, in qrels order
        if not len(rows):
            return rows, {metric: np.zeros(0) for metric in metrics}
        from ranx import metrics as ranx_metrics

        if self._ranked is None:
            self._ranked = self.runs.select(self.qids)
        ranked = self._ranked[rows]
        run = np.empty((*ranked.shape, 2))
        run[:, :, 0] = ranked
        run[:, :, 1] = np.arange(ranked.shape[1], 0, -1, dtype=np.float64)

        query_of = np.searchsorted(rows, query_of)  # → row in the judged subset
        order = np.lexsort((-relevance, query_of))
        query_of, doc_of, relevance = query_of[order], doc_of[order], relevance[order]
        counts = np.bincount(query_of, minlength=len(rows))
        column = np.arange(len(query_of)) - (np.cumsum(counts) - counts)[query_of]
        qrels = np.zeros((len(rows), int(counts.max()), 2))
        qrels[:, :, 0] = -1.0
        qrels[query_of, column, 0] = doc_of
        qrels[query_of, column, 1] = relevance

        out: dict[str, np.ndarray] = {}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*unsafe cast.*")
            for metric in metrics:
                name, _, cutoff = metric.partition("@")
                function = getattr(ranx_metrics, _RANX_METRICS[name])
                out[metric] = np.asarray(function(qrels, run, k=int(cutoff or 0), rel_lvl=1))
        return rows, out


# Metric names → ranx's metric functions (the same ones ranx.evaluate dispatches to).
_RANX_METRICS = {"mrr": "reciprocal_rank", "ndcg": "ndcg", "recall": "recall"}


def _doc_ids(ranked: Sequence[tuple[str, float]] | Sequence[str]) -> list[str]:
    """The doc ids of a ranked list of ``(doc, score)`` pairs or of plain ids."""
    if ranked and isinstance(ranked[0], str):
        return list(ranked)
    return [item[0] for item in ranked]


# ============================================================================ files


def write_trec(uri: str, ranking: Ranking, tag: str) -> None:
    """Write a TREC run file: ``qid Q0 docid rank score tag`` (ranks from 1)."""
    lines = []
    for qid, hits in ranking.items():
        for rank, (doc, score) in enumerate(hits, start=1):
            lines.append(f"{qid} Q0 {doc} {rank} {score:.6f} {tag}")
    storage.write_bytes(uri, ("\n".join(lines) + "\n" if lines else "").encode("utf-8"))


def read_trec(uri: str) -> Ranking:
    """Read a TREC run file back (ranked by the rank column)."""
    rows: dict[str, list[tuple[int, str, float]]] = defaultdict(list)
    for line in storage.read_bytes(uri).decode("utf-8").splitlines():
        if line.strip():
            qid, _, doc, rank, score, _tag = line.split()
            rows[qid].append((int(rank), doc, float(score)))
    return {qid: [(doc, score) for _, doc, score in sorted(hits)] for qid, hits in rows.items()}


def _check_trec_ids(ids: Iterable[str], what: str) -> None:
    for value in ids:
        if not value or any(ch.isspace() for ch in value):
            raise ValueError(
                f"{what} id {value!r} is empty or has whitespace: a TREC run cannot hold it"
            )


def format_markdown(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown tables: systems × metrics, then per language when there is more than one."""
    columns = _metric_columns(results.values())
    lines = [_table_header(["system", *columns, "queries"])]
    for system, metrics in results.items():
        lines.append(_table_row([system], metrics, columns))
    languages = sorted({lang for m in results.values() for lang in m.get("by_language", {})})
    if len(languages) > 1:
        lines += [
            "",
            "Per language:",
            "",
            _table_header(["system", "language", *columns, "queries"]),
        ]
        for system, metrics in results.items():
            for language, values in metrics.get("by_language", {}).items():
                lines.append(_table_row([system, language], values, columns))
    return "\n".join(lines) + "\n"


def _metric_columns(all_metrics: Iterable[Mapping[str, Any]]) -> list[str]:
    present = {key for metrics in all_metrics for key in metrics}
    return [m for m in (*METRICS, NDCG_4CLASS) if m in present]


def _table_header(names: list[str]) -> str:
    return "| " + " | ".join(names) + " |\n|" + "|".join("---" for _ in names) + "|"


def _table_row(labels: list[str], metrics: Mapping[str, Any], columns: list[str]) -> str:
    cells = [f"{metrics[c]:.4f}" if c in metrics else "" for c in columns]
    return "| " + " | ".join([*labels, *cells, str(metrics.get("num_queries", ""))]) + " |"


# ============================================================================ top level


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
) -> np.ndarray:
    if on_ray:
        return encode_corpus_ray(
            model_uri if model_uri is not None else model,
            texts,
            max_length=max_length,
            batch_size=batch_size,
            **ray_options,
        )
    return encode_texts(
        model, texts, max_length=max_length, batch_size=batch_size, desc=desc, progress=progress
    )


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
    started = time.perf_counter()
    doc_ids, query_ids = beir.doc_ids, list(beir.queries)
    doc_embeddings = encode_texts(
        model,
        beir.document_texts(),
        max_length=max_document_length,
        batch_size=batch_size,
        desc="documents",
        progress=progress,
    )
    encoded_docs = time.perf_counter()
    query_embeddings = encode_texts(
        model,
        [beir.queries[q] for q in query_ids],
        max_length=max_query_length,
        batch_size=batch_size,
        desc="queries",
        progress=progress,
    )
    encoded = time.perf_counter()
    ranking = _dense_ranking(
        model, beir, query_embeddings, query_ids, doc_embeddings, doc_ids, protocol, top_k
    )
    retrieved = time.perf_counter()
    metrics = compute_metrics(
        beir.qrels, ranking, graded=beir.graded, query_languages=beir.query_languages
    )
    done = time.perf_counter()
    metrics["timings"] = {
        "encode_documents_s": encoded_docs - started,
        "encode_queries_s": encoded - encoded_docs,
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


def _protocols(protocol: str | Sequence[str]) -> list[str]:
    if isinstance(protocol, str):
        protocol = list(PROTOCOLS) if protocol == "both" else [protocol]
    unknown = [p for p in protocol if p not in PROTOCOLS]
    if unknown or not protocol:
        raise ValueError(f"protocol must be full, rerank, both or a list of them; got {protocol}")
    return list(protocol)


def system_name(system: str, protocol: str) -> str:
    """``model``/``bm25`` for the full protocol, ``model-rerank``/``bm25-rerank`` else."""
    return system if protocol == "full" else f"{system}-{protocol}"


def evaluate(
    model: str | DualEncoder,
    data: str | BeirData,
    *,
    split: str = "test",
    output: str | None = None,
    baseline: str | None = "bm25",
    protocol: str | Sequence[str] = "full",
    max_query_length: int | None = None,
    max_document_length: int | None = None,
    top_k: int = DEFAULT_TOP_K,
    batch_size: int = 64,
    use_ray: bool | None = None,
    ray_threshold: int = DEFAULT_RAY_THRESHOLD,
    ray_address: str | None = None,
    ray_options: Mapping[str, Any] | None = None,
    index_kind: str = "flat",
    device: str = "auto",
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Evaluate a model (and BM25) on a BEIR split; return ``{system: metrics}``.

    ``model``: a :class:`DualEncoder`, or a URI (local or ``s3://``) of a model folder, a
    santa/Ray checkpoint (its ``model/``), a Ray Train run (its newest checkpoint) or a
    sweep's ``best.json``; or a hub name. Lengths default to the model's saved
    ``santa_config.json`` (``train.max_query_length`` / ``max_document_length``), else
    50/240. ``protocol``: ``full``, ``rerank``, ``both`` or a list. Systems are named
    ``model``, ``bm25`` (full) and ``model-rerank``, ``bm25-rerank``.

    Encoding runs in-process, or through a Ray Data actor pool (:func:`encode_corpus_ray`)
    when the texts outnumber ``ray_threshold`` or ``use_ray=True`` (``False``: never).

    With ``output`` (local or ``s3://``): ``metrics.json`` (the returned dict),
    ``metrics.md`` (the table), ``run.<system>.trec`` and ``info.json`` (what ran, counts,
    timings).
    """
    import torch

    started = time.perf_counter()
    protocols = _protocols(protocol)
    if baseline not in (None, "none", "bm25"):
        raise ValueError(f"baseline must be 'bm25' or None, got {baseline!r}")
    beir = data if isinstance(data, BeirData) else load_beir(data, split)
    doc_ids, query_ids = beir.doc_ids, list(beir.queries)
    if not doc_ids:
        raise ValueError(f"{beir.uri}: the corpus is empty")
    if output is not None:
        _check_trec_ids(doc_ids, "document")
        _check_trec_ids(query_ids, "query")

    model_uri: str | None = None
    train_config: dict[str, Any] = {}
    if isinstance(model, str):
        model_uri = resolve_model_uri(model)
        encoder, train_config = load_model(model_uri)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        encoder = encoder.to(device)
    else:
        encoder = model
    query_length = max_query_length or int(
        train_config.get("max_query_length", DEFAULT_MAX_QUERY_LENGTH)
    )
    document_length = max_document_length or int(
        train_config.get("max_document_length", DEFAULT_MAX_DOCUMENT_LENGTH)
    )

    docs_on_ray = use_ray is True or (use_ray is None and len(doc_ids) > ray_threshold)
    queries_on_ray = use_ray is True or (use_ray is None and len(query_ids) > ray_threshold)
    if docs_on_ray or queries_on_ray:
        from santa.ray_utils import init_ray

        init_ray(ray_address)
    timings: dict[str, float] = {"load_s": time.perf_counter() - started}
    common = {
        "batch_size": batch_size,
        "progress": progress,
        "ray_options": dict(ray_options or {}),
    }
    mark = time.perf_counter()
    doc_texts = beir.document_texts()
    doc_embeddings = _encode(
        encoder,
        model_uri,
        doc_texts,
        max_length=document_length,
        on_ray=docs_on_ray,
        desc="documents",
        **common,
    )
    timings["encode_documents_s"] = time.perf_counter() - mark
    mark = time.perf_counter()
    query_texts = [beir.queries[q] for q in query_ids]
    query_embeddings = _encode(
        encoder,
        model_uri,
        query_texts,
        max_length=query_length,
        on_ray=queries_on_ray,
        desc="queries",
        **common,
    )
    timings["encode_queries_s"] = time.perf_counter() - mark

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
            top_k,
            index_kind,
        )
        timings[f"retrieve_model_{proto}_s"] = time.perf_counter() - mark
        if baseline == "bm25":
            mark = time.perf_counter()
            if proto == "rerank":
                bm25_ranking = bm25_rerank(
                    doc_texts, doc_ids, query_texts, query_ids, beir.candidates()
                )
            else:
                bm25_ranking = bm25_retrieve(
                    doc_texts, doc_ids, query_texts, query_ids, top_k=top_k
                )
            rankings[system_name("bm25", proto)] = bm25_ranking
            timings[f"retrieve_bm25_{proto}_s"] = time.perf_counter() - mark

    mark = time.perf_counter()
    results = {
        system: compute_metrics(
            beir.qrels, ranking, graded=beir.graded, query_languages=beir.query_languages
        )
        for system, ranking in rankings.items()
    }
    timings["metrics_s"] = time.perf_counter() - mark
    timings["total_s"] = time.perf_counter() - started
    info = {
        "model": model_uri if model_uri is not None else type(model).__name__,
        "data": beir.uri,
        "split": beir.split,
        "protocols": protocols,
        "baseline": baseline if baseline == "bm25" else None,
        "graded": beir.graded,
        "num_documents": len(doc_ids),
        "num_queries": len(query_ids),
        "max_query_length": query_length,
        "max_document_length": document_length,
        "top_k": top_k,
        "index_kind": index_kind,
        "ray": {"documents": docs_on_ray, "queries": queries_on_ray},
        "timings_s": {name: round(value, 3) for name, value in timings.items()},
    }
    logger.info("evaluation info: %s", json.dumps(info))
    if output is not None:
        for system, ranking in rankings.items():
            write_trec(storage.join(output, f"run.{system}.trec"), ranking, tag=system)
        storage.write_json(storage.join(output, "metrics.json"), results)
        storage.write_bytes(
            storage.join(output, "metrics.md"), format_markdown(results).encode("utf-8")
        )
        storage.write_json(storage.join(output, "info.json"), info)
    return results
