"""Load section of ``bench/retrieval.py``: many concurrent clients against the service on the
demo index (``resources/demo/chunked_wikipedia.tar.gz``) with the demo's reranker (the tiny random
cross-encoder of ``config/demo.yaml``, on CPU): errors and latency percentiles.

Each client sends its requests one after the other (as a rollout does: search, wait, generate,
search again); all clients run at once. Requests hold 1-3 queries drawn from a pool of queries
built from the demo corpus, popular ones more often (rollouts of one prompt repeat queries).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import tarfile
import time
from pathlib import Path

import numpy as np
from retrieval_scale import service_settings


def demo_queries(archive: Path, distinct: int, seed: int = 0) -> list[str]:
    """``distinct`` queries from the demo corpus: a page title plus words of its passages."""
    rng = random.Random(seed)
    records = []
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            if member.isfile() and member.name.endswith(".jsonl"):
                records += [json.loads(line) for line in tf.extractfile(member) if line.strip()]
    out: set[str] = set()
    while len(out) < distinct:
        rec = rng.choice(records)
        words = rec["contents"].split()
        title = (rec.get("meta") or {}).get("title") or " ".join(words[:2])
        out.add(f"{title} {' '.join(rng.sample(words, min(3, len(words))))}")
    return sorted(out)


class _Connection:
    """One keep-alive HTTP/1.1 connection sending JSON POSTs (a load generator's client, nothing
    more: one request at a time, answers with ``Content-Length``). It costs ~0.07 ms of CPU per
    request where httpx's AsyncClient with 512 connections cost ~7 ms, which on a 2-core machine
    took more CPU than the service it was measuring."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        body = json.dumps(payload).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self._writer.write(head.encode() + body)
        try:
            lines = (await self._reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            status = int(lines[0].split()[1])
            length = next(
                int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length"
            )
            return status, await self._reader.readexactly(length)
        except BaseException:
            self.close()  # the connection's state is unknown: the next request opens a new one
            raise

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _load(url: str, pool: list[str], clients: int, per_client: int, seed: int) -> dict:
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** 0.8 for k in range(len(pool))]  # some queries far more popular
    plans = [
        [rng.choices(pool, weights, k=rng.choice((1, 2, 3))) for _ in range(per_client)]
        for _ in range(clients)
    ]
    host, port = url.removeprefix("http://").rsplit(":", 1)
    latencies: list[float] = []
    later: list[float] = []  # requests after a client's first (which meets the cold cache)
    errors: list[str] = []

    async def client(plan):
        conn = _Connection(host, int(port))
        for turn, queries in enumerate(plan):
            unique = list(dict.fromkeys(queries))
            started = time.perf_counter()
            try:
                status, body = await asyncio.wait_for(conn.post("/retrieve", {"queries": unique}), 900)
                if status != 200 or len(json.loads(body)["result"]) != len(unique):
                    errors.append(f"HTTP {status}: {body[:200]!r}")
            except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            latencies.append(time.perf_counter() - started)
            if turn:
                later.append(latencies[-1])
        conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(p) for p in plans))
    seconds = time.perf_counter() - started
    lat = np.array(latencies) * 1e3
    warm = np.array(later) * 1e3
    return {
        "requests": len(latencies),
        "queries": sum(len(set(q)) for p in plans for q in p),
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "later_p50_ms": float(np.percentile(warm, 50)) if warm.size else None,
        "later_p99_ms": float(np.percentile(warm, 99)) if warm.size else None,
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_load(work: Path, archive: Path, clients: int, per_client: int, distinct: int, threads: int) -> dict:
    """``clients`` concurrent clients x ``per_client`` requests of 1-3 queries against the service
    on the demo index with the demo's reranker (the tiny random cross-encoder, CPU)."""
    from spader.demo.tiny import build_tiny_reranker
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.index import build_bm25_index
    from spader.retrieval.service import running_service

    index = work / "demo_index"
    if not index.exists():
        build_bm25_index(archive, index, threads=1)
    reranker = work / "demo_reranker"
    if not reranker.exists():
        build_tiny_reranker(reranker)
    settings = service_settings(reranker, 16)  # config/demo.yaml's reranker batch size
    pool = demo_queries(archive, distinct)
    with running_service(index, SearchSettings.from_config(settings), threads=threads) as url:
        with RetrievalClient(url, timeout=60, retries=0) as c:
            pid = c.health()["pid"]
        service_cpu, client_cpu = _cpu_seconds(pid), resource.getrusage(resource.RUSAGE_SELF)
        out = asyncio.run(_load(url, pool, clients, per_client, seed=1))
        # CPU seconds each side spent under load: which process the 2 cores were busy with.
        out["service_cpu_s"] = _cpu_seconds(pid) - service_cpu
        after = resource.getrusage(resource.RUSAGE_SELF)
        out["client_cpu_s"] = after.ru_utime + after.ru_stime - client_cpu.ru_utime - client_cpu.ru_stime
        with RetrievalClient(url, timeout=60, retries=0) as c:
            out["stats"] = c.health()["stats"]
    out["distinct_queries"] = distinct
    return out
