"""Corpus and search: the chunk dump, its BM25 index, cross-encoder reranking, the HTTP service.

Modules (imported on use: Java and torch start only where needed):

* :mod:`~spader.retrieval.corpus` - the QAMPARI Wikipedia chunk format, streamed from dir or tar.gz
* :mod:`~spader.retrieval.index` - ``build_bm25_index``, ``verify_index``
* :mod:`~spader.retrieval.searcher` - batched BM25 (``Bm25Searcher``)
* :mod:`~spader.retrieval.reranker` - batched cross-encoder scoring (``CrossEncoderReranker``)
* :mod:`~spader.retrieval.backend` - ``SearchSettings``, ``Bm25RerankBackend``
* :mod:`~spader.retrieval.app` - the FastAPI app; :mod:`~spader.retrieval.service` - ``serve``,
  ``running_service``; :mod:`~spader.retrieval.client` - ``RetrievalClient``
* :mod:`~spader.retrieval.jvm` - ``start_jvm`` (call before importing pyserini.search/index)

CLI: ``python -m spader.retrieval index ...`` and ``python -m spader.retrieval serve ...``.
"""
