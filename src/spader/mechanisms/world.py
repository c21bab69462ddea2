"""A controlled multi-answer search world: synthetic entities, passages and query pages.

Each question has gold entities of two kinds, following the premise of the paper (docs/mechanisms.md,
"The world"):

* **head** entities are popular: they are the subject of most passages a broad query returns
  (every page of the broad ranking mentions them again), and they also turn up in facet pages;
* **rare** entities are each tied to one of the question's facets; a broad page mentions one
  only now and then, and the specific query naming its facet is the way to find it.

Every passage also mentions a distractor (a name that is not a gold answer) now and then.

The agent's search actions: ``BROAD`` (the question's own words; the first call shows page 1 of the
broad ranking, the next call page 2, ...), ``FACET_1`` ... ``FACET_F`` (a query naming one facet:
always the same page, so repeating one finds nothing new) and ``STOP`` (answer with every name
seen so far). Passages are text; which gold entities and distractors a page shows is computed once
by the project's matcher (:func:`spader.core.matching.find_hits`), and the answer is scored by the
project's metric (:func:`spader.core.metrics.prf`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from spader.core.matching import find_hits
from spader.core.metrics import prf

__all__ = ["BROAD", "Question", "World", "WorldSpec", "make_world"]

BROAD = 0  #: action index of the broad query; facet f (1-based) is action f; STOP is the last


@dataclass(frozen=True)
class WorldSpec:
    """The world's parameters (fixed before any arm was measured; docs/mechanisms.md says why each).

    Attributes:
        heads: inclusive range of the number of head entities of a question.
        rare: inclusive range of the number of rare entities (spread over the facets in turn).
        facets: facet queries per question.
        distractors: non-gold names per question.
        broad_pages: pages of the broad ranking (the n-th broad call shows page n; no page after
            the last).
        page_size: passages per page.
        broad_head: share of a broad passage's subjects that are head entities (the rest are rare).
        facet_own: share of a facet passage's subjects that are the facet's own rare entities.
        facet_head: share that are head entities (the rest: rare entities of other facets).
        distractor: probability that a passage also mentions a distractor.
    """

    heads: tuple[int, int] = (3, 7)
    rare: tuple[int, int] = (3, 7)
    facets: int = 3
    distractors: int = 4
    broad_pages: int = 3
    page_size: int = 5
    broad_head: float = 0.9
    facet_own: float = 0.6
    facet_head: float = 0.3
    distractor: float = 0.25

    @property
    def actions(self) -> int:
        """Search actions plus STOP."""
        return 2 + self.facets

    @property
    def stop(self) -> int:
        return 1 + self.facets


@dataclass
class Question:
    """One question: its gold entities (``head`` flags), distractors and pages.

    Attributes:
        gold: gold entity names (one alias each).
        head: per gold entity, whether it is a head entity.
        distractors: non-gold names.
        pages: per page (broad pages first, then one per facet), the passage texts.
        gold_bits: per page, bitmask of the gold entities its passages mention (find_hits).
        distractor_bits: per page, bitmask of the distractors it mentions.
    """

    gold: list[str]
    head: np.ndarray
    distractors: list[str]
    pages: list[list[str]]
    gold_bits: np.ndarray
    distractor_bits: np.ndarray
    _scores: dict[int, tuple[float, float, float]] = field(default_factory=dict, repr=False)

    @property
    def n_gold(self) -> int:
        return len(self.gold)

    def answer_scores(self, pages_seen: int) -> tuple[float, float, float]:
        """P/R/F1 (:func:`spader.core.metrics.prf`) of the answer naming everything the pages of the
        bitmask ``pages_seen`` showed (cached: few page sets occur)."""
        if pages_seen not in self._scores:
            gold_bits = dist_bits = 0
            for p in range(len(self.pages)):
                if pages_seen >> p & 1:
                    gold_bits |= int(self.gold_bits[p])
                    dist_bits |= int(self.distractor_bits[p])
            named = [g for k, g in enumerate(self.gold) if gold_bits >> k & 1]
            named += [d for k, d in enumerate(self.distractors) if dist_bits >> k & 1]
            self._scores[pages_seen] = prf(named, [[g] for g in self.gold])
        return self._scores[pages_seen]


@dataclass
class World:
    """Questions of one seed (training and held-out evaluation questions) and the spec."""

    spec: WorldSpec
    train: list[Question]
    test: list[Question]


_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")


def _names(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct made-up two-word names (no word is shared, so no name contains another)."""
    words: set[str] = set()
    out = []
    while len(out) < n:
        pair = []
        while len(pair) < 2:
            w = "".join(
                _ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(3)
            )
            if w not in words:
                words.add(w)
                pair.append(w.capitalize())
        out.append(" ".join(pair))
    return out


def _bits(indices: set[int]) -> int:
    return sum(1 << i for i in indices)


def _question(spec: WorldSpec, rng: np.random.Generator) -> Question:
    n_head = int(rng.integers(spec.heads[0], spec.heads[1] + 1))
    n_rare = int(rng.integers(spec.rare[0], spec.rare[1] + 1))
    names = _names(rng, n_head + n_rare + spec.distractors)
    gold, distractors = names[: n_head + n_rare], names[n_head + n_rare :]
    heads = list(range(n_head))
    rare = list(range(n_head, n_head + n_rare))
    facet_of = {e: k % spec.facets for k, e in enumerate(rare)}

    def passage(subject: int) -> str:
        text = f"{gold[subject]} is one of the answers this passage is about."
        if rng.random() < spec.distractor:
            text += f" It also names {distractors[rng.integers(len(distractors))]}."
        return text

    def pick(pool: list[int]) -> int:
        return pool[rng.integers(len(pool))]

    pages = []
    for _ in range(spec.broad_pages):
        pages.append(
            [
                passage(pick(heads) if rng.random() < spec.broad_head else pick(rare))
                for _ in range(spec.page_size)
            ]
        )
    for f in range(spec.facets):
        own = [e for e in rare if facet_of[e] == f]
        other = [e for e in rare if facet_of[e] != f] or own
        page = []
        for _ in range(spec.page_size):
            u = rng.random()
            pool = own if u < spec.facet_own else heads if u < spec.facet_own + spec.facet_head else other
            page.append(passage(pick(pool)))
        pages.append(page)
    # one matcher call per page: gold entities first, then the distractors
    found = [_bits(find_hits(p, [[name] for name in names])) for p in pages]
    n_gold = len(gold)
    return Question(
        gold=gold,
        head=np.array([e < n_head for e in range(n_gold)]),
        distractors=distractors,
        pages=pages,
        gold_bits=np.array([f & ((1 << n_gold) - 1) for f in found], dtype=np.int64),
        distractor_bits=np.array([f >> n_gold for f in found], dtype=np.int64),
    )


def make_world(
    seed: int, *, train_questions: int, test_questions: int, spec: WorldSpec | None = None
) -> World:
    """The questions of one seed: ``train_questions`` to train on, ``test_questions`` held out."""
    spec = spec or WorldSpec()
    rng = np.random.default_rng([seed, 0x5EA])
    qs = [_question(spec, rng) for _ in range(train_questions + test_questions)]
    return World(spec, qs[:train_questions], qs[train_questions:])
