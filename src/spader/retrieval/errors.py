"""Typed errors of the retrieval package; the service maps them to HTTP status codes."""

from __future__ import annotations

__all__ = [
    "BadSearchRequestError",
    "IndexBuildError",
    "IndexUnavailableError",
    "RerankerUnavailableError",
    "RetrievalError",
    "ServiceClosingError",
    "ServiceError",
]


class RetrievalError(RuntimeError):
    """Base class of the errors below."""


class IndexUnavailableError(RetrievalError):
    """The BM25 index is missing, unreadable or lacks raw documents (the message names the path)."""


class RerankerUnavailableError(RetrievalError):
    """The reranker cannot be loaded: its directory lacks weights or a tokenizer, a weights file is
    cut short, or the loader failed (the message names the model directory)."""


class IndexBuildError(RetrievalError):
    """Indexing did not produce the index it should have."""


class BadSearchRequestError(RetrievalError, ValueError):
    """A search request is invalid (HTTP 4xx); ``status`` is the code the service answers with."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


class ServiceError(RetrievalError):
    """The retrieval service could not be started, or a request to it failed for good."""


class ServiceClosingError(RetrievalError):
    """The service is shutting down (a stop signal): requests still open are answered 503 with
    this message, and work in progress is abandoned at its next batch."""
