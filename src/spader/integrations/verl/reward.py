"""Terminal reward for verl: ``reward.custom_reward_function.path=pkg://spader.integrations.verl.reward``.

verl's ``naive`` reward manager calls :func:`compute_score` once per rollout with the decoded
response, the row's ``reward_model.ground_truth`` and ``extra_info`` merged with the agent loop's
extra fields. The answer is parsed from the *last assistant turn* only (recorded by the
``spader_tool_agent`` loop under :data:`spader.methods.steps.FINAL_TURN_KEY`), never from the decoded
response, which also holds the tool observations. The score is the F1 of the answer
(``spader.core.metrics.prf``) or ``invalid_format_reward`` (paper -1, authors' code 0); the search-step
rewards are added later by the ``spader_sync`` trainer mode. The last turn is read as every turn
is (:func:`spader.core.parsing.final_answer`): a turn that ends with a tool call has no answer.
An episode the agent loop recorded as failed (:data:`spader.methods.steps.FAILURE_KEY`) scores 0.

Two options reproduce the authors' reward (``reward_kwargs``): ``parser="authors"`` reads the
answer as their reward does, from the decoded response (observations included): invalid for
unbalanced ``<think>`` tags or a missing ``<answer>`` / ``</answer>``, else the last ``<answer>``
read as JSON, a Python literal or the raw string (:func:`spader.core.parsing.authors_answer`);
``aliases="blind"`` turns each entity's alias list into one string
(:func:`spader.core.metrics.alias_blind`), so an entity with two or more aliases never matches, and
scores the answer as their reward does, through their normaliser
(:func:`spader.core.metrics.authors_reward_prf`).

This module imports no verl: it only unpacks arguments for the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spader.core.metrics import alias_blind, authors_reward_prf, gold_alias_sets, prf
from spader.core.parsing import authors_answer, final_answer
from spader.core.rewards import terminal_reward
from spader.methods.steps import FAILURE_KEY, FINAL_TURN_KEY

__all__ = ["compute_score", "gold_entities"]


def _alias_lists(entities: Any) -> list[list[str]]:
    return [[aliases] if isinstance(aliases, str) else [str(a) for a in aliases] for aliases in entities]


def gold_entities(ground_truth: Any) -> list[list[str]]:
    """Gold entities (alias lists) of a row's ``reward_model.ground_truth``.

    Accepts the export format ``{"target": [primary, ...], "entities": [[alias, ...], ...]}``
    (``entities`` wins; ``target`` alone means one alias per entity), or a bare list of alias lists.
    Numpy arrays from a parquet read-back are accepted wherever lists are.
    """
    if isinstance(ground_truth, Mapping):
        if ground_truth.get("entities") is not None:
            return _alias_lists(ground_truth["entities"])
        if ground_truth.get("target") is not None:
            return [[str(t)] for t in ground_truth["target"]]
        raise ValueError(
            f"reward_model.ground_truth has neither 'entities' nor 'target': keys {sorted(ground_truth)}"
        )
    if ground_truth is None or isinstance(ground_truth, str):
        raise ValueError(
            f"reward_model.ground_truth must be a mapping or a list of alias lists, got {ground_truth!r}"
        )
    return _alias_lists(ground_truth)


def _answer_prf(parsed, gold: list[list[str]], aliases: str, data_source: str, ground_truth: Any):
    """The answer's precision, recall and F1 against ``gold`` (0 for an invalid answer)."""
    if aliases not in ("aware", "blind"):
        raise ValueError(f"reward_kwargs.aliases must be aware or blind, got {aliases!r}")
    if not gold_alias_sets(gold):
        raise ValueError(f"ground truth of a {data_source!r} row has no usable entity: {ground_truth!r}")
    if not parsed.valid:
        return 0.0, 0.0, 0.0
    if aliases == "blind":  # the authors' reward: one string per alias list, their normaliser
        return authors_reward_prf(parsed.answers, [t for (t,) in alias_blind(gold)])
    return prf(parsed.answers, gold)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    invalid_format_reward: float = -1.0,
    parser: str = "spader",
    aliases: str = "aware",
    **kwargs: Any,
) -> dict[str, float]:
    """verl reward function: the terminal reward of one rollout.

    Args:
        data_source: dataset name (unused; one reward for all datasets).
        solution_str: decoded response (unused: it also holds the observations).
        ground_truth: the row's ``reward_model.ground_truth`` (see :func:`gold_entities`).
        extra_info: the row's ``extra_info`` merged with the agent loop's extra fields; must hold
            :data:`spader.methods.steps.FINAL_TURN_KEY`.
        invalid_format_reward: reward of an invalid final turn (``reward_kwargs``).
        parser: ``spader`` (the last turn, :func:`spader.core.parsing.final_answer`) or ``authors``
            (their reward's reading of ``solution_str``).
        aliases: ``aware`` (any alias of an entity matches) or ``blind`` (the authors' reward).
    Returns:
        ``{"score", "f1", "precision", "recall", "format_valid", "num_predicted", "failed"}``
        (plain floats: verl turns the extra keys into validation metrics; every row has them all).
    """
    extra_info = extra_info or {}
    if extra_info.get(FAILURE_KEY):
        zero = dict.fromkeys(("score", "f1", "precision", "recall", "format_valid", "num_predicted"), 0.0)
        return {**zero, "failed": 1.0}
    if FINAL_TURN_KEY not in extra_info:
        raise KeyError(
            f"extra_info has no '{FINAL_TURN_KEY}': the SPADER reward needs the 'spader_tool_agent' "
            "agent loop (actor_rollout_ref.rollout.agent.default_agent_loop=spader_tool_agent)"
        )
    if parser == "authors":
        parsed = authors_answer(str(solution_str or ""), "training")
    elif parser == "spader":
        parsed = final_answer(str(extra_info[FINAL_TURN_KEY] or ""))
    else:
        raise ValueError(f"reward_kwargs.parser must be spader or authors, got {parser!r}")
    precision, recall, f1 = _answer_prf(
        parsed, gold_entities(ground_truth), aliases, data_source, ground_truth
    )
    score = terminal_reward(f1 if parsed.valid else None, invalid_format_reward=invalid_format_reward)
    return {
        "score": score,
        "f1": f1,
        "precision": precision,
        "recall": recall,
        "format_valid": 1.0 if parsed.valid else 0.0,
        "num_predicted": float(len(parsed.answers)),
        "failed": 0.0,
    }
