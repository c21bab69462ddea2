"""The agent loop's search function over the retrieval service (``spader.retrieval.client``).

It takes care of what the service would reject: queries longer than the service accepts are cut
to ``max_query_chars`` (a hostile 10,000-character query still searches), blank queries get no
passages without a request (the service rejects them), repeated queries of one turn are sent once, and large turns are split into requests of at most
``max_queries_per_request``. A service failure (after the client's own retries) raises: the
evaluation must not score episodes against a dead search engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger(__name__)

__all__ = ["RetrievalSearch"]


class RetrievalSearch:
    """Callable ``search(queries) -> passages per query`` for :func:`spader.agent.loop.run_episodes`.

    Args:
        client: an object with ``retrieve(queries, topk=None) -> list[list[dict]]``
            (``spader.retrieval.client.RetrievalClient``).
        topk: passages per query (``retrieval.topk``).
        max_query_chars: longest query the service accepts (``retrieval.service.max_query_chars``).
        max_queries_per_request: largest batch the service accepts.
    """

    def __init__(self, client, *, topk: int, max_query_chars: int = 1000, max_queries_per_request: int = 512):
        self.client = client
        self.topk = int(topk)
        self.max_query_chars = int(max_query_chars)
        self.max_queries_per_request = int(max_queries_per_request)
        self.requests = 0
        self.queries_sent = 0

    def __call__(self, queries: Sequence[str]) -> list[list[dict]]:
        cut = [q.strip()[: self.max_query_chars] for q in queries]
        unique = list(dict.fromkeys(q for q in cut if q))
        found: dict[str, list[dict]] = {"": []}
        for start in range(0, len(unique), self.max_queries_per_request):
            chunk = unique[start : start + self.max_queries_per_request]
            results = self.client.retrieve(chunk, topk=self.topk)
            if len(results) != len(chunk):
                raise RuntimeError(
                    f"retrieval service returned {len(results)} result lists for {len(chunk)} queries"
                )
            found.update(zip(chunk, results, strict=True))
            self.requests += 1
            self.queries_sent += len(chunk)
        if len(cut) != len(unique):
            log.debug("%d repeated queries of this turn searched once", len(cut) - len(unique))
        return [found[q] for q in cut]
