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

The authors' published code reads turns and answers otherwise, offered as ``parser="authors"``
(docs/method.md, "Known divergences"): a turn runs to its end (no stop string), its *last*
``<tool_call>...</tool_call>`` is the call (a JSON list of queries, nested lists flattened, or a
``{"arguments": {"query_list": [...]}}`` object), a turn without a complete call ends the episode,
and the answer is the last ``<answer>...</answer>`` anywhere in the episode's text, read as JSON,
else as a Python literal, else as the raw string (:func:`authors_answer`).

Nothing here raises on model output: hostile text yields an ``invalid`` result or a tool-call
error with a reason. Every function is linear in the length of the text (plain ``str.find`` scans
and one non-backtracking tag scan), because a response holds up to thousands of tokens of
anything.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "AUTHORS_EMPTY_CALL",
    "PARSERS",
    "TURN_END_TAGS",
    "AnswerParse",
    "ToolCallParse",
    "Turn",
    "authors_answer",
    "authors_answers",
    "authors_tool_call",
    "authors_training_call",
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
#: How turns and answers are read: the project's protocol, or the authors' published code.
PARSERS = ("spader", "authors")
_CALL_BLOCKS = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER_BLOCKS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
#: The observation of a call without a usable query in the authors' code (their tool's message).
AUTHORS_EMPTY_CALL = json.dumps(
    {"result": "Error: 'query_list' is missing, empty, or not a list in parameters."}
)


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


def _answers_closed(text: str, last: int) -> bool:
    """Whether every ``<answer>`` before position ``last`` closes before the next one opens."""
    pos = 0
    while (start := text.find(_ANSWER_OPEN, pos, last)) >= 0:
        close = text.find(_ANSWER_CLOSE, start + len(_ANSWER_OPEN))
        following = text.find(_ANSWER_OPEN, start + len(_ANSWER_OPEN))
        if close < 0 or following < close:  # ``following`` exists: ``last`` opens after ``start``
            return False
        pos = close + len(_ANSWER_CLOSE)
    return True


def parse_answer(text: str) -> AnswerParse:
    """Parse the answer step of a trajectory (the last assistant turn, already ended by
    :func:`end_of_turn`).

    Uses the last ``<answer>`` block. Every ``<answer>`` must close before the next opens: one
    opened again before its ``</answer>`` is unclosed. Reasons for invalid: ``no_answer``,
    ``unclosed_answer``, ``unbalanced_think``, ``answer_not_json_list``.

    >>> parse_answer('<answer>["A"] <answer>["B"]</answer>').reason
    'unclosed_answer'
    """
    if not think_tags_balanced(text):
        return AnswerParse(False, reason="unbalanced_think")
    start = text.rfind(_ANSWER_OPEN)
    if start < 0:
        return AnswerParse(False, reason="no_answer")
    end = text.find(_ANSWER_CLOSE, start + len(_ANSWER_OPEN))
    if end < 0 or not _answers_closed(text, start):
        return AnswerParse(False, reason="unclosed_answer")
    answers = _json_string_list(text[start + len(_ANSWER_OPEN) : end])
    if answers is None:
        return AnswerParse(False, reason="answer_not_json_list")
    return AnswerParse(True, answers=answers)


@dataclass(frozen=True)
class ToolCallParse:
    """Queries of a search step. ``error`` is set (and ``queries`` empty) for a malformed call;
    ``observation``, when set, is the whole content of the observation turn that answers it (the
    authors' training shows some malformed calls otherwise than their evaluation:
    :func:`authors_training_call`)."""

    queries: list[str] = field(default_factory=list)
    error: str | None = None
    observation: str | None = None


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


def parse_turn(text: str, stop: tuple[str, ...] | list[str] = TURN_END_TAGS, parser: str = "spader") -> Turn:
    """Classify one assistant turn (see :class:`Turn`); text after its end is ignored.

    With ``parser="authors"`` the whole text is the turn (``stop`` is not read: the loops end a
    turn where generation ended it), its call is its last complete ``<tool_call>`` block
    (:func:`authors_tool_call`) and a turn without one is the answer step; its ``answer`` is read
    from this turn's text alone (the loops read the episode's answer with :func:`authors_answer`).

    >>> parse_turn('<tool_call>["q"]</tool_call><answer>["A"]</answer>').kind
    'search'
    >>> parse_turn('<tool_call>["a"]</tool_call> then <tool_call>["b"]</tool_call>', (), "authors").tool_call.queries
    ['b']
    """
    if parser == "authors":
        call = authors_tool_call(text)
        if call is not None:
            return Turn("search", tool_call=call, text=text)
        kind = "answer" if _ANSWER_OPEN in text else "none"
        return Turn(kind, answer=authors_answer(text), text=text)
    if parser != "spader":
        raise ValueError(f"parser must be one of {PARSERS}, got {parser!r}")
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


def final_answer(
    text: str, stop: tuple[str, ...] | list[str] = TURN_END_TAGS, parser: str = "spader"
) -> AnswerParse:
    """The answer of a trajectory from its last assistant turn, read as :func:`parse_turn` reads
    every turn: a turn that ends with a tool call (the turn or length budget ran out) has no answer.
    """
    turn = parse_turn(text, stop, parser)
    if turn.kind == "search":
        return AnswerParse(False, reason="no_answer")
    return turn.answer if turn.answer is not None else AnswerParse(False, reason="no_answer")


def malformed_turn(
    text: str, stop: tuple[str, ...] | list[str] = TURN_END_TAGS, parser: str = "spader"
) -> bool:
    """True for a turn R3-RAG's original samples again: neither a well-formed search call nor a
    valid answer.

    >>> malformed_turn('<tool_call>["films of Ilse Varga"]</tool_call>')
    False
    >>> malformed_turn("I am not sure.")
    True
    """
    turn = parse_turn(text, stop, parser)
    if turn.kind == "search":
        return turn.tool_call is None or turn.tool_call.error is not None
    if turn.kind == "answer":
        return turn.answer is None or not turn.answer.valid
    return True


# ---------------------------------------------------------------------------------------------
# The authors' published parsing (parser="authors")
# ---------------------------------------------------------------------------------------------
def _query_list(value) -> list[str]:
    """Their query-list normalisation: strings stripped, blanks dropped, nested lists flattened,
    anything else dropped."""
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    if not isinstance(value, list):
        return []
    out: list[str] = []
    stack = [iter(value)]
    while stack:  # iterative: a hostile nesting depth costs no recursion
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, str):
            if item.strip():
                out.append(item.strip())
        elif isinstance(item, list):
            stack.append(iter(item))
    return out


_END = object()


def _encodable(items: list[str]) -> list[str]:
    """Strings a UTF-8 writer accepts (a lone surrogate from a JSON escape is replaced)."""
    return [s.encode("utf-8", "replace").decode("utf-8") for s in items]


def authors_tool_call(text: str) -> ToolCallParse | None:
    """The authors' reading of a turn's call: the last ``<tool_call>...</tool_call>`` block; None
    when the turn has none.

    Its content is parsed as JSON: a list gives the queries (stripped, blanks dropped, nested lists
    flattened), an object its ``arguments.query_list``; anything else, or text that is not JSON,
    is a malformed call whose ``error`` is the message their loop sends back. A call without a
    usable query gets their tool's error (:data:`AUTHORS_EMPTY_CALL`).

    >>> authors_tool_call('<tool_call>["a", ["b", " "]]</tool_call>').queries
    ['a', 'b']
    >>> authors_tool_call("<tool_call>[oops</tool_call>").error[:35]
    'Your tool call could not be parsed.'
    """
    blocks = _CALL_BLOCKS.findall(text)
    if not blocks:
        return None
    try:
        value = json.loads(blocks[-1])
        if isinstance(value, list):
            queries = _query_list(value)
        elif isinstance(value, dict):
            arguments = value.get("arguments", {})
            if not isinstance(arguments, dict):  # their .get on it raises
                raise AttributeError(_no_get(arguments))
            queries = _query_list(arguments.get("query_list", []))
        else:
            raise ValueError(f"Unexpected tool call format: {type(value)}")
    except (ValueError, RecursionError, AttributeError) as exc:
        return ToolCallParse(error=_unparsed(exc))
    queries = _encodable(queries)
    if not queries:
        return ToolCallParse(error=AUTHORS_EMPTY_CALL)
    return ToolCallParse(queries=queries)


def _no_get(value) -> str:
    """Python's message for ``value.get`` on a value that has no ``get``."""
    return f"'{type(value).__name__}' object has no attribute 'get'"


def _unparsed(exc: BaseException) -> str:
    """Their message for a call that could not be parsed (their evaluation's and training's)."""
    return (
        f"Your tool call could not be parsed. Error: {exc}. Please output valid JSON inside "
        "<tool_call>...</tool_call> tags and try again."
    )


def _function_name_error(name) -> str:
    """The error their training's parser catches when a call's ``name`` is not a string: the
    validation error of verl's ``FunctionCall`` model (pydantic, as verl builds it)."""
    from pydantic import BaseModel, ValidationError

    class FunctionCall(BaseModel):
        arguments: str
        name: str

    try:
        FunctionCall(name=name, arguments="{}")
    except ValidationError as exc:
        return str(exc)
    return ""  # pragma: no cover  (only called for a name that is not a string)


def authors_training_call(text: str) -> ToolCallParse | None:
    """The authors' training reading of a turn's call (their verl fork's ``text`` tool parser, its
    agent loop and their search tool), which differs from their evaluation's
    (:func:`authors_tool_call`) in what a malformed call shows and in one case that ends the
    episode. None when the turn makes no call, which ends their training episode: no complete
    ``<tool_call>...</tool_call>`` block, or a last block holding a JSON scalar (a string, number,
    ``true`` or ``null``; their evaluation answers it with an error and goes on).

    A call comes with ``observation``, the whole content of the observation turn their training
    shows, when it is not a search: text that is not JSON gets their parse-error message as a
    ``tool`` message, which Qwen3's chat template renders as the user turn
    ``<tool_response>\\n...\\n</tool_response>``; a call without a usable query gets their search
    tool's JSON error without tags; an object naming another tool than ``search``, or with
    ``arguments`` that are not an object, gets their loop's ``Error when executing tool: ...``.

    >>> authors_training_call('<tool_call>"films of Ilse Varga"</tool_call>') is None
    True
    >>> print(authors_training_call("<tool_call> [oops</tool_call>").observation[:80])
    <tool_response>
    Your tool call could not be parsed. Error: Expecting value: line
    >>> print(authors_training_call('<tool_call>[" "]</tool_call>').observation)
    {"result": "Error: 'query_list' is missing, empty, or not a list in parameters."}
    """
    if _CALL_OPEN not in text or _CALL_CLOSE not in text:
        return None
    blocks = _CALL_BLOCKS.findall(text)
    if not blocks:
        return None
    try:
        value = json.loads(blocks[-1].strip())
        if isinstance(value, dict):
            name = value.get("name", "search")
            arguments = value.get("arguments", value)
            if not isinstance(name, str):
                raise _NameError(_function_name_error(name))
        elif isinstance(value, list):
            name, arguments = "search", {"query_list": _query_list(value)}
        else:
            return None  # their parser makes no call of a scalar: the episode ends
    except (ValueError, RecursionError, _NameError) as exc:
        message = _unparsed(exc)
        return ToolCallParse(error=message, observation=f"<tool_response>\n{message}\n</tool_response>")
    return _training_call(name, arguments)


class _NameError(Exception):
    """A call whose ``name`` verl's ``FunctionCall`` refuses (caught as their parser catches it)."""


def _training_call(name: str, arguments) -> ToolCallParse:
    """What their training's agent loop and search tool make of a parsed call."""
    if name != "search":  # their loop looks the tool up by name: a KeyError
        message = f"Error when executing tool: {name!r}"
        return ToolCallParse(error=message, observation=message)
    if not isinstance(arguments, dict):
        message = f"Error when executing tool: {_no_get(arguments)}"
        return ToolCallParse(error=message, observation=message)
    queries = arguments.get("query_list")
    if "query_list" in arguments:
        queries = _query_list(queries)
    if not queries or not isinstance(queries, list):
        return ToolCallParse(error=AUTHORS_EMPTY_CALL, observation=AUTHORS_EMPTY_CALL)
    queries = _encodable([q for q in queries if isinstance(q, str)])
    return ToolCallParse(queries=queries)


def authors_answers(text: str) -> list[str] | None:
    """The authors' ``get_answers``: the content of the last ``<answer>...</answer>`` block of
    ``text``, stripped; a ``[...]`` content parsed as JSON, else as a Python literal, and when
    that gives a list, its items as strings (blank ones dropped); otherwise the raw content as
    the one answer. None without a block or with an empty one.

    >>> authors_answers("<answer>['Paris', 3]</answer>"), authors_answers("<answer>Paris, Lyon</answer>")
    (['Paris', '3'], ['Paris, Lyon'])
    """
    blocks = _ANSWER_BLOCKS.findall(text)
    if not blocks:
        return None
    content = blocks[-1].strip()
    if not content:
        return None
    if content.startswith("[") and content.endswith("]"):
        for read in (json.loads, ast.literal_eval):
            try:
                value = read(content)
            except Exception:  # noqa: BLE001 (their fall-through: hostile text is just not a list)
                continue
            if isinstance(value, list):
                return _encodable([str(x) for x in value if str(x).strip()])
            break  # valid JSON that is not a list: their code keeps the raw content
    return _encodable([content])


_QUESTION_MARKER = re.compile(r"Question:", re.IGNORECASE)
_THINK_ANY_CASE = re.compile(r"</?think>", re.IGNORECASE)


def authors_answer(text: str, rule: Literal["evaluation", "training"] = "evaluation") -> AnswerParse:
    """The authors' final answer of an episode's text.

    ``evaluation`` (their evaluation script, on the assistant turns joined): invalid without a
    non-empty ``<answer>`` block (:func:`authors_answers`). ``training`` (their reward, on the
    decoded response): invalid when, after the first ``Question:``, ``<think>`` tags are nested,
    closed twice or left open, or no ``<answer>`` or no ``</answer>`` occurs; otherwise valid with
    the answers of :func:`authors_answers` (none when its block is empty).

    >>> authors_answer("<answer>[]</answer> <answer>A</answer>").answers
    ['A']
    >>> authors_answer("<think>x <answer>[]</answer>", "training").reason
    'unbalanced_think'
    """
    if rule == "training":
        marker = _QUESTION_MARKER.search(text)
        checked = text[marker.end() :] if marker else text
        depth = 0
        for m in _THINK_ANY_CASE.finditer(checked):
            depth += -1 if m.group(0).startswith("</") else 1
            if depth > 1 or depth < 0:
                return AnswerParse(False, reason="unbalanced_think")
        if depth:
            return AnswerParse(False, reason="unbalanced_think")
        lowered = checked.lower()
        if _ANSWER_OPEN not in lowered:
            return AnswerParse(False, reason="no_answer")
        if _ANSWER_CLOSE not in lowered:
            return AnswerParse(False, reason="unclosed_answer")
        return AnswerParse(True, answers=authors_answers(text) or [])
    answers = authors_answers(text)
    if answers is None:
        return AnswerParse(False, reason="no_answer")
    return AnswerParse(True, answers=answers)
