"""Parsing of the agent's text protocol, shared by the verl tool parser, the training reward
and evaluation (method.md, "Prompt and format").

An assistant turn is either a search step (``<tool_call>["q1", "q2"]</tool_call>``) or the answer
step (``<answer>["A", "B"]</answer>``). The final step is *invalid* (terminal reward -1) when it
has no ``<answer>...</answer>``, the ``<answer>`` is unclosed, ``<think>`` tags are unbalanced or
nested, or the answer content is not a JSON list of strings. ``[]`` is a valid (empty) answer.

Nothing here raises on model output: hostile text yields an ``invalid`` result with a reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "AnswerParse",
    "ToolCallParse",
    "Turn",
    "parse_answer",
    "parse_tool_call",
    "parse_turn",
    "think_tags_balanced",
]

_THINK_TAG = re.compile(r"</?think>")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER_OPEN = "<answer>"
_ANSWER_CLOSE = "</answer>"


def think_tags_balanced(text: str) -> bool:
    """True when every ``<think>`` is closed, none is nested and none is closed twice."""
    depth = 0
    for m in _THINK_TAG.finditer(text):
        if m.group(0) == "<think>":
            depth += 1
            if depth > 1:
                return False
        else:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _json_string_list(content: str) -> list[str] | None:
    try:
        value = json.loads(content.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


@dataclass(frozen=True)
class AnswerParse:
    """Result of parsing a final turn. ``answers`` is empty unless ``valid``."""

    valid: bool
    answers: list[str] = field(default_factory=list)
    reason: str = ""


def parse_answer(text: str) -> AnswerParse:
    """Parse the answer step of a trajectory (the last assistant turn).

    Uses the last ``<answer>`` block. Reasons for invalid: ``no_answer``, ``unclosed_answer``,
    ``unbalanced_think``, ``answer_not_json_list``.
    """
    if not think_tags_balanced(text):
        return AnswerParse(False, reason="unbalanced_think")
    start = text.rfind(_ANSWER_OPEN)
    if start < 0:
        return AnswerParse(False, reason="no_answer")
    end = text.find(_ANSWER_CLOSE, start + len(_ANSWER_OPEN))
    if end < 0:
        return AnswerParse(False, reason="unclosed_answer")
    answers = _json_string_list(text[start + len(_ANSWER_OPEN) : end])
    if answers is None:
        return AnswerParse(False, reason="answer_not_json_list")
    return AnswerParse(True, answers=answers)


@dataclass(frozen=True)
class ToolCallParse:
    """Queries of a search step. ``error`` is set (and ``queries`` empty) for a malformed call."""

    queries: list[str] = field(default_factory=list)
    error: str | None = None


def parse_tool_call(text: str) -> ToolCallParse | None:
    """Parse the last ``<tool_call>...</tool_call>`` of a turn; ``None`` if the turn has none.

    The content must be a JSON list of non-empty strings; otherwise ``error`` says why, so the
    caller can return the error to the model as the observation (the step issues 0 queries).
    """
    matches = _TOOL_CALL.findall(text)
    if not matches:
        return None
    queries = _json_string_list(matches[-1])
    if queries is None:
        return ToolCallParse(error="the tool call must be a JSON list of query strings")
    queries = [q.strip() for q in queries if q.strip()]
    if not queries:
        return ToolCallParse(error="the tool call contains no non-empty query")
    return ToolCallParse(queries=queries)


@dataclass(frozen=True)
class Turn:
    """Classification of one assistant turn.

    ``kind`` is ``answer`` when the turn contains ``<answer>`` (it ends the episode, valid or not),
    ``search`` when it contains a complete ``<tool_call>``, else ``none`` (the episode ends with an
    invalid format when such a turn is the last one).
    """

    kind: Literal["search", "answer", "none"]
    tool_call: ToolCallParse | None = None
    answer: AnswerParse | None = None


def parse_turn(text: str) -> Turn:
    """Classify one assistant turn (see :class:`Turn`)."""
    if _ANSWER_OPEN in text:
        return Turn("answer", answer=parse_answer(text))
    call = parse_tool_call(text)
    if call is not None:
        return Turn("search", tool_call=call)
    return Turn("none", answer=parse_answer(text))
