"""Corpus and search: the chunk dump, its BM25 index, cross-encoder reranking, the HTTP service.

Modules (imported on use: Java and torch start only where needed):

* :mod:`~spader.retrieval.corpus` - the QAMPARI Wikipedia chunk format, streamed from dir or tar.gz
* :mod:`~spader.retrieval.index` - ``build_bm25_index``, ``verify_index``
* :mod:`~spader.retrieval.searcher` - batched BM25 (``Bm25Searcher``)
* :mod:`~spader.retrieval.reranker` - batched cross-encoder scoring (``CrossEncoderReranker``)
* :mod:`~spader.retrieval.replicas` - one reranker replica per device (``RerankerReplicas``)
* :mod:`~spader.retrieval.backend` - ``SearchSettings``, ``Bm25RerankBackend``
* :mod:`~spader.retrieval.app` - the FastAPI app; :mod:`~spader.retrieval.payload` - body limits;
  :mod:`~spader.retrieval.protocol` - HTTP framing errors in JSON, read timeouts, the connection cap;
  :mod:`~spader.retrieval.batcher` - slices, overlap, failure isolation;
  :mod:`~spader.retrieval.cache` - the result cache
* :mod:`~spader.retrieval.service` - ``serve``, ``running_service``, ``reranker_on_job_gpus``;
  :mod:`~spader.retrieval.client` - ``RetrievalClient``

How these work together at training scale: docs/retrieval.md.
* :mod:`~spader.retrieval.jvm` - ``start_jvm`` (call before importing pyserini.search/index)

CLI: ``spader retrieval index ...`` and ``spader retrieval serve ...`` (alias ``python -m
spader.retrieval``).
"""
