"""A faiss inner-product index over embeddings with string ids: evaluation and mining.

:class:`EmbeddingIndex` is a plain class (no Ray): the evaluator retrieves with it and the
hard-negative miner searches it for each training query's top-K. Scores are raw inner
products, the model's dot-product similarity (normalise the vectors first for cosine).

Kinds:

- ``"flat"``: exact search (``IndexFlatIP``).
- ``"ivf"``: ``IndexIVFFlat`` with ``nlist`` k-means cells, ``nprobe`` of them searched. It is
  trained on the first batch added, on at most :data:`IVF_TRAIN_POINTS_PER_CELL` points per
  cell drawn from it. ``nlist`` defaults to :func:`ivf_cells` of that batch (4·√n, faiss's
  rule of thumb: a query scans ``nprobe``·√n/4 vectors, so the search grows as √n per
  query, not n) and is clamped to ``n // 39`` for small batches (faiss wants about 39
  training points per cell), so tiny corpora degrade to one cell, which is exact.
- ``"hnsw"``: ``IndexHNSWFlat`` with ``hnsw_m`` links per node (CPU only in faiss).

GPU: ``use_gpu="auto"`` moves flat and IVF indexes to GPU 0 when faiss was built with GPU
support *and* ``torch.cuda.is_available()``; ``True`` insists and raises when impossible.

Ties: the hits of a query come back ordered by score, then by insertion order (the order
of :meth:`EmbeddingIndex.add` calls and rows), so equal scores always rank the same way.
Which of several documents tied at the ``k``-th score make the top ``k`` is faiss's choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

__all__ = [
    "AUTO_IVF_MIN_DOCUMENTS",
    "EmbeddingIndex",
    "INDEX_KINDS",
    "IVF_TRAIN_POINTS_PER_CELL",
    "index_kind",
    "ivf_cells",
]

INDEX_KINDS = ("flat", "ivf", "hnsw")
# faiss warns below ~39 training points per k-means centroid.
_MIN_POINTS_PER_CENTROID = 39
# k-means points per IVF cell (faiss samples 256 by default): at a million vectors and
# 4,000 cells, 64 train in a quarter of the time with about the same recall.
IVF_TRAIN_POINTS_PER_CELL = 64
# Queries searched per faiss call: bounds the (batch, k) buffers and the id lists built
# from them, whatever the number of queries.
SEARCH_BATCH_SIZE = 8192


# ``negatives.index="auto"``: exact search up to this many documents, IVF from here on.
AUTO_IVF_MIN_DOCUMENTS = 500_000


def ivf_cells(documents: int) -> int:
    """IVF cells for ``documents`` vectors: 4·√n (at least one)."""
    return max(1, int(4 * math.sqrt(documents)))


def index_kind(setting: str, documents: int) -> str:
    """The faiss index kind for ``setting``; ``auto`` is flat below
    :data:`AUTO_IVF_MIN_DOCUMENTS` documents and IVF from there on."""
    if setting != "auto":
        return setting
    return "ivf" if documents >= AUTO_IVF_MIN_DOCUMENTS else "flat"


def _faiss():
    import faiss

    return faiss


def faiss_has_gpu() -> bool:
    """Whether the installed faiss was built with GPU support and sees a GPU."""
    faiss = _faiss()
    if not hasattr(faiss, "StandardGpuResources"):
        return False
    try:
        return faiss.get_num_gpus() > 0
    except Exception:  # a GPU build on a machine whose driver is missing
        return False


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()


class EmbeddingIndex:
    """Inner-product nearest neighbours over float32 vectors, addressed by string ids, or by
    row only (``ids=None``: mining numbers its documents itself and keeps no id table)."""

    def __init__(
        self,
        dim: int,
        kind: str = "flat",
        *,
        nlist: int | None = None,
        nprobe: int = 32,
        hnsw_m: int = 32,
        use_gpu: str | bool = "auto",
    ) -> None:
        if not isinstance(dim, int | np.integer) or dim <= 0:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if kind not in INDEX_KINDS:
            raise ValueError(f"kind must be one of {INDEX_KINDS}, got {kind!r}")
        for name, value in (("nlist", nlist or 1), ("nprobe", nprobe), ("hnsw_m", hnsw_m)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if use_gpu not in ("auto", True, False):
            raise ValueError(f"use_gpu must be 'auto', True or False, got {use_gpu!r}")
        self.dim = int(dim)
        self.kind = kind
        self.nlist = nlist
        self.nprobe = nprobe
        self.hnsw_m = hnsw_m
        self.on_gpu = self._want_gpu(use_gpu)
        self._ids: list[str] = []
        self._id_array: np.ndarray | None = None  # self._ids as an object array, built lazily
        self._positions: dict[str, int] = {}  # id → row, also what keeps ids unique
        self._size = 0
        self._named: bool | None = None  # rows named by ids, or numbered only
        self._index = None  # built on the first add (IVF needs the data to train)
        self._gpu_resources = None

    def _want_gpu(self, use_gpu: str | bool) -> bool:
        if use_gpu is False:
            return False
        possible = faiss_has_gpu() and _torch_cuda()
        if use_gpu is True:
            if self.kind == "hnsw":
                raise ValueError("use_gpu=True: faiss has no GPU HNSW index; use flat or ivf")
            if not possible:
                raise ValueError(
                    "use_gpu=True but no GPU index is possible here: faiss needs a GPU build "
                    "(pip install faiss-gpu-cu12, the [gpu] extra) and torch must see CUDA"
                )
            return True
        return possible and self.kind != "hnsw"

    # ----------------------------------------------------------------- building

    @classmethod
    def build(
        cls, embeddings: np.ndarray, ids: Sequence[str] | None, kind: str = "flat", **kw
    ) -> EmbeddingIndex:
        """An index of ``kind`` holding ``embeddings`` ``(n, dim)`` under ``ids`` (None:
        rows only, searched with :meth:`search_rows`)."""
        embeddings = _check_matrix(embeddings, "embeddings")
        index = cls(embeddings.shape[1], kind, **kw)
        index.add(embeddings, ids)
        return index

    def add(self, embeddings: np.ndarray, ids: Sequence[str] | None) -> None:
        """Add ``embeddings`` ``(n, dim)`` float32 under string ``ids`` (unique overall), or
        numbered only (``ids=None``, every add alike)."""
        embeddings = _check_matrix(embeddings, "embeddings", self.dim)
        if self._named is None:
            self._named = ids is not None
        elif self._named != (ids is not None):
            raise ValueError("an index is named by ids or numbered only, not both")
        if ids is None:
            if embeddings.shape[0]:
                if self._index is None:
                    self._index = self._new_index(embeddings)
                self._index.add(embeddings)
                self._size += embeddings.shape[0]
            return
        if isinstance(ids, str | bytes):
            raise ValueError("ids must be a sequence of strings, not one string")
        ids = list(ids)
        if len(ids) != embeddings.shape[0]:
            raise ValueError(f"{embeddings.shape[0]} embeddings but {len(ids)} ids")
        if not set(map(type, ids)) <= {str}:
            raise ValueError("ids must be strings")
        new = dict(zip(ids, range(len(self._ids), len(self._ids) + len(ids)), strict=True))
        if len(new) != len(ids) or (self._positions and not new.keys().isdisjoint(self._positions)):
            seen: set[str] = set(self._positions)
            duplicate = next(i for i in ids if i in seen or seen.add(i))
            raise ValueError(f"duplicate id {duplicate!r}: every id must be unique")
        if not ids:
            return
        if self._index is None:
            self._index = self._new_index(embeddings)
        self._index.add(embeddings)
        self._ids.extend(ids)
        self._size += len(ids)
        self._id_array = None
        if self._positions:
            self._positions.update(new)
        else:
            self._positions = new

    def _new_index(self, first_batch: np.ndarray):
        faiss = _faiss()
        if self.kind == "flat":
            index = faiss.IndexFlatIP(self.dim)
        elif self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        else:
            rows = first_batch.shape[0]
            nlist = max(1, min(self.nlist or ivf_cells(rows), rows // _MIN_POINTS_PER_CENTROID))
            self.nlist = nlist
            self._quantizer = faiss.IndexFlatIP(self.dim)  # kept alive beside the IVF index
            index = faiss.IndexIVFFlat(self._quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
            self.nprobe = min(self.nprobe, nlist)
        if self.on_gpu:
            self._gpu_resources = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, index)
        if self.kind == "ivf":
            index.train(_training_sample(first_batch, self.nlist * IVF_TRAIN_POINTS_PER_CELL))
            index.nprobe = self.nprobe
        return index

    # ----------------------------------------------------------------- searching

    def __len__(self) -> int:
        return self._size

    @property
    def ids(self) -> list[str]:
        """The ids in insertion order (row ``i`` of the index is ``ids[i]``)."""
        return list(self._ids)

    @property
    def positions(self) -> Mapping[str, int]:
        """id → its row (what :meth:`search_rows` returns), read-only."""
        return MappingProxyType(self._positions)

    def search(self, queries: np.ndarray, k: int) -> tuple[list[list[str]], np.ndarray]:
        """Top-``k`` ids per query and their scores ``(nq, k')``, ``k' = min(k, len(self))``.

        Hits are ordered by score (highest first), ties by insertion order. An approximate
        index can return fewer than ``k'`` hits for a query (IVF probing cells with too few
        vectors): its id list is then shorter and the missing scores are ``-inf``.
        """
        if self._named is False:
            raise ValueError("a numbered index has no ids: use search_rows")
        rows, scores = self.search_rows(queries, k)
        if self._id_array is None:
            self._id_array = np.array(self._ids, dtype=object)  # (n,) for vectorised lookup
        hits: list[list[str]] = []
        for start in range(0, rows.shape[0], SEARCH_BATCH_SIZE):
            labels = rows[start : start + SEARCH_BATCH_SIZE]
            names = self._id_array[np.maximum(labels, 0)].tolist()  # (b, k) ids
            found = labels >= 0
            if not found.all():  # missing hits are sorted last: cut them off
                counts = found.sum(axis=1).tolist()
                names = [row[:count] for row, count in zip(names, counts, strict=True)]
            hits.extend(names)
        return hits, scores

    def search_rows(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` without the id lookup: insertion-order rows ``(nq, k')`` int64.

        Row ``r`` is the document added ``r``-th (``ids[r]``); a missing hit is ``-1``,
        sorted last, with score ``-inf``. The evaluator keeps rankings in this form.
        """
        if not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        queries = _check_matrix(queries, "queries", self.dim)
        k = min(int(k), len(self))
        rows = np.empty((queries.shape[0], k), dtype=np.int64)
        scores = np.empty((queries.shape[0], k), dtype=np.float32)
        if k == 0:
            return rows, scores
        if self.kind == "hnsw":
            # efSearch below k caps the hits; twice k keeps recall high.
            self._index.hnsw.efSearch = max(64, 2 * k)
        for start in range(0, queries.shape[0], SEARCH_BATCH_SIZE):
            batch = queries[start : start + SEARCH_BATCH_SIZE]
            distances, labels = _order_ties(*self._index.search(batch, k))  # (b, k) each
            scores[start : start + len(batch)] = distances
            rows[start : start + len(batch)] = labels
        return rows, scores

    # ----------------------------------------------------------------- persisting

    def to_bytes(self) -> bytes:
        """The faiss index serialized (a GPU index is copied to CPU first); ids not included."""
        faiss = _faiss()
        if self._index is None:
            raise ValueError("the index is empty: add embeddings before saving it")
        index = faiss.index_gpu_to_cpu(self._index) if self.on_gpu else self._index
        return faiss.serialize_index(index).tobytes()

    @classmethod
    def from_bytes(
        cls, data: bytes, ids: Sequence[str], *, use_gpu: str | bool = "auto", nprobe: int = 32
    ) -> EmbeddingIndex:
        """An index read back from :meth:`to_bytes`, its rows named by ``ids`` (in order)."""
        faiss = _faiss()
        loaded = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        ids = list(ids)
        if loaded.ntotal != len(ids):
            raise ValueError(f"the index holds {loaded.ntotal} vectors but {len(ids)} ids")
        if isinstance(loaded, faiss.IndexHNSWFlat):
            kind, options = "hnsw", {"hnsw_m": max(1, loaded.hnsw.nb_neighbors(1))}
        elif isinstance(loaded, faiss.IndexIVF):
            kind, options = "ivf", {"nlist": loaded.nlist, "nprobe": min(nprobe, loaded.nlist)}
        else:
            kind, options = "flat", {}
        index = cls(loaded.d, kind, use_gpu=use_gpu, **options)
        if kind == "ivf":
            loaded.nprobe = index.nprobe
        if index.on_gpu:
            index._gpu_resources = faiss.StandardGpuResources()
            loaded = faiss.index_cpu_to_gpu(index._gpu_resources, 0, loaded)
        index._index = loaded
        index._ids = ids
        index._size, index._named = len(ids), True
        index._positions = dict(zip(ids, range(len(ids)), strict=True))
        if len(index._positions) != len(ids):
            raise ValueError("duplicate ids: every id must be unique")
        return index

    def __repr__(self) -> str:
        where = "gpu" if self.on_gpu else "cpu"
        return f"EmbeddingIndex(kind={self.kind!r}, dim={self.dim}, size={len(self)}, {where})"


def _training_sample(vectors: np.ndarray, size: int) -> np.ndarray:
    """``size`` rows of ``vectors`` drawn without replacement (seeded, in row order), or all
    of them when there are no more."""
    if vectors.shape[0] <= size:
        return vectors
    rows = np.random.default_rng(0).choice(vectors.shape[0], size, replace=False)
    return vectors[np.sort(rows)]


def _order_ties(distances: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows by score descending, equal scores by label (insertion order), no-hits last.

    faiss returns each row best first but equal scores in no set order (a flat index gives
    them highest label first). Rows already in order cost one vectorised comparison; rows
    whose only fault is the order inside runs of equal scores get their labels sorted
    within each run (one integer sort, scores untouched); rows with missing hits (label
    -1) or scores out of order are fully re-sorted.
    """
    with np.errstate(invalid="ignore"):  # -inf - -inf where hits are missing
        steps = np.diff(distances, axis=1)
    ties = steps == 0
    unsorted_ties = (ties & (np.diff(labels, axis=1) < 0)).any(axis=1)
    full = (steps > 0).any(axis=1) | (labels < 0).any(axis=1)
    within = unsorted_ties & ~full
    if within.any():
        rows = np.flatnonzero(within)
        sub_labels = labels[rows]
        # Run number along each row (scores are non-increasing there): sorting
        # run * stride + label sorts labels inside runs and keeps the runs in place.
        runs = np.zeros(sub_labels.shape, dtype=np.int64)
        np.cumsum(~ties[rows], axis=1, out=runs[:, 1:])
        stride = int(sub_labels.max()) + 1
        labels[rows] = np.sort(runs * stride + sub_labels, axis=1) - runs * stride
    if full.any():
        rows = np.flatnonzero(full)
        sub_distances, sub_labels = distances[rows], labels[rows]
        last = np.where(sub_labels < 0, np.iinfo(np.int64).max, sub_labels)
        order = np.lexsort((last, -sub_distances))
        distances[rows] = np.take_along_axis(sub_distances, order, axis=1)
        labels[rows] = np.take_along_axis(sub_labels, order, axis=1)
        distances[labels < 0] = -np.inf
    return distances, labels


def _check_matrix(array: np.ndarray, name: str, dim: int | None = None) -> np.ndarray:
    """A C-contiguous float32 ``(n, dim)`` view of ``array``, or a clear ValueError."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, dim), got shape {array.shape}")
    if array.dtype != np.float32:
        raise ValueError(f"{name} must be float32, got {array.dtype} (use .astype(np.float32))")
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"{name} have dimension {array.shape[1]}, the index has {dim}")
    if array.shape[1] == 0:
        raise ValueError(f"{name} must have a positive dimension")
    # A NaN or infinity anywhere makes the sum non-finite; a finite sum proves there is
    # none, at half the cost of the elementwise test (which settles overflowing sums).
    if not np.isfinite(array.sum()) and not np.isfinite(array).all():
        raise ValueError(f"{name} contain NaN or infinite values")
    return np.ascontiguousarray(array)
