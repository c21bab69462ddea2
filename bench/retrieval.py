"""Benchmark of the search stack on a generated corpus in the real chunk format.

Generates at least 200,000 passages (~100 words, Zipf vocabulary of 50,000 words) and 512 queries,
then measures, in one run and side by side:

1. Indexing docs/s: our build (``python -m spader.retrieval index``, streaming the ``.tar.gz``,
   and again from the extracted directory) against the raw pyserini indexing CLI
   (``python -m pyserini.index.lucene --collection JsonCollection --generator
   DefaultLuceneDocumentGenerator --storeRaw``, on the extracted directory), same threads, each
   in a fresh process (JVM start-up included on both sides). The overhead target compares the
   two on the same extracted directory; from the archive, our streaming build is compared with
   ``tar xzf`` followed by the raw CLI (which cannot read a .tar.gz).
2. Queries/s for BM25 top-50 -> cross-encoder -> top-5 (and BM25 top-5 alone, reranker off):
   (a) our service over HTTP on 127.0.0.1 (``running_service`` + ``RetrievalClient``): one
       request of 512 queries, and 128 concurrent requests of 4 queries (the training pattern),
       reranking in passes of ``--rerank-batch`` pairs sorted by length across queries;
   (b) the design of the authors' and Search-R1's servers, in process (no HTTP, which only
       favours it): one query at a time through ``LuceneSearcher.search`` with passages looked up
       by id (``searcher.doc(docid).raw()``), then ``FlagReranker.compute_score`` per query in a
       thread pool.
   Both must return identical top-5s.

The reranker is a tiny random XLM-R cross-encoder (no weights can be downloaded here; see
:func:`build_bench_reranker`), loaded and run by both designs through the same FlagEmbedding
class. Both do the same model FLOPs per pair, so the ratio measures the design: batch search,
stored raw documents instead of lookups by id, one tokenizer call per chunk of pairs instead of
FlagEmbedding 1.4.2's per-pair tokenize/decode/re-tokenize, and no batch-size probe
(``compute_score`` runs its first batch twice, i.e. every 50-pair query twice).

Training scale (``retrieval_scale.py``, ``retrieval_load.py``), in the same run:

3. ``stream``: a rollout-shaped query stream (prompts x 16 rollouts, 2-3 search turns of 2-3
   queries; first turns often repeat the question, later turns diverge) at duplicate rates swept
   from 0 to 60%, through a service with the result cache, one without (which still computes
   repeats merged into one slice once), and the latter with every repeat made a different text
   (every query computed): queries/s, reranker pairs, identical top-5s; then the projection per paper-size training step (queries, unique
   queries, pairs, reranker seconds on one H200 / one A100 from the pairs and the model's FLOPs,
   or from ``--h200-pairs-per-s``/``--a100-pairs-per-s`` measured, e.g. by ``bench/reranker_gpu.py``).
4. ``overlap``: slices of 64 with BM25 of the next slice overlapping reranking, without overlap,
   and unsliced.
5. ``replicas``: one reranker replica vs two.
6. ``load``: 512 concurrent clients x 20 requests against the service on the demo index: errors,
   p50/p99 latency as the clients and as the service (``/stats``) measured it.

Targets: service >= 3x the per-query design's queries/s with identical results; indexing
overhead <= 10% over raw pyserini (same input); at a 50% duplicate rate >= 2x fewer reranker
pairs and >= 1.8x queries/s with the cache against every query computed (and the same ratios
against the cache-less service, reported), identical top-5s; 0 errors under load.

The run ends by writing a record (``bench/records/``; ``retrieval_record.py``): one row per section,
and the stream and projection tables docs/retrieval.md quotes.

Usage: .venv/bin/python bench/retrieval.py [--passages 200000] [--queries 512] [--threads 2]
       [--rounds 3] [--rerank-batch 256] [--device cpu] [--keep DIR]
       [--sections index,search,stream,overlap,replicas,load] [--rates 0,0.2,0.4,0.5,0.6]
       [--prompts 32] [--h200-pairs-per-s N] [--a100-pairs-per-s N] [--load-clients 512]
       [--load-requests 20] [--load-distinct 400] [--records DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import statistics
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import retrieval_record
from retrieval_index import OURS_DIR, OURS_TAR, RAW, RAW_TAR, bench_indexing
from retrieval_load import bench_load
from retrieval_scale import (
    bench_overlap,
    bench_replicas,
    bench_stream,
    projection,
    report_scale,
    service_settings,
)

VOCAB = 50_000
ONE_REQUEST, CONCURRENT, PER_QUERY = (
    retrieval_record.ONE_REQUEST,
    retrieval_record.CONCURRENT,
    retrieval_record.PER_QUERY,
)
_CONS, _VOWELS = "bcdfghjklmnprstvwz", "aeiou"
SYLLABLES = [c + v for c in _CONS for v in _VOWELS]  # 90 syllables of lowercase letters


def word(i: int) -> str:
    """The i-th pseudo-word (2-3 syllables, unique)."""
    out = []
    for _ in range(3 if i >= len(SYLLABLES) ** 2 else 2):
        i, r = divmod(i, len(SYLLABLES))
        out.append(SYLLABLES[r])
    return "".join(out)


def make_corpus(root: Path, n: int, n_queries: int, seed: int = 0):
    """Write ``n`` chunk records (4 jsonl files + the .tar.gz; kept if a previous run in the same
    ``--keep`` directory wrote them) and return ``(dir, archive, queries, make_fresh)``;
    ``make_fresh(seed)`` returns a function giving new queries of the same kind."""
    rng = np.random.default_rng(seed)
    words = np.array([word(i) for i in range(VOCAB)])
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    p /= p.sum()
    body = rng.choice(VOCAB, size=(n, 100), p=p)
    titles = rng.choice(VOCAB, size=(n, 2), p=p)
    out = root / "corpus" / "wikipedia_chunks" / "chunks_v5"
    archive = root / "chunked_wikipedia.tar.gz"
    if not archive.exists():
        out.mkdir(parents=True, exist_ok=True)
        files = [open(out / f"wikipedia_chunks_{i}.jsonl", "w") for i in range(4)]
        for i in range(n):
            title, text, cid = " ".join(words[titles[i]]), " ".join(words[body[i]]), f"{i // 3}__{i % 3}"
            rec = {
                "id": cid,
                "contents": f"{title} {text}",
                "meta": {"title": title, "content": text, "page_id": str(i // 3), "chunk_id": cid},
            }
            files[i % 4].write(json.dumps(rec) + "\n")
        for f in files:
            f.close()
        with tarfile.open(archive.with_suffix(".tmp"), "w:gz", compresslevel=1) as tf:
            tf.add(root / "corpus" / "wikipedia_chunks", arcname="wikipedia_chunks")
        os.replace(archive.with_suffix(".tmp"), archive)

    def query(r) -> str:  # words of one passage plus frequent words, as questions mix both
        doc = body[r.integers(n)]
        picked = list(r.choice(doc, size=r.integers(2, 5), replace=False)) + list(
            r.choice(VOCAB, size=r.integers(1, 4), p=p)
        )
        return " ".join(words[picked])

    queries = [query(rng) for _ in range(n_queries)]

    def make_fresh(stream_seed: int):
        r = np.random.default_rng([seed, stream_seed])
        return lambda: query(r)

    return root / "corpus", archive, queries, make_fresh


def build_bench_reranker(out: Path, seed: int = 0) -> Path:
    """A tiny random XLM-R cross-encoder (the shape of ``spader.demo.tiny``) with a word-level
    tokenizer over the synthetic vocabulary: passages come to ~100 tokens as real ones do with
    bge-reranker-v2-m3 (the 65-piece tiny tokenizer would spell them out letter by letter, ~500
    tokens), every word is known (FlagEmbedding's decode/re-encode round trip is exact), and
    ``initializer_range=0.5`` spreads the scores (the usual 0.02 puts every pair within ~1e-5,
    where batched vs per-query float noise reorders near-ties)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from spader.demo.tiny import save_random_cross_encoder

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = {t: i for i, t in enumerate(specials + [word(i) for i in range(VOCAB)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return save_random_cross_encoder(tok, out, seed=seed, initializer_range=0.5)


class PerQueryDesign:
    """One query at a time through BM25 (docs looked up by id), per-query reranking in a thread pool."""

    def __init__(self, index: Path, reranker: Path | None, threads: int, device: str):
        from pyserini.search.lucene import LuceneSearcher

        self.searcher = LuceneSearcher(str(index))
        self.searcher.set_bm25(0.9, 0.4)
        self.threads = threads
        self.local = threading.local()
        self.base = None
        if reranker is not None:
            from FlagEmbedding import FlagReranker

            self.base = FlagReranker(
                str(reranker), use_fp16=False, devices=[device], batch_size=64, max_length=512
            )

    def _reranker(self):
        # The servers share one model across threads; the fast tokenizer is not thread-safe
        # ("Already borrowed"), so each worker gets its own tokenizer copy over the same weights.
        r = getattr(self.local, "r", None)
        if r is None:
            r = self.local.r = copy.copy(self.base)
            r.tokenizer = copy.deepcopy(self.base.tokenizer)
        return r

    def _bm25(self, query: str, k: int) -> list[dict]:
        hits = self.searcher.search(query, k)
        out = []
        for h in hits:
            rec = json.loads(self.searcher.doc(h.docid).raw())
            out.append(
                {
                    "id": rec["id"],
                    "text": f"{rec['meta']['title']} {rec['meta']['content']}",
                    "score": h.score,
                }
            )
        return out

    def _rerank(self, item: tuple[str, list[dict]]) -> list[tuple[str, float]]:
        query, cands = item
        if not cands:
            return []
        scores = self._reranker().compute_score([[query, c["text"]] for c in cands])
        scores = [scores] if isinstance(scores, float) else scores
        order = sorted(range(len(cands)), key=lambda i: -scores[i])
        return [(cands[i]["id"], float(scores[i])) for i in order[:5]]

    def retrieve(self, queries: list[str]) -> list[list[tuple[str, float]]]:
        if self.base is None:
            return [[(c["id"], c["score"]) for c in self._bm25(q, 5)] for q in queries]
        candidates = [self._bm25(q, 50) for q in queries]
        with ThreadPoolExecutor(self.threads) as pool:
            return list(pool.map(self._rerank, zip(queries, candidates, strict=True)))


def ours_one_request(client, queries):
    return [[(p["id"], p["score"]) for p in hits] for hits in client.retrieve(queries)]


def ours_concurrent(client, queries, per_request=4, workers=64):
    chunks = [queries[i : i + per_request] for i in range(0, len(queries), per_request)]
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(client.retrieve, chunks))
    return [[(p["id"], p["score"]) for p in hits] for part in parts for hits in part]


def compare(a, b) -> tuple[int, float]:
    same = sum([i for i, _ in x] == [i for i, _ in y] for x, y in zip(a, b, strict=True))
    diffs = [abs(s - t) for x, y in zip(a, b, strict=True) for (_, s), (_, t) in zip(x, y, strict=True)]
    return same, max(diffs, default=0.0)


def bench_search(
    index: Path,
    reranker: Path | None,
    queries: list[str],
    threads: int,
    rounds: int,
    device: str,
    rerank_batch: int,
) -> dict:
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service

    # No result cache: every round computes every query, as the per-query design does.
    settings = service_settings(reranker, rerank_batch, cache_entries=0)
    times: dict[str, list[float]] = {
        ONE_REQUEST: [],
        CONCURRENT: [],
        PER_QUERY: [],
    }
    results = {}
    # The service starts first: a process forked after the tokenizer ran loses tokenizer threads.
    with (
        running_service(index, SearchSettings.from_config(settings), threads=threads) as url,
        RetrievalClient(url, timeout=600, retries=0) as c,
    ):
        import torch

        torch.set_num_threads(threads)  # what the service does with the same `threads`
        per_query = PerQueryDesign(index, reranker, threads, device)
        per_query.retrieve(queries[:8])  # warm-up (JIT, first forward)
        c.retrieve(queries[:8])
        for r in range(rounds):
            for name, fn in (
                (ONE_REQUEST, lambda: ours_one_request(c, queries)),
                (CONCURRENT, lambda: ours_concurrent(c, queries)),
                (PER_QUERY, lambda: per_query.retrieve(queries)),
            ):
                started = time.perf_counter()
                results[name] = fn()
                times[name].append(time.perf_counter() - started)
                print(
                    f"  search round {r + 1} ({'rerank' if reranker else 'BM25 only'}): {name}: "
                    f"{times[name][-1]:.2f} s",
                    flush=True,
                )
    base = results[PER_QUERY]
    out = {}
    for name, ts in times.items():
        same, diff = compare(results[name], base)
        out[name] = {
            "best_s": min(ts),
            "median_s": statistics.median(ts),
            "qps": len(queries) / min(ts),
            "identical_top5": same,
            "max_score_diff": diff,
        }
    return out


def report(indexing: dict | None, search: dict | None, args, n_queries: int) -> None:
    """Print the side-by-side tables, the ratios and whether the issue's targets are met.

    Indexing overhead compares like with like: our indexer and the raw CLI on the same extracted
    directory. From the archive, our streaming build is compared with extracting it and then
    running the raw CLI (the raw CLI cannot read a .tar.gz)."""
    targets = []
    if indexing:
        print(f"\n== indexing {args.passages:,} passages, {args.threads} threads (best of {args.rounds}) ==")
        for name, r in indexing.items():
            same_input = RAW_TAR if name in (OURS_TAR, RAW_TAR) else RAW
            overhead = r["best_s"] / indexing[same_input]["best_s"] - 1
            print(
                f"{name:30s} {r['best_s']:7.1f} s {r['docs_per_s']:9,.0f} docs/s  vs {same_input} {overhead:+.1%}"
            )
        overhead = indexing[OURS_DIR]["best_s"] / indexing[RAW]["best_s"] - 1
        targets.append(
            f"indexing overhead <= 10%: {overhead:+.1%} ({'met' if overhead <= 0.10 else 'NOT met'})"
        )
    if search:
        for mode, res in search.items():
            base = res[PER_QUERY]["qps"]
            what = (
                "BM25 top-50 -> tiny reranker -> top-5" if mode == "rerank" else "BM25 top-5 (reranker off)"
            )
            print(f"\n== {n_queries} queries, {what}, {args.threads} threads (best of {args.rounds}) ==")
            for name, r in res.items():
                print(
                    f"{name:26s} {r['best_s']:7.2f} s {r['qps']:8.1f} q/s  x{r['qps'] / base:5.2f}  "
                    f"identical top-5 {r['identical_top5']}/{n_queries}  max score diff {r['max_score_diff']:.1e}"
                )
        ratio = search["rerank"][ONE_REQUEST]["qps"] / search["rerank"][PER_QUERY]["qps"]
        identical = all(r["identical_top5"] == n_queries for res in search.values() for r in res.values())
        targets.insert(
            0,
            f"service >= 3x the per-query design: x{ratio:.2f} ({'met' if ratio >= 3 else 'NOT met'}), "
            f"identical top-5s: {'yes' if identical else 'NO'}",
        )
    if targets:
        print("\ntargets: " + "; ".join(targets))


SECTIONS = ("index", "search", "stream", "overlap", "replicas", "load")


def _parser() -> argparse.ArgumentParser:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=512)
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 2,
        help="indexing threads; search threads, torch threads and the per-query design's pool size",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--rerank-batch",
        type=int,
        default=256,
        help="our service's pairs per forward pass (it batches across queries; the per-query design "
        "scores one query's 50 candidates per pass whatever its batch size)",
    )
    parser.add_argument("--device", default="cpu", help="device of the per-query design's reranker")
    parser.add_argument("--keep", default=None, help="work directory to keep (default: a temporary one)")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )
    parser.add_argument("--rates", default="0,0.2,0.4,0.5,0.6", help="duplicate rates of the query stream")
    parser.add_argument(
        "--prompts",
        type=int,
        default=32,
        help="prompts per stream step (16 rollouts each; 32: the paper's step)",
    )
    parser.add_argument(
        "--h200-pairs-per-s", type=float, default=None, help="measured reranker pairs/s, one H200"
    )
    parser.add_argument(
        "--a100-pairs-per-s", type=float, default=None, help="measured reranker pairs/s, one A100"
    )
    parser.add_argument("--load-clients", type=int, default=512)
    parser.add_argument("--load-requests", type=int, default=20, help="requests per client")
    parser.add_argument(
        "--load-distinct", type=int, default=400, help="distinct queries the clients draw from"
    )
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    return parser


def _corpus_sections(args, sections: list[str], work: Path, started: float, results: dict) -> None:
    """Generate the corpus, then run the sections that search it (all but ``load``) into ``results``."""
    corpus_dir, archive, queries, make_fresh = make_corpus(work, args.passages, args.queries)
    print(
        f"corpus: {args.passages:,} passages, {archive.stat().st_size / 2**20:.0f} MiB archive, "
        f"{len(queries)} queries ({time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    if "index" in sections:
        results["indexing"] = bench_indexing(
            work, corpus_dir, archive, args.passages, args.threads, args.rounds
        )
    elif not (work / "index").exists():
        from spader.retrieval.index import build_bm25_index

        build_bm25_index(corpus_dir, work / "index", threads=args.threads)
    from spader.retrieval.jvm import start_jvm

    start_jvm("4g")
    reranker = build_bench_reranker(work / "tiny_reranker")
    index = work / "index"
    common = (args.threads, args.rerank_batch)
    if "search" in sections:
        results["search"] = {
            "rerank": bench_search(
                index, reranker, queries, args.threads, args.rounds, args.device, args.rerank_batch
            ),
            "bm25": bench_search(
                index, None, queries, args.threads, args.rounds, args.device, args.rerank_batch
            ),
        }
    if "stream" in sections:
        rates = [float(r) for r in args.rates.split(",")]
        results["stream"] = bench_stream(
            index, reranker, make_fresh, *common, rates, args.prompts, args.rounds
        )
        measured = {"H200": args.h200_pairs_per_s, "A100": args.a100_pairs_per_s}
        results["projection"] = projection(results["stream"], measured)
    if "overlap" in sections:
        results["overlap"] = bench_overlap(index, reranker, queries, *common, args.rounds)
    if "replicas" in sections:
        results["replicas"] = bench_replicas(index, reranker, queries, *common, args.rounds)


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the service sets it (spader.retrieval.__main__)

    load_before = os.getloadavg()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_retrieval_"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict = {"args": vars(args)}
    if set(sections) - {"load"}:
        _corpus_sections(args, sections, work, started, results)
    if "load" in sections:
        demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "chunked_wikipedia.tar.gz"
        results["load"] = bench_load(
            work, demo, args.load_clients, args.load_requests, args.load_distinct, args.threads
        )

    if "indexing" in results or "search" in results:
        report(results.get("indexing"), results.get("search"), args, args.queries)
    targets = report_scale(results, args)
    if targets:
        print("\ntargets (training scale): " + "; ".join(targets))
    print(f"machine: {os.cpu_count()} CPUs, load average {load_before} before, {os.getloadavg()} after")
    (work / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {work / 'results.json'} (total {time.perf_counter() - started:.0f} s)")
    print(f"record: {retrieval_record.write(results, args)}")


if __name__ == "__main__":
    main()
