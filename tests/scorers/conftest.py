"""Fixtures of the baseline tests.

The verl tests' stand-ins are reused rather than copied (conftest modules are not importable by
name, so they are loaded from their files): the in-memory TransferQueue (the real one needs a Ray
cluster) and the stdlib retrieval-service stand-in (the search tool's own tests use it; the evidence
tests run the real BM25 + reranker service instead). The retrieval tests' corpus helpers build a
real Lucene index for the evidence tests; the tiny models come from the suite's root conftest.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_verl = _load("_baselines_verl_conftest", _TESTS / "verl" / "conftest.py")
_retrieval = _load("_baselines_retrieval_conftest", _TESTS / "retrieval" / "conftest.py")

retrieval_service = _verl.retrieval_service


class InMemoryTransferQueue(_verl.InMemoryTransferQueue):
    """The verl tests' stand-in, answering ``kv_batch_put`` with the batch's metadata as the real
    one does (the trainer mode reads the batch back from it); tags are kept per key."""

    def __init__(self):
        super().__init__()
        self.tags: dict[tuple[str, str], dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        if fields is not None:
            super().kv_batch_put(keys, partition_id, fields)
        for key, tag in zip(keys, tags or [None] * len(keys), strict=True):
            if tag is not None:
                self.tags[(partition_id, key)] = dict(tag)
        stored = [self.tags.get((partition_id, k), {}) for k in keys]
        return KVBatchMeta(keys=list(keys), tags=stored, partition_id=partition_id)


StubRetrievalService = _verl.StubRetrievalService
PAGES = _retrieval.PAGES


@pytest.fixture
def fake_tq(monkeypatch):
    """Route every TransferQueue call of the trainer path (verl's, ours) to one in-memory store."""
    import transfer_queue
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    import spader.integrations.verl.step_rewards as step_rewards
    import spader.integrations.verl.trainer as spader_trainer
    import spader.integrations.verl.turn_gae as turn_gae

    queue = InMemoryTransferQueue()
    for module in (trainer_base, spader_trainer, step_rewards, turn_gae):
        monkeypatch.setattr(module, "tq", queue)
    # and for code that imports the module where it runs
    monkeypatch.setattr(transfer_queue, "kv_batch_get", queue.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", queue.kv_batch_put)
    return queue


@pytest.fixture(scope="session")
def bm25_index(tmp_path_factory) -> Path:
    """The retrieval tests' small corpus as a real Lucene index."""
    from spader.retrieval.index import build_bm25_index

    root = _retrieval.write_corpus(tmp_path_factory.mktemp("corpus"), _retrieval.chunk_records())
    archive = _retrieval.write_tar(root, tmp_path_factory.mktemp("dump") / "chunked_wikipedia.tar.gz")
    out = tmp_path_factory.mktemp("index") / "bm25"
    build_bm25_index(archive, out, threads=1)
    return out
