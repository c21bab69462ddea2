"""Cross-encoder reranking with a tiny random XLM-R (a stand-in for bge-reranker-v2-m3: real loading
and scoring code, meaningless scores) and the BM25 -> rerank backend."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sections import search_settings

from spader.retrieval.backend import Bm25RerankBackend, SearchSettings
from spader.retrieval.reranker import CrossEncoderReranker

# Words the tiny tokenizer holds as whole pieces (spader.demo.tiny._reranker_vocab): FlagEmbedding's
# decode/re-encode round trip is exact for them, so its scores are the reference for ours.
WORDS = (
    "the quick brown fox jumps over lazy dog which films were directed by director lucene builds an inverted "
    "index of wikipedia passages reranker scores query passage pairs rivers lakes mountains cities novels"
).split()


@pytest.fixture(scope="module")
def reranker(tiny_reranker):
    return CrossEncoderReranker(tiny_reranker, batch_size=8, max_length=512, fp16=True, device="cpu")


def _pairs(n, seed=0, passage_words=(5, 60)):
    rng = random.Random(seed)
    return [
        (
            " ".join(rng.choices(WORDS, k=rng.randint(2, 8))),
            " ".join(rng.choices(WORDS, k=rng.randint(*passage_words))),
        )
        for _ in range(n)
    ]


def test_scores_equal_flagembedding_compute_score(reranker):
    pairs = _pairs(40) + _pairs(3, seed=1, passage_words=(600, 700))  # the long ones are truncated
    ours = reranker.score(pairs)
    reference = np.asarray(reranker.flag_reranker().compute_score([list(p) for p in pairs]), dtype=np.float32)
    assert ours.shape == (43,) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)


def test_the_tiny_reranker_builds_byte_identically(tmp_path):
    """A fresh demo run builds its reranker again: the same bytes, so the same searches (a trained
    Unigram vocabulary moved token ids from build to build)."""
    from spader.demo.tiny import build_tiny_reranker

    first, second = build_tiny_reranker(tmp_path / "a"), build_tiny_reranker(tmp_path / "b")
    files = sorted(p.name for p in first.iterdir())
    assert "tokenizer.json" in files and "model.safetensors" in files
    assert files == sorted(p.name for p in second.iterdir())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_the_tiny_reranker_tokenizes_english_without_unknown_pieces(reranker):
    tok = reranker.tokenizer
    text = "Lake Askgarner (Title: Varga, 1999) - which films were directed by Ana?"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok.tokenize("the director") == ["\u2581the", "\u2581director"]  # corpus words are one piece


def test_chunked_tokenization_gives_the_same_scores(reranker, monkeypatch):
    from spader.retrieval import reranker as module

    pairs = _pairs(50, seed=3)
    whole = reranker.score(pairs)
    monkeypatch.setattr(module, "_CHUNK", 7)  # 8 chunks, the next tokenized while one is scored
    np.testing.assert_allclose(reranker.score(pairs), whole, atol=1e-6)  # other batches: float noise only


def test_scoring_never_reconfigures_the_shared_tokenizer(reranker):
    """Pairs are truncated by a private copy of the tokenizer: the replica's tokenizer keeps its
    settings, so cutting queries in one thread while pairs are tokenized in another neither fails
    ("Already borrowed") nor changes either's ids."""
    from concurrent.futures import ThreadPoolExecutor

    settings = (reranker.tokenizer.backend_tokenizer.truncation, reranker.tokenizer.backend_tokenizer.padding)
    long_queries = [" ".join(WORDS * 30), *(q for q, _ in _pairs(20, seed=4))]
    pairs = _pairs(40, seed=5, passage_words=(200, 700))
    cut, encoded = reranker.cut_queries(long_queries), reranker._encode(*map(list, zip(*pairs, strict=True)))
    assert (
        reranker.tokenizer.backend_tokenizer.truncation,
        reranker.tokenizer.backend_tokenizer.padding,
    ) == settings

    with ThreadPoolExecutor(2) as pool:
        cuts = pool.submit(lambda: [reranker.cut_queries(long_queries) for _ in range(200)])
        encodes = pool.submit(
            lambda: [reranker._encode(*map(list, zip(*pairs, strict=True))) for _ in range(200)]
        )
        assert cuts.result() == [cut] * 200
        assert encodes.result() == [encoded] * 200


def test_long_query_is_cut_like_flagembedding(reranker):
    pairs = [(" ".join(WORDS * 30), "lucene builds an inverted index")]  # > 3/4 of max_length tokens
    reference = reranker.flag_reranker().compute_score([list(pairs[0])])
    np.testing.assert_allclose(reranker.score(pairs), np.atleast_1d(reference), atol=1e-6)


def test_score_of_a_pair_does_not_depend_on_its_batch(reranker):
    pairs = _pairs(30, seed=2)
    together = reranker.score(pairs)
    alone = np.concatenate([reranker.score([p]) for p in pairs])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert reranker.score([]).shape == (0,)


def test_fp16_only_on_gpu(reranker):
    assert reranker.device == "cpu" and reranker.fp16 is False
    import torch

    assert next(reranker.model.parameters()).dtype == torch.float32


@pytest.fixture(scope="module")
def backend(bm25_index, tiny_reranker):
    return Bm25RerankBackend(
        bm25_index, search_settings(reranker=str(tiny_reranker), fp16=False, rerank_batch_size=4)
    )


def test_backend_keeps_the_reranker_top_k_of_the_bm25_candidates(backend):
    queries = ["films directed by Ilse Varga", "river flowing into Lake Ørnes", "band album"]
    got = backend.search(queries, topk=2, initial_k=4)
    candidates = backend.searcher.search(queries, 4)
    for query, hits, cands in zip(queries, got, candidates, strict=True):
        scores = backend.reranker.score([(query, f"{c.title} {c.text}") for c in cands])
        expected = [cands[i].id for i in sorted(range(len(cands)), key=lambda i: -scores[i])[:2]]
        assert [h.id for h in hits] == expected
        assert [h.score for h in hits] == pytest.approx(sorted(scores, reverse=True)[:2], abs=1e-5)
        assert {h.id for h in hits} <= {c.id for c in cands}


def test_backend_without_reranker_returns_bm25_order(bm25_index):
    plain = Bm25RerankBackend(bm25_index, search_settings(reranker=None))
    assert plain.reranker is None
    hits = plain.search(["films directed by Ilse Varga"], topk=2, initial_k=50)[0]
    assert [(h.id, round(h.score, 4)) for h in hits] == [("1003__1", 2.2408), ("1001__0", 2.0802)]


def test_repeated_queries_are_searched_once(backend, monkeypatch):
    seen = []
    search = backend.searcher.search
    monkeypatch.setattr(backend.searcher, "search", lambda qs, k: seen.append(list(qs)) or search(qs, k))
    a, _b, c = backend.search(["Lucene", "Winter Quay", "Lucene"], topk=1, initial_k=3)
    assert seen == [["Lucene", "Winter Quay"]]
    assert a == c and a[0].id == "5001__0"


def test_max_batch_tokens_bounds_every_pass_and_changes_no_score(tiny_reranker, monkeypatch):
    """A token cap per pass: long pairs fill fewer rows, short ones the whole batch; same scores."""
    capped = CrossEncoderReranker(
        tiny_reranker, batch_size=8, max_length=512, fp16=False, device="cpu", max_batch_tokens=2000
    )
    assert [capped.rows_for(width) for width in (100, 500, 512, 9000)] == [8, 4, 3, 1]
    pairs = _pairs(30, seed=4) + _pairs(6, seed=5, passage_words=(600, 700))  # up to 512 tokens
    shapes = []
    logits = capped._logits

    def spy(ids, mask):
        shapes.append(tuple(ids.shape))
        return logits(ids, mask)

    monkeypatch.setattr(capped, "_logits", spy)
    got = capped.score(pairs)
    assert all(rows * width <= 2000 for rows, width in shapes)
    assert max(rows for rows, _ in shapes) == 8 and max(width for _, width in shapes) == 512
    assert sum(rows for rows, _ in shapes) == len(pairs)
    uncapped = CrossEncoderReranker(tiny_reranker, batch_size=8, max_length=512, fp16=False, device="cpu")
    assert uncapped.max_batch_tokens == 8 * 512
    np.testing.assert_allclose(got, uncapped.score(pairs), atol=1e-5)


def test_max_batch_tokens_setting_reaches_the_replicas(bm25_index, tiny_reranker):
    cfg = {"reranker": {"path": str(tiny_reranker), "batch_size": 8, "max_batch_tokens": 300, "fp16": False}}
    settings = SearchSettings.from_config(cfg)
    assert settings.rerank_max_batch_tokens == 300
    backend = Bm25RerankBackend(bm25_index, settings)
    assert [r.max_batch_tokens for r in backend.reranker.replicas] == [300]
    with pytest.raises(ValueError, match="rerank_max_batch_tokens must be >= 1"):
        search_settings(rerank_max_batch_tokens=0)
