"""A controlled multi-answer search world: synthetic entities, passages and query pages.

Each question has gold entities of two kinds, following the premise of the paper (docs/mechanisms.md,
"The world"):

* **head** entities are popular: they are the subject of most passages of the broad ranking (the
  question's own words), and they also turn up on facet pages;
* **rare** entities each belong to one of the question's **facets** (sub-topics). Facets differ in
  yield: a *rich* facet holds several rare entities, a *poor* one none or one. A facet's own page
  (the query naming it) is mostly about its rare entities; elsewhere a rare entity turns up only
  now and then, and the passage that mentions it names its facet.

So what a search returns tells the agent where to look next: a passage about a rare entity names
its facet, a **lead** (rich facets give more of them), while a facet no passage has named can only
be tried **blind**. Every page also names some of its own distractors (names that are not answers;
each facet page has its own, so a search of a facet adds its distractors to the answer).

The agent's actions: ``BROAD`` (the question's words; the n-th call shows page n of the broad
ranking), ``LEAD`` (the query naming a facet that a passage seen so far named and that was not
searched yet), ``BLIND`` (the query naming a facet no passage has named yet) and ``STOP`` (answer
with every name seen so far). An episode has at most ``max_turns`` decision steps.

Passages are text; which gold entities, distractors and facet names a page shows is computed once
by the project's matcher (:func:`spader.core.matching.find_hits`), and the answer is scored by the
project's metric (:func:`spader.core.metrics.prf`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from spader.core.matching import find_hits
from spader.core.metrics import prf

__all__ = [
    "ACTIONS",
    "BLIND",
    "BROAD",
    "LEAD",
    "STOP",
    "SearchQuestion",
    "SearchWorld",
    "WorldSpec",
    "make_world",
    "popcount",
]

BROAD, LEAD, BLIND, STOP = 0, 1, 2, 3
ACTIONS = ("broad", "lead", "blind", "stop")


@dataclass(frozen=True)
class WorldSpec:
    """The world's parameters, fixed before any arm was trained (docs/mechanisms.md says why each).

    Attributes:
        heads: inclusive range of the number of head entities of a question.
        facets: facets per question.
        rich_share: probability that a facet is rich (a question with none gets one rich facet).
        rich, poor: inclusive ranges of the number of rare entities of a rich / poor facet.
        broad_pages: pages of the broad ranking (the n-th broad call shows page n).
        page_size: passages per page.
        broad_head: share of a broad passage's subjects that are head entities (the rest: a rare
            entity drawn from all of the question's rare entities, so rich facets come up more).
        facet_own: share of a facet passage's subjects that are the facet's own rare entities (a
            facet with none gives that share to the head entities).
        facet_head: share that are head entities (the rest: rare entities of other facets).
        distractors: distractor names of the broad ranking and of each facet.
        distractor: probability that a passage also names one of its page's distractors.
        max_turns: decision steps per episode; one still searching at the last is cut off.
    """

    heads: tuple[int, int] = (3, 6)
    facets: int = 6
    rich_share: float = 0.25
    rich: tuple[int, int] = (3, 5)
    poor: tuple[int, int] = (0, 1)
    broad_pages: int = 2
    page_size: int = 5
    broad_head: float = 0.8
    facet_own: float = 0.7
    facet_head: float = 0.2
    distractors: int = 2
    distractor: float = 0.3
    max_turns: int = 7

    def __post_init__(self):
        if not 1 <= self.facets <= 8:
            raise ValueError(
                f"facets must be 1..8 (the policy's state counts them in a byte), got {self.facets}"
            )

    @property
    def pages(self) -> int:
        """Broad pages, then one page per facet."""
        return self.broad_pages + self.facets


@dataclass
class SearchQuestion:
    """One question: its gold entities, facets, distractors and pages.

    Attributes:
        gold: gold entity names (one alias each); the head entities first.
        head: per gold entity, whether it is a head entity.
        facet_of: per gold entity, its facet (-1 for a head entity).
        facet_names, distractors: the facets' names, and the distractor names.
        pages: per page (broad pages first, then one per facet), the passage texts.
        gold_bits: per page, bitmask of the gold entities its passages name (find_hits).
        facet_bits: per page, bitmask of the facets its passages name (the leads it gives).
        distractor_bits: per page, bitmask of the distractors it names.
    """

    gold: list[str]
    head: np.ndarray
    facet_of: np.ndarray
    facet_names: list[str]
    distractors: list[str]
    pages: list[list[str]]
    gold_bits: np.ndarray
    facet_bits: np.ndarray
    distractor_bits: np.ndarray
    _scores: dict[int, tuple[float, float, float]] = field(default_factory=dict, repr=False)
    _f1: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_gold(self) -> int:
        return len(self.gold)

    @property
    def rare_bits(self) -> int:
        """Bitmask of the rare gold entities."""
        return sum(1 << k for k in range(self.n_gold) if not self.head[k])

    def f1_table(self) -> np.ndarray:
        """Answer F1 for every set of pages seen (index: the bitmask of pages), from counts: every
        name is distinct and no name contains another, so the answer naming ``k`` gold entities and
        ``d`` distractors scores ``2k / (k + d + |gold|)``; equal to :meth:`answer_scores` (the
        project's metric) on every set, which tests/mechanisms checks."""
        if self._f1 is None:
            subsets = np.arange(1 << len(self.pages), dtype=np.int64)
            gold = np.zeros_like(subsets)
            dist = np.zeros_like(subsets)
            for p in range(len(self.pages)):
                has = (subsets >> p) & 1 == 1
                gold[has] |= self.gold_bits[p]
                dist[has] |= self.distractor_bits[p]
            k, d = popcount(gold), popcount(dist)
            self._f1 = np.where(k > 0, 2 * k / np.maximum(k + d + self.n_gold, 1), 0.0)
        return self._f1

    def answer_scores(self, pages_seen: int) -> tuple[float, float, float]:
        """P/R/F1 (:func:`spader.core.metrics.prf`) of the answer naming everything the pages of the
        bitmask ``pages_seen`` showed."""
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
class SearchWorld:
    """Questions of one seed (training and held-out evaluation questions) and the spec."""

    spec: WorldSpec
    train: list[SearchQuestion]
    test: list[SearchQuestion]


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


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each (non-negative) int64."""
    x = x.astype(np.uint64)
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 8), axis=-1).sum(axis=-1).astype(np.int64)


def _bits(indices: set[int]) -> int:
    return sum(1 << i for i in indices)


def _draw(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _question(spec: WorldSpec, rng: np.random.Generator) -> SearchQuestion:
    n_head = _draw(rng, spec.heads)
    rich = rng.random(spec.facets) < spec.rich_share
    if not rich.any():
        rich[rng.integers(spec.facets)] = True
    sizes = [_draw(rng, spec.rich if r else spec.poor) for r in rich]
    facet_of = [-1] * n_head + [f for f, n in enumerate(sizes) for _ in range(n)]
    n_gold, n_dist = len(facet_of), spec.distractors * (1 + spec.facets)
    names = _names(rng, n_gold + n_dist + spec.facets)
    gold, distractors, facet_names = names[:n_gold], names[n_gold : n_gold + n_dist], names[n_gold + n_dist :]
    heads = list(range(n_head))
    rare = list(range(n_head, n_gold))
    own = [[e for e in rare if facet_of[e] == f] for f in range(spec.facets)]

    def passage(subject: int, kind: int) -> str:
        """A passage about ``subject`` on a page of ``kind`` (0: broad ranking, 1 + f: facet f)."""
        text = f"{gold[subject]} is one of the answers this passage is about."
        if facet_of[subject] >= 0:
            text += f" It is listed under {facet_names[facet_of[subject]]}."
        if rng.random() < spec.distractor:
            text += f" It also names {distractors[kind * spec.distractors + rng.integers(spec.distractors)]}."
        return text

    def pick(pool: list[int]) -> int:
        return pool[rng.integers(len(pool))]

    pages = []
    for _ in range(spec.broad_pages):
        subjects = [
            pick(heads) if not rare or rng.random() < spec.broad_head else pick(rare)
            for _ in range(spec.page_size)
        ]
        pages.append([passage(s, 0) for s in subjects])
    for f in range(spec.facets):
        other = [e for e in rare if facet_of[e] != f]
        page = []
        for _ in range(spec.page_size):
            u = rng.random()
            if u < spec.facet_own:
                pool = own[f] or heads
            elif u < spec.facet_own + spec.facet_head or not other:
                pool = heads
            else:
                pool = other
            page.append(passage(pick(pool), 1 + f))
        pages.append(page)
    # one matcher call per page: gold entities, then the distractors, then the facet names
    found = [_bits(find_hits(p, [[name] for name in names])) for p in pages]
    n_named = n_gold + n_dist
    return SearchQuestion(
        gold=gold,
        head=np.array([f < 0 for f in facet_of]),
        facet_of=np.array(facet_of, dtype=np.int64),
        facet_names=facet_names,
        distractors=distractors,
        pages=pages,
        gold_bits=np.array([x & ((1 << n_gold) - 1) for x in found], dtype=np.int64),
        facet_bits=np.array([x >> n_named for x in found], dtype=np.int64),
        distractor_bits=np.array([(x >> n_gold) & ((1 << n_dist) - 1) for x in found], dtype=np.int64),
    )


def make_world(
    seed: int, *, train_questions: int, test_questions: int, spec: WorldSpec | None = None
) -> SearchWorld:
    """The questions of one seed: ``train_questions`` to train on, ``test_questions`` held out."""
    spec = spec or WorldSpec()
    rng = np.random.default_rng([seed, 0x5EB])
    qs = [_question(spec, rng) for _ in range(train_questions + test_questions)]
    return SearchWorld(spec, qs[:train_questions], qs[train_questions:])
