"""Client of the retrieval service, used by the training search tool and by evaluation.

Connection errors, timeouts and 5xx answers are retried (a bounded number of times, with
exponential backoff); 4xx answers are not, and raise :class:`RetrievalRequestError` carrying the
service's message (a bad request stays bad).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from spader.retrieval.errors import ServiceError

log = logging.getLogger(__name__)

__all__ = ["RetrievalClient", "RetrievalRequestError"]


class RetrievalRequestError(ServiceError):
    """The service rejected a request (HTTP 4xx); ``status`` and the service's message are kept."""

    def __init__(self, status: int, message: str):
        super().__init__(f"retrieval service rejected the request (HTTP {status}): {message}")
        self.status = status
        self.server_message = message


class RetrievalClient:
    """Blocking client of ``POST /retrieve`` and ``GET /health`` (safe to share between threads).

    Args:
        base_url: ``http://host:port`` of the service.
        timeout: seconds per attempt (connect, read, write).
        retries: further attempts after a transient failure.
        backoff: the n-th retry waits ``backoff * 2**n`` seconds (at most 30).
    """

    def __init__(self, base_url: str, *, timeout: float, retries: int, backoff: float = 0.5):
        self.base_url = base_url.rstrip("/")
        self.retries = int(retries)
        self.backoff = float(backoff)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, **kwargs) -> Any:
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                wait = min(30.0, self.backoff * 2 ** (attempt - 1))
                log.warning(
                    "%s %s%s failed (%s); retry %d/%d in %.1f s",
                    method,
                    self.base_url,
                    path,
                    last,
                    attempt,
                    self.retries,
                    wait,
                )
                time.sleep(wait)
            try:
                resp = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {_message(resp)}"
                continue
            if resp.status_code >= 400:
                raise RetrievalRequestError(resp.status_code, _message(resp))
            try:
                return resp.json()
            except ValueError:
                raise ServiceError(f"{self.base_url}{path} answered with a body that is not JSON") from None
        raise ServiceError(f"{method} {self.base_url}{path} failed after {self.retries + 1} attempts: {last}")

    def health(self) -> dict[str, Any]:
        """The service's ``/health`` answer (index, documents, reranker, ...)."""
        return self._request("GET", "/health")

    def retrieve(
        self, queries: list[str], topk: int | None = None, initial_k: int | None = None
    ) -> list[list[dict]]:
        """Search many queries in one request.

        Args:
            queries: query strings (the service rejects empty ones and too many).
            topk: passages per query (service default when ``None``).
            initial_k: BM25 candidates per query before reranking (service default when ``None``).

        Returns:
            Per query, in order, passages ``{"id", "title", "text", "score"}``, best first.
        """
        body: dict[str, Any] = {"queries": list(queries), "return_scores": True}
        if topk is not None:
            body["topk"] = topk
        if initial_k is not None:
            body["initial_k"] = initial_k
        answer = self._request("POST", "/retrieve", json=body)
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise ServiceError(
                f"{self.base_url}/retrieve answered "
                f"{len(result) if isinstance(result, list) else 'no'} result "
                f"lists for {len(queries)} queries"
            )
        return result


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        return str(body.get("error") or body.get("detail") or body)
    return str(body)[:500]
