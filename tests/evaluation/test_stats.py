"""Bootstrap intervals and paired tests (spader.evaluation.stats) against slow pure-Python
references drawing the same random numbers, exact enumerations, and their statistical behaviour
on simulated scores (coverage of the intervals, level and power of the test)."""

from __future__ import annotations

import doctest
import itertools
import math
import random

import numpy as np
import pytest

from spader.evaluation import stats
from spader.evaluation.stats import (
    EXACT_MAX_PAIRS,
    SignFlip,
    bootstrap_means,
    holm,
    paired_permutation_test,
    percentile_interval,
    seed_spread,
    smallest_p,
    stratified_mean,
)


def test_doctests():
    result = doctest.testmod(stats)
    assert result.attempted >= 7 and result.failed == 0


# ---------------------------------------------------------------------------------------------
# slow references: one random number at a time, in the order the module documents
# ---------------------------------------------------------------------------------------------
def reference_bootstrap(strata: list[list[list[float]]], samples: int, seed: int) -> list[list[float]]:
    """Per resample and quantity, the mean over strata of the mean of the drawn questions; the
    questions of stratum s are drawn for all resamples before those of stratum s + 1."""
    rng = np.random.default_rng(seed)
    k = len(strata[0])
    out = [[0.0] * k for _ in range(samples)]
    for stratum in strata:
        n = len(stratum[0])
        for j in range(samples):
            drawn = [int(rng.integers(0, n)) for _ in range(n)]
            for q in range(k):
                out[j][q] += sum(stratum[q][i] for i in drawn) / n / len(strata)
    return out


def reference_percentile(values: list[float], level: float) -> tuple[float, float]:
    """Linear interpolation between order statistics (numpy's default definition)."""
    v = sorted(values)

    def at(p: float) -> float:
        pos = p / 100 * (len(v) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    tail = (1 - level) / 2 * 100
    return at(tail), at(100 - tail)


def reference_statistic(a: list[list[float]], b: list[list[float]], signs: list[int]) -> float:
    """Stratified mean of the sign-flipped differences (signs over the concatenated questions)."""
    total, at = 0.0, 0
    for sa, sb in zip(a, b, strict=True):
        n = len(sa)
        total += sum(signs[at + i] * (sa[i] - sb[i]) for i in range(n)) / n / len(a)
        at += n
    return total


def reference_exact_p(a: list[list[float]], b: list[list[float]]) -> float:
    n = sum(len(s) for s in a)
    observed = abs(reference_statistic(a, b, [1] * n))
    if observed < 1e-12:
        return 1.0
    hits = sum(
        abs(reference_statistic(a, b, list(signs))) >= observed - 1e-12
        for signs in itertools.product([1, -1], repeat=n)
    )
    return hits / 2**n


def reference_exact_p_over_differing(a: list[list[float]], b: list[list[float]]) -> float:
    """The exact p-value over every sign pattern of the pairs that differ (a tied pair's sign
    changes nothing), stratum weights kept."""
    n = sum(len(s) for s in a)
    flat_a, flat_b = [x for s in a for x in s], [y for s in b for y in s]
    differs = [i for i, (x, y) in enumerate(zip(flat_a, flat_b, strict=True)) if x != y]
    observed = abs(reference_statistic(a, b, [1] * n))
    if observed < 1e-12:
        return 1.0
    hits = 0
    for flipped in itertools.product([1, -1], repeat=len(differs)):
        signs = [1] * n
        for i, sign in zip(differs, flipped, strict=True):
            signs[i] = sign
        hits += abs(reference_statistic(a, b, signs)) >= observed - 1e-12
    return hits / 2 ** len(differs)


def reference_random_p(a: list[list[float]], b: list[list[float]], samples: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    n = sum(len(s) for s in a)
    observed = abs(reference_statistic(a, b, [1] * n))
    if observed < 1e-12:
        return 1.0
    hits = 0
    for _ in range(samples):
        signs = [1 - 2 * int(rng.integers(0, 2)) for _ in range(n)]
        hits += abs(reference_statistic(a, b, signs)) >= observed - 1e-12
    return (hits + 1) / (samples + 1)


def reference_holm(p: list[float]) -> list[float]:
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted = {}
    for rank, i in enumerate(order):
        adjusted[i] = max(min(1.0, (m - r) * p[order[r]]) for r in range(rank + 1))
    return [adjusted[i] for i in range(m)]


def _components(labels: list[list[object]]) -> list[list[int]]:
    """Groups of strata linked by a shared label (slow: pairwise until nothing merges)."""
    groups = [[s] for s in range(len(labels))]
    merged = True
    while merged:
        merged = False
        for g, h in itertools.combinations(range(len(groups)), 2):
            if {x for s in groups[g] for x in labels[s]} & {x for s in groups[h] for x in labels[s]}:
                groups[g] = sorted(groups[g] + groups.pop(h))
                merged = True
                break
    return sorted(groups)


def reference_cluster_bootstrap(
    strata: list[list[list[float]]], labels: list[list[object]], samples: int, seed: int
) -> list[list[float]]:
    """Per group of linked strata (in order), per resample: draw as many clusters as the group
    has, one at a time; each stratum's mean is the sum of its drawn questions' scores over its
    number of questions, and the statistic the unweighted mean over strata."""
    rng = np.random.default_rng(seed)
    k = len(strata[0])
    out = [[0.0] * k for _ in range(samples)]
    for group in _components(labels):
        units = list(dict.fromkeys(x for s in group for x in labels[s]))
        for j in range(samples):
            drawn = [units[int(rng.integers(0, len(units)))] for _ in units]
            for s in group:
                n = len(strata[s][0])
                for q in range(k):
                    total = sum(strata[s][q][i] for u in drawn for i in range(n) if labels[s][i] == u)
                    out[j][q] += total / n / len(strata)
    return out


def reference_cluster_exact_p(
    a: list[list[float]], b: list[list[float]], labels: list[list[object]]
) -> float:
    """Every sign pattern over the clusters: a cluster's questions share one sign."""
    units = list(dict.fromkeys(x for stratum in labels for x in stratum))
    flat = [x for stratum in labels for x in stratum]
    observed = abs(reference_statistic(a, b, [1] * len(flat)))
    if observed < 1e-12:
        return 1.0
    hits = 0
    for signs in itertools.product([1, -1], repeat=len(units)):
        of = dict(zip(units, signs, strict=True))
        hits += abs(reference_statistic(a, b, [of[x] for x in flat])) >= observed - 1e-12
    return hits / 2 ** len(units)


def _scores(rng: random.Random, k: int, n: int) -> list[list[float]]:
    return [[rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()]) for _ in range(n)] for _ in range(k)]


# ---------------------------------------------------------------------------------------------
# equality with the references
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [[7], [5, 9, 3]])
def test_bootstrap_equals_the_slow_reference(sizes):
    rng = random.Random(1)
    strata = [_scores(rng, 3, n) for n in sizes]
    samples = 600  # more than one chunk of resamples
    fast = bootstrap_means([np.array(s) for s in strata], samples, seed=11)
    slow = reference_bootstrap(strata, samples, seed=11)
    assert fast.shape == (samples, 3)
    assert fast == pytest.approx(np.array(slow), abs=1e-12)
    # the statistic itself: the unweighted mean over strata of each stratum's mean
    expected = [sum(sum(s[q]) / len(s[q]) for s in strata) / len(strata) for q in range(3)]
    assert stratified_mean([np.array(s) for s in strata]) == pytest.approx(expected)


def test_bootstrap_is_seeded_and_pairs_the_quantities():
    x = np.array([[0.0, 1.0, 0.5, 0.25, 1.0], [1.0, 1.0, 0.0, 0.0, 0.5]])
    a, b = bootstrap_means(x, 300, seed=3), bootstrap_means(x, 300, seed=3)
    assert np.array_equal(a, b) and not np.array_equal(a, bootstrap_means(x, 300, seed=4))
    # a quantity's resamples do not depend on what else is resampled with it
    assert np.array_equal(bootstrap_means(x[:1], 300, seed=3)[:, 0], a[:, 0])
    # the same question draws for both rows: a row and its copy shifted by 0.1 differ by 0.1 always
    shifted = bootstrap_means(np.stack([x[0], x[0] + 0.1]), 300, seed=3)
    assert shifted[:, 1] - shifted[:, 0] == pytest.approx(np.full(300, 0.1))


def test_percentile_interval_equals_the_reference():
    values = [random.Random(2).random() for _ in range(257)]
    for level in (0.9, 0.95, 0.99):
        lo, hi = percentile_interval(np.array(values), level)
        assert (float(lo), float(hi)) == pytest.approx(reference_percentile(values, level))
    lo, hi = percentile_interval(np.array([values, values[::-1]]).T, 0.95)
    assert lo.shape == (2,) and lo[0] == pytest.approx(lo[1])


@pytest.mark.parametrize("sizes", [[8], [3, 4, 2]])
def test_exact_permutation_test_equals_full_enumeration(sizes):
    rng = random.Random(5)
    a = [_scores(rng, 1, n)[0] for n in sizes]
    b = [_scores(rng, 1, n)[0] for n in sizes]
    p = paired_permutation_test([np.array(s) for s in a], [np.array(s) for s in b], samples=10_000, seed=0)
    assert float(p[0]) == pytest.approx(reference_exact_p(a, b))


def test_the_test_is_exact_up_to_the_cut_off_whatever_the_number_of_random_patterns():
    """12 questions and 100 random patterns: all 4,096 sign patterns are enumerated (a random
    estimate with 100 patterns would miss the exact p by about 0.03); 13 differing questions: 8,192
    patterns, enumerated with 10,000 random patterns to spare, drawn at random with 300; 13
    questions of which some tie: the differing ones are few enough to enumerate, with 300 too."""
    rng = random.Random(8)
    a = [_scores(rng, 1, n)[0] for n in (5, 7)]
    b = [_scores(rng, 1, n)[0] for n in (5, 7)]
    p = paired_permutation_test([np.array(s) for s in a], [np.array(s) for s in b], samples=100, seed=0)
    assert float(p[0]) == pytest.approx(reference_exact_p(a, b), abs=1e-12)
    assert EXACT_MAX_PAIRS == 12 and stats.exact(13, 10_000) and not stats.exact(13, 300)
    a13 = [rng.random() for _ in range(13)]
    b13 = [x + rng.choice([-1, 1]) * (0.05 + rng.random()) for x in a13]  # every pair differs
    p13 = paired_permutation_test(np.array(a13), np.array(b13), samples=10_000, seed=4)
    assert float(p13[0]) == pytest.approx(reference_exact_p([a13], [b13]), abs=1e-12)
    p13 = paired_permutation_test(np.array(a13), np.array(b13), samples=300, seed=4)
    assert float(p13[0]) == pytest.approx(reference_random_p([a13], [b13], 300, seed=4))
    tied = [x if i % 3 == 0 else y for i, (x, y) in enumerate(zip(a13, b13, strict=True))]  # 5 tie
    p13 = paired_permutation_test(np.array(a13), np.array(tied), samples=300, seed=4)
    assert float(p13[0]) == pytest.approx(reference_exact_p([a13], [tied]), abs=1e-12)


def test_each_table_can_state_the_smallest_p_its_test_reaches():
    """Every question better by the same amount: only the observed signs and their mirror image are
    as extreme, so the exact test reaches 2 / 2**n and no less; random patterns reach 1 / (samples + 1)."""
    for n in (1, 6, 10, 12):
        assert smallest_p(n, 10_000) == min(1.0, 2 / 2**n)
        assert float(paired_permutation_test(np.ones(n), np.zeros(n), 10_000, 0)[0]) == smallest_p(n, 10_000)
    assert smallest_p(40, 499) == 1 / 500
    assert float(paired_permutation_test(np.ones(40), np.zeros(40), 499, 0)[0]) == 1 / 500
    assert SignFlip(np.ones(6), np.zeros(6), 10, 0).smallest_p.tolist() == [2 / 64]
    assert smallest_p(0, 10) == 1.0  # nothing differs: nothing to flip
    with pytest.raises(ValueError, match=">= 0"):
        smallest_p(-1, 10)


@pytest.mark.parametrize("differing", [0, 1, 2, 5, 9, 13, 14, 40])
def test_with_ties_the_smallest_p_is_that_of_the_differing_pairs(differing):
    """50 questions of which ``differing`` are better by one amount and the others tie (as when
    two methods answer alike): the test reaches 2 / 2**k over the k differing questions, never the
    1 / (samples + 1) that 50 differing questions would allow; random patterns only where 2**k
    exceeds them. The floor holds whatever the tied questions score."""
    rng = np.random.default_rng(differing)
    base = rng.choice([0.0, 0.25, 1.0], size=50)
    better = base.copy()
    better[rng.choice(50, size=differing, replace=False)] += 0.5
    flip = SignFlip(better, base, 10_000, seed=1)
    assert flip.differing.tolist() == [differing]
    floor = 2 / 2**differing if differing <= 13 else 1 / 10_001
    assert flip.smallest_p.tolist() == pytest.approx([min(1.0, floor)])
    assert float(flip.p_value()[0]) == pytest.approx(min(1.0, floor) if differing <= 13 else floor, abs=2e-4)
    assert float(flip.p_value()[0]) >= float(flip.smallest_p[0])
    # per quantity: a row where a single question differs cannot go below 1
    two = SignFlip(np.stack([better, base + np.eye(50)[0]]), np.stack([base, base]), 10_000, seed=1)
    assert two.smallest_p.tolist() == pytest.approx([min(1.0, floor), 1.0])
    assert float(two.p_value()[1]) == 1.0


def _agree(flip: SignFlip, level: float) -> None:
    """The interval is the set of shifts the test does not reject: it excludes 0 exactly when the
    p-value is below alpha, its ends are not rejected, and just beyond them is."""
    alpha = 1 - level
    lo, hi = flip.interval(level)
    p0 = flip.p_value()
    assert np.array_equal((lo > 0) | (hi < 0), p0 < alpha), (lo, hi, p0)
    for k in range(len(p0)):
        for end, side in ((lo[k], -1.0), (hi[k], 1.0)):
            if math.isinf(end):
                continue
            delta = np.zeros_like(p0)
            delta[k] = end
            assert flip.p_value(delta)[k] >= alpha
            delta[k] = end + side * 1e-7
            assert flip.p_value(delta)[k] < alpha


def test_difference_intervals_agree_with_the_test_on_the_same_questions():
    rng = np.random.default_rng(3)
    for trial in range(30):  # 2 to 21 questions: exact enumeration and random patterns
        sizes = [int(x) for x in rng.integers(2, 8, size=int(rng.integers(1, 4)))]
        # scores with many ties, as F1 has: several quantities on the same questions
        a = [rng.choice([0.0, 0.0, 0.5, 1.0, 0.25], size=(3, n)) for n in sizes]
        b = [
            np.where(rng.random((3, n)) < 0.5, x, rng.choice([0.0, 1.0, 0.5], size=(3, n)))
            for x, n in zip(a, sizes, strict=True)
        ]
        for level in (0.9, 0.95):
            _agree(SignFlip(a, b, samples=400, seed=trial), level)
    # the example of a six-question table: three questions differ (p = 1/4); a percentile
    # bootstrap interval of the same difference excludes 0 all the same, this one does not
    spader, rag = np.array([1.0, 0.0, 0.5, 0.0, 1.0, 0.0]), np.zeros(6)
    flip = SignFlip(rag, spader, 10_000, 0)
    boot = bootstrap_means(np.stack([rag, spader]), 10_000, 0)
    _, boot_hi = percentile_interval(boot[:, 0] - boot[:, 1], 0.95)
    assert float(flip.p_value()[0]) == 0.25 and float(boot_hi) < 0
    lo, hi = flip.interval(0.95)
    assert lo[0] < 0 <= hi[0]
    # too few questions to reject any shift at this level: the interval is unbounded
    lo, hi = SignFlip(np.ones(4), np.zeros(4), 100, 0).interval(0.95)
    assert lo[0] == -math.inf and hi[0] == math.inf


def test_random_permutation_test_equals_the_slow_reference():
    rng = random.Random(6)
    a = [_scores(rng, 1, n)[0] for n in (20, 15)]
    b = [[x + rng.choice([-0.25, 0.1, 0.25]) for x in s] for s in a]  # every pair differs
    p = paired_permutation_test([np.array(s) for s in a], [np.array(s) for s in b], samples=700, seed=9)
    assert float(p[0]) == pytest.approx(reference_random_p(a, b, 700, seed=9))


def test_with_few_differing_pairs_the_test_enumerates_them_exactly():
    """35 questions of which 10 differ: 700 random patterns over all 35 only estimate the p-value
    (0.0029 here, and by chance it could fall below the exact 2 / 2**10 = 0.00195, the floor a
    table states); the test enumerates the 2**10 patterns of the differing pairs instead, the p
    that every pattern of all 35 would give."""
    rng = random.Random(6)
    a = [_scores(rng, 1, n)[0] for n in (20, 15)]
    b = [[min(1.0, x + rng.choice([0.0, 0.0, 0.25])) for x in s] for s in a]
    p = paired_permutation_test([np.array(s) for s in a], [np.array(s) for s in b], samples=700, seed=9)
    assert sum(x != y for sa, sb in zip(a, b, strict=True) for x, y in zip(sa, sb, strict=True)) == 10
    assert float(p[0]) == pytest.approx(reference_exact_p_over_differing(a, b), abs=1e-12)
    assert reference_random_p(a, b, 700, seed=9) != pytest.approx(float(p[0]))


def test_permutation_test_edge_cases():
    same = np.array([0.5, 0.0, 1.0])
    assert paired_permutation_test(same, same, 100, 0).tolist() == [1.0]
    # one question better by 1 out of 3: half of the 8 patterns are as extreme
    assert float(paired_permutation_test(np.array([1.0, 0, 0]), np.zeros(3), 100, 0)[0]) == 1.0
    # several quantities at once, each tested on its own row
    a = np.stack([np.ones(10), np.zeros(10)])
    p = paired_permutation_test(a, np.zeros((2, 10)), 5000, 0)
    assert p[0] == pytest.approx(2 / 1024) and p[1] == 1.0
    with pytest.raises(ValueError, match="differ in shape"):
        paired_permutation_test(np.ones(3), np.ones(4), 10, 0)
    with pytest.raises(ValueError, match="finite"):
        bootstrap_means(np.array([0.5, float("nan")]), 10, 0)


def test_holm_equals_the_reference_and_seed_spread():
    rng = random.Random(7)
    for _ in range(20):
        p = [rng.random() ** 2 for _ in range(rng.randint(1, 9))]
        assert holm(p) == pytest.approx(reference_holm(p))
    mean, sd = seed_spread([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5) and sd == pytest.approx(np.std([0.2, 0.4, 0.9], ddof=1))
    assert seed_spread([0.3]) == (0.3, 0.0)


# ---------------------------------------------------------------------------------------------
# clusters: questions that share a topic are one unit
# ---------------------------------------------------------------------------------------------
#: three datasets whose questions ask about topics t0..t5: t1 and t2 in two datasets, t5 alone
CLUSTERED = [["t0", "t1", "t1", "t2"], ["t1", "t3", "t2"], ["t4", "t4", "t5"]]


def test_cluster_bootstrap_equals_the_slow_reference():
    rng = random.Random(11)
    strata = [_scores(rng, 2, len(x)) for x in CLUSTERED]
    fast = bootstrap_means([np.array(x) for x in strata], 600, seed=5, clusters=CLUSTERED)
    assert fast == pytest.approx(
        np.array(reference_cluster_bootstrap(strata, CLUSTERED, 600, seed=5)), abs=1e-12
    )
    # labels no two questions share: the bootstrap of the questions, resample for resample
    own = [[f"{s}:{i}" for i in range(len(x))] for s, x in enumerate(CLUSTERED)]
    plain = bootstrap_means([np.array(x) for x in strata], 600, seed=5)
    assert np.array_equal(bootstrap_means([np.array(x) for x in strata], 600, seed=5, clusters=own), plain)
    with pytest.raises(ValueError, match="one label per question"):
        bootstrap_means([np.array(x) for x in strata], 10, 0, clusters=[["a"], ["b"], ["c"]])


def test_cluster_bootstrap_draws_a_topics_questions_together():
    """Two datasets asking about the same two topics, one answered and one not: resampling topics
    gives 0, 0.5 or 1 (both datasets move together); resampling questions within each dataset
    would also give 0.25 and 0.75. The statistic's mean over resamples is the observed one."""
    x = [np.array([1.0, 0.0]), np.array([1.0, 0.0])]
    draws = bootstrap_means(x, 4000, seed=2, clusters=[["a", "b"], ["a", "b"]])[:, 0]
    assert set(np.round(draws, 6)) == {0.0, 0.5, 1.0}
    assert set(np.round(bootstrap_means(x, 4000, seed=2)[:, 0], 6)) == {0.0, 0.25, 0.5, 0.75, 1.0}
    assert abs(float(draws.mean()) - 0.5) < 0.02


@pytest.mark.parametrize("seed", range(4))
def test_cluster_sign_flip_equals_full_enumeration(seed):
    rng = random.Random(seed)
    a = [_scores(rng, 1, len(x))[0] for x in CLUSTERED]
    b = [_scores(rng, 1, len(x))[0] for x in CLUSTERED]
    arrays = [np.array(x) for x in a], [np.array(x) for x in b]
    flip = SignFlip(*arrays, samples=10_000, seed=0, clusters=CLUSTERED)
    assert flip.units == 6 and flip.exact
    assert float(flip.p_value()[0]) == pytest.approx(reference_cluster_exact_p(a, b, CLUSTERED), abs=1e-12)
    p = paired_permutation_test(*arrays, samples=10_000, seed=0, clusters=CLUSTERED)
    assert float(p[0]) == float(flip.p_value()[0])


def test_a_cluster_whose_differences_cancel_does_not_differ():
    """Topic t1's two questions differ by +0.5 and -0.5 in one dataset: as a unit it ties, so only
    the other topics count towards the smallest p."""
    a = [np.array([1.0, 1.0, 0.0, 0.5]), np.array([1.0, 1.0, 1.0])]
    b = [np.array([0.0, 0.5, 0.5, 0.0]), np.array([1.0, 1.0, 0.0])]
    flip = SignFlip(a, b, 10_000, 0, clusters=[["t0", "t1", "t1", "t2"], ["t1", "t3", "t4"]])
    assert flip.units == 5 and flip.differing.tolist() == [3]  # t0, t2, t4
    assert flip.smallest_p.tolist() == [2 / 8]


def test_difference_intervals_agree_with_the_test_on_clusters_over_many_seeds():
    """On random paired scores with ties, clustered over topics shared across datasets, exact and
    random patterns: the difference's interval excludes 0 exactly when p < alpha, every time."""
    rng = np.random.default_rng(13)
    agreed = trials = 0
    for trial in range(40):
        sizes = [int(x) for x in rng.integers(3, 12, size=int(rng.integers(1, 4)))]
        topics = int(rng.integers(2, 25))
        labels = [rng.integers(0, topics, size=n).tolist() for n in sizes]
        a = [rng.choice([0.0, 0.0, 0.5, 1.0, 0.25], size=(3, n)) for n in sizes]
        b = [
            np.where(rng.random((3, n)) < 0.4, x, np.clip(x + rng.choice([0.0, 0.5, 1.0], size=(3, n)), 0, 1))
            for x, n in zip(a, sizes, strict=True)
        ]
        flip = SignFlip(a, b, samples=300, seed=trial, clusters=labels)
        _agree(flip, 0.95)
        lo, hi = flip.interval(0.95)
        agreed += int(np.sum(((lo > 0) | (hi < 0)) == (flip.p_value() < 0.05)))
        trials += 3
    assert agreed == trials


def test_the_cluster_test_keeps_its_level_where_the_question_test_does_not():
    """Topics asked in three datasets each, a topic effect shared by its questions and no
    difference between the methods: tested over questions as if independent, the test rejects far
    more often than 5%; over topics it keeps its level."""
    rng = np.random.default_rng(4)
    trials, by_question, by_topic = 150, 0, 0
    labels = [list(range(20))] * 3  # 20 topics, each asked once in each of three datasets
    for t in range(trials):
        effect = rng.normal(0, 0.3, 20)  # how much better method a does on a topic, mean 0
        a = [np.clip(0.5 + effect + rng.normal(0, 0.05, 20), 0, 1) for _ in range(3)]
        b = [np.full(20, 0.5) for _ in range(3)]
        by_question += float(paired_permutation_test(a, b, 400, seed=t)[0]) < 0.05
        by_topic += float(paired_permutation_test(a, b, 400, seed=t, clusters=labels)[0]) < 0.05
    assert by_topic / trials <= 0.09, by_topic / trials
    assert by_question / trials >= 0.15, by_question / trials


# ---------------------------------------------------------------------------------------------
# statistical behaviour on simulated scores
# ---------------------------------------------------------------------------------------------
def test_bootstrap_intervals_cover_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    truth, covered, trials = 0.3, 0, 300
    for t in range(trials):
        x = (rng.random(120) < truth).astype(float)  # a method that answers 30% of questions right
        lo, hi = percentile_interval(bootstrap_means(x, 1000, seed=t)[:, 0], 0.95)
        covered += float(lo) <= truth <= float(hi)
    assert 0.90 <= covered / trials <= 0.99, covered / trials


def test_permutation_test_keeps_its_level_and_finds_a_real_difference():
    rng = np.random.default_rng(1)
    trials, rejected, found = 200, 0, 0
    for t in range(trials):
        base = rng.random(80)
        a = np.clip(base + rng.normal(0, 0.2, 80), 0, 1)
        b = np.clip(base + rng.normal(0, 0.2, 80), 0, 1)  # same method twice: null is true
        rejected += float(paired_permutation_test(a, b, 500, seed=t)[0]) < 0.05
        better = np.clip(base + 0.1 + rng.normal(0, 0.2, 80), 0, 1)  # 10 points better
        found += float(paired_permutation_test(better, b, 500, seed=t)[0]) < 0.05
    assert rejected / trials <= 0.09, rejected / trials
    assert found / trials >= 0.8, found / trials


def test_sign_flip_intervals_cover_a_symmetric_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    truth, covered, trials = 0.1, 0, 200
    for t in range(trials):
        base = rng.random(40)
        a = base + truth + rng.normal(0, 0.3, 40)
        b = base + rng.normal(0, 0.3, 40)
        lo, hi = SignFlip(a, b, 200, seed=t).interval(0.95)
        covered += float(lo[0]) <= truth <= float(hi[0])
    assert 0.90 <= covered / trials <= 0.99, covered / trials
