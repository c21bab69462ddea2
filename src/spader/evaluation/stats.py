"""Uncertainty of evaluation scores over questions: bootstrap intervals and paired tests (numpy only).

A method's score on a test set is the mean of per-question scores (P, R or F1), so its
uncertainty is that of a mean over the questions drawn: the questions are resampled, never the
methods. Every function here takes the per-question scores and a seed and returns the same numbers
for the same inputs.

* :func:`bootstrap_means` - percentile bootstrap: resample the questions of each dataset with
  replacement, ``samples`` times; the 95% interval of a score is the 2.5th and 97.5th percentile
  of its resampled values (:func:`percentile_interval`). Several quantities measured on the same
  questions (P, R, F1 of every method) share the resamples, so differences between them are
  paired. A score averaged over datasets (the tables' ``avg``, the unweighted mean of the
  datasets' means) is resampled within each dataset (stratified), as it was computed.
* :func:`paired_permutation_test` - whether two methods differ on the same questions: under the
  null hypothesis the two scores of a question are exchangeable, so the sign of each question's
  difference is flipped at random (approximate randomization), exactly over all sign patterns
  when there are few questions. Used for p-values rather than the paired bootstrap because it
  needs no assumption about the shape of the difference's distribution and keeps its level with
  few questions and many ties (most per-question F1 differences are 0), where bootstrap p-values
  are known to be too small; the paired bootstrap gives the difference's interval.
* :func:`holm` - Holm's step-down adjustment of a family of p-values.
* :func:`seed_spread` - mean and sample standard deviation of a score over sampling seeds.

Resampling runs in chunks of resamples as counts of each question (``counts @ scores``), so
memory stays at ``chunk x questions`` whatever the number of methods.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def bootstrap_means(strata: Sequence[np.ndarray] | np.ndarray, samples: int, seed: int) -> np.ndarray:
    """Bootstrap distribution of :func:`stratified_mean`.

    Args:
        strata: per dataset, scores of shape ``(k, n_s)`` (k quantities on the same n_s questions;
            a 1-D array is one quantity); one stratum is a plain mean over questions.
        samples: number of resamples.
        seed: seed of the resampling (the same seed gives the same resamples).
    Returns:
        ``(samples, k)``: the statistic of every quantity in each resample. Resample ``j`` draws
        the same questions for every quantity, so differences of its columns are paired.

    >>> draws = bootstrap_means(np.array([0.0, 1.0, 1.0, 1.0]), samples=2000, seed=0)
    >>> draws.shape, abs(float(draws.mean()) - 0.75) < 0.01
    ((2000, 1), True)
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    parts = _strata(strata)
    rng = np.random.default_rng(seed)
    out = np.zeros((samples, parts[0].shape[0]))
    for a in parts:
        n = a.shape[1]
        for start in range(0, samples, _CHUNK):
            rows = min(_CHUNK, samples - start)
            out[start : start + rows] += _counts(rng, rows, n) @ a.T / n
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


#: The sign-flip test enumerates all ``2**n`` sign patterns for up to this many pairs (4,096
#: patterns), and beyond it while ``2**n`` is not more than the random patterns it would draw
#: (``samples``; 13 pairs at the default 10,000); otherwise it draws ``samples`` random patterns.
EXACT_MAX_PAIRS = 12


def exact(n: int, samples: int) -> bool:
    """Whether the test of ``n`` pairs enumerates every sign pattern (:data:`EXACT_MAX_PAIRS`)."""
    return n <= EXACT_MAX_PAIRS or (n < 63 and (1 << n) <= samples)


def smallest_p(n: int, samples: int) -> float:
    """The smallest p-value :func:`paired_permutation_test` can return for ``n`` pairs.

    Exact enumeration (:func:`exact`): ``2 / 2**n`` (only the observed signs and their mirror image
    are as extreme, when every pair differs in the same direction); random patterns:
    ``1 / (samples + 1)``. With 6 questions no difference can reach p < 0.031, so nothing is
    significant at 0.05 after a multiple-testing adjustment over more than one comparison.

    >>> smallest_p(6, 10_000), round(smallest_p(100, 9_999), 6)
    (0.03125, 0.0001)
    """
    if n < 1:
        raise ValueError(f"a paired test needs at least one pair, got {n}")
    return 2.0 / (1 << n) if exact(n, samples) else 1.0 / (samples + 1)


class SignFlip:
    """The paired sign-flip test of ``stratified_mean(a) - stratified_mean(b) == delta``, for any
    shift ``delta``, on one fixed set of sign patterns.

    Under the null hypothesis each question's difference minus ``delta`` is symmetric about 0, so
    its sign is kept or flipped with probability 1/2. The statistic is the stratified mean of the
    shifted differences, one weighted sum over all questions (stratum s weighs ``1 / (S * n_s)``),
    so a pattern's statistic is linear in ``delta``: ``sum_i s_i w_i d_i - delta * sum_i s_i w_i``.
    The patterns are all ``2**n`` when :func:`exact` says so, otherwise ``samples`` random ones
    (``seed``); :meth:`p_value` at ``delta = 0`` is the test of :func:`paired_permutation_test`,
    and :meth:`interval` the set of shifts it does not reject, so the interval excludes 0 exactly
    when the test rejects.
    """

    def __init__(
        self,
        a: Sequence[np.ndarray] | np.ndarray,
        b: Sequence[np.ndarray] | np.ndarray,
        samples: int,
        seed: int,
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
        n = self.diffs.shape[1]
        self.n, self.samples = n, samples
        self.exact = exact(n, samples)
        self.statistic = self.diffs @ self.weights  # (k,) the observed stratified mean difference
        wd = self.diffs * self.weights
        rows = 1 << n if self.exact else samples
        self._s1 = np.empty((rows, wd.shape[0]))  # per pattern: sum_i s_i w_i d_i
        self._s0 = np.empty(rows)  # per pattern: sum_i s_i w_i
        rng = None if self.exact else np.random.default_rng(seed)
        for start in range(0, rows, _CHUNK):
            count = min(_CHUNK, rows - start)
            if rng is None:
                codes = np.arange(start, start + count)[:, None]
                signs = 1.0 - 2.0 * ((codes >> np.arange(n)[None, :]) & 1)
            else:
                signs = 1.0 - 2.0 * rng.integers(0, 2, size=(count, n))
            self._s1[start : start + count] = signs @ wd.T
            self._s0[start : start + count] = signs @ self.weights

    @property
    def smallest_p(self) -> float:
        """The smallest p-value this test can return (:func:`smallest_p`)."""
        return smallest_p(self.n, self.samples)

    def p_value(self, delta: np.ndarray | float = 0.0) -> np.ndarray:
        """Two-sided p-values ``(k,)`` of ``mean difference == delta`` (``delta`` scalar or ``(k,)``).

        The share of sign patterns whose statistic is at least as far from 0 as the observed one:
        ``hits / 2**n`` over all patterns (the observed one among them), or ``(1 + hits) / (1 +
        samples)`` over random ones; 1.0 where every shifted difference is 0.
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
        return np.where(observed <= tol, 1.0, np.minimum(p, 1.0))

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
) -> np.ndarray:
    """Two-sided paired permutation (sign-flip) test of ``stratified_mean(a) == stratified_mean(b)``.

    Under the null hypothesis the scores of the two methods on a question are exchangeable, so
    each question's difference keeps or flips its sign with probability 1/2, independently. The
    p-value is the share of sign patterns whose statistic is at least as far from 0 as the one
    observed: exact over all ``2**n`` patterns for few pairs (:func:`exact`), otherwise
    ``(1 + hits) / (1 + samples)`` over random patterns (:class:`SignFlip`).

    Args:
        a, b: scores of the two methods, stratified like :func:`bootstrap_means` (same shapes,
            same questions in the same order).
        samples: random sign patterns (where the test does not enumerate them all).
        seed: seed of the random patterns.
    Returns:
        ``(k,)`` p-values, one per quantity (1.0 where the two methods score the same on every
        question).

    >>> float(paired_permutation_test(np.ones(6), np.zeros(6), samples=1000, seed=0)[0])  # 2 of 64
    0.03125
    >>> float(paired_permutation_test(np.ones(6), np.ones(6), samples=1000, seed=0)[0])
    1.0
    """
    return SignFlip(a, b, samples, seed).p_value()


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
