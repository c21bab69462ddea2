"""The search backend behind the service: BM25 top-``initial_k`` -> cross-encoder -> top-``topk``.

It knows nothing about HTTP (:mod:`spader.retrieval.app` does). :class:`SearchSettings` is the
validated form of ``config["retrieval"]`` (plus the resolved reranker path the rules add).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from spader.config.model import MAX_INITIAL_K, RetrievalConfig, ServiceConfig
from spader.retrieval.corpus import Passage
from spader.retrieval.errors import BadSearchRequestError, IndexUnavailableError
from spader.retrieval.replicas import parse_devices

log = logging.getLogger(__name__)

__all__ = ["MAX_INITIAL_K", "Bm25RerankBackend", "SearchSettings"]


@dataclass(frozen=True)
class SearchSettings:
    """The ``retrieval`` section flattened for the search backend and its service, built by
    :meth:`from_config` only (the configuration model, ``spader.config.RetrievalConfig``, holds
    every default and description). Each field is the key of that section named beside it:
    ``k1``, ``b``: ``bm25.*``; ``initial_k``, ``topk``; ``reranker``: ``reranker.model`` (or the
    resolved local directory the rules add as ``reranker.path``; None: no reranking);
    ``rerank_batch_size``, ``rerank_max_length``, ``rerank_max_batch_tokens``, ``fp16``,
    ``devices``: ``reranker.batch_size``, ``.max_length``, ``.max_batch_tokens``, ``.fp16``,
    ``.devices``; the others: ``service.<field>``.
    """

    k1: float
    b: float
    initial_k: int
    topk: int
    reranker: str | None
    rerank_batch_size: int
    rerank_max_length: int
    rerank_max_batch_tokens: int | None
    fp16: bool
    host: str
    max_queries_per_request: int
    max_query_chars: int
    startup_timeout_s: float
    request_timeout_s: float
    retries: int
    devices: tuple[str, ...] | None
    cache_entries: int
    cache_bytes: int
    slice_queries: int
    overlap: bool
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int

    def __post_init__(self):
        if not 1 <= self.topk <= self.initial_k <= MAX_INITIAL_K:
            raise ValueError(
                f"retrieval settings need 1 <= topk ({self.topk}) <= initial_k ({self.initial_k}) "
                f"<= {MAX_INITIAL_K}"
            )
        for name in (
            "rerank_batch_size",
            "rerank_max_length",
            "max_queries_per_request",
            "max_query_chars",
            "slice_queries",
            "max_connections",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"retrieval setting {name} must be >= 1, got {getattr(self, name)}")
        for name in ("cache_entries", "cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"retrieval setting {name} must be >= 0, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"retrieval setting {name} must be > 0, got {getattr(self, name)}")
        if self.rerank_max_batch_tokens is not None and self.rerank_max_batch_tokens < 1:
            raise ValueError(
                f"retrieval setting rerank_max_batch_tokens must be >= 1, got {self.rerank_max_batch_tokens}"
            )
        if self.devices is not None:
            object.__setattr__(self, "devices", parse_devices(self.devices))

    @property
    def max_body_bytes(self) -> int:
        """Largest request body accepted: the largest valid request with every character sent as
        an escaped surrogate pair (12 bytes), plus room for the other fields."""
        return 65536 + self.max_queries_per_request * (12 * self.max_query_chars + 8)

    @classmethod
    def from_config(cls, settings: RetrievalConfig | Mapping[str, Any]) -> SearchSettings:
        """Build from the ``retrieval`` section: typed, or as the rules pass it (``params.retrieval``
        plus the operational keys, validated here; a key it lacks takes the section's default).

        The reranker is ``settings["reranker"]["path"]`` (the resolved local directory) when the
        rules set it, else ``reranker.model``; ``null``/``"none"`` switches it off.
        """
        path = None
        if not isinstance(settings, RetrievalConfig):
            raw = dict(settings)
            reranker = dict(raw.get("reranker") or {})
            path = reranker.pop("path", None)
            settings = RetrievalConfig.model_validate({**raw, "reranker": reranker})
        rr, service = settings.reranker, settings.service
        model = path or rr.model
        return cls(
            k1=settings.bm25.k1,
            b=settings.bm25.b,
            initial_k=settings.initial_k,
            topk=settings.topk,
            reranker=None if model in (None, "none") else str(model),
            rerank_batch_size=rr.batch_size,
            rerank_max_length=rr.max_length,
            rerank_max_batch_tokens=rr.max_batch_tokens,
            fp16=rr.fp16,
            devices=rr.devices if rr.devices is None or isinstance(rr.devices, str) else tuple(rr.devices),
            **{f.name: getattr(service, f.name) for f in fields(cls) if f.name in ServiceConfig.model_fields},
        )


class Bm25RerankBackend:
    """BM25 candidates for many queries in one batch search, reranked in one batched pass.

    The two stages are also callable apart (:meth:`candidates`, :meth:`rerank`), so the service
    can run BM25 of one slice while the reranker works on the previous one.

    Args:
        index_dir: the Lucene index (checked on load; see :func:`spader.retrieval.index.verify_index`).
        settings: search settings; ``settings.reranker`` ``None`` means BM25 order and scores.
        threads: Java search threads and torch CPU threads.
        devices: reranker devices, one replica each (default ``settings.devices``, else the first
            GPU, else CPU).
    """

    def __init__(
        self,
        index_dir: str | os.PathLike,
        settings: SearchSettings,
        *,
        threads: int = 1,
        devices: str | list[str] | tuple[str, ...] | None = None,
    ):
        from spader.retrieval.searcher import Bm25Searcher

        self.settings = settings
        self.index_dir = str(index_dir)
        # Lucene refuses a query of more than 1,024 clauses (distinct terms) and Anserini's batch
        # search then fails for every query of the batch; a query of n characters has at most n
        # terms, so lifting the limit to max_query_chars makes every accepted query searchable.
        self.searcher = Bm25Searcher(
            index_dir, k1=settings.k1, b=settings.b, threads=threads, max_clauses=settings.max_query_chars
        )
        self.reranker = None
        self.pairs_reranked = 0
        self.gpu_memory_mib: dict[str, float] = {}
        if settings.reranker is not None:
            from spader.retrieval.replicas import RerankerReplicas

            self.reranker = RerankerReplicas(
                settings.reranker,
                parse_devices(devices if devices is not None else settings.devices),
                batch_size=settings.rerank_batch_size,
                max_length=settings.rerank_max_length,
                fp16=settings.fp16,
                threads=threads,
                max_batch_tokens=settings.rerank_max_batch_tokens,
            )

    def identity(self) -> tuple:
        """What the results depend on besides the request: index, BM25 and reranker settings.

        Part of every cache key, so a cached result never answers for another index or model.
        """
        s, info = self.settings, self.searcher.info
        reranker = None
        if self.reranker is not None:
            reranker = (s.reranker, s.rerank_max_length, s.fp16, self.reranker.device)
        return (self.index_dir, info["documents"], info.get("generation"), s.k1, s.b, reranker)

    def warm_up(self) -> None:
        """Throw-away searches through the whole pipeline (JIT, first CUDA kernels); the probe
        query, built from a stored document, must find it.

        Raises:
            IndexUnavailableError: the probe failed; the message names the index.
        """
        self.searcher.warm_up(self.settings.initial_k)
        try:
            self.searcher.probe()
            self.search(["warm up query"], topk=self.settings.topk, initial_k=self.settings.initial_k)
            if self.reranker is not None:
                self.gpu_memory_mib = self.reranker.reserve_peak()
        except IndexUnavailableError:
            raise
        except Exception as exc:  # a Java or torch error: the service must not start
            raise IndexUnavailableError(
                f"start-up probe search on BM25 index {self.index_dir} failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.pairs_reranked = 0

    def describe(self) -> dict[str, Any]:
        """What ``/health`` reports."""
        s = self.settings
        return {
            "index": self.index_dir,
            "documents": self.searcher.num_docs,
            "reranker": s.reranker,
            "reranker_device": self.reranker.device if self.reranker else None,
            "reranker_replicas": len(self.reranker.replicas) if self.reranker else 0,
            "reranker_gpu_mib": self.gpu_memory_mib,
            "initial_k": s.initial_k,
            "topk": s.topk,
            "max_queries_per_request": s.max_queries_per_request,
            "slice_queries": s.slice_queries,
            "overlap": s.overlap,
        }

    def check_request(
        self, queries: Any, topk: int | None, initial_k: int | None
    ) -> tuple[list[str], int, int]:
        """Validate a request; returns ``(queries, topk, initial_k)`` with defaults filled in.

        Raises:
            BadSearchRequestError: with the status the service answers (413 too large, 422 invalid).
        """
        s = self.settings
        if not isinstance(queries, list) or not queries:
            raise BadSearchRequestError("'queries' must be a non-empty list of strings")
        if len(queries) > s.max_queries_per_request:
            raise BadSearchRequestError(
                f"{len(queries)} queries in one request; the limit is {s.max_queries_per_request}", status=413
            )
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                raise BadSearchRequestError(f"queries[{i}] must be a string, got {type(q).__name__}")
            if not q.strip():
                raise BadSearchRequestError(f"queries[{i}] is empty")
            if len(q) > s.max_query_chars:
                raise BadSearchRequestError(
                    f"queries[{i}] has {len(q)} characters; the limit is {s.max_query_chars}", status=413
                )
            try:  # a lone surrogate (JSON "\ud800") decodes to a str that no encoder accepts
                q.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BadSearchRequestError(
                    f"queries[{i}] cannot be encoded as UTF-8: {exc.reason} "
                    f"({q[exc.start]!a} at character {exc.start})"
                ) from None
        initial_k = s.initial_k if initial_k is None else initial_k
        topk = s.topk if topk is None else topk
        for name, value in (("topk", topk), ("initial_k", initial_k)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadSearchRequestError(f"'{name}' must be an integer, got {value!r:.60}")
        if not 1 <= initial_k <= MAX_INITIAL_K:
            raise BadSearchRequestError(f"'initial_k' must be between 1 and {MAX_INITIAL_K}, got {initial_k}")
        if not 1 <= topk <= initial_k:
            raise BadSearchRequestError(f"'topk' must be between 1 and initial_k ({initial_k}), got {topk}")
        return queries, topk, initial_k

    def candidates(self, queries: list[str], *, topk: int, initial_k: int) -> list[list[Passage]]:
        """The BM25 stage: top-``initial_k`` per query (top-``topk`` without a reranker).

        Args:
            queries: distinct, validated query strings.
            topk: passages per query in the end.
            initial_k: BM25 candidates per query for the reranker.

        Returns:
            One list of :class:`Passage` (BM25 scores) per query.
        """
        return self.searcher.search(queries, initial_k if self.reranker is not None else topk)

    def rerank(
        self, queries: list[str], candidates: list[list[Passage]], *, topk: int
    ) -> list[list[Passage]]:
        """The reranking stage: score every (query, candidate) pair in one batched pass.

        Args:
            queries: the queries of :meth:`candidates`.
            candidates: its result.
            topk: passages kept per query.

        Returns:
            The ``topk`` best candidates per query (ties: BM25 order), with reranker scores; the
            BM25 top-``topk`` without a reranker.
        """
        if self.reranker is None:
            return [hits[:topk] for hits in candidates]
        pairs = [
            (q, f"{p.title} {p.text}") for q, hits in zip(queries, candidates, strict=True) for p in hits
        ]
        scores = self.reranker.score(pairs).tolist()
        self.pairs_reranked += len(pairs)
        ranked, start = [], 0
        for hits in candidates:
            own = scores[start : start + len(hits)]
            start += len(hits)
            order = sorted(range(len(hits)), key=lambda i: -own[i])  # stable: BM25 order on ties
            ranked.append([Passage(hits[i].id, hits[i].title, hits[i].text, own[i]) for i in order[:topk]])
        return ranked

    def search(self, queries: list[str], *, topk: int, initial_k: int) -> list[list[Passage]]:
        """Top-``topk`` passages per query, in query order (both stages; identical queries once).

        Args:
            queries: validated query strings.
            topk: passages per query.
            initial_k: BM25 candidates per query (ignored without a reranker).

        Returns:
            One list of :class:`Passage` per query.
        """
        unique = list(dict.fromkeys(queries))
        ranked = self.rerank(unique, self.candidates(unique, topk=topk, initial_k=initial_k), topk=topk)
        by_query = dict(zip(unique, ranked, strict=True))
        return [by_query[q] for q in queries]
