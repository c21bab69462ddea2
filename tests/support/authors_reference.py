"""The authors' published functions (KhanCold/spader), reimplemented from their code for the tests
that hold the options of config/authors.yaml to them on random inputs. Each function names the file
and function it follows; it keeps their behaviour, edge cases included, and nothing of the
project's code is used here.

* their normaliser, ``run_test/utils/metrics.py`` ``normalize_answer``;
* their training reward: ``verl/utils/reward_score/qa_em_qampari.py`` ``compute_score_qampari``
  (the answer's F1) and ``verl/workers/reward_manager/spader_step.py`` with
  ``verl/utils/reward_score/qampari_spader_step.py`` (step discovery, N(e), the step rewards);
* their training's reading of a call: ``verl/experimental/agent_loop/tool_parser.py``
  (``TextToolParser``), ``tool_agent_loop.py`` (the parse-error message, ``_call_tool``) and
  ``verl/tools/search_tool.py`` (``execute``), with Qwen3's chat template rendering a ``tool``
  message;
* their evaluation's reading of a call and its loop: ``run_test/inference.py``
  (``parse_tool_call``, ``run_single_sample``) against a vLLM server that refuses a request whose
  prompt plus ``max_tokens`` exceed the model's length.
"""

from __future__ import annotations

import ast
import json
import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_EXCLUDE = set(string.punctuation + "\u2014" + "\u2013" + "\u2010")
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
EMPTY_CALL = json.dumps({"result": "Error: 'query_list' is missing, empty, or not a list in parameters."})


def normalize_answer(text) -> str:
    """``normalize_answer``."""
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text)
    text = text.lower()
    text = text.replace("''", '"').replace("``", '"')
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201d", '"').replace("\u201c", '"')
    text = "".join(ch for ch in text if ch not in _EXCLUDE)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def parse_target_list(target) -> list[str]:
    """``_parse_target_list``: a list's items as ``str`` (an alias list becomes its ``str``)."""
    if target is None:
        return []
    if isinstance(target, list | tuple):
        return [str(x) for x in target]
    if isinstance(target, str):
        stripped = target.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            try:
                parsed = json.loads(stripped)
                if isinstance(parsed, list):
                    return [str(x) for x in parsed]
            except json.JSONDecodeError:
                try:
                    parsed = ast.literal_eval(stripped)
                    if isinstance(parsed, list):
                        return [str(x) for x in parsed]
                except Exception:  # noqa: BLE001 (theirs)
                    pass
        return [target]
    return [str(target)]


def gt_list(target) -> list[str]:
    """``_safe_get_gt_list`` of their reward manager: the non-blank entries."""
    return [t for t in (str(x) for x in parse_target_list(target)) if t.strip()]


def get_answers(text: str) -> list[str] | None:
    """``get_answers``: the last ``<answer>`` block, as JSON, a Python literal or the raw string."""
    matches = _ANSWER.findall(text)
    if not matches:
        return None
    content = matches[-1].strip()
    if not content:
        return None
    if content.startswith("[") and content.endswith("]"):
        try:
            parsed = json.loads(content)
            if isinstance(parsed, list):
                return [str(x) for x in parsed if str(x).strip()]
        except json.JSONDecodeError:
            try:
                parsed = ast.literal_eval(content)
                if isinstance(parsed, list):
                    return [str(x) for x in parsed if str(x).strip()]
            except Exception:  # noqa: BLE001 (theirs)
                pass
    return [content]


def format_error(text: str) -> str | None:
    """``check_format_error`` of their reward."""
    marker = re.search(r"Question:", text, re.IGNORECASE)
    check = text[marker.end() :] if marker else text
    depth = 0
    for m in re.finditer(r"</?think>", check, re.IGNORECASE):
        if m.group().lower() == "<think>":
            depth += 1
            if depth > 1:
                return "nested_think"
        else:
            depth -= 1
            if depth < 0:
                return "extra_close_think"
    if depth > 0:
        return "unclosed_think"
    if not re.search(r"<answer>", check, re.IGNORECASE):
        return "no_answer_tag"
    if not re.search(r"</answer>", check, re.IGNORECASE):
        return "truncated_answer"
    return None


def training_f1(solution: str, target) -> float:
    """The ``f1_score`` of their reward's ``compute_score_qampari`` (0 for a format error)."""
    gold = {normalize_answer(t) for t in parse_target_list(target)} - {""}
    if format_error(solution) is not None:
        return 0.0
    predicted = get_answers(solution)
    preds = {normalize_answer(p) for p in predicted or []} - {""}
    matched = len(preds & gold)
    if not preds or not gold:
        return 0.0
    precision, recall = matched / len(preds), matched / len(gold)
    return 2 * (precision * recall) / (precision + recall) if (precision + recall) > 0 else 0.0


def _found(text: str, entities: Sequence[str]) -> set[str]:
    """``extract_gt_entities_from_text``."""
    if not text:
        return set()
    haystack = normalize_answer(text)
    if not haystack:
        return set()
    return {e for e in entities if normalize_answer(e) and normalize_answer(e) in haystack}


def group_step_rewards(
    tool_texts: Sequence[Sequence[str]],
    target,
    *,
    alpha: float,
    beta: float,
    lambda_val: float = 1.0,
    cost: float = 0.0,
    call_counts: Sequence[Sequence[int]] | None = None,
) -> list[list[float]]:
    """Their reward manager's step rewards of one group (``tool_texts[i][t]``: the observation of
    trajectory i's step t): discovery by substring of their normaliser, N(e) over the group by
    entry text, ``(sum of alpha + beta * exp(-lambda (N - 1)) - cost * count) / len(gt_list)``."""
    entities = gt_list(target)
    discoveries = []
    for texts in tool_texts:
        cumulative: set[str] = set()
        new_by_step = []
        for text in texts:
            found = _found(text, entities)
            new_by_step.append(found - cumulative)
            cumulative |= found
        discoveries.append((new_by_step, cumulative))
    freq: Counter = Counter()
    for _, union in discoveries:
        for e in union:
            freq[e] += 1
    size = len(entities)
    out = []
    for i, (new_by_step, _) in enumerate(discoveries):
        if size <= 0:
            out.append([0.0] * len(new_by_step))
            continue
        rewards = [
            sum(alpha + beta * math.exp(-lambda_val * (float(freq.get(e, 1)) - 1)) for e in new) / float(size)
            for new in new_by_step
        ]
        if cost != 0.0 and rewards and call_counts is not None:
            rewards = [r - (cost * c) / size for r, c in zip(rewards, call_counts[i], strict=False)]
        out.append(rewards)
    return out


def _normalize_query_list(value) -> list[str]:
    """``_normalize_query_list`` (their parser's and their evaluation's)."""
    if isinstance(value, str):
        q = value.strip()
        return [q] if q else []
    if not isinstance(value, list):
        return []
    out: list[str] = []
    for item in value:
        if isinstance(item, str):
            if item.strip():
                out.append(item.strip())
        elif isinstance(item, list):
            out.extend(_normalize_query_list(item))
    return out


def _function_call(name, arguments):
    """verl's ``FunctionCall`` (a pydantic model with two string fields)."""
    from pydantic import BaseModel

    class FunctionCall(BaseModel):
        arguments: str
        name: str

    return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _parse_error(error) -> str:
    return (
        f"Your tool call could not be parsed. Error: {error}. "
        f"Please output valid JSON inside <tool_call>...</tool_call> tags and try again."
    )


def training_turn(text: str) -> tuple[str, object]:
    """What their training does with one assistant turn's text: ``("end", None)`` (no call: the
    episode ends), ``("search", queries)``, or ``("observation", content)`` (the content of the
    observation turn their loop appends: the parse-error ``tool`` message as Qwen3's template
    renders it, or the tool's response text)."""
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return "end", None
    matches = _CALL.findall(text)
    if not matches:
        return "end", None
    last = matches[-1].strip()
    try:
        parsed = json.loads(last)
        if isinstance(parsed, list):
            call = _function_call("search", {"query_list": _normalize_query_list(parsed)})
        elif isinstance(parsed, dict):
            name = parsed.get("name", "search")
            arguments = parsed.get("arguments", parsed)
            if isinstance(arguments, dict) and "query_list" in arguments:
                arguments = dict(arguments)
                arguments["query_list"] = _normalize_query_list(arguments.get("query_list"))
            call = _function_call(name, arguments)
        else:
            return "end", None
    except Exception as e:  # noqa: BLE001 (theirs: a sentinel call fed back as a tool message)
        return "observation", f"<tool_response>\n{_parse_error(e)}\n</tool_response>"
    try:  # _call_tool: the tool by name, then SearchTool.execute
        if call.name != "search":
            raise KeyError(call.name)
        parameters = json.loads(call.arguments)
        query_list = parameters.get("query_list")
    except Exception as e:  # noqa: BLE001 (theirs)
        return "observation", f"Error when executing tool: {e}"
    if not query_list or not isinstance(query_list, list):
        return "observation", EMPTY_CALL
    return "search", query_list


def evaluation_turn(content: str) -> tuple[str, object]:
    """What their evaluation loop does with one assistant turn: ``("end", None)`` (no call: the
    loop stops), ``("search", queries)`` or ``("observation", content)`` (their user turn)."""
    try:
        matches = _CALL.findall(content)
        if not matches:
            return "end", None
        value = json.loads(matches[-1])
        if isinstance(value, list):
            queries = _normalize_query_list(value)
        elif isinstance(value, dict):
            queries = _normalize_query_list(value.get("arguments", {}).get("query_list", []))
        else:
            raise ValueError(f"Unexpected tool call format: {type(value)}")
    except Exception as e:  # noqa: BLE001 (theirs)
        return "observation", f"<tool_response>{_parse_error(e)}</tool_response>"
    if not queries:
        return "observation", f"<tool_response>{EMPTY_CALL}</tool_response>"
    return "search", queries


def evaluation_episode(
    messages: list[dict],
    generate: Callable[[list[dict]], str],
    observe: Callable[[list[str]], str],
    prompt_tokens: Callable[[list[dict]], int],
    *,
    max_model_len: int,
    max_tokens: int = 5096,
    max_turns: int = 16,
) -> list[dict]:
    """``run_single_sample``'s loop against a vLLM server: a request whose rendered prompt plus
    ``max_tokens`` exceed ``max_model_len`` fails (after their three retries) and the loop stops;
    the episode is scored on the messages so far."""
    for _ in range(max_turns):
        if prompt_tokens(messages) + max_tokens > max_model_len:
            break  # vLLM refuses the request: retry_generate raises, the loop breaks
        content = generate(messages)
        messages.append({"role": "assistant", "content": content})
        kind, value = evaluation_turn(content)
        if kind == "end":
            break
        messages.append({"role": "user", "content": value if kind == "observation" else observe(value)})
    return messages
