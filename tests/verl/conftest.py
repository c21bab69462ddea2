"""Fixtures of the verl integration tests.

Stand-ins, each for something that cannot run here:

* :class:`InMemoryTransferQueue` replaces TransferQueue's ``kv_batch_get``/``kv_batch_put`` so that
  these unit tests run in one process; the real one needs a Ray cluster, and tests/cpu_training
  runs it (with verl's whole trainer). Samples are stored and read back as tensordicts with verl's
  own ``list_of_dict_to_tensordict``, as the agent loop writes them.
* :class:`StubRetrievalService` is a stdlib HTTP server on 127.0.0.1 speaking the retrieval
  protocol (``POST /retrieve``, ``GET /health``) over a fixed passage table, instead of the
  BM25 + reranker service (a Lucene index and a JVM). The real ``RetrievalClient`` talks to it.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
import torch.distributed as dist

# ---------------------------------------------------------------------------------------------
# TransferQueue stand-in
# ---------------------------------------------------------------------------------------------


class InMemoryTransferQueue:
    """``kv_batch_put`` / ``kv_batch_get`` of transfer_queue over a dict (see module docstring)."""

    def __init__(self):
        self.store: dict[tuple[str, str], dict] = {}

    def put_samples(self, keys, samples, partition_id="train"):
        for key, sample in zip(keys, samples, strict=False):
            self.store[(partition_id, key)] = dict(sample)

    def kv_batch_put(self, keys, partition_id, fields, tags=None):
        for name in fields.keys():
            value = fields[name]
            rows = value.unbind() if isinstance(value, torch.Tensor) else list(value)
            for key, row in zip(keys, rows, strict=False):
                self.store.setdefault((partition_id, key), {})[name] = row
        return None

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        rows = []
        for key in keys:
            sample = self.store[(partition_id, key)]
            names = select_fields if select_fields is not None else list(sample)
            rows.append({n: sample[n] for n in names if n in sample})
        return list_of_dict_to_tensordict(rows)


@pytest.fixture
def fake_tq(monkeypatch):
    """Route the trainer's TransferQueue calls (ours and verl's) to an in-memory store."""
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    import spader.integrations.verl.step_rewards as step_rewards
    import spader.integrations.verl.trainer as spader_trainer

    queue = InMemoryTransferQueue()
    monkeypatch.setattr(spader_trainer, "tq", queue)
    monkeypatch.setattr(step_rewards, "tq", queue)
    monkeypatch.setattr(trainer_base, "tq", queue)
    return queue


# ---------------------------------------------------------------------------------------------
# Retrieval service stand-in
# ---------------------------------------------------------------------------------------------

PASSAGES = [
    {"id": "p1", "title": "Ilse Varga", "text": "Ilse Varga directed The Salt Orchard in 1961."},
    {"id": "p2", "title": "Winter Quay", "text": "Winter Quay is a drama film directed by Ilse Varga."},
    {"id": "p3", "title": "Salt marsh", "text": "A salt marsh is a coastal ecosystem."},
    {"id": "p4", "title": "Harbour Lights", "text": "Harbour Lights is a 1964 film by Ilse Varga."},
    {"id": "p5", "title": "Varga family", "text": "The Varga family of Budapest."},
]


class StubRetrievalService:
    """Threaded HTTP server on 127.0.0.1: passages ranked by the number of query words they contain."""

    def __init__(self, passages=PASSAGES):
        self.passages = passages
        self.requests: list[dict] = []
        self.fail_next = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"status": "ok", "documents": len(service.passages)})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(body)
                if service.fail_next:
                    service.fail_next -= 1
                    self._send(503, {"error": "stub failure"})
                    return
                self._send(200, {"result": [service.rank(q, body.get("topk") or 5) for q in body["queries"]]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def rank(self, query: str, topk: int) -> list[dict]:
        words = set(query.lower().split())
        scored = []
        for p in self.passages:
            text = f"{p['title']} {p['text']}".lower()
            score = sum(1 for w in words if w in text)
            if score:
                scored.append((score, p))
        scored.sort(key=lambda sp: -sp[0])
        return [{**p, "score": float(s)} for s, p in scored[:topk]]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def retrieval_service():
    with StubRetrievalService() as service:
        yield service


@pytest.fixture
def stub_retrieval():
    """``make(passages)``: a stub service over other passages (``PASSAGES`` is the default table),
    stopped after the test."""
    import contextlib

    with contextlib.ExitStack() as stack:

        def make(passages=PASSAGES):
            return stack.enter_context(StubRetrievalService(passages))

        make.default = PASSAGES
        yield make


# a one-process gloo group (verl's FSDP code needs one), and verl's patched model class restored


@pytest.fixture
def process_group():
    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def patched_class():
    """verl's monkey patch replaces the model class's forward; put it back for other tests."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3ForCausalLM

    original = Qwen3ForCausalLM.forward
    yield
    Qwen3ForCausalLM.forward = original
