"""``retrieval``: BM25, the reranker and the retrieval service."""

from __future__ import annotations

from pydantic import Field, StrictFloat, StrictInt, model_validator

from spader.config.sections.base import MAX_BYTES, MAX_COUNT, MAX_INITIAL_K, MAX_SECONDS, Device, Section

__all__ = [
    "Bm25Config",
    "RerankerConfig",
    "RetrievalConfig",
    "ServiceConfig",
]


class Bm25Config(Section):
    """BM25 parameters."""

    k1: StrictFloat = Field(0.9, ge=0, le=100, description="term-frequency saturation")
    b: StrictFloat = Field(0.4, ge=0, le=1, description="length normalization")


class RerankerConfig(Section):
    """Cross-encoder reranker (FlagEmbedding)."""

    model: str | None = Field(
        "BAAI/bge-reranker-v2-m3",
        description="hub id, local path, tiny:reranker, or null for no reranking",
    )
    revision: str | None = Field(
        None,
        description="hub revision (a commit) the weights are downloaded at, when `model` is a hub id; "
        "null: the main branch",
    )
    batch_size: StrictInt = Field(64, ge=1, le=2**20, description="pairs per forward pass")
    max_length: StrictInt = Field(512, ge=16, le=2**20, description="max tokens per query-passage pair")
    max_batch_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**30,
        description="most tokens per forward pass (pairs x padded length), which bounds activation "
        "memory; null: batch_size x max_length",
    )
    fp16: bool = Field(True, description="half precision on GPU")
    devices: Device | list[Device] | None = Field(
        None,
        description="reranker devices, one replica each (cpu or cuda:<i>); null: every GPU of a "
        "training job, else the first GPU or the CPU",
    )

    @model_validator(mode="after")
    def _tiny_kind(self) -> RerankerConfig:
        if self.model and self.model.startswith("tiny:") and self.model != "tiny:reranker":
            raise ValueError(f"model: tiny rerankers are 'tiny:reranker', got '{self.model}'")
        return self

    @property
    def enabled(self) -> bool:
        """Whether passages are reranked at all."""
        return self.model not in (None, "none")


class ServiceConfig(Section):
    """The retrieval HTTP service started for the jobs that need it."""

    host: str = Field("127.0.0.1", description="bind address")
    max_queries_per_request: StrictInt = Field(512, ge=1, le=2**20, description="largest accepted batch")
    max_query_chars: StrictInt = Field(1000, ge=1, le=2**20, description="longest accepted query")
    startup_timeout_s: StrictFloat = Field(
        1800, ge=1, le=MAX_SECONDS, description="how long to wait for /health"
    )
    request_timeout_s: StrictFloat = Field(
        120, ge=1, le=MAX_SECONDS, description="client timeout per request"
    )
    retries: StrictInt = Field(3, ge=0, le=100, description="client retries on transient errors")
    cache_entries: StrictInt = Field(
        100000, ge=0, le=MAX_COUNT, description="most results the service's LRU cache keeps (0: no cache)"
    )
    cache_bytes: StrictInt = Field(
        268435456,
        ge=0,
        le=MAX_BYTES,
        description="most bytes the cache may hold in memory, keys and passages counted as Python holds them",
    )
    slice_queries: StrictInt = Field(
        64,
        ge=1,
        le=2**20,
        description="queries per search step; larger and merged requests are cut into slices",
    )
    overlap: bool = Field(True, description="BM25 of the next slice while the current one is reranked")
    header_timeout_s: StrictFloat = Field(
        20,
        gt=0,
        le=MAX_SECONDS,
        description="seconds a request's headers may take to arrive; then 408 and the connection is closed",
    )
    body_timeout_s: StrictFloat = Field(
        60,
        gt=0,
        le=MAX_SECONDS,
        description="seconds a request's body may take to arrive after its headers; then 408 and closed",
    )
    max_connections: StrictInt = Field(
        1024,
        ge=1,
        le=2**20,
        description="most open connections; one more is answered 503 (clients retry) and closed",
    )


class RetrievalConfig(Section):
    """The search tool (docs/method.md, "Retrieval")."""

    bm25: Bm25Config = Field(default_factory=Bm25Config, description="BM25 parameters.")
    initial_k: StrictInt = Field(
        50,
        ge=1,
        le=MAX_INITIAL_K,
        description="BM25 candidates per query (reranked; the service's maximum is 1000)",
    )
    topk: StrictInt = Field(5, ge=1, le=MAX_INITIAL_K, description="passages per query after reranking")
    reranker: RerankerConfig = Field(
        default_factory=RerankerConfig, description="Cross-encoder reranker (FlagEmbedding)."
    )
    service: ServiceConfig = Field(
        default_factory=ServiceConfig,
        description="The retrieval HTTP service started for the jobs that need it.",
    )
