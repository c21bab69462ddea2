"""The service's scheduler: merges concurrent requests, serves repeats from the cache, cuts large
requests into slices, overlaps BM25 with reranking and confines failures to the queries causing them.

Each distinct ``(query, topk, initial_k)`` of a request is either

* a cache hit (answered at once),
* already being computed for another request (the request waits for that result: *coalesced*),
* or new work, queued with its request.

Work is taken in slices of at most ``slice_queries`` queries of one ``initial_k``: requests not yet
started come first, then the rest of requests already partly served, so a 512-query request lets
the small requests that arrive meanwhile through between its slices. A slice runs in two stages on
two threads: BM25 (the JVM searcher, one caller at a time) and reranking (torch; the replicas have
their own threads). With ``overlap`` the BM25 stage of the next slice runs while the current one
is reranked.

When a stage fails, the slice is split in halves by query and each half is computed again, down
to single queries: only the queries that fail alone fail, and only the requests that asked for
them are answered with an error.

:meth:`Batcher.close` (the service received a stop signal) fails every open request at once with
:class:`~spader.retrieval.errors.ServiceClosingError`, refuses new ones, and asks the backend to
abandon the reranking in progress at its next batch, so the service stops in about one batch's
time and no client waits for an answer that will not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from spader.retrieval.cache import ResultCache
from spader.retrieval.errors import ServiceClosingError

log = logging.getLogger(__name__)

__all__ = ["Batcher", "SearchFailedError"]


class SearchFailedError(RuntimeError):
    """The backend failed on one query of a request; ``index`` is its position in the request."""

    def __init__(self, index: int, cause: BaseException):
        super().__init__(f"search failed for queries[{index}]: {type(cause).__name__}: {cause}")
        self.index = index
        self.cause = cause


@dataclass(eq=False)
class _Work:
    key: tuple
    query: str
    topk: int
    initial_k: int
    future: asyncio.Future


@dataclass(eq=False)
class _Job:
    items: list[_Work]
    pos: int = 0


@dataclass
class _Counters:
    requests: int = 0
    queries: int = 0
    coalesced: int = 0
    computed: int = 0
    slices: int = 0
    failed_queries: int = 0
    isolation_runs: int = 0
    bm25_s: float = 0.0  # time in each stage (worker threads), for telling where the time goes
    rerank_s: float = 0.0


class Batcher:
    """Schedules the backend's work for all requests of a service.

    Args:
        backend: :class:`spader.retrieval.backend.Bm25RerankBackend` (or anything with its
            ``candidates``/``rerank``/``pairs_reranked``).
        cache: the service's result cache (``max_entries`` 0: no cache and no sharing of results
            in flight; identical queries inside one slice are still computed once).
        slice_queries: most queries per slice.
        overlap: run BM25 of the next slice while the current one is reranked.
    """

    def __init__(self, backend, cache: ResultCache, *, slice_queries: int, overlap: bool):
        self.backend = backend
        self.cache = cache
        self.slice_queries = int(slice_queries)
        self.overlap = bool(overlap)
        self.counters = _Counters()
        self._fresh: deque[_Job] = deque()
        self._continuing: deque[_Job] = deque()
        self._inflight: dict[tuple, asyncio.Future] = {}
        self._open: set[_Work] = set()  # queued or running, not yet answered
        self._wake = asyncio.Event()
        # One thread per stage: the JVM searcher and each tokenizer have one caller at a time.
        self._search_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bm25")
        self._rerank_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank")
        self._task: asyncio.Task | None = None
        self.closing: str | None = None  # why the service stops, once it does

    def start(self) -> None:
        """Start the scheduling loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def close(self, reason: str) -> None:
        """The service is stopping: answer every open request with :class:`ServiceClosingError`
        now, refuse new ones, and let the backend abandon its reranking at the next batch. Call on
        the event loop's thread."""
        if self.closing is not None:
            return
        self.closing = reason
        error = ServiceClosingError(f"the retrieval service is shutting down ({reason}); retry the request")
        self._fresh.clear()
        self._continuing.clear()
        open_work = list(self._open)
        for w in open_work:
            self._inflight.pop(w.key, None)
            self._open.discard(w)
            if not w.future.done():
                w.future.set_exception(error)
        abort = getattr(self.backend, "abort", None)
        if abort is not None:
            abort()
        if self._task is not None:
            self._task.cancel()
        log.warning("%s: %d open queries answered 503", reason, len(open_work))

    async def stop(self) -> None:
        """Stop the loop; the stage running now finishes first."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._search_pool.shutdown(wait=True)
        self._rerank_pool.shutdown(wait=True)

    def stats(self) -> dict[str, Any]:
        """Counters for ``/stats``: requests, queries, cache, coalesced, computed, pairs reranked,
        seconds spent in each stage."""
        c = self.counters
        return {
            "requests": c.requests,
            "queries": c.queries,
            "cache": self.cache.stats.as_dict(),
            "coalesced": c.coalesced,
            "computed": c.computed,
            "slices": c.slices,
            "pairs_reranked": int(getattr(self.backend, "pairs_reranked", 0)),
            "failed_queries": c.failed_queries,
            "isolation_runs": c.isolation_runs,
            "bm25_s": round(c.bm25_s, 3),
            "rerank_s": round(c.rerank_s, 3),
            "queued_queries": sum(len(j.items) - j.pos for q in (self._fresh, self._continuing) for j in q),
        }

    async def submit(self, queries: list[str], topk: int, initial_k: int) -> list[list[Any]]:
        """The results of one validated request, in query order.

        Raises:
            SearchFailedError: the backend failed on one of the queries (the first one is named).
            ServiceClosingError: the service is shutting down.
        """
        if self.closing is not None:
            raise ServiceClosingError(
                f"the retrieval service is shutting down ({self.closing}); retry the request"
            )
        loop = asyncio.get_running_loop()
        self.counters.requests += 1
        self.counters.queries += len(queries)
        share = self.cache.enabled
        waits: dict[str, Any] = {}
        new: list[_Work] = []
        for q in dict.fromkeys(queries):
            key = self.cache.key(q, topk, initial_k)
            hit = self.cache.get(key) if share else None
            if hit is not None:
                waits[q] = hit
                continue
            running = self._inflight.get(key) if share else None
            if running is not None:
                self.counters.coalesced += 1
                waits[q] = running
                continue
            fut = loop.create_future()
            if share:
                self._inflight[key] = fut
            new.append(_Work(key, q, topk, initial_k, fut))
            waits[q] = fut
        self._open.update(new)
        if new:
            self._fresh.append(_Job(new))
            self._wake.set()
        # shield: a request that goes away must not cancel a result other requests share.
        pending = [asyncio.shield(w) for w in waits.values() if isinstance(w, asyncio.Future)]
        done = iter(await asyncio.gather(*pending, return_exceptions=True))
        results = {q: (next(done) if isinstance(w, asyncio.Future) else w) for q, w in waits.items()}
        for i, q in enumerate(queries):
            if isinstance(results[q], ServiceClosingError):
                raise results[q]
            if isinstance(results[q], BaseException):
                raise SearchFailedError(i, results[q])
        return [results[q] for q in queries]

    # -- scheduling ---------------------------------------------------------------------------

    def _pending(self) -> bool:
        return bool(self._fresh or self._continuing)

    def _take_slice(self) -> list[_Work]:
        """Up to ``slice_queries`` queries of one ``initial_k``: fresh requests first, in order."""
        out: list[_Work] = []
        depth = None
        for queue in (self._fresh, self._continuing):
            skipped: list[_Job] = []
            while queue and len(out) < self.slice_queries:
                job = queue.popleft()
                if depth is None:
                    depth = job.items[0].initial_k
                if job.items[0].initial_k != depth:
                    skipped.append(job)
                    continue
                take = job.items[job.pos : job.pos + self.slice_queries - len(out)]
                job.pos += len(take)
                out.extend(take)
                if job.pos < len(job.items):
                    self._continuing.append(job)
            queue.extendleft(reversed(skipped))
        return out

    async def _loop(self) -> None:
        while self.closing is None:
            try:
                await self._schedule()
            except Exception as exc:  # a bug here must not leave requests waiting forever
                log.exception(
                    "the scheduler failed; failing the %d open queries and restarting", len(self._open)
                )
                self._fresh.clear()
                self._continuing.clear()
                self._fail(list(self._open), exc)

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        prev: tuple[list[_Work], asyncio.Future] | None = None  # the slice being reranked
        while True:
            if not self._pending():
                self._wake.clear()
                if prev is None:
                    await self._wake.wait()
                    continue
                if self.overlap:  # wake up for new requests too: their BM25 can start now
                    waiter = asyncio.ensure_future(self._wake.wait())
                    await asyncio.wait({prev[1], waiter}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if not prev[1].done():
                        continue
                await self._finish(*prev)
                prev = None
                continue
            if prev is not None and not self.overlap:
                await self._finish(*prev)
                prev = None
                continue
            items = self._take_slice()
            self.counters.slices += 1
            stage1 = loop.run_in_executor(self._search_pool, self._bm25, items)
            if prev is not None:  # reranks while BM25 of `items` runs
                await self._finish(*prev)
                prev = None
            try:
                texts, topk, candidates = await stage1
            except Exception as exc:
                log.exception(
                    "BM25 of a slice of %d queries failed; isolating the failing queries", len(items)
                )
                await self._isolate(items, exc)
                continue
            prev = (items, loop.run_in_executor(self._rerank_pool, self._rerank, texts, topk, candidates))

    # -- the two stages (worker threads) ------------------------------------------------------

    def _bm25(self, items: list[_Work]) -> tuple[list[str], int, list]:
        started = time.perf_counter()
        texts = list(dict.fromkeys(w.query for w in items))
        topk = max(w.topk for w in items)  # rankings are prefixes of one another: cut per request
        try:
            return texts, topk, self.backend.candidates(texts, topk=topk, initial_k=items[0].initial_k)
        finally:
            self.counters.bm25_s += time.perf_counter() - started

    def _rerank(self, texts: list[str], topk: int, candidates: list) -> dict[str, list]:
        started = time.perf_counter()
        try:
            return dict(zip(texts, self.backend.rerank(texts, candidates, topk=topk), strict=True))
        finally:
            self.counters.rerank_s += time.perf_counter() - started

    # -- results and failures -----------------------------------------------------------------

    async def _finish(self, items: list[_Work], reranking: asyncio.Future) -> None:
        try:
            ranked = await reranking
        except ServiceClosingError:
            return  # closing: close() answered the requests
        except Exception as exc:
            log.exception("reranking a slice of %d queries failed; isolating the failing queries", len(items))
            await self._isolate(items, exc)
            return
        self._deliver(items, ranked)

    def _deliver(self, items: list[_Work], ranked: dict[str, list]) -> None:
        for w in items:
            result = ranked[w.query][: w.topk]
            self.counters.computed += 1
            self.cache.put(w.key, result)
            self._inflight.pop(w.key, None)
            self._open.discard(w)
            if not w.future.done():
                w.future.set_result(result)

    def _fail(self, items: list[_Work], exc: BaseException) -> None:
        for w in items:
            self.counters.failed_queries += 1
            self._inflight.pop(w.key, None)
            self._open.discard(w)
            if not w.future.done():
                w.future.set_exception(exc)

    async def _isolate(self, items: list[_Work], exc: BaseException) -> None:
        """``items`` failed together with ``exc``: compute them again in halves (by query text),
        down to single queries, which then fail alone."""
        if self.closing is not None:
            return  # close() answered the requests; nothing is computed again
        loop = asyncio.get_running_loop()
        texts = list(dict.fromkeys(w.query for w in items))
        if len(texts) == 1:
            log.warning("query %a failed: %s: %s", texts[0][:80], type(exc).__name__, exc)
            self._fail(items, exc)
            return
        self.counters.isolation_runs += 1
        half = set(texts[: len(texts) // 2])
        for part in ([w for w in items if w.query in half], [w for w in items if w.query not in half]):
            try:
                part_texts, topk, candidates = await loop.run_in_executor(self._search_pool, self._bm25, part)
                ranked = await loop.run_in_executor(
                    self._rerank_pool, self._rerank, part_texts, topk, candidates
                )
            except Exception as part_exc:  # noqa: BLE001  any failure is bisected further
                await self._isolate(part, part_exc)
                continue
            self._deliver(part, ranked)
