"""Training-scale sections of ``bench/retrieval.py`` (kept apart to keep each file readable).

* :func:`bench_stream` - a rollout-shaped query stream with and without the result cache,
  duplicate rate swept: queries/s, reranker pairs, identical top-5s;
* :func:`bench_overlap` - one large request and many small ones with BM25/rerank overlap on and
  off, and unsliced (the design before slices);
* :func:`bench_replicas` - one vs two reranker replicas (CPU stands in for GPUs);
* :func:`projection` - per paper-size training step: queries, unique queries, pairs and reranker
  seconds on one H200 / one A100 (and on 8 replicas), from the measured stream and the model's FLOPs
  or a measured pairs/s;

The load test (512 concurrent clients x 20 requests on the demo index) is in ``retrieval_load.py``.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# bge-reranker-v2-m3 = XLM-RoBERTa large + a one-logit head.
RERANKER_PARAMS = 567_755_777
_LAYERS, _HIDDEN, _VOCAB, _POSITIONS = 24, 1024, 250_002, 8194
TOKENS_PER_PAIR = 160
# Dense bf16/fp16 tensor-core peaks (vendor data sheets), TFLOP/s.
PEAK_TFLOPS = {"H200": 989.0, "A100": 312.0}
# Paper-size training step: 32 prompts x 16 rollouts x 2-3 search turns x 2-3 queries.
STEP_QUERIES = (32 * 16 * 2 * 2, 32 * 16 * 3 * 3)


def flops_per_pair(tokens: int = TOKENS_PER_PAIR) -> float:
    """Forward FLOPs of one (query, passage) pair through bge-reranker-v2-m3: 2 per non-embedding
    weight per token plus attention scores and value sums (4 * layers * tokens^2 * hidden)."""
    dense = RERANKER_PARAMS - (_VOCAB + _POSITIONS + 1) * _HIDDEN
    return 2.0 * dense * tokens + 4.0 * _LAYERS * tokens * tokens * _HIDDEN


def service_settings(reranker: Path | None, rerank_batch: int, **service) -> dict:
    """``config["retrieval"]`` for a bench service (the reranker path as the rules resolve it)."""
    return {
        "bm25": {"k1": 0.9, "b": 0.4},
        "initial_k": 50,
        "topk": 5,
        "reranker": {
            "model": str(reranker) if reranker else None,
            "path": str(reranker) if reranker else None,
            "batch_size": rerank_batch,
            "max_length": 512,
            "fp16": False,
            "devices": service.pop("devices", None),
        },
        "service": {
            "host": "127.0.0.1",
            "max_queries_per_request": 512,
            "max_query_chars": 1000,
            "startup_timeout_s": 900,
            "request_timeout_s": 900,
            "retries": 0,
            **service,
        },
    }


# -- the rollout-shaped stream ----------------------------------------------------------------


def rollout_stream(fresh, prompts: int, level: float, seed: int, rollouts: int = 16) -> list[list[list[str]]]:
    """Search requests of one training step, turn by turn: ``turns[t]`` holds the requests every
    rollout still searching sends in turn ``t`` (each request: 2-3 queries).

    Each prompt has a question and a few popular follow-up queries. A rollout's first query repeats
    the question with probability ``min(1, 2 * level)``; every other query repeats one of the
    prompt's follow-ups (the first ones most often) with probability ``level``, else it is new.

    Args:
        fresh: callable returning a new query string.
        prompts: prompts per step (16 rollouts each).
        level: 0..1, how repetitive rollouts are (see :func:`calibrate`).
        seed: random seed.
        rollouts: rollouts per prompt.

    Returns:
        ``turns`` as described.
    """
    rng = random.Random(seed)
    turns: list[list[list[str]]] = [[], [], []]
    for _ in range(prompts):
        question = fresh()
        follow_ups = [fresh() for _ in range(6)]
        weights = [1.0 / (k + 1) for k in range(len(follow_ups))]
        for _ in range(rollouts):
            for t in range(rng.choice((2, 3))):
                queries = []
                for j in range(rng.choice((2, 3))):
                    if t == 0 and j == 0 and rng.random() < min(1.0, 2 * level):
                        queries.append(question)
                    elif rng.random() < level:
                        queries.append(rng.choices(follow_ups, weights)[0])
                    else:
                        queries.append(fresh())
                turns[t].append(list(dict.fromkeys(queries)))  # a tool call never repeats itself
    return turns


def duplicate_rate(turns: list[list[list[str]]]) -> float:
    """Share of the step's queries that repeat an earlier query of the step."""
    queries = [q for requests in turns for r in requests for q in r]
    return 1.0 - len(set(queries)) / len(queries)


def calibrate(target: float, make_fresh, prompts: int, seed: int) -> tuple[list, float]:
    """The stream whose duplicate rate is closest to ``target`` (bisection on ``level``)."""
    lo, hi, best = 0.0, 1.0, None
    for _ in range(14):
        level = (lo + hi) / 2
        turns = rollout_stream(make_fresh(seed), prompts, level, seed)
        rate = duplicate_rate(turns)
        if best is None or abs(rate - target) < abs(best[1] - target):
            best = (turns, rate)
        if rate < target:
            lo = level
        else:
            hi = level
    if target == 0:
        turns = rollout_stream(make_fresh(seed), prompts, 0.0, seed)
        best = (turns, duplicate_rate(turns))
    return best


def replay(client, turns: list[list[list[str]]], workers: int = 128, seed: int = 0) -> tuple[list, float]:
    """Send the stream turn by turn, the requests of a turn all at once in a random order (rollouts
    finish generating at random times, prompts mixed); returns (results in stream order, seconds)."""
    rng = random.Random(seed)
    results = []
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        for requests in turns:
            order = list(range(len(requests)))
            rng.shuffle(order)
            answers = dict(zip(order, pool.map(client.retrieve, [requests[i] for i in order]), strict=True))
            results.extend(answers[i] for i in range(len(requests)))
    return results, time.perf_counter() - started


def _top_ids(results) -> list[list[str]]:
    return [[p["id"] for p in hits] for part in results for hits in part]


def bench_stream(
    index: Path, reranker: Path, make_fresh, threads: int, rerank_batch: int, rates, prompts, rounds: int = 1
) -> dict:
    """The stream at each duplicate rate, through a service with the cache and one without.

    Each of ``rounds`` rounds replays a new stream of the rate (other queries, so the cache starts
    cold for it) through both services, alternating which goes first; queries/s is the best
    round's (the machine is shared: the best round is the least disturbed one), pairs and
    computed queries are summed over the rounds.
    """
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service

    on = service_settings(reranker, rerank_batch)
    off = service_settings(reranker, rerank_batch, cache_entries=0)
    out = {}
    with (
        running_service(index, on, threads=threads) as url_on,
        running_service(index, off, threads=threads) as url_off,
        RetrievalClient(url_on, timeout=900, retries=0) as c_on,
        RetrievalClient(url_off, timeout=900, retries=0) as c_off,
    ):
        for c in (c_on, c_off):  # warm-up outside the measurement, with queries of no later step
            replay(c, calibrate(0.0, make_fresh, 1, seed=999)[0][:1])
        order = [("cache", c_on), ("no cache", c_off)]
        for k, target in enumerate(rates):
            runs: dict[str, list[dict]] = {"cache": [], "no cache": []}
            seen_rates, queries, identical = [], 0, 0
            for r in range(rounds):
                turns, rate = calibrate(target, make_fresh, prompts, seed=100 + k + 1000 * r)
                n = sum(len(q) for requests in turns for q in requests)
                top = {}
                for name, c in order if (k + r) % 2 == 0 else order[::-1]:  # alternate who goes first
                    before = c.health()["stats"]
                    results, seconds = replay(c, turns)
                    after = c.health()["stats"]
                    top[name] = _top_ids(results)
                    runs[name].append(
                        {
                            "seconds": seconds,
                            "qps": n / seconds,
                            "pairs": after["pairs_reranked"] - before["pairs_reranked"],
                            "computed": after["computed"] - before["computed"],
                        }
                    )
                identical += sum(a == b for a, b in zip(top["cache"], top["no cache"], strict=True))
                seen_rates.append(rate)
                queries += n
                print(
                    f"  stream {rate:5.1%} duplicates, {n} queries, round {r + 1}: cache "
                    f"{runs['cache'][-1]['qps']:6.1f} q/s {runs['cache'][-1]['pairs']} pairs | no cache "
                    f"{runs['no cache'][-1]['qps']:6.1f} q/s {runs['no cache'][-1]['pairs']} pairs",
                    flush=True,
                )
            row = {
                "target": target,
                "duplicate_rate": statistics.mean(seen_rates),
                "queries": queries,
                "rounds": rounds,
                "identical_top5": identical,
            }
            for name, rs in runs.items():
                row[name] = {
                    "qps": max(x["qps"] for x in rs),
                    "median_qps": statistics.median(x["qps"] for x in rs),
                    "seconds": sum(x["seconds"] for x in rs),
                    "pairs": sum(x["pairs"] for x in rs),
                    "computed": sum(x["computed"] for x in rs),
                }
            out[f"{target:.0%}"] = row
    return out


# -- overlap and replicas ---------------------------------------------------------------------


def _one_request(c, queries):
    return [[(p["id"], p["score"]) for p in hits] for hits in c.retrieve(queries)]


def _concurrent(c, queries, per_request=4, workers=64):
    chunks = [queries[i : i + per_request] for i in range(0, len(queries), per_request)]
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(c.retrieve, chunks))
    return [[(p["id"], p["score"]) for p in hits] for part in parts for hits in part]


def _side_by_side(index, variants: dict, queries, threads, rounds) -> dict:
    """Each variant's service (cache off) on one request of all queries and on requests of 4 sent
    at once; best of ``rounds``, rounds interleaved across variants."""
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service

    times = {(v, p): [] for v in variants for p in ("one request", "concurrent, 4 each")}
    results = {}
    with contextlib.ExitStack() as stack:
        clients = {}
        for name, settings in variants.items():
            url = stack.enter_context(running_service(index, settings, threads=threads))
            clients[name] = stack.enter_context(RetrievalClient(url, timeout=900, retries=0))
            clients[name].retrieve(queries[:8])
        for r in range(rounds):
            for name, c in clients.items():
                for pattern, fn in (("one request", _one_request), ("concurrent, 4 each", _concurrent)):
                    started = time.perf_counter()
                    results[name, pattern] = fn(c, queries)
                    times[name, pattern].append(time.perf_counter() - started)
                    print(f"  round {r + 1}: {name}, {pattern}: {times[name, pattern][-1]:.2f} s", flush=True)
    ref = results[next(iter(times))]
    return {
        f"{name} | {pattern}": {
            "best_s": min(ts),
            "median_s": statistics.median(ts),
            "qps": len(queries) / min(ts),
            "identical_top5": sum(
                [i for i, _ in a] == [i for i, _ in b]
                for a, b in zip(results[name, pattern], ref, strict=True)
            ),
        }
        for (name, pattern), ts in times.items()
    }


def bench_overlap(index, reranker, queries, threads, rerank_batch, rounds) -> dict:
    """Slices of 64 with BM25 of the next slice overlapping reranking, without overlap, and unsliced."""
    variants = {
        "slices of 64, overlap": service_settings(reranker, rerank_batch, cache_entries=0),
        "slices of 64, no overlap": service_settings(reranker, rerank_batch, cache_entries=0, overlap=False),
        "unsliced (512), no overlap": service_settings(
            reranker, rerank_batch, cache_entries=0, overlap=False, slice_queries=512
        ),
    }
    return _side_by_side(index, variants, queries, threads, rounds)


def bench_replicas(index, reranker, queries, threads, rerank_batch, rounds) -> dict:
    """One reranker replica vs two (CPU: each replica's forward passes on their own threads)."""
    variants = {
        "1 replica": service_settings(reranker, rerank_batch, cache_entries=0, devices=["cpu"]),
        "2 replicas": service_settings(reranker, rerank_batch, cache_entries=0, devices=["cpu", "cpu"]),
    }
    return _side_by_side(index, variants, queries, threads, rounds)


# -- projection -------------------------------------------------------------------------------


def estimated_rates(pairs_per_s: dict[str, float | None]) -> dict[str, tuple[float, str]]:
    """Reranker pairs/s per GPU kind and how each was obtained.

    Args:
        pairs_per_s: measured pairs/s per kind of :data:`PEAK_TFLOPS` (``None`` or absent: not measured).

    Returns:
        ``{gpu: (pairs/s, how)}``: measured; else the first measured kind scaled by the ratio of
        the bf16 peaks; else the FLOPs of a pair at the peak.
    """
    measured = {g: float(v) for g, v in pairs_per_s.items() if v}
    out = {}
    for gpu, peak in PEAK_TFLOPS.items():
        if gpu in measured:
            out[gpu] = (measured[gpu], "measured")
        elif measured:
            ref, rate = next(iter(measured.items()))
            out[gpu] = (
                rate * peak / PEAK_TFLOPS[ref],
                f"estimate: measured {ref} x {peak:.0f}/{PEAK_TFLOPS[ref]:.0f} TFLOP/s bf16 peak ratio",
            )
        else:
            out[gpu] = (peak * 1e12 / flops_per_pair(), f"at the {peak:.0f} TFLOP/s bf16 peak (upper bound)")
    return out


def projection(stream: dict, pairs_per_s: dict[str, float | None]) -> list[dict]:
    """Per paper-size training step: queries, unique queries, reranker pairs and seconds.

    Args:
        stream: :func:`bench_stream`'s result (duplicate rates and pairs per computed query).
        pairs_per_s: measured reranker pairs/s per GPU kind. A kind without a measurement is
            estimated from a measured kind scaled by the ratio of their dense bf16 peaks (the model
            runs near the same fraction of peak on both); with no measurement at all, from the
            FLOPs at the peak, an upper bound on speed.

    Returns:
        One row per (duplicate rate, step size).
    """
    rates = estimated_rates(pairs_per_s)
    rows = []
    for row in stream.values():
        computed = row["cache"]["computed"] or 1
        per_query = row["cache"]["pairs"] / computed  # candidates reranked per distinct query
        for n in STEP_QUERIES:
            unique = round(n * (1 - row["duplicate_rate"]))
            pairs_cached, pairs_plain = unique * per_query, n * per_query
            out = {
                "duplicate_rate": row["duplicate_rate"],
                "queries": n,
                "unique": unique,
                "pairs": pairs_cached,
            }
            for gpu, (rate, _) in rates.items():
                out[f"{gpu} s"] = pairs_cached / rate
                out[f"{gpu} s, all computed"] = pairs_plain / rate
                out[f"{gpu} pairs/s"] = rate
            rows.append(out)
    return rows


# -- report -----------------------------------------------------------------------------------


def report_scale(res: dict, args) -> list[str]:
    """Print the training-scale tables; returns the target lines (for the summary at the end)."""
    targets = []
    if "stream" in res:
        print(f"\n== rollout-shaped stream, {args.prompts} prompts x 16 rollouts, cache vs no cache "
              f"(q/s: best of {args.rounds} rounds of new streams; pairs: all rounds) ==")  # fmt: skip
        print(
            "(no cache: identical queries merged into one slice are still computed once, as before the cache;"
        )
        print(" 'all' = pairs if every query were computed, i.e. no reuse of any result)")
        print(f"{'duplicates':>10} {'queries':>8} | {'cache q/s':>9} {'pairs':>7} | {'no cache q/s':>12} "
              f"{'pairs':>7} {'all':>7} | {'x q/s':>6} {'/ pairs':>7} {'/ all':>6} | identical top-5")  # fmt: skip
        for row in res["stream"].values():
            c, n = row["cache"], row["no cache"]
            every = row["queries"] * c["pairs"] / max(c["computed"], 1)
            row["pairs_if_all_computed"] = every
            print(f"{row['duplicate_rate']:10.1%} {row['queries']:8d} | {c['qps']:9.1f} {c['pairs']:7d} | "
                  f"{n['qps']:12.1f} {n['pairs']:7d} {every:7.0f} | {c['qps'] / n['qps']:6.2f} "
                  f"{n['pairs'] / max(c['pairs'], 1):7.2f} {every / max(c['pairs'], 1):6.2f} | "
                  f"{row['identical_top5']}/{row['queries']}")  # fmt: skip
        half = min(res["stream"].values(), key=lambda r: abs(r["target"] - 0.5))
        qps = half["cache"]["qps"] / half["no cache"]["qps"]
        pairs = half["no cache"]["pairs"] / max(half["cache"]["pairs"], 1)
        every = half["pairs_if_all_computed"] / max(half["cache"]["pairs"], 1)
        same = half["identical_top5"] == half["queries"]
        targets.append(
            f"at {half['duplicate_rate']:.0%} duplicates: reranker pairs / {pairs:.2f} vs no cache, / {every:.2f} vs "
            f"every query computed (>= 2: {'met' if max(pairs, every) >= 2 else 'NOT met'}), queries/s x{qps:.2f} "
            f"(>= 1.8: {'met' if qps >= 1.8 else 'NOT met'}), identical top-5s: {'yes' if same else 'NO'}"
        )
    for section, title in (("overlap", "slices and overlap"), ("replicas", "reranker replicas")):
        if section not in res:
            continue
        print(
            f"\n== {title}: {args.queries} queries, cache off, {args.threads} threads (best of {args.rounds}) =="
        )
        rows = res[section]
        base = next(iter(rows.values()))["qps"]
        for name, r in rows.items():
            print(f"{name:52s} {r['best_s']:7.2f} s {r['qps']:8.1f} q/s  x{r['qps'] / base:5.2f}  "
                  f"identical top-5 {r['identical_top5']}/{args.queries}")  # fmt: skip
    if "projection" in res:
        measured = {k: v for k, v in (("H200", args.h200_pairs_per_s), ("A100", args.a100_pairs_per_s)) if v}
        print(f"\n== projection per paper-size training step (bge-reranker-v2-m3, {TOKENS_PER_PAIR} tokens/pair, "
              f"{flops_per_pair() / 1e9:.0f} GFLOP/pair) ==")  # fmt: skip
        for gpu, (rate, how) in estimated_rates(measured).items():
            print(f"  {gpu}: {rate:,.0f} pairs/s ({how})")
        print(f"{'duplicates':>10} {'queries':>8} {'unique':>7} {'pairs':>8} | {'H200 s':>7} {'(all)':>10} "
              f"{'8xH200 s':>8} | {'A100 s':>7} {'(all)':>10} {'8xA100 s':>8}")  # fmt: skip
        for r in res["projection"]:
            print(f"{r['duplicate_rate']:10.1%} {r['queries']:8d} {r['unique']:7d} {r['pairs']:8.0f} | "
                  f"{r['H200 s']:7.1f} {r['H200 s, all computed']:10.1f} {r['H200 s'] / 8:8.2f} | "
                  f"{r['A100 s']:7.1f} {r['A100 s, all computed']:10.1f} {r['A100 s'] / 8:8.2f}")  # fmt: skip
    if "load" in res:
        ld = res["load"]
        st = ld["stats"]
        print(f"\n== load: {args.load_clients} concurrent clients x {args.load_requests} requests, demo index "
              f"({ld['distinct_queries']} distinct queries in the pool) ==")  # fmt: skip
        print(f"{ld['requests']} requests, {ld['queries']} queries in {ld['seconds']:.1f} s "
              f"({ld['requests'] / ld['seconds']:.0f} requests/s), errors {ld['errors']}, "
              f"latency p50 {ld['p50_ms']:.0f} ms, p99 {ld['p99_ms']:.0f} ms, max {ld['max_ms']:.0f} ms; "
              f"computed {st['computed']}, cache hits {st['cache']['hits']}, coalesced {st['coalesced']}")  # fmt: skip
        if "service_cpu_s" in ld:
            print(f"  CPU seconds under load: service {ld['service_cpu_s']:.0f}, load generator "
                  f"{ld['client_cpu_s']:.0f}")  # fmt: skip
        if ld.get("later_p50_ms") is not None:
            print(f"  after each client's first request (warm cache): p50 {ld['later_p50_ms']:.0f} ms, "
                  f"p99 {ld['later_p99_ms']:.0f} ms")  # fmt: skip
        if ld["errors"]:
            print("  first errors:", ld["first_errors"])
        targets.append(f"load: {ld['errors']} errors ({'met' if ld['errors'] == 0 else 'NOT met'}), "
                       f"p50 {ld['p50_ms']:.0f} ms, p99 {ld['p99_ms']:.0f} ms")  # fmt: skip
    return targets
