"""The paper's claims as paired effects over seeds, on what a user gets (docs/mechanisms.md).

Every arm is trained on the same seeds (the same world, questions and evaluation questions per
seed), so a claim is a paired comparison: per seed, the claimed arm's metric minus the other
arm's. Its mean over seeds is tested with the paired sign-flip test of
:mod:`spader.evaluation.stats` and bounded by the interval that same test gives (the shifts it does
not reject at 95%, so the interval excludes 0 exactly when the test rejects). A claim's **verdict**
(:func:`verdict`): ``holds`` when the interval lies above 0, ``contradicted`` when it lies below,
``no evidence`` otherwise.

Every claim is on an outcome the method does not define: answer F1, the recall of rare entities
per answer, searches after the last discovery. The rewards' own quantities (discovered entities,
the novelty premium a group collects, the advantages) are not claims: what holds of them by
construction is tested as formulas in tests/mechanisms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spader.evaluation.stats import SignFlip, bootstrap_means, percentile_interval
from spader.mechanisms.train import ARMS, Run, TrainSpec, train_arm
from spader.mechanisms.world import make_world

__all__ = [
    "CALIBRATION",
    "CLAIMS",
    "HELD_OUT",
    "METRICS",
    "VERDICTS",
    "Claim",
    "Effect",
    "arm_summary",
    "disagreements",
    "effect",
    "run_arms",
    "run_metrics",
    "verdict",
]

#: Per-run metrics: the held-out evaluation's means (:func:`spader.mechanisms.train.episode_outcomes`)
#: and ``f1_auc``, the mean answer F1 of the training batches (the area under the learning curve).
METRICS = (
    "f1",
    "recall_rare",
    "recall_head",
    "searches",
    "empty",
    "after_last",
    "invalid",
    "blind",
    "lead",
    "f1_auc",
)

#: Seeds the trainer's settings and the documented verdicts were set on.
CALIBRATION = range(3000, 3100)
#: Seeds the documented verdicts were measured on, after every parameter and every documented
#: verdict was committed (the bench's default).
HELD_OUT = range(5000, 5100)

VERDICTS = ("holds", "contradicted", "no evidence")


@dataclass(frozen=True)
class Claim:
    """A claim: ``metric`` is higher for ``arm`` than for ``against``.

    Attributes:
        name: short id. statement: the claim in words. arm, against: the two arms. metric: one of
            :data:`METRICS`. documented: the verdict docs/mechanisms.md states (one of
            :data:`VERDICTS`), measured on the :data:`HELD_OUT` seeds.
    """

    name: str
    statement: str
    arm: str
    against: str
    metric: str
    documented: str


#: The documented verdicts were set to those of the calibration seeds 3000..3099
#: (bench/records/2026-12-05-e7fa1e0-mechanisms.yaml) and committed before any held-out seed ran;
#: the held-out seeds 5000..5099 (bench/records/2026-12-05-e575075-mechanisms.yaml) gave the same
#: verdict for every claim, the ones docs/mechanisms.md states.
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "spa_f1",
        "SPA raises answer F1 over the trajectory-level advantage on the same rewards",
        "spader",
        "no_spa",
        "f1",
        "holds",
    ),
    Claim(
        "spa_speed",
        "SPA learns faster in answer F1 (area under the training F1 curve) than the trajectory-level advantage",
        "spader",
        "no_spa",
        "f1_auc",
        "holds",
    ),
    Claim(
        "np_rare",
        "the novelty premium raises the recall of rare entities per answer",
        "spader",
        "no_np",
        "recall_rare",
        "holds",
    ),
    Claim(
        "ig_stop",
        "without the information gain, more searches find nothing after the last discovery (Case 3)",
        "no_ig",
        "spader",
        "after_last",
        "contradicted",
    ),
    Claim("grpo_f1", "SPADER's answers beat GRPO's in F1", "spader", "grpo", "f1", "holds"),
    Claim(
        "grpo_speed",
        "SPADER learns faster in answer F1 (area under the training F1 curve) than GRPO",
        "spader",
        "grpo",
        "f1_auc",
        "holds",
    ),
    Claim(
        "grpo_rare",
        "SPADER's answers name more of the rare entities than GRPO's",
        "spader",
        "grpo",
        "recall_rare",
        "holds",
    ),
    Claim(
        "grpo_stop",
        "GRPO spends more searches than SPADER after its last discovery",
        "grpo",
        "spader",
        "after_last",
        "no evidence",
    ),
)


def run_metrics(run: Run) -> dict[str, float]:
    """The :data:`METRICS` of one run."""
    return {**run.final, "f1_auc": float(np.mean(run.curve))}


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
    """A paired effect over seeds, ``metric[arm] - metric[against]``: its mean, the sign-flip
    test's interval and p-value, the per-seed differences and the number of seeds."""

    mean: float
    lo: float
    hi: float
    p: float
    per_seed: np.ndarray

    @property
    def n(self) -> int:
        return len(self.per_seed)


def verdict(lo: float, hi: float) -> str:
    """``holds`` (the interval lies above 0), ``contradicted`` (below 0) or ``no evidence``."""
    if lo > 0:
        return "holds"
    if hi < 0:
        return "contradicted"
    return "no evidence"


def effect(
    results: Mapping[str, Mapping[int, Mapping[str, float]]],
    claim: Claim,
    *,
    level: float = 0.95,
    samples: int = 10_000,
    seeds: Iterable[int] | None = None,
) -> Effect:
    """``metric[arm] - metric[against]`` over ``seeds`` (default: every seed both arms ran)."""
    both = set(results[claim.arm]) & set(results[claim.against])
    seeds = sorted(both if seeds is None else set(seeds) & both)
    if len(seeds) < 2:
        raise ValueError(
            f"claim {claim.name}: {claim.arm} and {claim.against} share {len(seeds)} seed(s), need 2"
        )
    a = np.array([results[claim.arm][s][claim.metric] for s in seeds])
    b = np.array([results[claim.against][s][claim.metric] for s in seeds])
    flip = SignFlip(a, b, samples, seed=0)
    lo, hi = flip.interval(level)
    return Effect(float(np.mean(a - b)), float(lo[0]), float(hi[0]), float(flip.p_value()[0]), a - b)


def disagreements(found: Mapping[str, str], claims: Sequence[Claim] = CLAIMS) -> list[str]:
    """Claims whose verdict (``found[name]``) differs from a documented effect: a claim the docs say
    holds, or say is contradicted, must come out so again. (A claim documented as ``no evidence``
    that comes out either way is reported by the bench, not failed: a claim with no effect does so
    on about 5% of fresh seed blocks.)"""
    return [
        f"{c.name}: {found[c.name]}, documented as {c.documented}"
        for c in claims
        if c.documented != "no evidence" and found[c.name] != c.documented
    ]


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
