"""The paper's claims as paired effects over seeds (docs/mechanisms.md, "The claims").

Every arm is trained on the same seeds (the same world, questions and evaluation questions per
seed), so a claim is a paired comparison: per seed, the claimed arm's metric minus the other
arm's. Its mean over seeds is tested with the paired sign-flip test of
:mod:`spader.evaluation.stats` and bounded by the interval that same test gives (so the interval
excludes 0 exactly when the test rejects at its level).

Each claim carries a **bound** for the test of ``tests/mechanisms``: for a claim that holds in this
world, the floor its mean effect must reach (never below 0, so the direction is asserted); for one
that does not, the ceiling it must stay under. Bounds come from the distribution of the per-seed
effects on calibration seeds the test never uses (:data:`CALIBRATION`, :func:`calibrated_bound`);
``source`` names the run and the implied failure rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spader.evaluation.stats import SignFlip, bootstrap_means, percentile_interval
from spader.mechanisms.train import ARMS, Run, TrainSpec, train_arm
from spader.mechanisms.world import make_world

__all__ = [
    "CALIBRATION",
    "CLAIMS",
    "METRICS",
    "Claim",
    "Effect",
    "arm_summary",
    "calibrated_bound",
    "effect",
    "run_arms",
    "run_metrics",
]

#: Per-run metrics: the held-out evaluation's (:func:`spader.mechanisms.train.evaluate`), plus
#: ``f1_auc`` (mean answer F1 of the training batches, the area under the learning curve) and
#: ``credit`` (mean over training batches of the advantage contrast of finding vs empty steps).
METRICS = (
    "f1",
    "recall_rare",
    "recall_head",
    "searches",
    "low_yield",
    "invalid",
    "broad",
    "group_rare",
    "f1_auc",
    "credit",
)

#: The seeds the floors were set on (never the test's, 0..19).
CALIBRATION = range(1000, 1200)


@dataclass(frozen=True)
class Claim:
    """A claim as ``direction * mean over seeds of (metric[arm] - metric[against])``, the *effect*.

    Attributes:
        name: short id. statement: the claim in words. arm, against: the two arms. metric: one of
            :data:`METRICS`. direction: +1 when the claim says ``arm`` is higher.
        holds: whether the claim holds in this world, as measured on the calibration seeds
            (docs/mechanisms.md says which do not, and why).
        seeds: how many seeds the test averages the effect over (0 .. seeds - 1).
        bound: for a claim that holds, the floor the test's effect must reach (at least 0, so the
            direction is asserted); for one that does not, the ceiling it must stay under (the
            claim has not started to hold, which would make the docs wrong).
        source: where ``bound`` comes from and its implied failure rate.
    """

    name: str
    statement: str
    arm: str
    against: str
    metric: str
    direction: int
    holds: bool
    seeds: int
    bound: float
    source: str


CLAIMS: tuple[Claim, ...] = (
    Claim(
        name="credit",
        statement="SPA's step advantages follow the steps that found new entities",
        arm="spader",
        against="no_spa",
        metric="credit",
        direction=+1,
        holds=True,
        seeds=20,
        bound=0.1742,
        source="bench/records/2026-12-03-4e6a83a-mechanisms.yaml: the mean effect on seeds 1000..1199 (+0.2289, per-seed sd 0.0743) minus 3.29 standard errors of a 20-seed mean; implied failure rate 5e-4",
    ),
    Claim(
        name="speed",
        statement="SPA learns faster than the trajectory-level advantage on the same rewards",
        arm="spader",
        against="no_spa",
        metric="f1_auc",
        direction=+1,
        holds=True,
        seeds=40,
        bound=0.0,
        source="bench/records/2026-12-03-4e6a83a-mechanisms.yaml: 0, the direction: the mean effect on seeds 1000..1199 is +0.0082 (per-seed sd 0.0189), 2.74 standard errors of a 40-seed mean above 0 (a 20-seed mean would fall to 0 or below 2.5% of the time, one of the ten 20-seed blocks did); implied failure rate 3e-3",
    ),
    Claim(
        name="rare",
        statement="the novelty premium raises the recall of rare entities",
        arm="spader",
        against="no_np",
        metric="recall_rare",
        direction=+1,
        holds=False,
        seeds=20,
        bound=0.0736,
        source="bench/records/2026-12-03-4e6a83a-mechanisms.yaml: the mean effect on seeds 1000..1199 (-0.0042, per-seed sd 0.1057) plus 3.29 standard errors of a 20-seed mean; implied failure rate 5e-4",
    ),
    Claim(
        name="rare_group",
        statement="the novelty premium spreads a group's rollouts over more of the rare entities",
        arm="spader",
        against="no_np",
        metric="group_rare",
        direction=+1,
        holds=True,
        seeds=20,
        bound=0.2209,
        source="bench/records/2026-12-03-4e6a83a-mechanisms.yaml: the mean effect on seeds 1000..1199 (+0.3046, per-seed sd 0.1137) minus 3.29 standard errors of a 20-seed mean; implied failure rate 5e-4",
    ),
    Claim(
        name="low_yield",
        statement="without the information gain, searches that find nothing new grow (Case 3)",
        arm="no_ig",
        against="spader",
        metric="low_yield",
        direction=+1,
        holds=False,
        seeds=20,
        bound=0.0155,
        source="bench/records/2026-12-03-4e6a83a-mechanisms.yaml: the mean effect on seeds 1000..1199 (-0.0042, per-seed sd 0.0268) plus 3.29 standard errors of a 20-seed mean; implied failure rate 5e-4",
    ),
)

#: z of the bounds: a 20-seed (or 40-seed) mean beyond ``mean -/+ Z * sd / sqrt(seeds)`` of the
#: calibration distribution has probability 1 - Phi(3.29) = 0.05% under its normal approximation.
Z = 3.29


def normal_tail(x: float) -> float:
    """``P(N(0, 1) > x)``."""
    return 0.5 * math.erfc(x / math.sqrt(2))


def calibrated_bound(per_seed: np.ndarray, claim: Claim) -> tuple[float, float]:
    """``(bound, implied failure rate)`` of ``claim`` from its per-seed effects on calibration seeds.

    The test's effect is a mean over ``claim.seeds`` seeds, approximately normal with the
    calibration mean and ``sd / sqrt(seeds)``. A claim that holds gets the floor
    ``max(0, mean - Z * se)`` (at least 0, so the test asserts the direction), and the failure rate
    is the chance the test's mean falls below it; a claim that does not hold gets the ceiling
    ``mean + Z * se``.
    """
    mean, se = float(np.mean(per_seed)), float(np.std(per_seed, ddof=1)) / math.sqrt(claim.seeds)
    if claim.holds:
        bound = max(0.0, mean - Z * se)
        return bound, normal_tail((mean - bound) / se) if se > 0 else 0.0
    bound = mean + Z * se
    return bound, normal_tail((bound - mean) / se) if se > 0 else 0.0


def run_metrics(run: Run) -> dict[str, float]:
    """The :data:`METRICS` of one run."""
    credit = [c for c in run.credit if np.isfinite(c)]
    return {
        **run.final,
        "f1_auc": float(np.mean(run.curve)),
        "credit": float(np.mean(credit)) if credit else 0.0,
    }


def run_arms(
    seeds: Iterable[int], arms: Sequence[str] = tuple(ARMS), spec: TrainSpec | None = None, progress=None
) -> dict[str, dict[int, dict[str, float]]]:
    """``{arm: {seed: metrics}}``: every arm trained on every seed (one world per seed, shared).

    ``progress``: an optional callable called with ``(seed, arm)`` after each run.
    """
    spec = spec or TrainSpec()
    out: dict[str, dict[int, dict[str, float]]] = {a: {} for a in arms}
    for seed in seeds:
        world = make_world(seed, train_questions=spec.train_questions, test_questions=spec.test_questions)
        for arm in arms:
            out[arm][seed] = run_metrics(train_arm(arm, seed, spec, world))
            if progress is not None:
                progress(seed, arm)
    return out


@dataclass(frozen=True)
class Effect:
    """A paired effect over seeds: its mean, interval, the sign-flip test's p-value, the per-seed
    differences and the number of seeds."""

    mean: float
    lo: float
    hi: float
    p: float
    per_seed: np.ndarray

    @property
    def n(self) -> int:
        return len(self.per_seed)


def effect(
    results: Mapping[str, Mapping[int, Mapping[str, float]]],
    claim: Claim,
    *,
    level: float = 0.95,
    samples: int = 10_000,
    seeds: Iterable[int] | None = None,
) -> Effect:
    """``direction * (metric[arm] - metric[against])`` over ``seeds`` (default: every seed both
    arms ran)."""
    both = set(results[claim.arm]) & set(results[claim.against])
    seeds = sorted(both if seeds is None else set(seeds) & both)
    if not seeds:
        raise ValueError(f"claim {claim.name}: no seed on which both {claim.arm} and {claim.against} ran")
    a = np.array([results[claim.arm][s][claim.metric] for s in seeds]) * claim.direction
    b = np.array([results[claim.against][s][claim.metric] for s in seeds]) * claim.direction
    flip = SignFlip(a, b, samples, seed=0)
    lo, hi = flip.interval(level)
    return Effect(float(np.mean(a - b)), float(lo[0]), float(hi[0]), float(flip.p_value()[0]), a - b)


def arm_summary(
    results: Mapping[str, Mapping[int, Mapping[str, float]]],
    *,
    level: float = 0.95,
    samples: int = 10_000,
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """``{arm: {metric: (mean, lo, hi)}}`` over seeds (percentile bootstrap over the seeds)."""
    out = {}
    for arm, per_seed in results.items():
        seeds = sorted(per_seed)
        values = np.array([[per_seed[s][m] for s in seeds] for m in METRICS])
        lo, hi = percentile_interval(bootstrap_means(values, samples, seed=0), level)
        out[arm] = {m: (float(values[k].mean()), float(lo[k]), float(hi[k])) for k, m in enumerate(METRICS)}
    return out
