"""The search service: a Ray Serve deployment holding the model and the index in each replica.

HTTP API (JSON):

- ``POST /search`` ``{"query": "...", "k": 10}`` → ``{"query", "k", "hits": [{"rank", "score",
  "id", "title", "text"}], "took_ms"}``; ``"queries": [...]`` instead of ``"query"`` answers
  several at once (``"results": [{"query", "hits"}, ...]``).
- ``GET /healthz`` → ``{"status": "ok", "model", "count", "similarity", ...}``.

A bad request (not JSON, no query, a ``k`` out of range, an unknown path or method) is
answered with a 4xx and ``{"error": "<what>"}``; the replica goes on serving.

:class:`SearchService` is plain Python (a request in, a status and a payload out);
:func:`build_app` wraps it as a Serve deployment.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from santa.search.searcher import MAX_K, Searcher

__all__ = [
    "APP_NAME",
    "ServeOptions",
    "SearchService",
    "build_app",
    "deploy",
]

APP_NAME = "santa-search"
TEXT_CHARS = 2000  # characters of each hit's text sent back
MAX_QUERIES = 256
MAX_BODY_BYTES = 1 << 20


class BadRequest(ValueError):
    """A request the service cannot answer; ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SearchService:
    """Answers the HTTP API from one :class:`Searcher` (no Ray, no HTTP server here)."""

    def __init__(self, searcher: Searcher, default_k: int = 10) -> None:
        self.searcher = searcher
        self.default_k = default_k

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The status code and JSON payload for one request."""
        try:
            return 200, self._route(method, path.rstrip("/") or "/", body)
        except BadRequest as error:
            return error.status, {"error": str(error)}

    def _route(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        if path == "/healthz":
            if method not in ("GET", "HEAD"):
                raise BadRequest(f"{method} {path}: use GET", 405)
            return {"status": "ok", **self.searcher.describe()}
        if path == "/search":
            if method != "POST":
                raise BadRequest(f"{method} {path}: use POST with a JSON body", 405)
            return self._search(body)
        raise BadRequest(f"no route {path}: use POST /search or GET /healthz", 404)

    def _search(self, body: bytes) -> dict[str, Any]:
        if len(body) > MAX_BODY_BYTES:
            raise BadRequest(f"the body is over {MAX_BODY_BYTES} bytes", 413)
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
        started = time.perf_counter()
        results = self.searcher.search(queries, k)
        took_ms = round((time.perf_counter() - started) * 1000, 2)
        answers = [
            {"query": query, "hits": [hit.to_dict(text_chars=TEXT_CHARS) for hit in hits]}
            for query, hits in zip(queries, results, strict=True)
        ]
        if single:
            return {**answers[0], "k": k, "took_ms": took_ms}
        return {"results": answers, "k": k, "took_ms": took_ms}


class SearchDeployment:
    """The Serve replica: loads the index and its model once, answers HTTP requests."""

    def __init__(self, index: str, model: str | None = None, default_k: int = 10) -> None:
        self.service = SearchService(Searcher.open(index, model=model), default_k=default_k)

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        body = await request.body()
        path = request.url.path
        root = request.scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :] or "/"  # the route prefix is the app's, not a route
        # The search itself is torch work: off the replica's event loop, so that health
        # checks and other requests are answered meanwhile.
        status, payload = await asyncio.to_thread(self.service.handle, request.method, path, body)
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
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    max_ongoing_requests: int = 8
    default_k: int = 10
    host: str = "127.0.0.1"
    port: int = 8000
    route_prefix: str = "/"
    name: str = APP_NAME

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")
        if self.cpus_per_replica < 0 or self.gpus_per_replica < 0:
            raise ValueError("CPUs and GPUs per replica must be >= 0")
        if not 1 <= self.default_k <= MAX_K:
            raise ValueError(f"default k must be from 1 to {MAX_K}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be from 1 to 65535, got {self.port}")
        if not self.route_prefix.startswith("/"):
            raise ValueError("route prefix must start with /")


def build_app(options: ServeOptions):
    """The Serve application (``Deployment.bind``) for ``options``."""
    from ray import serve

    deployment = serve.deployment(
        SearchDeployment,
        name="SearchDeployment",
        num_replicas=options.replicas,
        max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options={
            "num_cpus": options.cpus_per_replica,
            "num_gpus": options.gpus_per_replica,
        },
        health_check_period_s=10,
    )
    return deployment.bind(options.index, options.model, options.default_k)


def deploy(options: ServeOptions) -> str:
    """Start Serve's HTTP proxy (on the head node) and the deployment; returns its URL."""
    from ray import serve

    serve.start(
        proxy_location="HeadOnly",
        http_options={"host": options.host, "port": options.port},
    )
    serve.run(build_app(options), name=options.name, route_prefix=options.route_prefix)
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
    return f"http://{host}:{options.port}{options.route_prefix.rstrip('/')}"
