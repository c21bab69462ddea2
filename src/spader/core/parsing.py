"""Parsing of the agent's text protocol, shared by the verl tool parser, the training reward
and evaluation (docs/method.md, "Prompt and format").

An assistant turn is either a search step (``<tool_call>["q1", "q2"]</tool_call>``) or the answer
step (``<answer>["A", "B"]</answer>``). A turn ends at the first closing action tag
(:data:`TURN_END_TAGS`): generation stops there in rollouts and in evaluation alike, and the
parser reads a turn only up to that point (:func:`end_of_turn`), so that text a server produced
after it can never turn a search step into an answer step (or back). The final step is
*invalid* (terminal reward -1) when it has no ``<answer>...</answer>``, the ``<answer>`` is
unclosed, ``<think>`` tags are unbalanced or nested, or the answer content is not a JSON list of
strings. ``[]`` is a valid (empty) answer.

Nothing here raises on model output: hostile text yields an ``invalid`` result or a tool-call
error with a reason. Every function is linear in the length of the text (plain ``str.find`` scans
and one non-backtracking tag scan), because a response holds up to thousands of tokens of
anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "TURN_END_TAGS",
    "AnswerParse",
    "ToolCallParse",
    "Turn",
    "end_of_turn",
    "final_answer",
    "malformed_turn",
    "parse_answer",
    "parse_tool_call",
    "parse_turn",
    "think_tags_balanced",
]

_THINK_TAG = re.compile(r"</?think>")
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"

#: The closing action tags: an assistant turn ends right after the first one it contains.
TURN_END_TAGS = (_CALL_CLOSE, _ANSWER_CLOSE)


def end_of_turn(text: str, stop: tuple[str, ...] | list[str] = TURN_END_TAGS) -> int | None:
    """Index just after the first stop tag in ``text`` (the turn ends there), or None.

    Args:
        text: generated text of one assistant turn.
        stop: the stop tags (``agent.stop``; the protocol's closing tags by default).
    Returns:
        The end offset of the earliest occurrence of any tag, None when none occurs.

    >>> t = '<tool_call>["q"]</tool_call> and then <answer>["A"]</answer>'
    >>> t[: end_of_turn(t)]
    '<tool_call>["q"]</tool_call>'
    """
    best = None
    for tag in stop:
        i = text.find(tag)
        if i >= 0 and (best is None or i + len(tag) < best):
            best = i + len(tag)
    return best


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
    """The content as a list of strings, or None when it is not a JSON list of real text.

    Rejected besides non-lists: over-deep nesting (RecursionError), integers beyond Python's
    digit limit (ValueError), and strings holding a lone surrogate such as the JSON escape
    ``"\\ud800"``, which no UTF-8 encoder (HTTP client, JSON writer) accepts downstream.
    """
    try:
        value = json.loads(content.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    try:
        for v in value:
            v.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


@dataclass(frozen=True)
class AnswerParse:
    """Result of parsing a final turn. ``answers`` is empty unless ``valid``."""

    valid: bool
    answers: list[str] = field(default_factory=list)
    reason: str = ""


def parse_answer(text: str) -> AnswerParse:
    """Parse the answer step of a trajectory (the last assistant turn, already ended by
    :func:`end_of_turn`).

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
    """Parse the first complete ``<tool_call>...</tool_call>`` of a turn; ``None`` if it has none.

    The call is the text between the first ``</tool_call>`` and the last ``<tool_call>`` before
    it. Its content must be a JSON list of strings; blank queries are dropped and the others
    stripped. Otherwise ``error`` says why, so the caller returns the error to the model as the
    observation (the step issues 0 queries).
    """
    close = text.find(_CALL_CLOSE)
    if close < 0:
        return None
    start = text.rfind(_CALL_OPEN, 0, close)
    if start < 0:
        return None
    queries = _json_string_list(text[start + len(_CALL_OPEN) : close])
    if queries is None:
        return ToolCallParse(error="the tool call must be a JSON list of query strings")
    queries = [q.strip() for q in queries if q.strip()]
    if not queries:
        return ToolCallParse(error="the tool call contains no non-empty query")
    return ToolCallParse(queries=queries)


@dataclass(frozen=True)
class Turn:
    """Classification of one assistant turn.

    ``kind`` is ``search`` when the turn ends with a complete ``<tool_call>...</tool_call>`` (its
    first closing action tag), ``answer`` when it holds an ``<answer>`` otherwise (it ends the
    episode, valid or not), else ``none`` (the episode ends with an invalid format when such a
    turn is the last one). ``text`` is the turn as read: cut after its first closing tag.
    """

    kind: Literal["search", "answer", "none"]
    tool_call: ToolCallParse | None = None
    answer: AnswerParse | None = None
    text: str = ""


def parse_turn(text: str, stop: tuple[str, ...] | list[str] = TURN_END_TAGS) -> Turn:
    """Classify one assistant turn (see :class:`Turn`); text after its end is ignored.

    >>> parse_turn('<tool_call>["q"]</tool_call><answer>["A"]</answer>').kind
    'search'
    """
    end = end_of_turn(text, stop)
    if end is not None:
        text = text[:end]
    if text.endswith(_CALL_CLOSE):
        call = parse_tool_call(text)
        if call is not None:
            return Turn("search", tool_call=call, text=text)
    if _ANSWER_OPEN in text:
        return Turn("answer", answer=parse_answer(text), text=text)
    return Turn("none", answer=parse_answer(text), text=text)


def final_answer(text: str, stop: tuple[str, ...] | list[str] = TURN_END_TAGS) -> AnswerParse:
    """The answer of a trajectory from its last assistant turn, read as :func:`parse_turn` reads
    every turn: a turn that ends with a tool call (the turn or length budget ran out) has no answer.
    """
    turn = parse_turn(text, stop)
    if turn.kind == "search":
        return AnswerParse(False, reason="no_answer")
    return turn.answer if turn.answer is not None else AnswerParse(False, reason="no_answer")


def malformed_turn(text: str, stop: tuple[str, ...] | list[str] = TURN_END_TAGS) -> bool:
    """True for a turn R3-RAG's original samples again: neither a well-formed search call nor a
    valid answer.

    >>> malformed_turn('<tool_call>["films of Ilse Varga"]</tool_call>')
    False
    >>> malformed_turn("I am not sure.")
    True
    """
    turn = parse_turn(text, stop)
    if turn.kind == "search":
        return turn.tool_call is None or turn.tool_call.error is not None
    if turn.kind == "answer":
        return turn.answer is None or not turn.answer.valid
    return True
