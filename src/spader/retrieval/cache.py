"""A bounded LRU cache of search results, shared by every request of one service's lifetime.

Rollouts of one prompt often send the same query (the first turn tends to repeat the question),
so a training step asks for far fewer distinct results than it sends queries. Each distinct
``(query, topk, initial_k)`` is computed once; later requests get the stored passages. The cache
is bounded twice: by entries and by an estimate of the bytes its passages hold, evicting the least
recently used entry first. The key also carries the identity of the index and the reranker (and
their settings), so entries can never answer for another index or model.

The service calls it from its event loop only; a lock still guards it so that tests and the
benchmark may share one across threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CacheStats", "ResultCache", "passages_nbytes"]

# Rough per-object overhead of a cached passage (the Passage object, its four attribute slots and
# the string headers) on CPython, added to the UTF-8 size of its strings.
_PASSAGE_OVERHEAD = 200
_ENTRY_OVERHEAD = 250


def passages_nbytes(passages: Sequence[Any]) -> int:
    """Estimated memory held by one cached result: its strings plus fixed per-object overhead.

    Args:
        passages: objects with ``id``, ``title`` and ``text`` strings.

    Returns:
        An estimate in bytes (strings counted at one byte per character: exact for ASCII text,
        an underestimate of at most 4x otherwise, which the overhead terms partly absorb).
    """
    return _ENTRY_OVERHEAD + sum(_PASSAGE_OVERHEAD + len(p.id) + len(p.title) + len(p.text) for p in passages)


@dataclass
class CacheStats:
    """Counters of a :class:`ResultCache` (what ``/stats`` reports under ``cache``)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    max_entries: int = 0
    max_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return asdict(self)


class ResultCache:
    """LRU map ``key -> list of passages`` capped by entries and estimated bytes.

    Args:
        max_entries: most results kept (0 turns caching off: every lookup misses, nothing is kept).
        max_bytes: most estimated bytes kept (see :func:`passages_nbytes`); a single result larger
            than this is not kept.
        identity: hashable description of what produced the results (index, reranker, their
            settings); part of every key.
    """

    def __init__(self, max_entries: int, max_bytes: int, identity: Hashable = ()):
        if max_entries < 0 or max_bytes < 0:
            raise ValueError(f"cache limits must be >= 0, got {max_entries} entries, {max_bytes} bytes")
        self.identity = identity
        self._data: OrderedDict[Hashable, tuple[list[Any], int]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = CacheStats(max_entries=max_entries, max_bytes=max_bytes)

    @property
    def enabled(self) -> bool:
        """Whether anything can be kept."""
        return self.stats.max_entries > 0 and self.stats.max_bytes > 0

    def key(self, query: str, topk: int, initial_k: int) -> tuple:
        """The cache key of one query of a request (the exact text, nothing normalized)."""
        return (self.identity, query, topk, initial_k)

    def get(self, key: Hashable) -> list[Any] | None:
        """The cached result of ``key`` (marked most recently used), or ``None``; counts a hit or miss."""
        with self._lock:
            item = self._data.get(key)
            if item is None:
                self.stats.misses += 1
                return None
            self._data.move_to_end(key)
            self.stats.hits += 1
            return item[0]

    def put(self, key: Hashable, passages: list[Any]) -> None:
        """Store ``passages`` under ``key``, evicting least recently used entries to stay in bounds."""
        if not self.enabled:
            return
        size = passages_nbytes(passages)
        s = self.stats
        if size > s.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                s.bytes -= old[1]
            self._data[key] = (passages, size)
            s.bytes += size
            while len(self._data) > s.max_entries or s.bytes > s.max_bytes:
                _, (_, freed) = self._data.popitem(last=False)
                s.bytes -= freed
                s.evictions += 1
            s.entries = len(self._data)

    def __len__(self) -> int:
        return len(self._data)
