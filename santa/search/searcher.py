"""Search a published index: queries encoded exactly as the evaluator encodes queries.

:class:`Searcher` holds the model and the faiss index of one index folder (see
:mod:`santa.search.indexing`). A query is embedded by :func:`santa.models.encoding.encode_texts`
at the query length recorded in the index's manifest (the evaluator's choice for that
model), made unit length when the similarity is cosine, and searched; hits come back best
first, equal scores in corpus order, as in evaluation.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from santa.files import storage
from santa.files.outputs import published_root, read_manifest
from santa.index.faiss_index import EmbeddingIndex
from santa.search.shards import INDEX_FILE, read_documents

if TYPE_CHECKING:
    from santa.models.dual_encoder import DualEncoder

__all__ = ["Hit", "Searcher", "first_line", "format_hits"]

MAX_K = 1000


@dataclass(frozen=True)
class Hit:
    """One retrieved document."""

    rank: int
    score: float
    id: str
    title: str
    text: str

    def to_dict(self, text_chars: int | None = None) -> dict[str, Any]:
        """JSON-ready; ``text_chars`` cuts the text (None: whole)."""
        payload = asdict(self)
        if text_chars is not None:
            payload["text"] = payload["text"][:text_chars]
        return payload


def first_line(text: str, width: int = 80) -> str:
    """The first non-blank line of ``text``, cut to ``width`` characters."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


class Searcher:
    """The model and the index of one published index folder."""

    def __init__(
        self,
        model: DualEncoder,
        index: EmbeddingIndex,
        titles: list[str],
        texts: list[str],
        manifest: dict[str, Any],
        *,
        batch_size: int = 64,
    ) -> None:
        self.model = model.eval()
        self.index = index
        self.ids = index.ids
        self.titles = titles
        self.texts = texts
        self.manifest = manifest
        self.batch_size = batch_size
        self.query_length = int(manifest["max_query_length"])
        self.similarity = str(manifest["similarity"])
        # torch modules are not safe to call from several threads at once (Serve replicas
        # may run requests concurrently).
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        uri: str,
        *,
        model: str | None = None,
        device: str = "auto",
        use_gpu: str | bool = "auto",
        dim: int | None = None,
    ) -> Searcher:
        """Load the index at ``uri`` and its model (``model`` overrides the manifest's).

        ``dim``: search the first ``dim`` dimensions only (a Matryoshka model): an index
        built at that dimension is used as it is, a wider one is rebuilt in memory from its
        embedding shards, cut to ``dim``. Queries are cut to the index's dimension.
        """
        import torch

        from santa.models.checkpoints import load

        manifest = read_manifest(uri)
        if manifest is None or "dimension" not in manifest:
            raise storage.StorageError(f"no index at {uri} (no complete report.json)")
        root = published_root(uri)
        documents = read_documents(root)
        ids = documents.column("id").to_pylist()
        stored_dim = int(manifest["dimension"])
        if dim is not None and not 1 <= dim <= stored_dim:
            raise ValueError(f"--dim {dim}: the index at {uri} holds {stored_dim} dimensions")
        nprobe = int((manifest.get("index") or {}).get("nprobe") or 32)
        if dim is not None and dim < stored_dim:
            index = _truncated_index(root, manifest, ids, dim, use_gpu, nprobe)
            manifest = {**manifest, "dimension": dim}
        else:
            index = EmbeddingIndex.from_bytes(
                storage.read_bytes(storage.join(root, INDEX_FILE)),
                ids,
                use_gpu=use_gpu,
                nprobe=nprobe,
            )
            if index.dim != stored_dim:
                raise ValueError(
                    f"{uri}: {INDEX_FILE} has dimension {index.dim}, not the manifest's"
                )
        encoder = load(model or manifest["model"])
        # An index of truncated vectors (model_dimension recorded) takes the first
        # dimensions of a wider model's; any other index, exactly the model's.
        truncated = "model_dimension" in manifest or dim is not None
        if encoder.embedding_dim < index.dim or (
            not truncated and encoder.embedding_dim != index.dim
        ):
            raise ValueError(
                f"the model gives {encoder.embedding_dim}-dimensional vectors, the index at "
                f"{uri} holds {index.dim}"
            )
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(
            encoder.to(device),
            index,
            documents.column("title").to_pylist(),
            documents.column("text").to_pylist(),
            manifest,
        )

    def __len__(self) -> int:
        return len(self.index)

    def encode_queries(self, queries: list[str]):
        """Query embeddings ``(n, dim)`` as the evaluator computes them, cut to the
        index's dimension."""
        from santa.eval.evaluation import truncate_embeddings
        from santa.models.encoding import encode_texts

        embeddings = encode_texts(
            self.model,
            list(queries),
            max_length=self.query_length,
            batch_size=self.batch_size,
            role="query",
            progress=False,
        )  # (n, model dim)
        return truncate_embeddings(embeddings, self.index.dim)

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        """The top ``k`` documents of each query, best first."""
        from santa.eval.retrieval import prepare_embeddings

        if isinstance(queries, str):
            raise ValueError("queries must be a list of strings, not one string")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise ValueError(f"k must be an integer from 1 to {MAX_K}, got {k!r}")
        if not queries:
            return []
        if not all(isinstance(query, str) and query.strip() for query in queries):
            raise ValueError("every query must be a non-empty string")
        with self._lock:
            embeddings = self.encode_queries(queries)  # (n, dim)
        rows, scores = self.index.search_rows(prepare_embeddings(embeddings, self.similarity), k)
        results = []
        for row_hits, row_scores in zip(rows.tolist(), scores.tolist(), strict=True):
            hits = []
            for rank, (row, score) in enumerate(zip(row_hits, row_scores, strict=True), 1):
                if row < 0:
                    break
                hits.append(
                    Hit(rank, float(score), self.ids[row], self.titles[row], self.texts[row])
                )
            results.append(hits)
        return results

    def describe(self) -> dict[str, Any]:
        """What this searcher serves (for health checks and logs)."""
        keys = ("model", "checkpoint", "pooling", "similarity", "dimension", "count")
        return {key: self.manifest.get(key) for key in keys} | {"index": self.index.kind}


def short_id(doc_id: str, width: int) -> str:
    """``doc_id`` within ``width`` characters, cut at its start: an id's end tells documents
    apart (``…/configdialog.py#L120-L135`` beside ``…/configdialog.py#L140-L152``; cut at the
    end, both read ``…/configdialog.py#L1…``)."""
    return doc_id if len(doc_id) <= width else "…" + doc_id[len(doc_id) - width + 1 :]


def _truncated_index(
    root: str, manifest: dict[str, Any], ids: list[str], dim: int, use_gpu, nprobe: int
) -> EmbeddingIndex:
    """The index folder's vectors cut to ``dim`` dimensions, indexed in memory as the index
    job indexes them (unit vectors for cosine; the manifest's kind)."""
    from santa.eval.retrieval import prepare_embeddings
    from santa.search.shards import read_embeddings

    shard_ids, vectors = read_embeddings(root, int(manifest["shards"]["count"]))  # (n, full)
    if shard_ids != ids:
        raise ValueError(f"{root}: the embedding shards and documents.parquet disagree")
    vectors = prepare_embeddings(np.ascontiguousarray(vectors[:, :dim]), manifest["similarity"])
    settings = manifest.get("index") or {}
    options = {"nprobe": nprobe}
    if settings.get("nlist"):
        options["nlist"] = int(settings["nlist"])
    if settings.get("hnsw_m"):
        options["hnsw_m"] = int(settings["hnsw_m"])
    return EmbeddingIndex.build(
        vectors, ids, kind=settings.get("kind", "flat"), use_gpu=use_gpu, **options
    )


def format_hits(query: str, hits: list[Hit], width: int = 100) -> str:
    """A query's hits as a plain-text table: rank, similarity score, id (its end kept),
    first line of the text."""
    id_width = min(48, max([len("id"), *(len(hit.id) for hit in hits)]))
    text_width = max(20, width - id_width - 18)
    lines = [f"query: {query}", f"{'rank':>4}  {'score':>8}  {'id':<{id_width}}  text"]
    for hit in hits:
        hit_id = short_id(hit.id, id_width)
        lines.append(
            f"{hit.rank:>4}  {hit.score:>8.4f}  {hit_id:<{id_width}}  "
            f"{first_line(hit.text, text_width)}"
        )
    if not hits:
        lines.append("  (no hits)")
    return "\n".join(lines)
