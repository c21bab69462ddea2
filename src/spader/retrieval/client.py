"""Client of the retrieval service, used by the training search tool and by evaluation.

Connection errors, timeouts and 5xx answers are retried with the project's one retry policy
(:func:`spader.infra.retry.retrying`: bounded attempts, capped exponential backoff); 4xx answers
are not, and raise :class:`RetrievalRequestError` carrying the service's message (a bad request
stays bad).

Requests to a loopback address (the service runs inside the job, on 127.0.0.1) never go through
a proxy named in the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``): cluster nodes
often set one for outbound traffic, and a proxy would either fail the local request or see it.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import httpx

from spader.infra.retry import retrying
from spader.retrieval.errors import ServiceError

log = logging.getLogger(__name__)

__all__ = ["RetrievalClient", "RetrievalRequestError", "is_loopback"]


class RetrievalRequestError(ServiceError):
    """The service rejected a request (HTTP 4xx); ``status`` and the service's message are kept."""

    def __init__(self, status: int, message: str):
        super().__init__(f"retrieval service rejected the request (HTTP {status}): {message}")
        self.status = status
        self.server_message = message


_CONNECTIONS = 128  # concurrent requests one client sends (rollouts of one process share it)


class _Transient(Exception):
    """A failure worth another attempt (connection error, timeout, 5xx)."""


def is_loopback(url: str) -> bool:
    """Whether ``url`` points at this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = httpx.URL(url).host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RetrievalClient:
    """Blocking client of ``POST /retrieve`` and ``GET /health`` (safe to share between threads).

    Args:
        base_url: ``http://host:port`` of the service.
        timeout: seconds per attempt (connect, read, write).
        retries: further attempts after a transient failure.
        backoff: the n-th retry waits ``backoff * 2**(n-1)`` seconds (at most 30).
    """

    def __init__(self, base_url: str, *, timeout: float, retries: int, backoff: float = 0.5):
        #: requests the client sends at once (its connection pool): callers size their threads by it
        self.connections = _CONNECTIONS
        self.base_url = base_url.rstrip("/")
        self.retries = int(retries)
        self.backoff = float(backoff)
        # trust_env=False for the local service: no proxy (nor .netrc) from the environment.
        # Idle connections are kept (not closed on release above a small keep-alive cap, as
        # httpx's default of 20 does under many threads) and expire before the service's own
        # keep-alive timeout (75 s), so the client never reuses a connection the server closes.
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            trust_env=not is_loopback(base_url),
            limits=httpx.Limits(
                max_connections=self.connections,
                max_keepalive_connections=self.connections,
                keepalive_expiry=60.0,
            ),
        )

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, **kwargs) -> Any:
        def attempt() -> httpx.Response:
            try:
                resp = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise _Transient(f"{type(exc).__name__}: {exc}") from exc
            if resp.status_code >= 500:
                raise _Transient(f"HTTP {resp.status_code}: {_message(resp)}")
            return resp

        policy = retrying(
            retries=self.retries,
            backoff=self.backoff,
            on=(_Transient,),
            what=f"{method} {self.base_url}{path}",
        )
        try:
            resp = policy(attempt)
        except _Transient as exc:
            raise ServiceError(
                f"{method} {self.base_url}{path} failed after {self.retries + 1} attempts: {exc}"
            ) from exc.__cause__
        if resp.status_code >= 400:
            raise RetrievalRequestError(resp.status_code, _message(resp))
        try:
            return resp.json()
        except ValueError:
            raise ServiceError(f"{self.base_url}{path} answered with a body that is not JSON") from None

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
