"""BM25 search over the chunk index: many queries per call, passages with title and text.

All queries of a call go through one multi-threaded Anserini ``batch_search``; the hits of all
queries then cross into Python as one JSON string (Jackson serializes the result map on the Java
side). Reading ``docid``/``score``/raw field of each hit through pyjnius instead costs several
JNI calls per hit, about as much as the search itself at top-50, and looking documents up by id
afterwards (``searcher.doc(docid).raw()``, what the per-query servers do) costs twice that.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from spader.retrieval.corpus import Passage, passage_from_record
from spader.retrieval.errors import IndexUnavailableError
from spader.retrieval.index import verify_index
from spader.retrieval.jvm import start_jvm

log = logging.getLogger(__name__)

__all__ = ["Bm25Searcher"]

# Generic queries run once at start-up: the first batch search of a fresh JVM is several times
# slower than the next ones (class loading, JIT).
_WARM_UP = ["the history of the city", "list of films", "river in europe", "album by the band", "novel"] * 8


class Bm25Searcher:
    """BM25 (Lucene via Anserini's ``SimpleSearcher``) over an index with raw chunk documents.

    Args:
        index_dir: Lucene index built by :func:`spader.retrieval.index.build_bm25_index` (or a
            prebuilt one with raw documents stored); checked by :func:`verify_index` first.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalization.
        threads: Java threads of a batch search.
        heap: JVM heap, if this call starts the JVM.
        max_clauses: Lucene's limit on terms per query is raised to at least this (it is 1,024
            by default, and one query over it fails the whole batch search).
    """

    def __init__(
        self,
        index_dir: str | os.PathLike,
        *,
        k1: float = 0.9,
        b: float = 0.4,
        threads: int = 1,
        heap: str | None = None,
        max_clauses: int = 1024,
    ):
        start_jvm(heap)
        self.info = verify_index(index_dir)
        from jnius import autoclass

        searcher_class = autoclass("org.apache.lucene.search.IndexSearcher")
        if searcher_class.getMaxClauseCount() < max_clauses:  # a JVM-wide setting
            searcher_class.setMaxClauseCount(int(max_clauses))

        self.index_dir = str(index_dir)
        self.threads = max(1, int(threads))
        self._searcher = autoclass("io.anserini.search.SimpleSearcher")(self.index_dir)
        self._searcher.set_bm25(float(k1), float(b))
        self._mapper = autoclass("com.fasterxml.jackson.databind.ObjectMapper")()
        self._array_list = autoclass("java.util.ArrayList")
        log.info(
            "BM25 index %s: %d documents (k1=%s, b=%s, %d threads)",
            index_dir,
            self.info["documents"],
            k1,
            b,
            self.threads,
        )

    @property
    def num_docs(self) -> int:
        """Documents in the index."""
        return self.info["documents"]

    def warm_up(self, k: int = 50) -> None:
        """Run a few throw-away batch searches so the first real request is not slow."""
        for _ in range(3):
            self.search(_WARM_UP, k)

    def probe(self) -> None:
        """Search words of a stored document, which must be found: the index answers queries.

        Raises:
            IndexUnavailableError: no hit; the message names the index.
        """
        text = self.info.get("probe_text") or ""
        hits = self.search([text], 10)[0] if text.strip() else []
        if not any(h.id == self.info.get("probe_id") for h in hits):
            raise IndexUnavailableError(
                f"BM25 index {self.index_dir}: the start-up probe query {text[:80]!r} did not find "
                f"document {self.info.get('probe_id')!r} it was taken from; the index is damaged"
            )

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-``k`` BM25 passages of each query, best first (ties broken by docid, as Anserini does).

        Args:
            queries: query strings (any text; Lucene's analyzer tokenizes it, no query syntax).
            k: hits per query.

        Returns:
            One list per query, in order, of :class:`Passage` with the BM25 score; a query with
            no matching term gets an empty list.
        """
        if not queries:
            return []
        texts, ids = self._array_list(), self._array_list()
        for i, q in enumerate(queries):
            texts.add(q)
            ids.add(str(i))
        results = self._searcher.batch_search(texts, ids, int(k), self.threads)
        decoded = json.loads(self._mapper.writeValueAsString(results))
        return [[self._passage(hit) for hit in decoded.get(str(i), ())] for i in range(len(queries))]

    def _passage(self, hit: dict[str, Any]) -> Passage:
        # Stored fields come as a list of values without names (Jackson sees Lucene's getters
        # only); the raw document is the one holding a JSON object (the other is the docid).
        for field in reversed(hit["lucene_document"]["fields"]):
            value = field.get("charSequenceValue")
            if isinstance(value, str) and value.startswith("{") and value != hit["docid"]:
                return passage_from_record(json.loads(value), hit["score"])
        raise IndexUnavailableError(
            f"BM25 index {self.index_dir}: document {hit['docid']} has no stored raw document"
        )

    def close(self) -> None:
        """Release the Lucene reader."""
        self._searcher.close()
