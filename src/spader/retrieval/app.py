"""The retrieval HTTP service (FastAPI), started by ``python -m spader.retrieval serve``.

Endpoints:

* ``POST /retrieve`` with ``{"queries": [str, ...], "topk": 5, "initial_k": 50, "return_scores": false}``
  (all but ``queries`` optional) answers ``{"result": [[{"id", "title", "text"[, "score"]}, ...], ...]}``,
  one list per query, in order, best passage first.
* ``GET /health`` answers ``{"status": "ok", "index": ..., "documents": ..., ...}`` once the index
  and the reranker are loaded and warmed up.

Bad requests get a JSON ``{"error": message}`` and the service keeps serving: 400 for a body that
is not a JSON object, 413 for too many queries or a query that is too long, 422 for anything else
that is invalid (empty list, empty or non-string query, unknown field, ``topk`` outside
``1..initial_k``).

Concurrent requests are merged: while one batch runs, new requests wait, and the next batch
takes all of them at once (up to ``max_queries_per_request`` queries), so thousands of rollouts
each sending a few queries still get batch search and batched reranking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from spader.retrieval.errors import BadSearchRequestError

log = logging.getLogger(__name__)

__all__ = ["create_app"]

_FIELDS = {"queries", "topk", "initial_k", "return_scores"}


@dataclass
class _Job:
    queries: list[str]
    topk: int
    initial_k: int
    future: asyncio.Future


class _Batcher:
    """Runs backend searches one batch at a time on one worker thread, merging waiting requests."""

    def __init__(self, backend, max_queries: int):
        self.backend = backend
        self.max_queries = max_queries
        self._pending: deque[_Job] = deque()
        self._wake = asyncio.Event()
        # One thread: the JVM searcher and the tokenizer are used by one caller at a time.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, queries: list[str], topk: int, initial_k: int) -> list[list[Any]]:
        job = _Job(queries, topk, initial_k, asyncio.get_running_loop().create_future())
        self._pending.append(job)
        self._wake.set()
        return await job.future

    def _take_group(self) -> list[_Job]:
        first = self._pending.popleft()
        group, size, later = [first], len(first.queries), deque()
        while self._pending:
            job = self._pending.popleft()
            if job.initial_k == first.initial_k and size + len(job.queries) <= self.max_queries:
                group.append(job)
                size += len(job.queries)
            else:
                later.append(job)
        self._pending.extendleft(reversed(later))
        return group

    def _run(self, group: list[_Job]) -> list[list[list[Any]]]:
        queries = [q for job in group for q in job.queries]
        ranked = self.backend.search(queries, topk=max(j.topk for j in group), initial_k=group[0].initial_k)
        out, start = [], 0
        for job in group:
            out.append([hits[: job.topk] for hits in ranked[start : start + len(job.queries)]])
            start += len(job.queries)
        return out

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                group = self._take_group()
                try:
                    results = await loop.run_in_executor(self._executor, self._run, group)
                except Exception as exc:  # every waiting request learns about it (HTTP 500)
                    log.exception("search of %d queries failed", sum(len(j.queries) for j in group))
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(exc)
                    continue
                for job, result in zip(group, results, strict=True):
                    if not job.future.done():  # the client may have gone away
                        job.future.set_result(result)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(load_backend: Callable[[], Any]) -> FastAPI:
    """Build the app; ``load_backend()`` runs at start-up (lifespan) and returns the backend.

    Args:
        load_backend: returns an object with ``search``, ``check_request``, ``describe``,
            ``warm_up`` and ``settings`` (see :class:`spader.retrieval.backend.Bm25RerankBackend`).
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        backend = await asyncio.to_thread(load_backend)
        await asyncio.to_thread(backend.warm_up)
        app.state.backend = backend
        app.state.batcher = _Batcher(backend, backend.settings.max_queries_per_request)
        app.state.batcher.start()
        log.info("retrieval service ready: %s", backend.describe())
        try:
            yield
        finally:
            await app.state.batcher.stop()

    app = FastAPI(title="spader retrieval", lifespan=lifespan)

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        return {"status": "ok", **request.app.state.backend.describe()}

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object with a 'queries' list")
        unknown = sorted(set(body) - _FIELDS)
        if unknown:
            return _error(
                422, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_FIELDS))}"
            )
        with_scores = body.get("return_scores", False)
        if not isinstance(with_scores, bool):
            return _error(422, f"'return_scores' must be true or false, got {with_scores!r}")
        state = request.app.state
        try:
            queries, topk, initial_k = state.backend.check_request(
                body.get("queries"), body.get("topk"), body.get("initial_k")
            )
        except BadSearchRequestError as exc:
            return _error(exc.status, str(exc))
        try:
            results = await state.batcher.submit(queries, topk, initial_k)
        except Exception as exc:  # noqa: BLE001  answered as a JSON 500
            return _error(500, f"search failed: {type(exc).__name__}: {exc}")
        payload = {"result": [[p.to_dict(with_scores) for p in hits] for hits in results]}
        return Response(json.dumps(payload, ensure_ascii=False), media_type="application/json")

    return app
