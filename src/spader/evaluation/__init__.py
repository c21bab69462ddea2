"""Evaluation: one method on one dataset (``evaluate``), per-instance records and macro averages
(``records``), the paper's tables (``tables``), plots (``plots``) and the per-backbone aggregation
(``aggregate``)."""

from spader.evaluation.aggregate import aggregate_results
from spader.evaluation.episodes import EvalSetError, episode_record, load_eval_set, summarize
from spader.evaluation.evaluate import TINY_NOTE, evaluate_method, evaluate_policy

__all__ = [
    "TINY_NOTE",
    "EvalSetError",
    "aggregate_results",
    "episode_record",
    "evaluate_method",
    "evaluate_policy",
    "load_eval_set",
    "summarize",
]
