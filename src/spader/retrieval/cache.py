"""A bounded LRU cache of search results, shared by every request of one service's lifetime.

Rollouts of one prompt often send the same query (the first turn tends to repeat the question),
so a training step asks for far fewer distinct results than it sends queries. Each distinct
``(query, topk, initial_k)`` is computed once; later requests get the stored passages. The cache
is bounded twice: by entries and by the bytes an entry holds in memory, evicting the least
recently used entry first. The key also carries the identity of the index and the reranker (and
their settings), so entries can never answer for another index or model.

Bytes are counted as CPython holds them (:func:`text_nbytes`, :func:`entry_nbytes`): the query of
the key (up to ``max_query_chars`` characters, 4 bytes each when one of them lies outside the
Basic Multilingual Plane) with the UTF-8 copy CPython keeps inside a non-ASCII string once a C
extension asked for it (the reranker's tokenizer does, for every query it scores), every passage's
strings at their real width (nothing asks them for UTF-8: the reranker gets new strings built from
them, the answer is encoded as a whole), and the objects around them (key and value tuples, the
list, the passages, the ordered-dict slot). ``bench/retrieval_cache.py`` fills a cache to its cap and compares the count
with the memory the process gained.

The service calls it from its event loop only; a lock still guards it so that tests and the
benchmark may share one across threads.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CacheStats", "ResultCache", "entry_nbytes", "passages_nbytes", "text_nbytes"]

# Objects around the strings, measured with tracemalloc on CPython 3.11: a cached Passage (object,
# attribute values, its float score) ~137 bytes; an entry's key tuple, value tuple, size int,
# ordered-dict slot and link and the list header ~234 bytes, plus 8 per list slot. Each also pays
# the allocator (malloc chunk headers and alignment, pymalloc's 16-byte size classes): ~16 bytes per
# allocation, 6 per passage and per entry. With these, the process's resident memory gained by a
# full cache stayed at 0.94-0.99x the count (bench/retrieval_cache.py, docs/retrieval.md).
_PASSAGE_OVERHEAD = 256
_ENTRY_OVERHEAD = 400
_LIST_SLOT = 8


def text_nbytes(text: str, *, utf8_copy: bool = False) -> int:
    """Bytes one string holds in CPython: its object (header plus 1, 2 or 4 bytes per character,
    by its widest character) and, with ``utf8_copy``, the UTF-8 copy CPython caches inside a
    non-ASCII string once C code asked for it (an ASCII string is its own UTF-8).

    >>> text_nbytes("a" * 100) < text_nbytes("\u00e9" * 100) < text_nbytes("\U0001f600" * 100)
    True
    """
    size = sys.getsizeof(text)
    if utf8_copy and not text.isascii():
        size += len(text.encode("utf-8", "surrogatepass")) + 1
    return size


def passages_nbytes(passages: Sequence[Any]) -> int:
    """Bytes held by one cached result: every passage's ``id``, ``title`` and ``text`` at their
    real size, the passage objects and the list."""
    return sum(
        _PASSAGE_OVERHEAD + text_nbytes(p.id) + text_nbytes(p.title) + text_nbytes(p.text) + _LIST_SLOT
        for p in passages
    )


def entry_nbytes(query: str, passages: Sequence[Any]) -> int:
    """Bytes one cache entry holds: its key's query, its passages and the objects around them."""
    return _ENTRY_OVERHEAD + text_nbytes(query, utf8_copy=True) + passages_nbytes(passages)


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
        max_bytes: most bytes kept, keys included (see :func:`entry_nbytes`); a single entry larger
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

    def _query(self, key: Hashable) -> str:
        """The text a key holds of its own: its strings (the query of a key made by :meth:`key`;
        the identity is one object shared by every key, so it is not counted per entry)."""
        if isinstance(key, str):
            return key
        if isinstance(key, tuple):
            return "".join(k for k in key if isinstance(k, str) and k is not self.identity)
        return ""

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
        size = entry_nbytes(self._query(key), passages)
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
