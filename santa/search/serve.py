"""The search service: a Ray Serve deployment holding the model and the index in each replica.

HTTP API:

- ``POST /search`` ``{"query": "...", "k": 10}`` → ``{"query", "k", "hits": [{"rank", "score",
  "id", "title", "text"}], "took_ms"}``; ``"queries": [...]`` instead of ``"query"`` answers
  several at once (``"results": [{"query", "hits"}, ...]``). A query echoed back is cut to
  ``QUERY_ECHO_CHARS`` characters; the model reads a query up to its query length, as the
  evaluator does.
- ``GET /`` → an HTML page with a query box (:mod:`santa.search.page`); ``GET /?q=...&k=5``
  shows the hits.
- ``GET /healthz`` → ``{"status": "ok", "model", "count", "similarity", ..., "batches"}``
  (``batches``: how many searches this replica ran and how many requests each took).

A bad request (not JSON, no query, a ``k`` out of range, a body over the limit, an unknown
path or method) is answered with a 4xx and ``{"error": "<what>"}``; the replica goes on
serving. Requests arriving together are searched together (``@serve.batch``: one encoder
pass and one index search for up to ``max_batch_size`` requests).

:class:`SearchService` is plain Python (a request in, a status and a payload out);
:func:`build_app` wraps it as a Serve deployment.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from ray import serve

from santa.search.searcher import MAX_K, Hit, Searcher

__all__ = [
    "APP_NAME",
    "SearchRequest",
    "SearchService",
    "ServeOptions",
    "build_app",
    "deploy",
]

APP_NAME = "santa-search"
TEXT_CHARS = 2000  # characters of each hit's text sent back
QUERY_ECHO_CHARS = 200  # characters of a query sent back
MAX_QUERIES = 256
MAX_BODY_BYTES = 64 * 1024


class BadRequest(ValueError):
    """A request the service cannot answer; ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SearchRequest:
    """One checked search: its queries, how many hits each, and how to answer."""

    queries: list[str]
    k: int
    single: bool = True
    page: bool = False
    """Answer with the HTML page rather than JSON."""


def echo(query: str) -> str:
    """A query as the answer repeats it: cut to ``QUERY_ECHO_CHARS`` characters."""
    return query if len(query) <= QUERY_ECHO_CHARS else query[:QUERY_ECHO_CHARS] + "…"


class SearchService:
    """Answers the HTTP API from one :class:`Searcher` (no Ray, no HTTP server here)."""

    def __init__(
        self, searcher: Searcher, default_k: int = 10, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        self.searcher = searcher
        self.default_k = default_k
        self.max_body_bytes = max_body_bytes
        self.batch_sizes: Counter[int] = Counter()  # requests per search run
        self._stats_lock = threading.Lock()

    def handle(
        self, method: str, path: str, body: bytes, query_string: str = ""
    ) -> tuple[int, dict[str, Any] | str]:
        """The status code and payload (a JSON object, or the page's HTML) for one request."""
        parsed = self.parse(method, path, body, query_string)
        if not isinstance(parsed, SearchRequest):
            return parsed
        started = time.perf_counter()
        (results,) = self.search_batch([parsed])
        return self.answer(parsed, results, (time.perf_counter() - started) * 1000)

    def parse(
        self, method: str, path: str, body: bytes, query_string: str = ""
    ) -> SearchRequest | tuple[int, dict[str, Any] | str]:
        """A search to run, or the finished answer (health, the empty page, an error)."""
        path = path.rstrip("/") or "/"
        try:
            if path == "/healthz":
                if method not in ("GET", "HEAD"):
                    raise BadRequest(f"{method} {path}: use GET", 405)
                return 200, {"status": "ok", **self.searcher.describe(), **self.stats()}
            if path == "/search":
                if method != "POST":
                    raise BadRequest(f"{method} {path}: use POST with a JSON body", 405)
                return self._parse_search(body)
            if path == "/" and method in ("GET", "HEAD"):
                return self._parse_page(query_string)
            raise BadRequest(
                f"no route {method} {path}: use POST /search, GET / or GET /healthz", 404
            )
        except BadRequest as error:
            return error.status, {"error": str(error)}

    def _parse_page(self, query_string: str) -> SearchRequest | tuple[int, str]:
        from santa.search.page import render_page

        fields = parse_qs(query_string[: self.max_body_bytes])
        query = (fields.get("q") or [""])[0]
        k_text = (fields.get("k") or [str(self.default_k)])[0]
        k = int(k_text) if k_text.strip().isdigit() else self.default_k
        about = self.searcher.describe()
        if not query.strip():
            return 200, render_page(about, k=k)
        if not 1 <= k <= MAX_K:
            return 400, render_page(about, query=query, k=k, error=f"k must be from 1 to {MAX_K}")
        return SearchRequest([query], k, page=True)

    def _parse_search(self, body: bytes) -> SearchRequest:
        if len(body) > self.max_body_bytes:
            raise BadRequest(
                f"the body has {len(body):,} bytes, over the limit of {self.max_body_bytes:,}", 413
            )
        try:
            request = json.loads(body or b"null")
        except (ValueError, UnicodeDecodeError) as error:
            raise BadRequest(f"the body is not JSON: {error}") from None
        if not isinstance(request, dict):
            raise BadRequest('the body must be a JSON object: {"query": "...", "k": 10}')
        unknown = set(request) - {"query", "queries", "k"}
        if unknown:
            raise BadRequest(f"unknown field(s) {sorted(unknown)}: use query (or queries) and k")
        k = request.get("k", self.default_k)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise BadRequest(f"k must be an integer from 1 to {MAX_K}, got {k!r}")
        if ("query" in request) == ("queries" in request):
            raise BadRequest('give "query" (a string) or "queries" (a list of strings)')
        single = "query" in request
        queries = [request["query"]] if single else request["queries"]
        if not isinstance(queries, list) or not 1 <= len(queries) <= MAX_QUERIES:
            raise BadRequest(f'"queries" must be a list of 1 to {MAX_QUERIES} strings')
        if not all(isinstance(query, str) and query.strip() for query in queries):
            raise BadRequest("every query must be a non-empty string")
        return SearchRequest(queries, k, single)

    def search_batch(self, requests: list[SearchRequest]) -> list[list[list[Hit]]]:
        """Every request's hits from one encoder pass and one index search."""
        queries = [query for request in requests for query in request.queries]
        hits = self.searcher.search(queries, max(request.k for request in requests))
        with self._stats_lock:
            self.batch_sizes[len(requests)] += 1
        results, start = [], 0
        for request in requests:
            end = start + len(request.queries)
            results.append([row[: request.k] for row in hits[start:end]])
            start = end
        return results

    def answer(
        self, request: SearchRequest, results: list[list[Hit]], took_ms: float
    ) -> tuple[int, dict[str, Any] | str]:
        """The payload of a search that ran."""
        took_ms = round(took_ms, 2)
        hits = [[hit.to_dict(text_chars=TEXT_CHARS) for hit in row] for row in results]
        if request.page:
            from santa.search.page import render_page

            about = self.searcher.describe()
            query = request.queries[0]
            return 200, render_page(about, query=query, k=request.k, hits=hits[0], took_ms=took_ms)
        answers = [
            {"query": echo(query), "hits": row}
            for query, row in zip(request.queries, hits, strict=True)
        ]
        if request.single:
            return 200, {**answers[0], "k": request.k, "took_ms": took_ms}
        return 200, {"results": answers, "k": request.k, "took_ms": took_ms}

    def stats(self) -> dict[str, Any]:
        """How this replica's searches were batched: runs, and requests per run."""
        with self._stats_lock:
            sizes = dict(sorted(self.batch_sizes.items()))
        return {
            "batches": {
                "runs": sum(sizes.values()),
                "requests": sum(size * count for size, count in sizes.items()),
                "largest": max(sizes, default=0),
                "sizes": {str(size): count for size, count in sizes.items()},
            }
        }


class SearchDeployment:
    """The Serve replica: loads the index and its model once, answers HTTP requests; the
    searches of requests arriving together run as one batch."""

    def __init__(
        self,
        index: str,
        model: str | None = None,
        default_k: int = 10,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_batch_size: int = 16,
        batch_wait_ms: float = 5.0,
        dim: int | None = None,
    ) -> None:
        self.service = SearchService(
            Searcher.open(index, model=model, dim=dim),
            default_k=default_k,
            max_body_bytes=max_body_bytes,
        )
        self._search.set_max_batch_size(max_batch_size)
        self._search.set_batch_wait_timeout_s(batch_wait_ms / 1000)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def _search(self, requests: list[SearchRequest]) -> list[list[list[Hit]]]:
        # torch work: off the replica's event loop, so that health checks and the next
        # batch's requests are taken meanwhile.
        return await asyncio.to_thread(self.service.search_batch, requests)

    async def __call__(self, request):
        from starlette.responses import HTMLResponse, JSONResponse

        length = int(request.headers.get("content-length") or 0)
        if length > self.service.max_body_bytes:  # refused before the body is read
            limit = self.service.max_body_bytes
            message = f"the body has {length:,} bytes, over the limit of {limit:,}"
            return JSONResponse({"error": message}, status_code=413)
        body = await request.body()
        path = request.url.path
        root = request.scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :] or "/"  # the route prefix is the app's, not a route
        parsed = self.service.parse(request.method, path, body, request.url.query)
        if isinstance(parsed, SearchRequest):
            started = time.perf_counter()
            results = await self._search(parsed)
            parsed = self.service.answer(parsed, results, (time.perf_counter() - started) * 1000)
        status, payload = parsed
        if isinstance(payload, str):
            return HTMLResponse(payload, status_code=status)
        return JSONResponse(payload, status_code=status)

    def check_health(self) -> None:
        """Serve's replica health check: the index and model are loaded."""
        if not len(self.service.searcher):
            raise RuntimeError("the index is empty")


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """How the deployment runs."""

    index: str
    model: str | None = None
    dim: int | None = None
    """Serve the first ``dim`` dimensions of the index's vectors (a Matryoshka model);
    None: the index's own."""
    replicas: int = 1
    max_replicas: int | None = None
    """With more than ``replicas``: Serve autoscales between the two (``replicas`` the
    least), aiming at ``target_ongoing_requests`` per replica."""
    target_ongoing_requests: float = 4.0
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    max_ongoing_requests: int = 32
    max_batch_size: int = 16
    """Requests searched together in one encoder pass (``@serve.batch``); 1: no batching."""
    batch_wait_ms: float = 5.0
    """How long a replica waits for more requests before it searches a batch."""
    max_body_bytes: int = MAX_BODY_BYTES
    default_k: int = 10
    host: str = "127.0.0.1"
    port: int = 8000
    route_prefix: str = "/"
    name: str = APP_NAME

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(
                f"--replicas {self.replicas}-{self.max_replicas}: MIN-MAX with MIN <= MAX"
            )
        if self.cpus_per_replica < 0 or self.gpus_per_replica < 0:
            raise ValueError("CPUs and GPUs per replica must be >= 0")
        if self.max_batch_size < 1 or self.batch_wait_ms < 0:
            raise ValueError("the batch size must be at least 1 and the batch wait >= 0 ms")
        if self.max_body_bytes < 1024:
            raise ValueError("the body limit must be at least 1 KB")
        if not 1 <= self.default_k <= MAX_K:
            raise ValueError(f"default k must be from 1 to {MAX_K}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be from 1 to 65535, got {self.port}")
        if not self.route_prefix.startswith("/"):
            raise ValueError("route prefix must start with /")

    def deployment_options(self) -> dict[str, Any]:
        """``serve.deployment``'s arguments: a fixed replica count or an autoscaling range."""
        options: dict[str, Any] = {
            "name": "SearchDeployment",
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {
                "num_cpus": self.cpus_per_replica,
                "num_gpus": self.gpus_per_replica,
            },
            "health_check_period_s": 10,
        }
        if self.max_replicas is not None and self.max_replicas > self.replicas:
            options["autoscaling_config"] = {
                "min_replicas": self.replicas,
                "initial_replicas": self.replicas,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
            }
        else:
            options["num_replicas"] = self.replicas
        return options


def build_app(options: ServeOptions):
    """The Serve application (``Deployment.bind``) for ``options``."""
    deployment = serve.deployment(SearchDeployment, **options.deployment_options())
    return deployment.bind(
        options.index,
        options.model,
        options.default_k,
        options.max_body_bytes,
        options.max_batch_size,
        options.batch_wait_ms,
        options.dim,
    )


def deploy(options: ServeOptions) -> str:
    """Start Serve's HTTP proxy (on the head node) and the deployment; returns its URL."""
    from santa.cluster.ray_utils import ray_log_level
    from santa.jobs import console

    if ray_log_level() == "WARNING":  # a quiet job: Serve's INFO lines go to its log file
        console.quiet_driver_loggers()
    replicas = options.replicas if options.max_replicas is None else f"{options.replicas}+"
    print(
        f"[serve] starting {options.name}: {replicas} replica(s), each loading the model "
        f"and the index {options.index}",
        flush=True,
    )
    serve.start(
        proxy_location="HeadOnly",
        http_options={"host": options.host, "port": options.port},
    )
    serve.run(build_app(options), name=options.name, route_prefix=options.route_prefix)
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
    return f"http://{host}:{options.port}{options.route_prefix.rstrip('/')}"
