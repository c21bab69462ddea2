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

from spader.retrieval.corpus import Passage
from spader.retrieval.errors import BadSearchRequestError

log = logging.getLogger(__name__)

__all__ = ["MAX_INITIAL_K", "Bm25RerankBackend", "SearchSettings"]

# BM25 candidates per query a request may ask for; reranking cost grows linearly with it.
MAX_INITIAL_K = 1000


@dataclass(frozen=True)
class SearchSettings:
    """Search and service settings (``config["retrieval"]``, flattened).

    Attributes:
        k1, b: BM25 parameters.
        initial_k: BM25 candidates per query (reranked).
        topk: passages returned per query.
        reranker: hub id or local directory of the cross-encoder; ``None`` turns reranking off.
        rerank_batch_size: pairs per forward pass.
        rerank_max_length: tokens per (query, passage) pair.
        fp16: half precision on GPU.
        host: bind address of the service.
        max_queries_per_request: largest accepted batch.
        max_query_chars: longest accepted query.
        startup_timeout_s: how long :func:`~spader.retrieval.service.running_service` waits for health.
        request_timeout_s: client timeout per request.
        retries: client retries on transient errors.
    """

    k1: float = 0.9
    b: float = 0.4
    initial_k: int = 50
    topk: int = 5
    reranker: str | None = None
    rerank_batch_size: int = 64
    rerank_max_length: int = 512
    fp16: bool = True
    host: str = "127.0.0.1"
    max_queries_per_request: int = 512
    max_query_chars: int = 1000
    startup_timeout_s: float = 1800.0
    request_timeout_s: float = 120.0
    retries: int = 3

    def __post_init__(self):
        if not 1 <= self.topk <= self.initial_k <= MAX_INITIAL_K:
            raise ValueError(
                f"retrieval settings need 1 <= topk ({self.topk}) <= initial_k ({self.initial_k}) "
                f"<= {MAX_INITIAL_K}"
            )
        for name in ("rerank_batch_size", "rerank_max_length", "max_queries_per_request", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"retrieval setting {name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_config(cls, settings: Mapping[str, Any]) -> SearchSettings:
        """Build from ``config["retrieval"]`` as the rules pass it (``params.retrieval``).

        The reranker is ``settings["reranker"]["path"]`` (the resolved local directory) when the
        rules set it, else ``settings["reranker"]["model"]``; ``null``/``"none"`` switches it off.
        """
        rr = dict(settings.get("reranker") or {})
        service = dict(settings.get("service") or {})
        bm25 = dict(settings.get("bm25") or {})
        model = rr.get("path") or rr.get("model")
        known = {f.name for f in fields(cls)}
        values = {
            "k1": bm25.get("k1"),
            "b": bm25.get("b"),
            "initial_k": settings.get("initial_k"),
            "topk": settings.get("topk"),
            "reranker": None if model in (None, "none") else str(model),
            "rerank_batch_size": rr.get("batch_size"),
            "rerank_max_length": rr.get("max_length"),
            "fp16": rr.get("fp16"),
            **{k: v for k, v in service.items() if k in known},
        }
        return cls(**{k: v for k, v in values.items() if v is not None or k == "reranker"})


class Bm25RerankBackend:
    """BM25 candidates for many queries in one batch search, reranked in one batched pass.

    Args:
        index_dir: the Lucene index (checked on load; see :func:`spader.retrieval.index.verify_index`).
        settings: search settings; ``settings.reranker`` ``None`` means BM25 order and scores.
        threads: Java search threads and torch CPU threads.
        device: reranker device (default: first GPU, else CPU).
    """

    def __init__(
        self,
        index_dir: str | os.PathLike,
        settings: SearchSettings,
        *,
        threads: int = 1,
        device: str | None = None,
    ):
        from spader.retrieval.searcher import Bm25Searcher

        self.settings = settings
        self.index_dir = str(index_dir)
        self.searcher = Bm25Searcher(index_dir, k1=settings.k1, b=settings.b, threads=threads)
        self.reranker = None
        if settings.reranker is not None:
            import torch

            from spader.retrieval.reranker import CrossEncoderReranker

            torch.set_num_threads(max(1, threads))
            self.reranker = CrossEncoderReranker(
                settings.reranker,
                batch_size=settings.rerank_batch_size,
                max_length=settings.rerank_max_length,
                fp16=settings.fp16,
                device=device,
            )

    def warm_up(self) -> None:
        """One throw-away search through the whole pipeline (JIT, first CUDA kernels)."""
        self.searcher.warm_up(self.settings.initial_k)
        self.search(["warm up query"], topk=self.settings.topk, initial_k=self.settings.initial_k)

    def describe(self) -> dict[str, Any]:
        """What ``/health`` reports."""
        return {
            "index": self.index_dir,
            "documents": self.searcher.num_docs,
            "reranker": self.settings.reranker,
            "reranker_device": self.reranker.device if self.reranker else None,
            "initial_k": self.settings.initial_k,
            "topk": self.settings.topk,
            "max_queries_per_request": self.settings.max_queries_per_request,
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
        initial_k = s.initial_k if initial_k is None else initial_k
        topk = s.topk if topk is None else topk
        for name, value in (("topk", topk), ("initial_k", initial_k)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadSearchRequestError(f"'{name}' must be an integer, got {value!r}")
        if not 1 <= initial_k <= MAX_INITIAL_K:
            raise BadSearchRequestError(f"'initial_k' must be between 1 and {MAX_INITIAL_K}, got {initial_k}")
        if not 1 <= topk <= initial_k:
            raise BadSearchRequestError(f"'topk' must be between 1 and initial_k ({initial_k}), got {topk}")
        return queries, topk, initial_k

    def search(self, queries: list[str], *, topk: int, initial_k: int) -> list[list[Passage]]:
        """Top-``topk`` passages per query, in query order.

        Identical queries are searched once. Without a reranker the BM25 top-``topk`` comes back
        with BM25 scores; with one, the BM25 top-``initial_k`` of every query are scored in one
        batched pass and the ``topk`` best (ties: BM25 order) are kept, with reranker scores.

        Args:
            queries: validated query strings.
            topk: passages per query.
            initial_k: BM25 candidates per query (ignored without a reranker).

        Returns:
            One list of :class:`Passage` per query.
        """
        unique = list(dict.fromkeys(queries))
        if self.reranker is None:
            ranked = self.searcher.search(unique, topk)
        else:
            candidates = self.searcher.search(unique, initial_k)
            pairs = [
                (q, f"{p.title} {p.text}") for q, hits in zip(unique, candidates, strict=True) for p in hits
            ]
            scores = self.reranker.score(pairs).tolist()
            ranked, start = [], 0
            for hits in candidates:
                own = scores[start : start + len(hits)]
                start += len(hits)
                order = sorted(range(len(hits)), key=lambda i: -own[i])  # stable: BM25 order on ties
                ranked.append(
                    [Passage(hits[i].id, hits[i].title, hits[i].text, own[i]) for i in order[:topk]]
                )
        by_query = dict(zip(unique, ranked, strict=True))
        return [by_query[q] for q in queries]
