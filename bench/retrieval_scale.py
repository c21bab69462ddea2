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


def every_query_distinct(turns: list[list[list[str]]]) -> list[list[list[str]]]:
    """The stream with every repeat of a query made a different text: the k-th repeat gets k
    trailing spaces. Neither BM25's analyzer nor the reranker's tokenizer sees them, so the results
    are the same (the bench checks it), but no two requests share a text: the service computes
    every query, which is what the pairs and queries/s of the cache are compared with."""
    seen: dict[str, int] = {}
    out = []
    for requests in turns:
        turn = []
        for request in requests:
            texts = []
            for q in request:
                texts.append(q + " " * seen.get(q, 0))
                seen[q] = seen.get(q, 0) + 1
            turn.append(texts)
        out.append(turn)
    return out


CACHE, NO_CACHE, EVERY = "cache", "no cache", "every query"


def _stream_round(variants, turns: list, k: int, r: int, runs: dict, identical: dict) -> int:
    """Replay one stream through every service (rotating which goes first), adding a run to
    ``runs`` and the identical top-5s to ``identical``; returns the stream's query count."""
    n = sum(len(q) for requests in turns for q in requests)
    top = {}
    shift = (k + r) % len(variants)
    for name, c, distinct in variants[shift:] + variants[:shift]:  # rotate who goes first
        before = c.health()["stats"]
        results, seconds = replay(c, every_query_distinct(turns) if distinct else turns)
        after = c.health()["stats"]
        top[name] = _top_ids(results)
        runs[name].append(
            {
                "seconds": seconds,
                "qps": n / seconds,
                **{
                    key: after[key] - before[key]
                    for key in ("pairs_reranked", "computed", "rerank_s", "bm25_s")
                },
            }
        )
    for name in identical:
        identical[name] += sum(a == b for a, b in zip(top[CACHE], top[name], strict=True))
    return n


def _stream_row(
    target: float, seen_rates: list, queries: int, rounds: int, identical: dict, runs: dict
) -> dict:
    """The stream table's row of one duplicate rate, from its rounds' runs."""
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
            "seconds": sum(x["seconds"] for x in rs),
            "pairs": sum(x["pairs_reranked"] for x in rs),
            "computed": sum(x["computed"] for x in rs),
            "rerank_s": sum(x["rerank_s"] for x in rs),
        }
        # cache's speed-up over this service, per round (same stream, back to back)
        row[name]["speedups"] = [c["qps"] / x["qps"] for c, x in zip(runs[CACHE], rs, strict=True)]
    return row


def _stream_rate(variants, k: int, target: float, make_fresh, prompts, rounds: int) -> dict:
    """``rounds`` new streams of duplicate rate ``target`` through every service; returns its row."""
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    seen_rates, queries, identical = [], 0, {NO_CACHE: 0, EVERY: 0}
    for r in range(rounds):
        turns, rate = calibrate(target, make_fresh, prompts, seed=100 + k + 1000 * r)
        n = _stream_round(variants, turns, k, r, runs, identical)
        seen_rates.append(rate)
        queries += n
        print(
            f"  stream {rate:5.1%} duplicates, {n} queries, round {r + 1}: "
            + " | ".join(
                f"{name} {x['qps']:6.1f} q/s {x['pairs_reranked']} pairs {x['seconds']:.1f} s "
                f"(BM25 {x['bm25_s']:.1f} s, rerank {x['rerank_s']:.1f} s)"
                for name, x in ((name, runs[name][-1]) for name in runs)
            ),
            flush=True,
        )
    return _stream_row(target, seen_rates, queries, rounds, identical, runs)


def bench_stream(
    index: Path, reranker: Path, make_fresh, threads: int, rerank_batch: int, rates, prompts, rounds: int = 1
) -> dict:
    """The stream at each duplicate rate through three services: with the cache; without it (the
    service before the cache: identical queries merged into one slice are still computed once);
    and without it on the stream whose repeats are all different texts (:func:`every_query_distinct`:
    every query computed, no result reused at all).

    Each of ``rounds`` rounds replays a new stream of the rate (other queries, so the cache starts
    cold for it) through the three, rotating which goes first. Ratios are taken per round (the
    three replays of one stream run back to back, so a slower spell of the shared machine hits
    them alike) and summarised by their median; queries/s is also given as each service's best
    round. Pairs and computed queries are summed over the rounds.
    """
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service

    on = service_settings(reranker, rerank_batch)
    off = service_settings(reranker, rerank_batch, cache_entries=0)
    out = {}
    with (
        running_service(index, SearchSettings.from_config(on), threads=threads) as url_on,
        running_service(index, SearchSettings.from_config(off), threads=threads) as url_off,
        RetrievalClient(url_on, timeout=900, retries=0) as c_on,
        RetrievalClient(url_off, timeout=900, retries=0) as c_off,
    ):
        for c in (c_on, c_off):  # warm-up outside the measurement, with queries of no later step
            replay(c, calibrate(0.0, make_fresh, 1, seed=999)[0][:1])
        variants = [(CACHE, c_on, False), (NO_CACHE, c_off, False), (EVERY, c_off, True)]
        for k, target in enumerate(rates):
            out[f"{target:.0%}"] = _stream_rate(variants, k, target, make_fresh, prompts, rounds)
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
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service

    times = {(v, p): [] for v in variants for p in ("one request", "concurrent, 4 each")}
    results = {}
    with contextlib.ExitStack() as stack:
        clients = {}
        for name, settings in variants.items():
            url = stack.enter_context(
                running_service(index, SearchSettings.from_config(settings), threads=threads)
            )
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


def _report_stream(res: dict, args) -> list[str]:
    """Print the stream table; returns its target lines."""
    targets = []
    print(f"\n== rollout-shaped stream, {args.prompts} prompts x 16 rollouts: with the cache, without it, "
          f"and every query computed ({args.rounds} rounds, each a new stream) ==")  # fmt: skip
    print(
        "('no cache': identical queries merged into one slice are still computed once, as before the cache;"
    )
    print(
        " 'every query': the same service on the stream with every repeat a different text, no reuse at all;"
    )
    print(
        " x q/s: the cache's queries/s over the other's, median of the rounds [range]; / pairs: pairs saved)"
    )
    print(f"{'duplicates':>10} {'queries':>7} | {'q/s: cache':>10} {'no cache':>8} {'every':>6} | "
          f"{'pairs: cache':>12} {'no cache':>8} {'every':>7} | {'vs no cache: x q/s':>26} {'/ pairs':>7} | "
          f"{'vs every query: x q/s':>26} {'/ pairs':>7} | identical top-5 (no cache/every)")  # fmt: skip
    for row in res["stream"].values():
        c, u, e = row[CACHE], row[NO_CACHE], row[EVERY]
        cells = []
        for other in (u, e):
            sp = other["speedups"]
            cells.append(f"x{statistics.median(sp):5.2f} [{min(sp):.2f}-{max(sp):.2f}] "
                         f"(best {c['qps'] / other['qps']:.2f}) {other['pairs'] / max(c['pairs'], 1):7.2f}")  # fmt: skip
        same = "/".join(str(v) for v in row["identical_top5"].values())
        print(f"{row['duplicate_rate']:10.1%} {row['queries']:7d} | {c['qps']:10.1f} {u['qps']:8.1f} "
              f"{e['qps']:6.1f} | {c['pairs']:12d} {u['pairs']:8d} {e['pairs']:7d} | {cells[0]:>34} | "
              f"{cells[1]:>34} | {same} of {row['queries']}")  # fmt: skip
    half = min(res["stream"].values(), key=lambda r: abs(r["target"] - 0.5))
    c = half[CACHE]
    same = all(v == half["queries"] for v in half["identical_top5"].values())
    for name in (EVERY, NO_CACHE):
        speedup = statistics.median(half[name]["speedups"])
        fewer = half[name]["pairs"] / max(c["pairs"], 1)
        # 2x is all the saving a 50% rate allows; a stream a hair under 50% allows a hair less
        best = 1 / (1 - half["duplicate_rate"])
        targets.append(
            f"at {half['duplicate_rate']:.1%} duplicates vs {name}: reranker pairs / {fewer:.2f} "
            f"(>= 2, at most {best:.3f} at this rate: {'met' if fewer >= min(2, best) - 5e-3 else 'NOT met'}), "
            f"queries/s x{speedup:.2f} "
            f"(>= 1.8: {'met' if speedup >= 1.8 else 'NOT met'})"
        )
    targets.append(f"identical top-5s: {'yes' if same else 'NO'}")
    return targets


def _report_projection(res: dict, args) -> None:
    """Print the projection per paper-size training step."""
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


def _report_load(ld: dict, args) -> str:
    """Print the load section; returns its target line."""
    st = ld["stats"]
    print(f"\n== load: {args.load_clients} concurrent clients x {args.load_requests} requests, demo index "
          f"({ld['distinct_queries']} distinct queries in the pool) ==")  # fmt: skip
    print(f"{ld['requests']} requests, {ld['queries']} queries in {ld['seconds']:.1f} s "
          f"({ld['requests'] / ld['seconds']:.0f} requests/s), errors {ld['errors']}, "
          f"latency p50 {ld['p50_ms']:.0f} ms, p99 {ld['p99_ms']:.0f} ms, max {ld['max_ms']:.0f} ms; "
          f"computed {st['computed']}, cache hits {st['cache']['hits']}, coalesced {st['coalesced']}")  # fmt: skip
    lat, lag = st["latency_ms"], st["loop_lag_ms"]
    print(f"  as the service measured it (request parsed -> answer encoded): p50 {lat['p50_ms']:.1f} ms, "
          f"p99 {lat['p99_ms']:.0f} ms, max {lat['max_ms']:.0f} ms; event loop late by p99 "
          f"{lag['p99_ms']:.1f} ms, max {lag['max_ms']:.0f} ms")  # fmt: skip
    print(f"  reranking the {st['computed']} distinct queries took {st['rerank_s']:.1f} s "
          f"({st['pairs_reranked'] / max(st['rerank_s'], 1e-9):.0f} pairs/s), BM25 {st['bm25_s']:.1f} s: "
          f"a request that needs a query computed waits for the backlog ahead of it")  # fmt: skip
    if "service_cpu_s" in ld:
        print(f"  CPU seconds under load: service {ld['service_cpu_s']:.0f}, load generator "
              f"{ld['client_cpu_s']:.0f}")  # fmt: skip
    if ld.get("later_p50_ms") is not None:
        print(f"  after each client's first request (warm cache): p50 {ld['later_p50_ms']:.0f} ms, "
              f"p99 {ld['later_p99_ms']:.0f} ms")  # fmt: skip
    if ld["errors"]:
        print("  first errors:", ld["first_errors"])
    return (f"load: {ld['errors']} errors ({'met' if ld['errors'] == 0 else 'NOT met'}), "
            f"p50 {ld['p50_ms']:.0f} ms, p99 {ld['p99_ms']:.0f} ms")  # fmt: skip


def report_scale(res: dict, args) -> list[str]:
    """Print the training-scale tables; returns the target lines (for the summary at the end)."""
    targets = []
    if "stream" in res:
        targets += _report_stream(res, args)
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
        _report_projection(res, args)
    if "load" in res:
        targets.append(_report_load(res["load"], args))
    return targets
