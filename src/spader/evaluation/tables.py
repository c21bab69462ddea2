"""The paper's tables from per-instance evaluation records (polars DataFrames, written as TSV).

Every table is computed from the records of ``results/{backbone}/eval/{method}/{dataset}.jsonl``:

* ``f1``: rows = methods (prompting baselines first, then trained variants), columns = the four
  datasets and ``avg`` (unweighted mean of the four macro F1s).
* ``prf``: long form ``method, dataset, precision, recall, f1, n`` (macro averages).
* ``ablation`` / ``beta_sweep``: every variant that is a row of the table
  (``variants.<name>.table``: the ablation by its ``label``, the beta sweep by its beta, in the
  paper config SPADER, w/o SPA, w/o NP, w/o IG and beta 0, 1, 4, 8) with a ``status`` column; a
  run this backbone does not train has status ``not run for this backbone`` and empty F1 cells: no
  number is ever invented.
* ``efficiency``: search efficiency as the authors compute it (``search_efficiency``: per
  instance, the queries the agent wrote divided by the gold entities it predicted correctly, 0
  when none; averaged over instances), per method and dataset (plus ``all``), beside the pooled
  figures named for what they measure (search calls and queries run per distinct gold entity
  surfaced in passages; empty when none was surfaced), the episodes a token budget cut short
  (``budget_cut``), and the authors' script's own counting as a second figure
  (``conversation_queries_per_correct_entity``: per instance, the queries of every ``<tool_call>``
  span of the whole conversation text, the prompt's example and error messages included, per gold
  entity of the last ``<answer>``, 0 when either is 0; averaged over the instances their script
  keeps, i.e. without those that failed otherwise than by a generation error).
* ``temporal``: mean cumulative number of distinct gold entities surfaced by turn t (episodes that
  ended earlier keep their final count), per method and dataset (plus ``all``), with its bootstrap
  interval (``ci_lo``, ``ci_hi``).

Uncertainty (:mod:`spader.evaluation.stats`, settings :class:`Uncertainty`): a score is a mean
over questions, so its interval comes from resampling the questions (percentile bootstrap; the
``avg`` over datasets resamples within each dataset). Rows pooled over datasets (``avg``, and
``all`` of efficiency and temporal) resample clusters of questions that share a topic when the
topics are known (``evaluation.topics``, :mod:`spader.evaluation.topics`); a dataset's own rows
always resample its questions. With several sampling seeds a question's score is first averaged
over the seeds, and the spread of the run-level score over seeds is reported beside it.

* ``prf`` carries ``<metric>_lo`` / ``<metric>_hi`` for precision, recall and F1, the number of
  ``seeds`` and ``f1_seed_sd``;
* ``significance``: every method against the reference (``spader``) on the same questions, per
  dataset and ``avg``, for P, R and F1: the number of questions and of resampled units, the
  difference, the paired sign-flip test's p-value (exact over all sign patterns of the differing
  units when they are few), the interval of the difference that same test gives (the differences
  it does not reject: it excludes 0 exactly when the p-value is below the level), Holm's
  adjustment over the table's comparisons of one metric, whether that adjusted p-value is below
  the configured level (``significant``), and the smallest p-value the test can reach on these
  scores (``p_min``: ``2 / 2**k`` over the k units that differ);
* ``f1_ci``: the F1 table as the report shows it, each cell ``F1 [lo, hi]``, marked ``(n.s.)``
  where the method does not differ significantly from the reference (the same verdict);
* ``ablation`` / ``beta_sweep`` carry the interval of ``avg``, its p-value against the
  reference, Holm's adjustment of it and the smallest p-value that test can reach.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from spader.config import PROMPTING, EvaluationConfig
from spader.core.metrics import correct_count, macro_average, search_efficiency
from spader.evaluation.stats import (
    SignFlip,
    bootstrap_means,
    holm,
    percentile_interval,
    seed_spread,
)
from spader.evaluation.topics import topic_clusters

__all__ = [
    "NOT_RUN",
    "ROLE_COLUMNS",
    "Uncertainty",
    "efficiency_table",
    "f1_ci_table",
    "f1_table",
    "method_order",
    "prf_table",
    "question_scores",
    "role_table",
    "significance_table",
    "temporal_table",
]

NOT_RUN = "not run for this backbone"
EVALUATED = "evaluated"
ALL = "all"

Runs = Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]  # (method, dataset) -> records


def method_order(methods: Sequence[str]) -> list[str]:
    """Prompting baselines first (as in the paper's tables), then trained variants in config order."""
    return [m for m in PROMPTING if m in methods] + [m for m in methods if m not in PROMPTING]


def _records(runs: Runs, method: str, dataset: str) -> Sequence[Mapping[str, Any]]:
    """The records of one evaluation the tables count: all but those the authors' evaluation loop
    drops from its means (``dropped``)."""
    try:
        records = runs[(method, dataset)]
    except KeyError:
        raise KeyError(f"no evaluation records for method {method!r} on dataset {dataset!r}") from None
    return [r for r in records if not r.get("dropped")]


def _macro(records) -> tuple[float, float, float, int]:
    return macro_average((r["precision"], r["recall"], r["f1"]) for r in records)


# ---------------------------------------------------------------------------------------------
# Uncertainty over questions (and sampling seeds)
# ---------------------------------------------------------------------------------------------
METRICS = ("precision", "recall", "f1")
AVG = "avg"
NOT_SIGNIFICANT = "(n.s.)"


def _evaluation(section: Mapping[str, Any]) -> EvaluationConfig:
    return EvaluationConfig.model_validate(dict(section))


@dataclass(frozen=True)
class Uncertainty:
    """How intervals and tests are computed.

    Attributes:
        samples: bootstrap resamples and random sign patterns of the permutation test
            (``evaluation.bootstrap_samples``).
        seed: seed of both (``evaluation.bootstrap_seed``).
        alpha: significance level; intervals are at ``1 - alpha`` (``evaluation.significance_level``).
        topics: ``{question id: topics}`` (``evaluation.topics``, :mod:`spader.evaluation.topics`):
            rows pooled over datasets (``avg``, ``all``) resample clusters of questions that share
            a topic; None: every question is its own unit.
        reference: the method every other one is tested against.
    """

    samples: int
    seed: int
    alpha: float
    topics: Mapping[str, Sequence[str]] | None
    reference: str = "spader"

    def clusters(self, ids: Sequence[Sequence[str]]) -> list[list[int]] | None:
        """The cluster of every question of each group of ``ids`` (None without topics)."""
        return None if self.topics is None else topic_clusters(ids, self.topics)

    def __post_init__(self):
        if self.samples < 1 or not 0 < self.alpha < 1:
            raise ValueError(
                f"bootstrap samples must be >= 1 and alpha in (0, 1), got {self.samples}, {self.alpha}"
            )

    @property
    def level(self) -> float:
        return 1 - self.alpha

    @classmethod
    def from_config(
        cls,
        evaluation: EvaluationConfig | Mapping[str, Any] | None = None,
        topics: Mapping[str, Sequence[str]] | None = None,
    ) -> Uncertainty:
        """From the ``evaluation`` section (a mapping is validated as one; None: its defaults) and
        the questions' topics (read from ``evaluation.topics`` by the caller)."""
        e = evaluation if isinstance(evaluation, EvaluationConfig) else _evaluation(evaluation or {})
        return cls(
            samples=e.bootstrap_samples, seed=e.bootstrap_seed, alpha=e.significance_level, topics=topics
        )


@dataclass(frozen=True)
class QuestionScores:
    """Per-question scores of one method on one dataset.

    Attributes:
        ids: question ids, in first-seen order.
        scores: ``(3, n)`` precision, recall and F1 of each question, averaged over seeds.
        seed_f1: macro F1 of each sampling seed (one value when the run had one seed).
    """

    ids: list[str]
    scores: np.ndarray
    seed_f1: list[float]


def question_scores(records: Sequence[Mapping[str, Any]]) -> QuestionScores:
    """Group an evaluation's records by question (``id``; the position when records carry none)
    and average each question's P/R/F1 over its sampling seeds (``seed``; one seed when absent).

    Raises:
        ValueError: when the seeds do not all cover the same questions once each.
    """
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    by_seed: dict[Any, dict[str, float]] = {}
    for pos, r in enumerate(records):
        qid = str(r.get("id", pos))
        seed = r.get("seed")
        if qid in by_seed.setdefault(seed, {}):
            raise ValueError(f"question {qid!r} appears twice for seed {seed!r}")
        by_seed[seed][qid] = float(r["f1"])
        by_id.setdefault(qid, []).append(r)
    for seed, scored in by_seed.items():
        if scored.keys() != by_id.keys():
            missing = sorted(set(by_id) - set(scored))[:3]
            raise ValueError(f"seed {seed!r} did not evaluate every question (missing e.g. {missing})")
    ids = list(by_id)
    scores = np.array(
        [[sum(float(r[k]) for r in by_id[q]) / len(by_id[q]) for q in ids] for k in METRICS], dtype=np.float64
    ).reshape(len(METRICS), len(ids))
    seed_f1 = [sum(v.values()) / len(v) if v else 0.0 for v in by_seed.values()]
    return QuestionScores(ids, scores, seed_f1)


class Estimates:
    """Bootstrap distributions and paired tests of every method's P/R/F1 on every dataset and on
    their ``avg``, computed once per table set (see :mod:`spader.evaluation.stats`).

    Every method of a dataset is resampled with the same question draws, so differences are paired.
    """

    def __init__(
        self,
        runs: Runs,
        methods: Sequence[str],
        datasets: Sequence[str],
        uncertainty: Uncertainty | None = None,
    ):
        self.u = uncertainty or Uncertainty.from_config()
        self.methods = method_order(methods)
        self.datasets = list(datasets)
        self.scores = {
            (m, d): question_scores(_records(runs, m, d)) for m in self.methods for d in self.datasets
        }
        self._stack: dict[str, np.ndarray] = {}
        self._ids: dict[str, list[str]] = {}  # the questions of each stack, in its order
        for d in self.datasets:
            ids = None
            rows = []
            # paired statistics run over the questions every method kept (the authors' loop drops some)
            common = (
                set.intersection(*(set(self.scores[(m, d)].ids) for m in self.methods))
                if self.methods
                else set()
            )
            for m in self.methods:
                qs = self.scores[(m, d)]
                if ids is None:
                    ids, first = qs.ids, m
                elif set(qs.ids) != set(ids) and not _any_dropped(runs, self.methods, d):
                    raise ValueError(
                        f"{m!r} and {first!r} were evaluated on different questions of {d!r} (a stale evaluation?)"
                    )
                order = {q: i for i, q in enumerate(qs.ids)}
                rows.append(qs.scores[:, [order[q] for q in ids if q in common]])
            self._stack[d] = np.stack(rows) if rows else np.zeros((0, len(METRICS), 1))
            self._ids[d] = [q for q in ids if q in common] if ids is not None else []
        self._clusters = self.u.clusters([self._ids[d] for d in self.datasets])
        self._draws: dict[str, np.ndarray] = {}
        self._p: dict[tuple, Any] = {}  # sign-flip tests, their p-values and Holm's adjustments
        self._intervals: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def _strata(self, dataset: str) -> list[np.ndarray]:
        names = self.datasets if dataset == AVG else [dataset]
        return [self._stack[d].reshape(-1, self._stack[d].shape[-1]) for d in names]

    def clusters(self, dataset: str) -> list[list[int]] | None:
        """The resampled units: every question of a dataset on its own; on ``avg``, the clusters
        of questions that share a topic when the topics are known (None: questions)."""
        return self._clusters if dataset == AVG else None

    def units(self, dataset: str) -> int:
        """How many units ``dataset`` (or ``avg``) resamples: questions, or clusters of them."""
        clusters = self.clusters(dataset)
        return self.questions(dataset) if clusters is None else len({c for group in clusters for c in group})

    def draws(self, dataset: str) -> np.ndarray:
        """``(samples, methods, 3)`` resampled P/R/F1 of every method on ``dataset`` (or ``avg``)."""
        if dataset not in self._draws:
            flat = bootstrap_means(self._strata(dataset), self.u.samples, self.u.seed, self.clusters(dataset))
            self._draws[dataset] = flat.reshape(self.u.samples, len(self.methods), len(METRICS))
        return self._draws[dataset]

    def point(self, method: str, dataset: str) -> np.ndarray:
        """P/R/F1 of ``method`` on ``dataset`` (``avg``: the unweighted mean over datasets)."""
        names = self.datasets if dataset == AVG else [dataset]
        i = self.methods.index(method)
        return sum(self._stack[d][i].mean(axis=1) for d in names) / len(names)

    def interval(self, method: str, dataset: str) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` of P/R/F1 at the configured level."""
        return percentile_interval(self.draws(dataset)[:, self.methods.index(method)], self.u.level)

    def _flip(self, dataset: str, reference: str) -> SignFlip:
        """The sign-flip test of every method against ``reference`` on ``dataset`` (or ``avg``):
        one set of sign patterns (one seed) for all of them, so each method's p-value and interval
        are the ones it would get alone."""
        key = (dataset, reference)
        if key not in self._p:
            names = self.datasets if dataset == AVG else [dataset]
            j = self.methods.index(reference)
            a = [self._stack[d].reshape(-1, self._stack[d].shape[-1]) for d in names]
            b = [np.tile(self._stack[d][j], (len(self.methods), 1)) for d in names]
            self._p[key] = SignFlip(a, b, self.u.samples, self.u.seed, self.clusters(dataset))
        return self._p[key]

    def _row(self, method: str) -> slice:
        i = self.methods.index(method)
        return slice(i * len(METRICS), (i + 1) * len(METRICS))

    def difference(
        self, method: str, dataset: str, reference: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``method - reference`` on P/R/F1 and its interval at the configured level: the shifts the
        paired sign-flip test does not reject (:meth:`SignFlip.interval`), so the interval excludes
        0 exactly when :meth:`p_value` is below the level's alpha."""
        if (dataset, reference) not in self._intervals:
            self._intervals[(dataset, reference)] = self._flip(dataset, reference).interval(self.u.level)
        lo, hi = self._intervals[(dataset, reference)]
        rows = self._row(method)
        return self.point(method, dataset) - self.point(reference, dataset), lo[rows], hi[rows]

    def p_value(self, method: str, dataset: str, reference: str) -> np.ndarray:
        """Paired permutation test's p-values of ``method`` vs ``reference`` on P/R/F1 (exact over
        all sign patterns up to :data:`spader.evaluation.stats.EXACT_MAX_PAIRS` questions)."""
        flip = self._flip(dataset, reference)
        if (dataset, reference, "p") not in self._p:
            self._p[(dataset, reference, "p")] = flip.p_value()
        return self._p[(dataset, reference, "p")][self._row(method)]

    def questions(self, dataset: str) -> int:
        """Number of questions (pairs) of ``dataset``; ``avg``: of all datasets together."""
        return sum(self._stack[d].shape[-1] for d in (self.datasets if dataset == AVG else [dataset]))

    def smallest_p(self, method: str, dataset: str, reference: str) -> np.ndarray:
        """The smallest p-value the paired test of ``method`` against ``reference`` can reach on
        P/R/F1: ``2 / 2**k`` over the k units (questions, or clusters on ``avg``) where the two
        differ while the test enumerates them, ``1 / (samples + 1)`` beyond
        (:func:`spader.evaluation.stats.smallest_p`)."""
        return self._flip(dataset, reference).smallest_p[self._row(method)]

    def comparisons(self) -> list[tuple[str, str]]:
        """The family Holm adjusts over, per metric: every method but the reference, on every
        dataset and on ``avg`` (the rows of :func:`significance_table`)."""
        ref = self.u.reference
        if ref not in self.methods:
            return []
        return [(m, d) for m in self.methods if m != ref for d in [*self.datasets, AVG]]

    def p_holm(self, method: str, dataset: str, metric: str = "f1") -> float:
        """Holm's adjustment of ``method``'s p-value against the reference over :meth:`comparisons`."""
        key = ("holm", metric)
        if key not in self._p:
            family = self.comparisons()
            k = METRICS.index(metric)
            raw = [float(self.p_value(m, d, self.u.reference)[k]) for m, d in family]
            self._p[key] = dict(zip(family, holm(raw), strict=True))
        return self._p[key][(method, dataset)]

    def significant(self, method: str, dataset: str, metric: str = "f1") -> bool | None:
        """Whether ``method`` differs from the reference after Holm's adjustment over the table's
        comparisons (None: it is the reference, or there is none)."""
        ref = self.u.reference
        if method == ref or ref not in self.methods:
            return None
        return bool(self.p_holm(method, dataset, metric) < self.u.alpha)

    def seeds(self, method: str, dataset: str) -> tuple[int, float | None]:
        """Number of sampling seeds and the standard deviation of macro F1 over them (None for one)."""
        per_seed = self.scores[(method, dataset)].seed_f1
        return len(per_seed), (seed_spread(per_seed)[1] if len(per_seed) > 1 else None)


def _any_dropped(runs: Runs, methods: Sequence[str], dataset: str) -> bool:
    return any(r.get("dropped") for m in methods for r in runs.get((m, dataset), ()))


def _estimates(runs, methods, datasets, estimates: Estimates | None) -> Estimates:
    return estimates if estimates is not None else Estimates(runs, methods, datasets)


def prf_table(
    runs: Runs, methods: Sequence[str], datasets: Sequence[str], estimates: Estimates | None = None
) -> pl.DataFrame:
    """Long form ``method, dataset, precision, recall, f1, n``, then each metric's interval
    (``precision_lo, precision_hi, recall_lo, recall_hi, f1_lo, f1_hi``), ``seeds`` and
    ``f1_seed_sd`` (standard deviation of F1 over the sampling seeds; empty for one seed). ``n``
    counts questions; with several seeds every question's scores are averaged over them."""
    est = _estimates(runs, methods, datasets, estimates)
    rows = []
    for m in method_order(methods):
        for d in datasets:
            p, r, f, _ = _macro(_records(runs, m, d))
            lo, hi = est.interval(m, d)
            seeds, sd = est.seeds(m, d)
            row = {"method": m, "dataset": d, "precision": p, "recall": r, "f1": f}
            row["n"] = len(est.scores[(m, d)].ids)
            for k, name in enumerate(METRICS):
                row[f"{name}_lo"], row[f"{name}_hi"] = float(lo[k]), float(hi[k])
            rows.append({**row, "seeds": seeds, "f1_seed_sd": sd})
    schema = {
        "method": pl.String,
        "dataset": pl.String,
        "precision": pl.Float64,
        "recall": pl.Float64,
        "f1": pl.Float64,
        "n": pl.Int64,
        **{f"{name}_{end}": pl.Float64 for name in METRICS for end in ("lo", "hi")},
        "seeds": pl.Int64,
        "f1_seed_sd": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)


def significance_table(
    runs: Runs, methods: Sequence[str], datasets: Sequence[str], estimates: Estimates | None = None
) -> pl.DataFrame:
    """Every method against the reference on the same questions: ``method, reference, dataset,
    metric, n, units, diff, diff_lo, diff_hi, p_value, p_holm, significant, p_min`` for each
    dataset and ``avg`` and each of P, R, F1.

    ``n`` counts the questions and ``units`` what the test and intervals resample: the questions,
    or on ``avg`` with known topics (``evaluation.topics``) the clusters of questions that share a
    topic across the datasets. ``diff`` is method minus reference; ``p_value`` the paired
    sign-flip test's (two-sided, exact over all sign patterns of the units that differ while
    :func:`spader.evaluation.stats.exact` allows); ``diff_lo``/``diff_hi`` the differences that
    test does not reject at the level (so the interval excludes 0 exactly when ``p_value`` is
    below the level); ``p_holm`` Holm's adjustment over the table's rows of the same metric;
    ``significant`` is ``p_holm`` below the level; ``p_min`` the smallest p-value the test can
    reach on these scores: ``2 / 2**k`` over the k units where the two methods differ (1 for
    one), ``1 / (samples + 1)`` when k is too large to enumerate (Holm's adjustment of the
    smallest is at least ``p_min`` times the number of rows of a metric). Empty when the
    reference was not evaluated."""
    est = _estimates(runs, methods, datasets, estimates)
    ref = est.u.reference
    rows = []
    for m, d in est.comparisons():
        diff, lo, hi = est.difference(m, d, ref)
        p, floor = est.p_value(m, d, ref), est.smallest_p(m, d, ref)
        for k, metric in enumerate(METRICS):
            rows.append(
                {
                    "method": m, "reference": ref, "dataset": d, "metric": metric, "n": est.questions(d),
                    "units": est.units(d), "diff": float(diff[k]), "diff_lo": float(lo[k]),
                    "diff_hi": float(hi[k]), "p_value": float(p[k]), "p_holm": est.p_holm(m, d, metric),
                    "significant": est.significant(m, d, metric), "p_min": float(floor[k]),
                }
            )  # fmt: skip
    schema = {
        "method": pl.String, "reference": pl.String, "dataset": pl.String, "metric": pl.String,
        "n": pl.Int64, "units": pl.Int64, "diff": pl.Float64, "diff_lo": pl.Float64, "diff_hi": pl.Float64,
        "p_value": pl.Float64, "p_holm": pl.Float64, "significant": pl.Boolean, "p_min": pl.Float64,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def _cell(value: float, lo: float, hi: float, significant: bool | None) -> str:
    mark = f" {NOT_SIGNIFICANT}" if significant is False else ""
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]{mark}"


def f1_ci_table(
    runs: Runs, methods: Sequence[str], datasets: Sequence[str], estimates: Estimates | None = None
) -> pl.DataFrame:
    """The F1 table as the report shows it: ``method, <datasets...>, avg`` with text cells
    ``F1 [lo, hi]``, followed by ``(n.s.)`` where the method does not differ significantly from
    the reference on those questions (paired permutation test, Holm-adjusted over the
    significance table's F1 rows: the same verdict as its ``significant`` column)."""
    est = _estimates(runs, methods, datasets, estimates)
    k = METRICS.index("f1")
    rows = []
    for m in est.methods:
        row = {"method": m}
        for d in [*datasets, AVG]:
            lo, hi = est.interval(m, d)
            row[d] = _cell(float(est.point(m, d)[k]), float(lo[k]), float(hi[k]), est.significant(m, d))
        rows.append(row)
    return pl.DataFrame(rows, schema={"method": pl.String, **{d: pl.String for d in [*datasets, AVG]}})


def _f1_row(runs: Runs, method: str, datasets: Sequence[str]) -> dict[str, float]:
    row = {d: _macro(_records(runs, method, d))[2] for d in datasets}
    row["avg"] = sum(row.values()) / len(datasets) if datasets else 0.0
    return row


def _f1_schema(datasets: Sequence[str], leading: Mapping[str, Any]) -> dict[str, Any]:
    return {**leading, **{d: pl.Float64 for d in datasets}, "avg": pl.Float64}


def f1_table(runs: Runs, methods: Sequence[str], datasets: Sequence[str]) -> pl.DataFrame:
    """Rows = methods, columns ``method, <datasets...>, avg`` (macro F1)."""
    rows = [{"method": m, **_f1_row(runs, m, datasets)} for m in method_order(methods)]
    return pl.DataFrame(rows, schema=_f1_schema(datasets, {"method": pl.String}))


_INTERVAL_COLUMNS = {
    "avg_lo": pl.Float64,
    "avg_hi": pl.Float64,
    "avg_p_vs_reference": pl.Float64,
    "avg_p_holm": pl.Float64,
    "avg_p_min": pl.Float64,
}


def _status_rows(
    runs: Runs,
    names: Sequence[str],
    methods: Sequence[str],
    datasets: Sequence[str],
    extra,
    estimates: Estimates | None,
) -> list[dict]:
    """Rows of the ablation and beta-sweep tables: F1 per dataset and ``avg``, the interval of
    ``avg``, its p-value against the reference, that p-value after Holm's adjustment over the
    significance table's F1 rows and the smallest p-value the test can reach on these questions
    (the p-values empty for the reference; everything empty for runs this backbone does not have)."""
    evaluated = [n for n in names if n in methods]
    est = _estimates(runs, methods, datasets, estimates) if evaluated else None
    k = METRICS.index("f1")
    rows = []
    for name in names:
        row = {"method": name, **extra(name)}
        if name in methods:
            row.update(status=EVALUATED, **_f1_row(runs, name, datasets))
            lo, hi = est.interval(name, AVG)
            ref = est.u.reference
            tested = name != ref and ref in est.methods
            row.update(
                avg_lo=float(lo[k]),
                avg_hi=float(hi[k]),
                avg_p_vs_reference=float(est.p_value(name, AVG, ref)[k]) if tested else None,
                avg_p_holm=est.p_holm(name, AVG) if tested else None,
                avg_p_min=float(est.smallest_p(name, AVG, ref)[k]) if tested else None,
            )
        else:
            row.update(status=NOT_RUN, **{d: None for d in datasets}, avg=None)
            row.update(dict.fromkeys(_INTERVAL_COLUMNS))
        rows.append(row)
    return rows


#: The tables a variant can be a row of (``variants.<name>.table``, :data:`spader.methods.TABLES`):
#: the leading column after ``method`` that names a row, and its type.
ROLE_COLUMNS = {"ablation": ("setting", pl.String), "beta_sweep": ("beta", pl.Float64)}


def role_table(
    table: str,
    runs: Runs,
    methods: Sequence[str],
    variants: Sequence[Sequence[Any]],
    datasets: Sequence[str],
    estimates: Estimates | None = None,
) -> pl.DataFrame:
    """``method, <column>, status, <datasets...>, avg, avg_lo, avg_hi, avg_p_vs_reference,
    avg_p_holm, avg_p_min`` for the variants that are rows of ``table``.

    Args:
        table: ``ablation`` or ``beta_sweep`` (:data:`ROLE_COLUMNS`).
        variants: ``[[variant, row], ...]`` (:func:`spader.methods.table_rows`): the rows of
            ``table`` in that order, or by value where the role says so; a row this backbone does
            not run says so.
    """
    column, dtype = ROLE_COLUMNS[table]
    rows = [(name, row) for name, row in variants if row.get("table") == table]
    if any(row["ordered"] for _, row in rows):
        rows.sort(key=lambda item: item[1]["value"])
    values = {name: (float(row["value"]) if dtype == pl.Float64 else row["value"]) for name, row in rows}
    names = [name for name, _ in rows]
    out = _status_rows(runs, names, methods, datasets, lambda v: {column: values[v]}, estimates)
    leading = {"method": pl.String, column: dtype, "status": pl.String}
    return pl.DataFrame(out, schema={**_f1_schema(datasets, leading), **_INTERVAL_COLUMNS})


def _pooled(
    runs: Runs, method: str, datasets: Sequence[str]
) -> list[tuple[str, Sequence[Mapping[str, Any]]]]:
    per = [(d, _records(runs, method, d)) for d in datasets]
    return [*per, (ALL, [r for _, recs in per for r in recs])]


def _instance_efficiency(r: Mapping[str, Any]) -> tuple[float, int, int]:
    """``(search efficiency, queries written, correct entities)`` of one record (records written
    before these fields existed are recomputed from their predictions and gold)."""
    written = int(r.get("queries_written", r["queries_issued"]))
    if "correct_entities" in r:
        correct = int(r["correct_entities"])
    elif "predictions" in r and "gold" in r:
        correct = correct_count(r["predictions"], r["gold"])
    else:
        raise KeyError(
            f"evaluation record {r.get('id', '?')!r} has neither 'correct_entities' nor "
            "'predictions' and 'gold': evaluate again"
        )
    value = r.get("search_efficiency")
    return (float(value) if value is not None else search_efficiency(written, correct)), written, correct


def _efficiency_row(m: str, d: str, recs: Sequence[Mapping[str, Any]], u: Uncertainty) -> dict[str, Any]:
    """The row of :func:`efficiency_table` of method ``m`` on dataset ``d`` (its records ``recs``)."""
    per = [_instance_efficiency(r) for r in recs]
    lo = hi = None
    if per:
        clusters = u.clusters([[str(r.get("id", i)) for i, r in enumerate(recs)]]) if d == ALL else None
        draws = bootstrap_means(
            np.array([e for e, _, _ in per], dtype=np.float64), u.samples, u.seed, clusters
        )
        lo, hi = (float(x[0]) for x in percentile_interval(draws, u.level))
    calls = sum(int(r["search_calls"]) for r in recs)
    queries = sum(int(r["queries_issued"]) for r in recs)
    found = sum(int(r["entities_found"]) for r in recs)
    # the authors' script: a mean over the instances it keeps (not those that failed)
    theirs = [
        float(r["conversation_queries_per_correct_entity"])
        for r in recs
        if r.get("status") != "episode_error" and "conversation_queries_per_correct_entity" in r
    ]
    return {
        "method": m,
        "dataset": d,
        "n": len(recs),
        "search_efficiency": sum(e for e, _, _ in per) / len(per) if per else 0.0,
        "queries_written": sum(w for _, w, _ in per),
        "correct_entities": sum(c for _, _, c in per),
        "search_calls": calls,
        "queries_issued": queries,
        "entities_found": found,
        "search_calls_per_surfaced_entity": calls / found if found else None,
        "queries_per_surfaced_entity": queries / found if found else None,
        "budget_cut": sum(bool(r.get("budget_cut")) for r in recs),
        "search_efficiency_lo": lo,
        "search_efficiency_hi": hi,
        "conversation_queries_per_correct_entity": sum(theirs) / len(theirs) if theirs else None,
    }


def efficiency_table(
    runs: Runs, methods: Sequence[str], datasets: Sequence[str], uncertainty: Uncertainty | None = None
) -> pl.DataFrame:
    """``method, dataset, n, search_efficiency, queries_written, correct_entities, search_calls,
    queries_issued, entities_found, search_calls_per_surfaced_entity,
    queries_per_surfaced_entity, budget_cut, search_efficiency_lo, search_efficiency_hi,
    conversation_queries_per_correct_entity`` (the authors' script's counting: see the module's
    docstring; empty for records written before it existed).

    ``search_efficiency`` is the authors' figure (mean over instances of queries written per
    correctly predicted entity, 0 for an instance without one); the ``*_per_surfaced_entity``
    columns are ratios of totals over the run (search calls or queries run per distinct gold
    entity its passages surfaced; empty when none was); ``budget_cut`` counts the episodes a token
    budget cut short. ``search_efficiency_lo``/``_hi`` bound the percentile bootstrap interval of
    ``search_efficiency`` over the instances (``all``: over the pooled ones, by clusters of
    questions that share a topic when the topics are known; empty without any)."""
    u = uncertainty or Uncertainty.from_config()
    rows = []
    for m in method_order(methods):
        rows.extend(_efficiency_row(m, d, recs, u) for d, recs in _pooled(runs, m, datasets))
    schema = {
        "method": pl.String, "dataset": pl.String, "n": pl.Int64, "search_efficiency": pl.Float64,
        "queries_written": pl.Int64, "correct_entities": pl.Int64, "search_calls": pl.Int64,
        "queries_issued": pl.Int64, "entities_found": pl.Int64,
        "search_calls_per_surfaced_entity": pl.Float64, "queries_per_surfaced_entity": pl.Float64,
        "budget_cut": pl.Int64, "search_efficiency_lo": pl.Float64, "search_efficiency_hi": pl.Float64,
        "conversation_queries_per_correct_entity": pl.Float64,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def cumulative_curve(records: Sequence[Mapping[str, Any]], turns: int) -> list[float]:
    """Mean over instances of the cumulative distinct entities found by turn 1..``turns``."""
    if not records:
        return [0.0] * turns
    totals = [0.0] * turns
    for r in records:
        running = 0
        per_turn = list(r["new_entities_per_turn"])
        for t in range(turns):
            if t < len(per_turn):
                running += int(per_turn[t])
            totals[t] += running
    return [x / len(records) for x in totals]


def _per_question_cumulative(
    pooled: Sequence[tuple[str, Mapping[str, Any]]], turns: int
) -> tuple[np.ndarray, list[str]]:
    """``(turns, questions)`` cumulative entities by turn of each question (averaged over seeds),
    and the questions' ids."""
    groups: dict[tuple[str, str], list[list[float]]] = {}
    for pos, (d, r) in enumerate(pooled):
        curve = cumulative_curve([r], turns)
        groups.setdefault((d, str(r.get("id", pos))), []).append(curve)
    if not groups:
        return np.zeros((turns, 1)), ["none"]
    curves = np.array([np.mean(curves, axis=0) for curves in groups.values()]).T.reshape(turns, len(groups))
    return curves, [q for _, q in groups]


def temporal_table(
    runs: Runs, methods: Sequence[str], datasets: Sequence[str], uncertainty: Uncertainty | None = None
) -> pl.DataFrame:
    """``method, dataset, turn, cumulative_entities, n, ci_lo, ci_hi`` (turn 1 .. longest episode
    of the run); the interval is the bootstrap's over questions (``all``: over the pooled ones, by
    clusters of questions that share a topic when the topics are known)."""
    u = uncertainty or Uncertainty.from_config()
    rows = []
    for m in method_order(methods):
        per = [(d, [(d, r) for r in _records(runs, m, d)]) for d in datasets]
        for d, pooled in [*per, (ALL, [x for _, items in per for x in items])]:
            recs = [r for _, r in pooled]
            turns = max([len(r["new_entities_per_turn"]) for r in recs] + [1])
            curves, ids = _per_question_cumulative(pooled, turns)
            clusters = u.clusters([ids]) if d == ALL and recs else None
            lo, hi = percentile_interval(bootstrap_means(curves, u.samples, u.seed, clusters), u.level)
            for t, value in enumerate(cumulative_curve(recs, turns), start=1):
                rows.append(
                    {
                        "method": m, "dataset": d, "turn": t, "cumulative_entities": value, "n": len(recs),
                        "ci_lo": float(lo[t - 1]), "ci_hi": float(hi[t - 1]),
                    }
                )  # fmt: skip
    schema = {
        "method": pl.String,
        "dataset": pl.String,
        "turn": pl.Int64,
        "cumulative_entities": pl.Float64,
        "n": pl.Int64,
        "ci_lo": pl.Float64,
        "ci_hi": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)
