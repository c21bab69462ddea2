"""The one prompt template of the project (method.md, "Prompt and format").

Trained checkpoints depend on this wording: data export (training parquet), the verl agent loop
and evaluation all call :func:`build_user_prompt`. Changing the text changes ``PROMPT_VERSION``,
which the data-export rules take as a param so that everything downstream reruns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

__all__ = [
    "PROMPT_TEMPLATE",
    "PROMPT_VERSION",
    "build_messages",
    "build_user_prompt",
    "fit_observation",
    "format_observation",
    "format_passages",
]

PROMPT_TEMPLATE = (
    "Answer the question below by listing every entity that satisfies it. Many questions have "
    "a long list of valid answers, so keep searching until you believe you have found all of them.\n"
    "\n"
    "Each time you act, first think step by step inside <think> and </think>. Then do exactly one "
    "of the following:\n"
    '- Search: write <tool_call>["first query", "second query"]</tool_call>, a JSON list of one '
    "or more search queries. For every query the search engine returns its top 5 Wikipedia passages "
    "(about 100 words each) inside <tool_response> and </tool_response>. You may search as many "
    "times as you need.\n"
    '- Answer: write <answer>["Entity A", "Entity B"]</answer>, a JSON list with the name of '
    "every answer entity you found. This ends the episode, so answer only once and only at the end.\n"
    "\n"
    "Question: {question}"
)

PROMPT_VERSION = hashlib.sha256(PROMPT_TEMPLATE.encode("utf-8")).hexdigest()[:12]


def build_user_prompt(question: str) -> str:
    """Fill the template with one question."""
    return PROMPT_TEMPLATE.format(question=question)


def build_messages(question: str) -> list[dict[str, str]]:
    """Chat messages for one episode's start: a single user turn, no system prompt."""
    return [{"role": "user", "content": build_user_prompt(question)}]


def format_passages(passages: Sequence[dict]) -> str:
    """Render one query's passages (dicts with ``title`` and ``text``) as numbered documents."""
    lines = []
    for rank, p in enumerate(passages, start=1):
        lines.append(f"Doc {rank} (Title: {p.get('title', '')}) {p.get('text', '')}".rstrip())
    return "\n".join(lines)


def format_observation(results: Sequence[tuple[str, Sequence[dict]]], error: str | None = None) -> str:
    """Observation text returned to the model for one search step.

    ``results`` holds ``(query, passages)`` pairs in the order the queries were issued. The text
    is what the chat template wraps as the tool message (``<tool_response>`` for Qwen3); it is the
    same in training (verl tool) and evaluation (agent loop).
    """
    if error is not None:
        return f"Error: {error}"
    blocks = []
    for query, passages in results:
        body = format_passages(passages) if passages else "(no results)"
        blocks.append(f"Results for {json.dumps(query, ensure_ascii=False)}:\n{body}")
    return "\n\n".join(blocks)


def fit_observation(
    queries: Sequence[str], passages: Sequence[Sequence[dict]], max_chars: int
) -> tuple[str, list[list[dict]]]:
    """Observation text of one search step within ``max_chars``, and the passages it shows.

    Used by the training search tool and by evaluation, so the model sees the same text and the
    discovery reward counts the same passages in both. Passages are dropped lowest rank first,
    from the query showing the most (the later one on ties), until the text fits; if even the
    bare query headers do not fit, the text is cut and shows no passage.

    Args:
        queries: the step's queries, in order.
        passages: ``passages[q]`` ranked passages (dicts with ``title``, ``text``) of query q.
        max_chars: character budget of the observation.
    Returns:
        ``(text, shown)`` with ``shown[q]`` the passages of query q present in ``text``.
    """
    keep = [len(p) for p in passages]
    while True:
        shown = [list(p[:k]) for p, k in zip(passages, keep, strict=True)]
        text = format_observation(list(zip(queries, shown, strict=True)))
        if len(text) <= max_chars or not any(keep):
            break
        most = max(keep)
        keep[max(i for i, k in enumerate(keep) if k == most)] -= 1
    if len(text) > max_chars:
        return text[:max_chars], [[] for _ in queries]
    return text, shown
