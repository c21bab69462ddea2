"""The retrieval HTTP service (FastAPI), started by ``python -m spader.retrieval serve``.

Endpoints:

* ``POST /retrieve`` with ``{"queries": [str, ...], "topk": 5, "initial_k": 50, "return_scores": false}``
  (all but ``queries`` optional) answers ``{"result": [[{"id", "title", "text"[, "score"]}, ...], ...]}``,
  one list per query, in order, best passage first.
* ``GET /health`` answers ``{"status": "ok", "index": ..., "documents": ..., "stats": {...}}`` once
  the index and the reranker are loaded, verified and warmed up.
* ``GET /stats``: requests, queries, cache hits/misses/evictions, results shared while in flight,
  queries computed, reranker pairs, seconds in each stage, the latency of ``/retrieve`` as the
  service measures it (``latency_ms``: from the parsed request to the encoded answer) and how late
  its event loop ran (``loop_lag_ms``; :mod:`spader.retrieval.monitor`).

Every bad request is answered with a JSON ``{"error": message}`` naming the problem, decided before
the request joins any batch: 400 for a body that is not a JSON object (including JSON nested
deeper than 16 levels, numbers of more than 40 characters, NaN), 413 for a body larger than
``SearchSettings.max_body_bytes`` (checked while it is read), too many queries or a query that is
too long, 422 for anything else that is invalid (empty list, empty or non-string query, text that
cannot be encoded such as a lone surrogate, unknown field, ``topk`` outside ``1..initial_k``).
A backend failure answers 500 for the requests whose queries failed, and only those
(:mod:`spader.retrieval.batcher`); nothing ever answers a plain-text error: errors in the HTTP
framing itself (a bad chunk size, a Content-Length that is negative or given twice, a NUL in a
header, a header or body that does not arrive in time, a connection over the cap) are answered in
JSON by the service's HTTP protocol (:mod:`spader.retrieval.protocol`).

A stop signal (:func:`spader.retrieval.service.serve`) closes the scheduler first: requests still
open are answered ``503`` with a JSON error saying the service is shutting down (the client
retries 5xx), and a request the server has to cut short while it stops gets the same JSON answer,
never uvicorn's plain-text 500. Request targets in absolute form (``GET http://host:port/health``,
which HTTP/1.1 servers must accept) are routed like their path.

Large bodies are decoded and checked off the event loop: a body over ``parse_off_loop_bytes``
(64 KiB; a request of 512 ordinary queries is ~30 KB) is parsed and validated on one worker thread,
and its answer encoded there too, so a request of several megabytes does not hold up the small
requests arriving meanwhile (cache hits are answered in about a millisecond; parsing a 6 MB body
takes hundreds). One thread: large bodies wait for each other rather than all taking the CPU at
once.

Concurrent requests are merged into slices of up to ``slice_queries`` queries, repeated queries
are served from a result cache, and BM25 of one slice overlaps reranking of the previous one
(:mod:`spader.retrieval.batcher`), so thousands of rollouts each sending a few queries get batch
search and batched reranking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from spader.retrieval.batcher import Batcher, SearchFailedError
from spader.retrieval.cache import ResultCache
from spader.retrieval.errors import BadSearchRequestError, ServiceClosingError
from spader.retrieval.monitor import DurationWindow, LoopLagMonitor
from spader.retrieval.payload import parse_json, read_limited

log = logging.getLogger(__name__)

__all__ = ["PARSE_OFF_LOOP_BYTES", "close_app", "create_app"]

_FIELDS = {"queries", "topk", "initial_k", "return_scores"}
#: Bodies larger than this are decoded, checked and answered on the parse thread.
PARSE_OFF_LOOP_BYTES = 65536


def _json(payload: Any, status: int = 200) -> Response:
    try:  # UTF-8 as is; escaped if some text (a message quoting the client, say) cannot be encoded
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        body = json.dumps(payload).encode("ascii")
    return Response(body, status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


class _Framing:
    """ASGI middleware: absolute-form targets routed by their path; a request cut short while the
    server stops (its task cancelled) answered with a JSON 503 rather than uvicorn's plain 500."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path[:8].lower().startswith(("http://", "https://")):
            from urllib.parse import urlsplit

            local = urlsplit(path).path or "/"
            scope = {**scope, "path": local, "raw_path": local.encode("latin-1", "replace")}
        started = False

        async def sending(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if started:
                raise
            body = json.dumps(
                {"error": "the retrieval service is shutting down and cut this request short; retry it"}
            ).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})


def close_app(app: FastAPI, reason: str) -> None:
    """The service is stopping: open requests are answered 503 now, new ones refused
    (:meth:`spader.retrieval.batcher.Batcher.close`). Call on the event loop's thread; a no-op
    before start-up completed."""
    batcher = getattr(app.state, "batcher", None)
    if batcher is not None:
        batcher.close(reason)


def _decode(raw: bytes, backend) -> tuple[list[str], int, int, bool]:
    """The validated ``(queries, topk, initial_k, return_scores)`` of a ``/retrieve`` body.

    Raises:
        BadSearchRequestError: the request is refused (status and message as answered).
    """
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise BadSearchRequestError("request body must be a JSON object with a 'queries' list", 400)
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        shown = ", ".join(ascii(k)[1:-1] for k in unknown[:5])
        raise BadSearchRequestError(f"unknown field(s) {shown}; allowed: {', '.join(sorted(_FIELDS))}")
    with_scores = body.get("return_scores", False)
    if not isinstance(with_scores, bool):
        raise BadSearchRequestError(f"'return_scores' must be true or false, got {with_scores!a:.60}")
    queries, topk, initial_k = backend.check_request(
        body.get("queries"), body.get("topk"), body.get("initial_k")
    )
    return queries, topk, initial_k, with_scores


def _encode(results, with_scores: bool) -> Response:
    return _json({"result": [[p.to_dict(with_scores) for p in hits] for hits in results]})


def _lifespan(load_backend: Callable[[], Any], warmed: bool):
    """The app's lifespan: load (and warm) the backend, start its batcher, stop all at the end."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        backend = await asyncio.to_thread(load_backend)
        if not warmed:
            await asyncio.to_thread(backend.warm_up)
        s = backend.settings
        cache = ResultCache(s.cache_entries, s.cache_bytes, identity=backend.identity())
        app.state.backend = backend
        app.state.batcher = Batcher(backend, cache, slice_queries=s.slice_queries, overlap=s.overlap)
        app.state.batcher.start()
        app.state.latency = DurationWindow()
        app.state.loop_lag = LoopLagMonitor()
        app.state.loop_lag.start()
        app.state.parse_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parse")
        log.info("retrieval service ready: %s", backend.describe())
        try:
            yield
        finally:
            await app.state.loop_lag.stop()
            await app.state.batcher.stop()
            app.state.parse_pool.shutdown(wait=True)

    return lifespan


def _stats(state) -> dict[str, Any]:
    """The service's counters: the batcher's, the latency of ``/retrieve`` and the event loop's lag."""
    return {
        **state.batcher.stats(),
        "latency_ms": state.latency.summary(),
        "loop_lag_ms": state.loop_lag.lag.summary(),
    }


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:  # 404, 405: JSON too
    """The JSON answer to an HTTP error of the framework."""
    return _error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")


async def _unexpected(request: Request, exc: Exception) -> Response:  # JSON, never plain text
    """The JSON answer to an unexpected error (logged)."""
    log.exception("unexpected error answering %s %s", request.method, request.url.path)
    return _error(500, f"internal error: {type(exc).__name__}")


# the routes have no docstring: FastAPI would publish it as their OpenAPI description


async def _health(request: Request) -> Response:  # GET /health: the backend's description and counters
    state = request.app.state
    return _json({"status": "ok", "pid": os.getpid(), **state.backend.describe(), "stats": _stats(state)})


async def _stats_endpoint(request: Request) -> Response:  # GET /stats: the service's counters
    return _json(_stats(request.app.state))


async def _retrieve(request: Request, parse_off_loop_bytes: int | None) -> Response:
    """``POST /retrieve``: read, check and answer one search request."""
    state = request.app.state
    backend = state.backend
    try:
        raw = await read_limited(
            request.stream(), backend.settings.max_body_bytes, request.headers.get("content-length")
        )
    except BadSearchRequestError as exc:
        return _error(exc.status, str(exc))
    except ClientDisconnect:  # the client left, or its body timed out (already answered)
        return Response(status_code=400)
    off_loop = parse_off_loop_bytes is not None and len(raw) > parse_off_loop_bytes
    loop = asyncio.get_running_loop()
    try:
        if off_loop:
            queries, topk, initial_k, with_scores = await loop.run_in_executor(
                state.parse_pool, _decode, raw, backend
            )
        else:
            queries, topk, initial_k, with_scores = _decode(raw, backend)
    except BadSearchRequestError as exc:
        return _error(exc.status, str(exc))
    del raw
    started = time.perf_counter()
    try:
        results = await state.batcher.submit(queries, topk, initial_k)
    except SearchFailedError as exc:
        return _error(500, str(exc))
    except ServiceClosingError as exc:
        return _error(503, str(exc))
    if off_loop:
        answer = await loop.run_in_executor(state.parse_pool, _encode, results, with_scores)
    else:
        answer = _encode(results, with_scores)
    state.latency.add(time.perf_counter() - started)
    return answer


def create_app(
    load_backend: Callable[[], Any],
    *,
    parse_off_loop_bytes: int | None = PARSE_OFF_LOOP_BYTES,
    warmed: bool = False,
) -> FastAPI:
    """Build the app; ``load_backend()`` runs at start-up (lifespan) and returns the backend.

    Args:
        load_backend: returns an object with ``candidates``, ``rerank``, ``check_request``,
            ``describe``, ``identity``, ``warm_up`` and ``settings`` (see
            :class:`spader.retrieval.backend.Bm25RerankBackend`).
        parse_off_loop_bytes: bodies larger than this are decoded, checked and answered on the
            parse thread; ``None`` does everything on the event loop (the earlier behaviour, kept
            for the benchmark's side-by-side).
        warmed: the backend is warmed up already (:func:`spader.retrieval.service.serve` loads
            and warms it before the server starts).
    """
    app = FastAPI(title="spader retrieval", lifespan=_lifespan(load_backend, warmed))
    app.add_middleware(_Framing)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    # the routes keep their names (the OpenAPI operation ids and summaries derive from them)
    app.add_api_route("/health", _health, methods=["GET"], name="health")
    app.add_api_route("/stats", _stats_endpoint, methods=["GET"], name="stats_endpoint")

    async def retrieve(request: Request) -> Response:
        return await _retrieve(request, parse_off_loop_bytes)

    app.add_api_route("/retrieve", retrieve, methods=["POST"])
    return app
