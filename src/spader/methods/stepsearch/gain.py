"""StepSearch's step rewards, adapted to multi-answer QA (docs/baselines.md, "StepSearch").

Per training question the gold evidence is one passage per gold entity (built offline by rule
``build_evidence``, :mod:`spader.scorers.evidence`); ``n`` is the number of entities that have
one. At search turn t of a trajectory, with passages ``d`` returned (all queries of the call):

* match degree ``c_i^t = max_d cos_tfidf(d, g_i)``, the TF-IDF vocabulary and IDF fitted on
  ``{d, g_1..g_n}`` separately for every passage ``d`` (as StepSearch's code does, with the default
  settings of its vectoriser: words of two or more word characters, raw counts, smoothed IDF
  ``ln((1 + N) / (1 + df)) + 1``, L2 norm), on normalised text (norm_v1); clipped at >= 0;
* memory ``m_i^t = max(m_i^{t-1}, c_i^t)``, ``m^0 = 0``;
* information gain ``G^t = (1/n) sum_i max(c_i^t - m_i^{t-1}, 0)`` (0 when ``n = 0``);
* redundancy ``P^t`` = share of the turn's passages whose id was returned before (earlier turn,
  or earlier in the same turn);
* search-turn reward ``lambda_s * (G^t - P^t)``; the answer turn gets the F1 of a valid answer,
  -1 for an invalid format (:func:`spader.core.rewards.terminal_reward`). As in StepSearch's
  code, a trajectory with an invalid format gets no step rewards (only the -1), and a question
  without evidence (``n = 0``) no step reward at all (no redundancy penalty either).

:func:`match_degrees` fits the per-passage TF-IDF of all passages of one question at once: the
IDF of a word only depends on its document frequency among the evidence plus whether the passage
contains it, so the cosine reduces to sums over the passage's words that the evidence also has
(one gather and one cumulative sum for the whole batch, no vectoriser per passage).
:func:`batch_match_degrees` scores a training batch, each (question, passage id) once, spread over
a process pool when one is given.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from itertools import chain

import numpy as np

from spader.core.rewards import terminal_reward
from spader.core.text import normalize

__all__ = [
    "LAMBDA_S",
    "EvidenceIndex",
    "SearchTurn",
    "batch_match_degrees",
    "information_gains",
    "match_degrees",
    "redundancy",
    "stepsearch_rewards",
    "tfidf_tokens",
]

#: StepSearch's nominal scale of the step reward (its code effectively applies 1.6, an option).
LAMBDA_S = 0.6

# The default token pattern of the TF-IDF vectoriser StepSearch's code uses.
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def tfidf_tokens(text: str) -> list[str]:
    """Words of ``normalize(text)`` as the TF-IDF sees them (two or more word characters).

    >>> tfidf_tokens("The Salt-Orchard (a 1961 film)")
    ['saltorchard', '1961', 'film']
    """
    return _TOKEN.findall(normalize(text))


@dataclass(frozen=True)
class EvidenceIndex:
    """Term counts of one question's evidence passages, prepared once per question.

    Attributes:
        vocab: word -> column.
        tf: (n, V) float64 raw counts.
        df: (V,) number of evidence passages containing each word.
    """

    vocab: dict[str, int]
    tf: np.ndarray
    df: np.ndarray

    @property
    def n(self) -> int:
        return int(self.tf.shape[0])

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> EvidenceIndex:
        """Index the evidence texts (raw text; normalised and tokenised here)."""
        counts = [Counter(tfidf_tokens(t)) for t in texts]
        vocab: dict[str, int] = {}
        for c in counts:
            for w in c:
                vocab.setdefault(w, len(vocab))
        tf = np.zeros((len(texts), len(vocab)), dtype=np.float64)
        for i, c in enumerate(counts):
            if c:
                tf[i, [vocab[w] for w in c]] = list(c.values())
        return cls(vocab=vocab, tf=tf, df=(tf > 0).sum(axis=0).astype(np.float64))


def match_degrees(passages: Sequence[Sequence[str]], evidence: EvidenceIndex) -> np.ndarray:
    """TF-IDF cosine of every passage with every evidence passage, fitted per passage.

    Args:
        passages: per passage its tokens (:func:`tfidf_tokens`).
        evidence: the question's :class:`EvidenceIndex`.
    Returns:
        (P, n) float64 in [0, 1]; 0 for a passage or evidence without tokens.

    >>> ev = EvidenceIndex.from_texts(["Winter Quay is a drama film", "Salt Orchard"])
    >>> match_degrees([tfidf_tokens("Winter Quay is a drama film")], ev).round(3).tolist()
    [[1.0, 0.0]]
    """
    n, p = evidence.n, len(passages)
    if n == 0 or p == 0:
        return np.zeros((p, n), dtype=np.float64)
    docs = n + 1  # the passage and the n evidence passages
    df = evidence.df
    idf_both = np.log((docs + 1) / (df + 2)) + 1  # word in the passage and in df evidence
    idf_evidence = np.log((docs + 1) / (df + 1)) + 1  # word in evidence only
    idf_passage = math.log((docs + 1) / 2) + 1  # word in the passage only
    # one id per distinct word: the evidence vocabulary first, then the words only passages have
    # (chain/set/map run in C: no Python step per token)
    tokens = list(chain.from_iterable(passages))
    ids = dict(evidence.vocab)
    v = len(ids)
    unseen = set(tokens).difference(ids)
    ids.update(zip(unseen, range(v, v + len(unseen)), strict=True))
    flat = np.fromiter(map(ids.__getitem__, tokens), dtype=np.int64, count=len(tokens))
    lengths = np.fromiter(map(len, passages), dtype=np.int64, count=p)
    # term counts per (passage, word), sorted by passage
    pairs, cnt = np.unique(np.repeat(np.arange(p), lengths) * len(ids) + flat, return_counts=True)
    row, col = np.divmod(pairs, len(ids))
    cnt = cnt.astype(np.float64)
    own = col >= v  # words the evidence lacks: they only add to the passage's norm
    own_sq = np.bincount(row[own], weights=cnt[own] ** 2, minlength=p)
    row, col, cnt = row[~own], col[~own], cnt[~own]
    lengths = np.bincount(row, minlength=p)
    w2 = idf_both[col] ** 2
    # squared norms of the passage vectors
    d_sq = np.bincount(row, weights=cnt * cnt * w2, minlength=p) + own_sq * idf_passage**2
    g = evidence.tf[:, col]  # (n, nnz)
    # per-segment sums over the shared words through one cumulative sum per evidence row
    ends = np.cumsum(lengths)
    starts = ends - lengths

    def segment_sums(values: np.ndarray) -> np.ndarray:
        cs = np.concatenate([np.zeros((values.shape[0], 1)), np.cumsum(values, axis=1)], axis=1)
        return (cs[:, ends] - cs[:, starts]).T  # (P, n)

    dot = segment_sums(g * (cnt * w2))
    # evidence norms: each word at its evidence-only IDF, corrected where the passage has it too
    base_sq = (evidence.tf**2) @ (idf_evidence**2)
    g_sq = base_sq[None, :] + segment_sums(g * g * (w2 - idf_evidence[col] ** 2))
    denom = np.sqrt(d_sq[:, None] * g_sq)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(denom > 0, dot / np.where(denom > 0, denom, 1.0), 0.0)
    return np.clip(cos, 0.0, 1.0)


@dataclass(frozen=True)
class SearchTurn:
    """The passages one search turn returned (all queries, rank order, repeats kept).

    Attributes:
        ids: passage ids.
        texts: passage texts (title and body), parallel to ``ids``.
    """

    ids: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()

    def __post_init__(self):
        if len(self.ids) != len(self.texts):
            raise ValueError(f"a search turn has {len(self.ids)} passage ids but {len(self.texts)} texts")


def _question_degrees(evidence: Sequence[str], texts: Sequence[str]) -> np.ndarray:
    """(U, n) match degrees of one question's unique passages (a process-pool task)."""
    return match_degrees([tfidf_tokens(t) for t in texts], EvidenceIndex.from_texts(evidence))


def batch_match_degrees(
    trajectories: Sequence[tuple[str, Sequence[SearchTurn]]],
    evidence: Mapping[str, Sequence[str]],
    *,
    pool: Executor | None = None,
) -> list[list[np.ndarray]]:
    """Match degrees ``c^t`` of every search turn of a batch of trajectories.

    Each question's passages are scored once per passage id (the rollouts of one prompt return
    many of the same passages), questions in parallel on ``pool`` when given.

    Args:
        trajectories: per trajectory ``(question key, search turns)``.
        evidence: question key -> evidence texts (a key without evidence has ``n = 0``).
        pool: optional executor (a ``ProcessPoolExecutor`` parallelises the tokenisation).
    Returns:
        Per trajectory, per search turn, the (n,) vector ``c^t`` (max over the turn's passages).
    """
    unique: dict[str, dict[str, str]] = {}
    for key, turns in trajectories:
        seen = unique.setdefault(key, {})
        for turn in turns:
            for pid, text in zip(turn.ids, turn.texts, strict=True):
                seen.setdefault(pid, text)
    keys = [k for k in unique if unique[k] and evidence.get(k)]
    jobs = [(list(evidence[k]), list(unique[k].values())) for k in keys]
    if pool is not None and len(jobs) > 1:
        results = list(pool.map(_question_degrees, *zip(*jobs, strict=True)))
    else:
        results = [_question_degrees(ev, texts) for ev, texts in jobs]
    rows = {k: dict(zip(unique[k], range(len(unique[k])), strict=True)) for k in keys}
    degrees = dict(zip(keys, results, strict=True))
    out: list[list[np.ndarray]] = []
    for key, turns in trajectories:
        n = len(evidence.get(key) or ())
        per_turn = []
        for turn in turns:
            if n == 0 or not turn.ids:
                per_turn.append(np.zeros(n))
            else:
                idx = [rows[key][pid] for pid in turn.ids]
                per_turn.append(degrees[key][idx].max(axis=0))
        out.append(per_turn)
    return out


def information_gains(degrees: Sequence[np.ndarray]) -> list[float]:
    """``G^t`` of each search turn from its match degrees ``c^t`` (memory starts at 0).

    >>> [round(g, 3) for g in information_gains([np.array([0.5, 0.0]), np.array([0.4, 0.6])])]
    [0.25, 0.3]
    """
    gains: list[float] = []
    memory: np.ndarray | None = None
    for c in degrees:
        c = np.asarray(c, dtype=np.float64)
        if c.size == 0:
            gains.append(0.0)
            continue
        memory = np.zeros_like(c) if memory is None else memory
        gains.append(float(np.maximum(c - memory, 0.0).mean()))
        memory = np.maximum(memory, c)
    return gains


def redundancy(turn_ids: Sequence[Sequence[str]]) -> list[float]:
    """``P^t``: share of a turn's passages whose id was returned earlier (0 for a turn without any).

    >>> redundancy([["a", "b"], ["b", "c", "c", "d"]])
    [0.0, 0.5]
    """
    seen: set[str] = set()
    out = []
    for ids in turn_ids:
        repeats = 0
        for pid in ids:
            repeats += pid in seen
            seen.add(pid)
        out.append(repeats / len(ids) if ids else 0.0)
    return out


def stepsearch_rewards(
    degrees: Sequence[np.ndarray],
    turn_ids: Sequence[Sequence[str]],
    final_f1: float | None,
    *,
    lambda_s: float = LAMBDA_S,
    invalid_format_reward: float = -1.0,
) -> list[float]:
    """Rewards of one trajectory's turns: ``lambda_s * (G^t - P^t)`` per search turn, then the
    terminal reward (F1, or ``invalid_format_reward`` when ``final_f1`` is None). The search
    turns get 0 when the format is invalid or the question has no evidence (``n = 0``).

    Args:
        degrees: per search turn ``c^t`` (:func:`batch_match_degrees`).
        turn_ids: per search turn the returned passage ids.
        final_f1: F1 of a valid final answer, None for an invalid format.
        lambda_s: step-reward scale.
        invalid_format_reward: terminal reward of an invalid format.
    Returns:
        ``len(degrees) + 1`` rewards.

    >>> stepsearch_rewards([np.array([0.5])], [["a", "a"]], 0.4, lambda_s=1.0)
    [0.0, 0.4]
    """
    if len(degrees) != len(turn_ids):
        raise ValueError(f"{len(degrees)} turns of match degrees but {len(turn_ids)} turns of passage ids")
    gains, repeats = information_gains(degrees), redundancy(turn_ids)
    search = [lambda_s * (g - r) for g, r in zip(gains, repeats, strict=True)]
    no_evidence = all(np.asarray(c).size == 0 for c in degrees)
    if final_f1 is None or no_evidence:
        search = [0.0] * len(search)
    return [*search, terminal_reward(final_f1, invalid_format_reward=invalid_format_reward)]
