"""Uncertainty of evaluation scores over questions: bootstrap intervals and paired tests (numpy only).

A method's score on a test set is the mean of per-question scores (P, R or F1), so its
uncertainty is that of a mean over the questions drawn: the questions are resampled, never the
methods. Every function here takes the per-question scores and a seed and returns the same numbers
for the same inputs.

The resampled unit is the question, or a *cluster* of questions (``clusters``: a label per
question; questions with one label are one unit, in whichever stratum they are). Clusters are for
questions that are not independent: the CPU demo asks about one topic in several datasets, so the
``avg`` over datasets resamples topics, not questions (:mod:`spader.evaluation.topics`).

* :func:`bootstrap_means` - percentile bootstrap: resample the units with replacement,
  ``samples`` times; the 95% interval of a score is the 2.5th and 97.5th percentile of its
  resampled values (:func:`percentile_interval`). Several quantities measured on the same
  questions (P, R, F1 of every method) share the resamples, so differences between them are
  paired. A score averaged over datasets (the tables' ``avg``, the unweighted mean of the
  datasets' means) is resampled within each dataset (stratified), as it was computed; clusters
  that span datasets are drawn once for all the datasets they span, and each dataset's mean stays
  a sum over its drawn questions divided by its number of questions.
* :class:`SignFlip` / :func:`paired_permutation_test` - whether two methods differ on the same
  questions: under the null hypothesis the two scores of a unit are exchangeable, so the sign of
  each unit's (summed, weighted) difference is flipped at random (approximate randomization),
  exactly over all sign patterns when few units differ. Used for p-values rather than the paired
  bootstrap because it needs no assumption about the shape of the difference's distribution and
  keeps its level with few questions and many ties (most per-question F1 differences are 0),
  where bootstrap p-values are known to be too small. The difference's interval is the set of
  differences this same test does not reject (:meth:`SignFlip.interval`), so interval and test
  agree. :func:`smallest_p` is the smallest p-value it can return: a unit whose difference is 0
  has no sign to flip, so it depends on the units that *differ*.
* :func:`holm` - Holm's step-down adjustment of a family of p-values.
* :func:`seed_spread` - mean and sample standard deviation of a score over sampling seeds.

Resampling runs in chunks of resamples as counts of each unit (``counts @ scores``), so memory
stays at ``chunk x units`` whatever the number of methods.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = [
    "EXACT_MAX_PAIRS",
    "SignFlip",
    "bootstrap_means",
    "exact",
    "holm",
    "paired_permutation_test",
    "percentile_interval",
    "seed_spread",
    "smallest_p",
    "stratified_mean",
]

_CHUNK = 512  # resamples per chunk


def _strata(strata: Sequence[np.ndarray] | np.ndarray) -> list[np.ndarray]:
    """Per-stratum arrays of shape ``(k, n_s)`` (a 1-D array is one quantity)."""
    if isinstance(strata, np.ndarray):
        strata = [strata]
    out = []
    for i, s in enumerate(strata):
        a = np.asarray(s, dtype=np.float64)
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim != 2 or a.shape[1] == 0:
            raise ValueError(
                f"stratum {i}: expected scores of shape (quantities, questions >= 1), got {a.shape}"
            )
        if not np.isfinite(a).all():
            raise ValueError(f"stratum {i}: scores must be finite")
        out.append(a)
    if not out:
        raise ValueError("no stratum of scores")
    if len({a.shape[0] for a in out}) != 1:
        raise ValueError(f"strata disagree on the number of quantities: {[a.shape[0] for a in out]}")
    return out


def stratified_mean(strata: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """The statistic the bootstrap resamples: per quantity, the unweighted mean over strata of the
    mean over each stratum's questions.

    >>> stratified_mean([np.array([1.0, 0.0]), np.array([1.0, 1.0, 1.0, 1.0])]).tolist()
    [0.75]
    """
    parts = _strata(strata)
    return sum(a.mean(axis=1) for a in parts) / len(parts)


def _counts(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    """How often each of ``n`` questions is drawn in each of ``rows`` resamples of size ``n``."""
    idx = rng.integers(0, n, size=(rows, n))
    flat = idx + n * np.arange(rows)[:, None]
    return np.bincount(flat.ravel(), minlength=rows * n).reshape(rows, n)


Clusters = Sequence[Sequence[Hashable]] | None


def _components(clusters: Clusters, sizes: list[int]) -> list[tuple[list[int], list[np.ndarray], int]]:
    """How :func:`bootstrap_means` draws: ``(strata, per stratum the unit of each question,
    number of units)`` per group of strata linked by a shared cluster label, in the order of
    their first stratum; units are numbered in first-seen order. Without clusters every stratum
    is its own group and every question its own unit."""
    if clusters is None:
        return [([s], [np.arange(n)], n) for s, n in enumerate(sizes)]
    labels = [list(c) for c in clusters]
    if [len(c) for c in labels] != sizes:
        raise ValueError(
            f"clusters: one label per question expected, got {[len(c) for c in labels]} for {sizes}"
        )
    root = list(range(len(sizes)))

    def find(s: int) -> int:
        while root[s] != s:
            s = root[s]
        return s

    first: dict[Hashable, int] = {}
    for s, stratum in enumerate(labels):
        for x in stratum:
            root[find(s)] = find(first.setdefault(x, s))
    groups: dict[int, list[int]] = {}
    for s in range(len(sizes)):
        groups.setdefault(find(s), []).append(s)
    out = []
    for members in sorted(groups.values()):
        index: dict[Hashable, int] = {}
        units = [
            np.array([index.setdefault(x, len(index)) for x in labels[s]], dtype=np.int64) for s in members
        ]
        out.append((members, units, len(index)))
    return out


def bootstrap_means(
    strata: Sequence[np.ndarray] | np.ndarray, samples: int, seed: int, clusters: Clusters = None
) -> np.ndarray:
    """Bootstrap distribution of :func:`stratified_mean`.

    Args:
        strata: per dataset, scores of shape ``(k, n_s)`` (k quantities on the same n_s questions;
            a 1-D array is one quantity); one stratum is a plain mean over questions.
        samples: number of resamples.
        seed: seed of the resampling (the same seed gives the same resamples).
        clusters: per stratum, a label per question (None: every question its own unit). A
            resample draws as many units as there are, with replacement, from every group of
            strata that share labels; a drawn unit brings all its questions, in every stratum,
            and stratum s's mean is the sum over its drawn questions divided by ``n_s``.
    Returns:
        ``(samples, k)``: the statistic of every quantity in each resample. Resample ``j`` draws
        the same units for every quantity, so differences of its columns are paired.

    >>> draws = bootstrap_means(np.array([0.0, 1.0, 1.0, 1.0]), samples=2000, seed=0)
    >>> draws.shape, abs(float(draws.mean()) - 0.75) < 0.01
    ((2000, 1), True)
    >>> pairs = bootstrap_means(np.array([0.0, 0.0, 1.0, 1.0]), 2000, 0, clusters=[[0, 0, 1, 1]])
    >>> sorted({round(float(x), 2) for x in pairs[:, 0]})  # both questions of a pair, or neither
    [0.0, 0.5, 1.0]
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    parts = _strata(strata)
    rng = np.random.default_rng(seed)
    out = np.zeros((samples, parts[0].shape[0]))
    for members, units, count in _components(clusters, [a.shape[1] for a in parts]):
        for start in range(0, samples, _CHUNK):
            rows = min(_CHUNK, samples - start)
            drawn = _counts(rng, rows, count)
            for s, unit in zip(members, units, strict=True):
                out[start : start + rows] += drawn[:, unit] @ parts[s].T / parts[s].shape[1]
    return out / len(parts)


def percentile_interval(draws: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of bootstrap draws (``(samples, k)`` or ``(samples,)``), per column.

    >>> lo, hi = percentile_interval(np.arange(101.0), 0.9)
    >>> round(float(lo), 6), round(float(hi), 6)
    (5.0, 95.0)
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(np.asarray(draws, dtype=np.float64), [tail, 100 - tail], axis=0)
    return lo, hi


#: The sign-flip test enumerates all ``2**n`` sign patterns for up to this many units (4,096
#: patterns), and beyond it while ``2**n`` is not more than the random patterns it would draw
#: (``samples``; 13 units at the default 10,000); otherwise it draws ``samples`` random patterns.
#: Units whose difference is 0 do not count at 0 (:meth:`SignFlip.p_value`).
EXACT_MAX_PAIRS = 12


def exact(n: int, samples: int) -> bool:
    """Whether the test of ``n`` units enumerates every sign pattern (:data:`EXACT_MAX_PAIRS`)."""
    return n <= EXACT_MAX_PAIRS or (n < 63 and (1 << n) <= samples)


def smallest_p(differing: int, samples: int) -> float:
    """The smallest p-value :func:`paired_permutation_test` can return when ``differing`` units
    (questions, or clusters of them) differ between the two methods.

    A unit whose difference is 0 looks the same under either sign, so only the ``k`` differing
    units count. When :func:`exact` holds for ``k`` the test enumerates their ``2**k`` patterns:
    only the observed signs and their mirror image are as extreme when all ``k`` differ in one
    direction, so it reaches ``2 / 2**k`` and no less (1 for one differing unit or none).
    Otherwise it draws random patterns and reaches ``1 / (samples + 1)`` (no random pattern as
    extreme), where ``2 / 2**k < 2 / samples``. With 6 differing questions no difference can reach
    p < 0.031, so nothing is significant at 0.05 after a multiple-testing adjustment over more
    than one comparison, however many questions tie.

    >>> smallest_p(6, 10_000), smallest_p(1, 10_000), smallest_p(0, 10_000), round(smallest_p(100, 9_999), 6)
    (0.03125, 1.0, 1.0, 0.0001)
    """
    if differing < 0:
        raise ValueError(f"the number of differing units must be >= 0, got {differing}")
    return min(1.0, 2.0 / (1 << differing)) if exact(differing, samples) else 1.0 / (samples + 1)


def _units(clusters: Sequence[Sequence[Hashable]], sizes: list[int]) -> tuple[np.ndarray, int]:
    """The unit of every question of the concatenated strata (labels numbered in first-seen
    order) and the number of units."""
    labels = [list(c) for c in clusters]
    if [len(c) for c in labels] != sizes:
        raise ValueError(
            f"clusters: one label per question expected, got {[len(c) for c in labels]} for {sizes}"
        )
    index: dict[Hashable, int] = {}
    return np.array([index.setdefault(x, len(index)) for c in labels for x in c], dtype=np.int64), len(index)


def _unit_sums(values: np.ndarray, unit: np.ndarray, count: int) -> np.ndarray:
    """``values`` (``(k, n)`` or ``(n,)``) summed over the questions of each unit."""
    if values.ndim == 1:
        return np.bincount(unit, weights=values, minlength=count)
    return np.stack([np.bincount(unit, weights=row, minlength=count) for row in values]).reshape(-1, count)


class SignFlip:
    """The paired sign-flip test of ``stratified_mean(a) - stratified_mean(b) == delta``, for any
    shift ``delta``, on one fixed set of sign patterns.

    The statistic is the stratified mean of the shifted differences, one weighted sum over all
    questions (stratum s weighs ``1 / (S * n_s)``). Its unit is a question, or a cluster of
    questions (``clusters``: a label per question of each stratum; one label is one unit across
    strata): under the null hypothesis each unit's weighted sum of differences minus ``delta``
    times its weight is symmetric about 0, so its sign is kept or flipped with probability 1/2.
    A pattern's statistic is linear in ``delta``: ``sum_u s_u D_u - delta * sum_u s_u W_u``
    (``D_u``, ``W_u``: the unit's weighted difference and weight). The patterns are all ``2**U``
    when :func:`exact` says so for the ``U`` units, otherwise ``samples`` random ones (``seed``);
    at ``delta = 0`` the units that tie (``D_u = 0``) are left out and the ``k`` that differ are
    enumerated whenever :func:`exact` holds for ``k`` (:attr:`differing`, :attr:`smallest_p`).
    :meth:`p_value` at 0 is the test of :func:`paired_permutation_test`, and :meth:`interval` the
    set of shifts it does not reject, so the interval excludes 0 exactly when the test rejects.
    """

    def __init__(
        self,
        a: Sequence[np.ndarray] | np.ndarray,
        b: Sequence[np.ndarray] | np.ndarray,
        samples: int,
        seed: int,
        clusters: Clusters = None,
    ):
        pa, pb = _strata(a), _strata(b)
        if [x.shape for x in pa] != [x.shape for x in pb]:
            raise ValueError(
                f"paired scores differ in shape: {[x.shape for x in pa]} vs {[x.shape for x in pb]}"
            )
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.weights = np.concatenate([np.full(x.shape[1], 1.0 / (len(pa) * x.shape[1])) for x in pa])
        self.diffs = np.concatenate([x - y for x, y in zip(pa, pb, strict=True)], axis=1)  # (k, n)
        self.n, self.samples = self.diffs.shape[1], samples
        self.statistic = self.diffs @ self.weights  # (k,) the observed stratified mean difference
        wd = self.diffs * self.weights
        if clusters is None:
            self.units, self._d, self._w = self.n, wd, self.weights
        else:
            unit, count = _units(clusters, [x.shape[1] for x in pa])
            self.units, self._d, self._w = (
                count,
                _unit_sums(wd, unit, count),
                _unit_sums(self.weights, unit, count),
            )
        self.exact = exact(self.units, samples)
        tol = 1e-12 * np.maximum(1.0, np.abs(self.diffs) @ self.weights)
        self._differs = np.abs(self._d) > tol[:, None]  # (k, U): the units that differ at delta = 0
        rows = 1 << self.units if self.exact else samples
        self._s1 = np.empty((rows, wd.shape[0]))  # per pattern: sum_u s_u D_u
        self._s0 = np.empty(rows)  # per pattern: sum_u s_u W_u
        rng = None if self.exact else np.random.default_rng(seed)
        for start in range(0, rows, _CHUNK):
            count = min(_CHUNK, rows - start)
            if rng is None:
                codes = np.arange(start, start + count)[:, None]
                signs = 1.0 - 2.0 * ((codes >> np.arange(self.units)[None, :]) & 1)
            else:
                signs = 1.0 - 2.0 * rng.integers(0, 2, size=(count, self.units))
            self._s1[start : start + count] = signs @ self._d.T
            self._s0[start : start + count] = signs @ self._w
        self._at_zero: np.ndarray | None = None

    @property
    def differing(self) -> np.ndarray:
        """``(k,)`` how many units differ between the two methods, per quantity."""
        return self._differs.sum(axis=1)

    @property
    def smallest_p(self) -> np.ndarray:
        """``(k,)`` the smallest p-value this test can return, per quantity (:func:`smallest_p`
        of its differing units)."""
        return np.array([smallest_p(int(k), self.samples) for k in self.differing])

    def _exact_at_zero(self) -> np.ndarray:
        """``(k,)`` p-values at ``delta = 0`` over every sign pattern of the differing units, where
        :func:`exact` holds for their number (NaN elsewhere)."""
        if self._at_zero is None:
            out = np.full(len(self.statistic), np.nan)
            tol = 1e-12 * np.maximum(1.0, np.abs(self.diffs) @ self.weights)
            for q, differs in enumerate(self._differs):
                d = self._d[q, differs]
                if not exact(len(d), self.samples):
                    continue
                observed = abs(float(self.statistic[q]))
                if observed <= tol[q]:
                    out[q] = 1.0
                    continue
                codes = np.arange(1 << len(d))[:, None]
                signs = 1.0 - 2.0 * ((codes >> np.arange(len(d))[None, :]) & 1)
                out[q] = np.count_nonzero(np.abs(signs @ d) >= observed - tol[q]) / len(codes)
            self._at_zero = out
        return self._at_zero

    def p_value(self, delta: np.ndarray | float = 0.0) -> np.ndarray:
        """Two-sided p-values ``(k,)`` of ``mean difference == delta`` (``delta`` scalar or ``(k,)``).

        The share of sign patterns whose statistic is at least as far from 0 as the observed one:
        ``hits / 2**U`` over all patterns (the observed one among them), or ``(1 + hits) / (1 +
        samples)`` over random ones; at ``delta = 0`` over the patterns of the differing units
        alone where they are few enough to enumerate; 1.0 where every shifted difference is 0.
        """
        delta = np.broadcast_to(np.asarray(delta, dtype=np.float64), self.statistic.shape)
        observed = np.abs(self.statistic - delta)
        tol = 1e-12 * np.maximum(1.0, np.abs(self.diffs - delta[:, None]) @ self.weights)
        hits = np.zeros(len(delta))
        rows = max(_CHUNK, (1 << 22) // max(1, len(delta)))  # about 4M pattern x quantity cells at once
        for start in range(0, len(self._s0), rows):
            s1, s0 = self._s1[start : start + rows], self._s0[start : start + rows]
            hits += (np.abs(s1 - s0[:, None] * delta[None, :]) >= observed - tol).sum(axis=0)
        p = hits / len(self._s0) if self.exact else (hits + 1) / (self.samples + 1)
        p = np.where(observed <= tol, 1.0, np.minimum(p, 1.0))
        at_zero = (delta == 0) & ~np.isnan(self._exact_at_zero())
        return np.where(at_zero, self._exact_at_zero(), p)

    def interval(self, level: float = 0.95, *, steps: int = 40) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` per quantity: the shifts ``delta`` whose test :meth:`p_value` does not reject
        at ``1 - level`` (found by bisection to ``range * 2**-steps``; ``-inf``/``inf`` where no
        shift is rejected on that side, which happens when the smallest reachable p is not below
        ``1 - level``). The search for the bound on 0's side starts from 0 itself, so the interval
        excludes 0 exactly when ``p_value(0) < 1 - level``.
        """
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        alpha = 1.0 - level
        point = self.statistic
        span = np.ptp(self.diffs, axis=1) + 1.0
        bounds = []
        for side in (-1.0, 1.0):
            # beyond every difference all shifted differences share a sign: the smallest p
            far = (self.diffs.min(axis=1) if side < 0 else self.diffs.max(axis=1)) + side * span
            unbounded = self.p_value(far) >= alpha
            inner, outer = point.copy(), far.copy()  # p(inner) >= alpha > p(outer)
            zero_between = (side * (0.0 - point) > 0) & (side * (outer - 0.0) > 0)
            if zero_between.any():
                rejected = self.p_value(np.zeros_like(point)) < alpha
                outer = np.where(zero_between & rejected, 0.0, outer)
                inner = np.where(zero_between & ~rejected, 0.0, inner)
            for _ in range(steps):
                mid = (inner + outer) / 2
                rejected = self.p_value(mid) < alpha
                outer = np.where(rejected, mid, outer)
                inner = np.where(rejected, inner, mid)
            bounds.append(np.where(unbounded, side * np.inf, inner))
        return bounds[0], bounds[1]


def paired_permutation_test(
    a: Sequence[np.ndarray] | np.ndarray,
    b: Sequence[np.ndarray] | np.ndarray,
    samples: int,
    seed: int,
    clusters: Clusters = None,
) -> np.ndarray:
    """Two-sided paired permutation (sign-flip) test of ``stratified_mean(a) == stratified_mean(b)``.

    Under the null hypothesis the scores of the two methods on a unit (a question, or a cluster
    of questions) are exchangeable, so each unit's difference keeps or flips its sign with
    probability 1/2, independently. The p-value is the share of sign patterns whose statistic is
    at least as far from 0 as the one observed: exact over all ``2**k`` patterns of the ``k``
    units that differ when they are few (:func:`exact`), otherwise ``(1 + hits) / (1 + samples)``
    over random patterns (:class:`SignFlip`).

    Args:
        a, b: scores of the two methods, stratified like :func:`bootstrap_means` (same shapes,
            same questions in the same order).
        samples: random sign patterns (where the test does not enumerate them all).
        seed: seed of the random patterns.
        clusters: per stratum, a label per question (None: every question its own unit).
    Returns:
        ``(k,)`` p-values, one per quantity (1.0 where the two methods score the same on every
        question).

    >>> float(paired_permutation_test(np.ones(6), np.zeros(6), samples=1000, seed=0)[0])  # 2 of 64
    0.03125
    >>> float(paired_permutation_test(np.ones(6), np.ones(6), samples=1000, seed=0)[0])
    1.0
    >>> # 50 questions, one differs: both of its signs are as extreme, whatever the others score
    >>> float(paired_permutation_test(np.r_[1.0, np.zeros(49)], np.zeros(50), samples=1000, seed=0)[0])
    1.0
    """
    return SignFlip(a, b, samples, seed, clusters).p_value()


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the input order.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    p = [float(x) for x in pvalues]
    order = sorted(range(len(p)), key=lambda i: p[i])
    out = [0.0] * len(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def seed_spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) of a score over sampling seeds (0 for one seed).

    >>> [round(x, 4) for x in seed_spread([0.5, 0.7])]
    [0.6, 0.1414]
    """
    v = [float(x) for x in values]
    if not v:
        raise ValueError("no value to summarize")
    mean = sum(v) / len(v)
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return mean, sd
