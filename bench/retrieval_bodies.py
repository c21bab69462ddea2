"""Benchmark: small-request latency beside large request bodies, with large bodies parsed on the
event loop (the earlier behaviour) and off it (the service's default), side by side in one run.

Three servers, one after the other: the earlier code (bodies parsed on the event loop, nesting
measured with per-byte numpy arrays, a copy of which is kept below), the current nesting check
still on the event loop, and the service as it is (bodies over 64 KiB parsed on the parse thread).

The service (the real app, uvicorn with the service's protocol, BM25 over the demo index, no
reranker) runs in a process of its own for each mode. One client sends small cached requests one
after another (a query answered from the result cache, the common case in training) and measures
each; meanwhile ``--large-senders`` clients send 5-6 MB bodies in a loop: 512 queries of 1,000
characters written as JSON surrogate-pair escapes with brackets inside the strings (so that the
nesting check cannot be skipped), the last query empty so that each body is refused with 422 after
being decoded and checked in full (the cost measured is parsing, not searching). Latency of the
small requests is reported alone (no large bodies) and beside the large ones, for both modes.

Before the servers, the parsing costs themselves are timed in this process: the nesting check of
the large body (current and earlier code), ``json.loads`` of it (which holds the interpreter lock
throughout), and the whole parse of an ordinary 512-query body (the size parsed inline).

Ends by writing a record (``bench/records/``, see ``bench/records.py``) with the table
docs/retrieval.md quotes.

Usage: .venv/bin/python bench/retrieval_bodies.py [--seconds 20] [--large-senders 2] [--records DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from records import write_record  # bench/records.py (the script's own directory is on sys.path)
from retrieval_load import _Connection

REPO = Path(__file__).resolve().parents[1]
SMALL = {"queries": ["Winter Quay"], "topk": 3}


def _large_body() -> bytes:
    char = "\\ud83d\\ude00"  # one character outside the BMP, 12 bytes escaped
    query = char * 900 + "[" * 100
    body = '{"queries": [' + ", ".join(f'"{query}"' for _ in range(511)) + ', ""]}'
    return body.encode()


def _earlier_json_depth(raw: bytes) -> int:
    """The nesting check before this benchmark was written (per-byte position arrays)."""
    b = np.frombuffer(raw, dtype=np.uint8)
    if b.size == 0:
        return 0
    pos = np.arange(b.size)
    last_plain = np.maximum.accumulate(np.where(b != 0x5C, pos, -1))
    quotes = np.flatnonzero(b == 0x22)
    before = np.where(quotes > 0, last_plain[np.maximum(quotes - 1, 0)], -1)
    run = np.where(quotes > 0, quotes - 1 - before, 0)
    real = np.zeros(b.size, dtype=np.int32)
    real[quotes[run % 2 == 0]] = 1
    outside = (np.cumsum(real) - real) % 2 == 0
    step = np.isin(b, np.frombuffer(b"[{", np.uint8)).astype(np.int32)
    step -= np.isin(b, np.frombuffer(b"]}", np.uint8)).astype(np.int32)
    step[~outside] = 0
    return int(max(0, np.cumsum(step).max()))


def _ordinary_body(queries: int = 512) -> bytes:
    """A request of ``queries`` ordinary questions (~50 characters each)."""
    words = ["river", "film", "album", "director", "village", "lake", "church", "band", "novel", "which"]
    qs = [" ".join(words[(i * 7 + k) % len(words)] for k in range(8)) + f" {i}" for i in range(queries)]
    return json.dumps({"queries": qs, "topk": 5}).encode()


def _best(fn, arg, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - started)
    return min(times)


def parse_costs(large: bytes) -> dict:
    """Seconds (best of 5) of the parsing steps, in this process."""
    from spader.retrieval.payload import json_depth, parse_json

    small = _ordinary_body()
    return {
        "large_mb": round(len(large) / 1e6, 2),
        "depth_now_s": round(_best(json_depth, large), 4),
        "depth_earlier_s": round(_best(_earlier_json_depth, large), 4),
        "json_loads_large_s": round(_best(json.loads, large), 4),
        "ordinary_kb": round(len(small) / 1e3, 1),
        "parse_ordinary_ms": round(1e3 * _best(parse_json, small), 3),
    }


MODES = (
    ("earlier code: on the event loop, per-byte nesting check", None, True),
    ("on the event loop, current nesting check", None, False),
    ("now: off the event loop (parse thread)", 65536, False),
)
LABELS = dict(
    zip(
        [m for m, _, _ in MODES],
        [
            "earlier code (parsed on the event loop, per-byte nesting check)",
            "current nesting check, still on the event loop",
            "**now: parsed off the event loop**",
        ],
        strict=True,
    )
)


def _ms(x: float) -> str:
    return f"{x / 1e3:.1f} s" if x >= 1000 else f"{x:.0f} ms" if x >= 10 else f"{x:.1f} ms"


def record(results: dict, costs: dict, args, large: bytes) -> str:
    """Write the run's record: the latency table of docs/retrieval.md, a row for the latency beside
    large bodies (now against the earlier code) and one for the nesting check."""
    table = []
    for mode, label in LABELS.items():
        a, b = results[mode]["alone"], results[mode]["beside_large"]
        table.append(
            [
                label,
                f"{_ms(a['small_p50_ms'])} / {_ms(a['small_p99_ms'])}",
                f"{_ms(b['small_p50_ms'])} / {_ms(b['small_p99_ms'])} / {_ms(b['small_max_ms'])}",
                f"{b['small_requests']:,}",
            ]
        )
    now, before = (results[m]["beside_large"] for m in (MODES[2][0], MODES[0][0]))
    load = os.getloadavg()[0]
    rows = [
        {
            "id": "beside-large",
            "what": f"small cached requests beside {args.large_senders} clients sending {len(large) / 1e6:.1f} MB "
            f"bodies in a loop, demo index, BM25 only, {args.seconds:g} s per mode",
            "result": f"bodies parsed off the event loop: small requests p99 **{_ms(now['small_p99_ms'])}**, "
            f"max {_ms(now['small_max_ms'])}, {now['small_requests']:,} answered; the earlier code (on the "
            f"loop): p99 {_ms(before['small_p99_ms'])}, max {_ms(before['small_max_ms'])}, "
            f"{before['small_requests']:,} answered",
            "target": "p99 beside large bodies below the earlier code's",
            "verdict": "met" if now["small_p99_ms"] < before["small_p99_ms"] else "not met",
            "numbers": results,
        },
        {
            "id": "nesting-check",
            "what": f"nesting check of a {costs['large_mb']} MB body of escapes and brackets (best of 5, in process)",
            "result": f"{costs['depth_now_s']:.2f} s vs {costs['depth_earlier_s']:.2f} s with per-byte arrays: "
            f"**{costs['depth_earlier_s'] / costs['depth_now_s']:.1f}x**; `json.loads` of the body "
            f"{1e3 * costs['json_loads_large_s']:.0f} ms (holding the interpreter lock); a whole parse of a "
            f"{costs['ordinary_kb']:.0f} KB request of 512 ordinary queries {costs['parse_ordinary_ms']:.1f} ms "
            f"(load average {load:.1f})",
            "target": None,
            "verdict": None,
            "numbers": costs,
        },
    ]
    tables = {
        "latency": {
            "title": f"Small requests alone and beside {args.large_senders} senders of "
            f"{len(large) / 1e6:.1f} MB bodies, per server",
            "columns": [
                "server",
                "small requests alone: p50 / p99",
                "beside the large bodies: p50 / p99 / max",
                "small requests answered beside them",
            ],
            "rows": table,
        }
    }
    return str(
        write_record(
            "bench/retrieval_bodies.py", rows, argv=sys.argv[1:], tables=tables, directory=args.records
        )
    )


def _serve(index: str, off_loop: int | None, earlier: bool, ports) -> None:
    import uvicorn

    if earlier:
        import spader.retrieval.payload

        spader.retrieval.payload.json_depth = _earlier_json_depth

    from spader.retrieval.app import create_app
    from spader.retrieval.backend import Bm25RerankBackend, SearchSettings
    from spader.retrieval.protocol import Limits, protocol_class
    from spader.retrieval.service import _bind

    settings = SearchSettings.from_config({"initial_k": 5, "topk": 3, "reranker": {"model": None}})
    sock = _bind("127.0.0.1", 0)
    ports.put(sock.getsockname()[1])
    app = create_app(lambda: Bm25RerankBackend(index, settings), parse_off_loop_bytes=off_loop)
    config = uvicorn.Config(app, http=protocol_class(Limits()), ws="none", log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


async def _measure(port: int, seconds: float, senders: int, large: bytes) -> dict:
    small = _Connection("127.0.0.1", port)
    status, _ = await small.post("/retrieve", SMALL)  # fills the cache
    assert status == 200
    stop = asyncio.Event()
    large_latency: list[float] = []

    async def send_large() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(large)
        while not stop.is_set():
            started = time.perf_counter()
            writer.write(head + large)
            lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            length = next(
                int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length"
            )
            body = await reader.readexactly(length)
            assert lines[0].split()[1] == b"422", body
            large_latency.append(time.perf_counter() - started)
        writer.close()

    tasks = [asyncio.create_task(send_large()) for _ in range(senders)]
    latencies = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        status, _ = await small.post("/retrieve", SMALL)
        latencies.append(time.perf_counter() - started)
        assert status == 200
        await asyncio.sleep(0.005)
    stop.set()
    await asyncio.gather(*tasks)
    small.close()
    lat = np.array(latencies) * 1e3
    out = {
        "small_requests": len(latencies),
        "small_p50_ms": round(float(np.percentile(lat, 50)), 2),
        "small_p99_ms": round(float(np.percentile(lat, 99)), 1),
        "small_max_ms": round(float(lat.max()), 1),
    }
    if large_latency:
        big = np.array(large_latency) * 1e3
        out.update(large_requests=len(big), large_p50_ms=round(float(np.percentile(big, 50)), 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    parser.add_argument("--large-senders", type=int, default=2)
    parser.add_argument("--index", default=None, help="a BM25 index (default: the demo's, built here)")
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = parser.parse_args()
    large = _large_body()
    costs = parse_costs(large)
    print(
        f"parsing, in process: nesting check of the {costs['large_mb']} MB body {costs['depth_now_s']:.3f} s "
        f"(earlier code {costs['depth_earlier_s']:.3f} s), json.loads {costs['json_loads_large_s']:.3f} s; "
        f"a {costs['ordinary_kb']} KB body of 512 ordinary queries parsed in {costs['parse_ordinary_ms']:.2f} ms"
    )
    with tempfile.TemporaryDirectory(prefix="bench-bodies-") as tmp:
        index = args.index
        if index is None:
            from spader.retrieval.index import build_bm25_index

            index = str(Path(tmp) / "bm25")
            build_bm25_index(REPO / "resources" / "demo" / "chunked_wikipedia.tar.gz", index, threads=1)
        ctx = mp.get_context("spawn")
        results = {}
        for mode, off_loop, earlier in MODES:
            ports = ctx.Queue()
            proc = ctx.Process(target=_serve, args=(index, off_loop, earlier, ports), daemon=True)
            proc.start()
            port = ports.get(timeout=300)
            time.sleep(1.0)
            for _ in range(600):  # the app loads the index before it answers
                try:
                    asyncio.run(_measure(port, 0.01, 0, large))
                    break
                except (OSError, AssertionError, asyncio.IncompleteReadError):
                    time.sleep(0.2)
            alone = asyncio.run(_measure(port, args.seconds / 2, 0, large))
            beside = asyncio.run(_measure(port, args.seconds, args.large_senders, large))
            proc.terminate()
            proc.join()
            results[mode] = {"alone": alone, "beside_large": beside}
            print(
                f"{mode}: small requests alone p50 {alone['small_p50_ms']} ms, p99 {alone['small_p99_ms']} ms; "
                f"beside {args.large_senders} senders of {len(large) / 1e6:.1f} MB bodies: "
                f"p50 {beside['small_p50_ms']} ms, p99 {beside['small_p99_ms']} ms, max {beside['small_max_ms']} ms "
                f"({beside['small_requests']} small, {beside.get('large_requests', 0)} large requests, "
                f"large p50 {beside.get('large_p50_ms')} ms)"
            )
    print(json.dumps(results, indent=1))
    print(f"record: {record(results, costs, args, large)}")


if __name__ == "__main__":
    main()
