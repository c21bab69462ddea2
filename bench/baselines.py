"""Benchmark of the step-level baselines' extra work: StepSearch's information gain per training
step and its evidence building, side by side with the straightforward designs.

1. Information gain of one training step at the paper's batch: 32 prompts x 16 rollouts = 512
   trajectories, up to 16 turns (15 search turns + the answer), ``--queries`` queries per call,
   5 passages per query (~100 words, Zipf vocabulary), 5 evidence passages per question (the
   mix's 60k entities over 12k questions), each rollout drawing its passages from a pool per
   question as rollouts of one prompt do. Timed end to end through
   :func:`spader.methods.stepsearch.densify.stepsearch_dense_rewards` (records -> dense token rewards):
   (a) ours in the trainer process; (b) ours with the TF-IDF on a pool of ``--workers``
   processes (the training default); (c) StepSearch's design: a TF-IDF vectoriser fitted for
   every returned passage (scikit-learn, as its code does), timed on a sample and scaled to the
   batch. Also the demo's batch (2 prompts x 2 rollouts x 3 turns).
2. Evidence building (rule ``build_evidence``) on a generated corpus through the real service
   (BM25 -> tiny random cross-encoder, every BM25 candidate reranked): our batched, concurrent
   requests against one query per request, and the projection to the paper's ~60k entities.

Target: the information gain of a paper-size step under 30 s.

The run ends by writing a record (``bench/records/``, see ``bench/records.py``), one row per part.

Usage: .venv/bin/python bench/baselines.py [--queries 1] [--workers 2] [--passages 30000]
       [--questions 100] [--skip-evidence] [--records DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from records import write_record  # bench/records.py (the script's own directory is on sys.path)

from spader.methods.steps import TurnDetails
from spader.methods.stepsearch.densify import stepsearch_dense_rewards

VOCAB = 20_000


_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]


def words(n: int) -> np.ndarray:
    """``n`` distinct pseudo-words of 2-3 syllables (a synthetic vocabulary)."""
    out = []
    for i in range(n):
        parts = []
        for _ in range(3 if i >= len(_SYLLABLES) ** 2 else 2):
            i, r = divmod(i, len(_SYLLABLES))
            parts.append(_SYLLABLES[r])
        out.append("".join(parts))
    return np.array(out)


def make_corpus(root: Path, n: int, seed: int = 0) -> tuple[Path, np.ndarray, np.ndarray]:
    """``n`` chunk records of ~100 Zipf-distributed words as a .tar.gz in the dump's layout;
    returns the archive, the vocabulary and the passages' word ids."""
    import json
    import tarfile

    rng = np.random.default_rng(seed)
    vocab = words(VOCAB)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    body = rng.choice(VOCAB, size=(n, 100), p=p / p.sum())
    out = root / "corpus" / "wikipedia_chunks" / "chunks_v5"
    out.mkdir(parents=True)
    with open(out / "wikipedia_chunks_0.jsonl", "w") as f:
        for i in range(n):
            title, text, cid = " ".join(vocab[body[i, :2]]), " ".join(vocab[body[i, 2:]]), f"{i}__0"
            meta = {"title": title, "content": text, "page_id": str(i), "chunk_id": cid}
            f.write(json.dumps({"id": cid, "contents": f"{title} {text}", "meta": meta}) + "\n")
    archive = root / "chunked_wikipedia.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tf:
        tf.add(root / "corpus" / "wikipedia_chunks", arcname="wikipedia_chunks")
    return archive, vocab, body


def word_reranker(vocab: np.ndarray, out: Path) -> Path:
    """A tiny random cross-encoder with a word-level tokenizer over the synthetic vocabulary, so a
    passage is ~100 tokens as real ones are for bge-reranker-v2-m3 (the tiny model's character
    tokenizer would make it ~500)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from spader.demo.tiny import save_random_cross_encoder

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*specials, *vocab])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return save_random_cross_encoder(tok, out, initializer_range=0.5)


def make_step(prompts: int, rollouts: int, turns: int, queries: int, seed: int = 0):
    """A training batch: response mask, terminal rewards, turn records, question keys, evidence."""
    rng = np.random.default_rng(seed)
    vocab = words(VOCAB)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    p /= p.sum()

    def text(k=100):
        return " ".join(vocab[rng.choice(VOCAB, size=k, p=p)])

    evidence, details, keys = {}, [], []
    for q in range(prompts):
        key = f"q{q}"
        evidence[key] = [text() for _ in range(5)]
        # the pool a prompt's rollouts draw from: some passages reuse evidence sentences
        pool = [text() if rng.random() > 0.1 else evidence[key][rng.integers(5)] for _ in range(300)]
        for _ in range(rollouts):
            rows = []
            for t in range(turns):
                ids = rng.integers(len(pool), size=5 * queries)
                rows.append(
                    TurnDetails(
                        turn=t + 1,
                        passage_ids=tuple(f"{key}:{i}" for i in ids),
                        passage_texts=tuple(pool[i] for i in ids),
                    )
                )
            details.append(rows)
            keys.append(key)
    # each trajectory: turns search runs of 30 tokens, observations of 200, the answer run
    run, obs = 30, 200
    length = (turns + 1) * run + turns * obs
    mask = torch.zeros(len(details), length, dtype=torch.int64)
    for t in range(turns + 1):
        mask[:, t * (run + obs) : t * (run + obs) + run] = 1
    terminal = torch.rand(len(details), generator=torch.Generator().manual_seed(seed))
    return mask, terminal, details, keys, evidence


def timed(fn, rounds=3) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def original_design(details, keys, evidence, sample: int) -> float:
    """StepSearch's code path: per returned passage, a vectoriser fitted on {d, g_1..g_n}.
    Returns the seconds per passage instance (median over ``sample`` instances)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_similarity

    from spader.core.text import normalize

    instances = [(k, t) for d, k in zip(details, keys, strict=True) for turn in d for t in turn.passage_texts]
    rng = np.random.default_rng(1)
    picked = [instances[i] for i in rng.choice(len(instances), size=sample, replace=False)]
    start = time.perf_counter()
    for key, passage in picked:
        docs = [normalize(passage)] + [normalize(g) for g in evidence[key]]
        m = TfidfVectorizer().fit_transform(docs)
        np.maximum(cosine_similarity(m[0], m[1:]).ravel(), 0)
    return (time.perf_counter() - start) / sample, len(instances)


def bench_reward(args) -> dict:
    print(f"== information gain, {args.queries} queries x 5 passages per search turn")
    batch = make_step(32, 16, 15, args.queries)
    mask, terminal, details, keys, evidence = batch
    instances = sum(len(t.passage_ids) for d in details for t in d)
    unique = len({(k, pid) for d, k in zip(details, keys, strict=True) for t in d for pid in t.passage_ids})
    print(
        f"paper batch: {len(details)} trajectories, {instances} passages returned, {unique} distinct per question"
    )

    def ours(pool=None):
        return stepsearch_dense_rewards(mask, terminal, details, keys, evidence, lambda_s=0.6, pool=pool)

    serial, (dense, _) = timed(ours)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        ours(pool)  # start the workers (once per training run)
        parallel, (dense_p, _) = timed(lambda: ours(pool))
    assert torch.equal(dense, dense_p)
    per_instance, n = original_design(details, keys, evidence, args.sample)
    original = per_instance * n
    demo = make_step(2, 2, 3, 1, seed=3)
    demo_s, _ = timed(lambda: stepsearch_dense_rewards(*demo[:4], demo[4], lambda_s=0.6), rounds=5)
    print(f"{'design':44s} {'s/step':>9s} {'vs ours':>8s}")
    print(f"{'(a) ours, trainer process':44s} {serial:9.2f} {1.0:8.2f}")
    print(f"{f'(b) ours, {args.workers} processes':44s} {parallel:9.2f} {serial / parallel:8.2f}")
    print(
        f"{'(c) vectoriser per passage (StepSearch code)':44s} {original:9.1f} {original / serial:8.1f}  (from {args.sample} passages)"
    )
    print(f"demo batch (2 x 2 x 3 turns): {demo_s * 1000:.1f} ms")
    print(
        f"paper-size step: {min(serial, parallel):.2f} s (target < 30 s: {'met' if min(serial, parallel) < 30 else 'NOT met'})"
    )
    best = min(serial, parallel)
    return {
        "id": "information-gain",
        "what": f"StepSearch's information gain of one paper-size step: {len(details)} trajectories x 15 search "
        f"turns x {5 * args.queries} passages ({instances:,} passages, {unique:,} distinct per question), "
        "5 evidence passages per question",
        "result": f"**{best:.1f} s** per step ({serial:.2f} s in the trainer process, {parallel:.2f} s on "
        f"{args.workers} worker processes), {original / serial:.0f}x faster than a TF-IDF vectoriser fitted per "
        f"returned passage (StepSearch's code, {original:.0f} s, timed on {args.sample} passages); the demo's "
        f"batch: {demo_s * 1e3:.0f} ms",
        "target": "< 30 s per paper-size step",
        "verdict": "met" if best < 30 else "not met",
        "numbers": {
            "serial_s": round(serial, 3),
            "parallel_s": round(parallel, 3),
            "original_s": round(original, 1),
            "demo_ms": round(demo_s * 1e3, 2),
            "passages": instances,
            "distinct": unique,
        },
    }


def _evidence_mix(root: Path, n_questions: int, vocab, body) -> Path:
    """A training mix of ``n_questions`` questions of words from one passage each, with five
    entities (three of the passage's words, found; two rare words); returns its path."""
    from spader.data.records import MIX_SCHEMA, records_frame, write_frame

    rng = np.random.default_rng(0)
    rows = []
    for i in range(n_questions):
        # a question of words from one passage; entities: some of its words (found), others rare
        doc = body[rng.integers(len(body))]
        question = " ".join(vocab[rng.choice(doc, size=5, replace=False)])
        names = [
            [str(vocab[w])] for w in [*rng.choice(doc, size=3), *rng.integers(VOCAB // 2, VOCAB, size=2)]
        ]
        rows.append(
            {
                "id": f"b{i}",
                "dataset": "qampari",
                "split": "train",
                "question": question,
                "answers": names,
                "answers_norm": names,
                "meta": {"source_id": f"b{i}"},
            }
        )
    return write_frame(records_frame(rows, MIX_SCHEMA), root / "train.jsonl", MIX_SCHEMA)


def _evidence_settings(reranker: Path) -> dict:
    """The retrieval section of the evidence service (the tiny reranker, no result cache)."""
    return {
        "bm25": {"k1": 0.9, "b": 0.4},
        "initial_k": 50,
        "topk": 5,
        "reranker": {
            "model": "tiny:reranker",
            "path": str(reranker),
            "batch_size": 64,
            "max_length": 512,
            "fp16": False,
        },
        "service": {
            "host": "127.0.0.1",
            "max_queries_per_request": 512,
            "max_query_chars": 1000,
            "startup_timeout_s": 300,
            # no result cache: every design searches every query itself
            "cache_entries": 0,
            "request_timeout_s": 600,
            "retries": 0,
        },
    }


def _time_evidence(index: Path, settings: dict, mix: Path, root: Path) -> tuple[dict, dict]:
    """``(seconds per design, coverage)``: ``build_evidence`` of ``mix`` through the service, one
    query per request and batched."""
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service
    from spader.scorers.evidence import EvidenceSettings, build_evidence

    results = {}
    with (
        running_service(index, SearchSettings.from_config(settings), threads=2) as url,
        RetrievalClient(url, timeout=600, retries=0) as client,
    ):
        for name, s in (
            ("one query per request", EvidenceSettings(depth=50, queries_per_request=1, concurrency=1)),
            (
                "ours: 128 per request, 2 in flight",
                EvidenceSettings(depth=50, queries_per_request=128, concurrency=2),
            ),
            (
                "ours: 128 per request, 1 in flight",
                EvidenceSettings(depth=50, queries_per_request=128, concurrency=1),
            ),
        ):
            start = time.perf_counter()
            coverage = build_evidence(mix, root / "ev.jsonl", root / "cov.json", client=client, settings=s)
            results[name] = time.perf_counter() - start
    return results, coverage


def bench_evidence(args) -> dict:
    from spader.retrieval.index import build_bm25_index

    print(f"\n== evidence building, {args.passages} passages, {args.questions} questions x 5 entities")
    with tempfile.TemporaryDirectory(prefix="bench-evidence-") as tmp:
        root = Path(tmp)
        archive, vocab, body = make_corpus(root, args.passages)
        index = root / "index"
        build_bm25_index(archive, index, threads=2)
        reranker = word_reranker(vocab, root / "reranker")
        mix = _evidence_mix(root, args.questions, vocab, body)
        results, coverage = _time_evidence(index, _evidence_settings(reranker), mix, root)
        entities = coverage["total"]["entities"]
        base = results["one query per request"]
        print(f"{'design':38s} {'s':>8s} {'entities/s':>11s} {'speed-up':>9s}")
        for name, sec in results.items():
            print(f"{name:38s} {sec:8.1f} {entities / sec:11.1f} {base / sec:9.2f}")
        best = min(results.values())
        print(
            f"coverage {coverage['total']['coverage']:.2f}; projected for 60,000 entities on this CPU with the tiny "
            f"reranker: {60000 / entities * best / 60:.0f} min"
        )
    batched = min(results[k] for k in results if k.startswith("ours"))
    return {
        "id": "evidence",
        "what": f"StepSearch evidence (`build_evidence`), {args.passages:,} passages, {entities:,} entities, "
        "every BM25 top-50 reranked",
        "result": f"batched requests of 128: **{base / batched:.1f}x** one query per request "
        f"({entities / batched:.1f} vs {entities / base:.1f} entities/s; tiny cross-encoder on the CPU); "
        f"coverage {coverage['total']['coverage']:.2f}",
        "target": None,
        "verdict": None,
        "numbers": {"seconds": results, "entities": entities, "coverage": coverage["total"]["coverage"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=1, help="queries per search call")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample", type=int, default=400, help="passages timed for the original design")
    parser.add_argument("--passages", type=int, default=30000)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--skip-evidence", action="store_true")
    parser.add_argument("--skip-reward", action="store_true")
    parser.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = parser.parse_args()
    rows = []
    if not args.skip_reward:
        rows.append(bench_reward(args))
    if not args.skip_evidence:
        rows.append(bench_evidence(args))
    if rows:
        print(
            f"record: {write_record('bench/baselines.py', rows, argv=sys.argv[1:], directory=args.records)}"
        )


if __name__ == "__main__":
    main()
