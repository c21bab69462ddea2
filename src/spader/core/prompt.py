"""The prompt template of the project and the observation format (docs/method.md, "Prompt and format").

The template is a text file, :data:`DEFAULT_TEMPLATE_PATH` (``spader/core/prompts/default.txt``),
which ``agent.prompt_template`` in the workflow config can replace (for example to evaluate a
released checkpoint with its authors' own wording). Trained checkpoints depend on its wording:
data export (the training parquet's prompts, which the verl agent loop starts from) and evaluation
both fill it through :class:`PromptTemplate`, and its :attr:`PromptTemplate.version` (a hash of
the text) is the param of the rules that read it, so editing the file reruns data export,
training and evaluation.

A template is plain text with exactly one ``{question}`` placeholder; nothing else in it is
special (braces in a JSON example stay as written). Trailing newlines of the file are dropped so
that the message ends with the question.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_TEMPLATE_NAME",
    "DEFAULT_TEMPLATE_PATH",
    "PLACEHOLDER",
    "PROMPT_TEMPLATE",
    "PROMPT_VERSION",
    "PromptTemplate",
    "build_messages",
    "build_user_prompt",
    "checked_template",
    "fit_observation",
    "format_observation",
    "format_passages",
    "load_template",
    "observation_message",
]

DEFAULT_TEMPLATE_PATH = Path(__file__).resolve().with_name("prompts") / "default.txt"
#: How summaries name the default template: its place in the package.
DEFAULT_TEMPLATE_NAME = "spader/core/prompts/default.txt"
PLACEHOLDER = "{question}"


@dataclass(frozen=True)
class PromptTemplate:
    """A user-prompt template: ``text`` with one :data:`PLACEHOLDER`, read from ``source``."""

    text: str
    source: str = "<string>"

    def __post_init__(self):
        count = self.text.count(PLACEHOLDER)
        if count != 1:
            raise ValueError(
                f"prompt template {self.source}: needs exactly one {PLACEHOLDER} placeholder, found {count}"
            )

    @property
    def version(self) -> str:
        """12 hex digits of the sha256 of the text: the rerun param of the rules that use it."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:12]

    def user_prompt(self, question: str) -> str:
        """The template filled with one question."""
        return self.text.replace(PLACEHOLDER, question)

    def messages(self, question: str) -> list[dict[str, str]]:
        """Chat messages for one episode's start: a single user turn, no system prompt."""
        return [{"role": "user", "content": self.user_prompt(question)}]


def load_template(path: str | os.PathLike | None = None) -> PromptTemplate:
    """Read a template file (the project's default when ``path`` is None).

    Raises:
        ValueError: the file is not UTF-8 text or lacks a single ``{question}`` (message names it).
        FileNotFoundError: no such file.
    """
    # the package's own template is named by its place in the package, not by where this machine
    # installed it (the name reaches the evaluation summaries, which stay relocatable)
    source = str(path) if path is not None else DEFAULT_TEMPLATE_NAME
    path = Path(path) if path is not None else DEFAULT_TEMPLATE_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"prompt template {source}: not UTF-8 text ({exc})") from exc
    return PromptTemplate(text.rstrip("\n"), source=source)


def checked_template(prompt: Mapping[str, Any] | None) -> PromptTemplate:
    """The prompt template a job was planned with: ``prompt["path"]`` (None: the project's
    default), verified against ``prompt["version"]`` when given.

    Raises:
        ValueError: the file changed since the workflow computed the version (names the file).
    """
    prompt = prompt or {}
    template = load_template(prompt.get("path"))
    expected = prompt.get("version")
    if expected is not None and expected != template.version:
        raise ValueError(
            f"prompt template {template.source} has version {template.version}, but the job was planned "
            f"with {expected}: it changed while the workflow ran; run snakemake again"
        )
    return template


_DEFAULT = load_template()
#: The default template's text and version.
PROMPT_TEMPLATE = _DEFAULT.text
PROMPT_VERSION = _DEFAULT.version


def build_user_prompt(question: str, template: PromptTemplate | None = None) -> str:
    """Fill ``template`` (default: the project's) with one question."""
    return (template or _DEFAULT).user_prompt(question)


def build_messages(question: str, template: PromptTemplate | None = None) -> list[dict[str, str]]:
    """Chat messages for one episode's start: a single user turn, no system prompt."""
    return (template or _DEFAULT).messages(question)


def format_passages(passages: Sequence[dict]) -> str:
    """Render one query's passages (dicts with ``title`` and ``text``) as numbered documents."""
    lines = []
    for rank, p in enumerate(passages, start=1):
        lines.append(f"Doc {rank} (Title: {p.get('title', '')}) {p.get('text', '')}".rstrip())
    return "\n".join(lines)


def format_observation(results: Sequence[tuple[str, Sequence[dict]]], error: str | None = None) -> str:
    """Observation text returned to the model for one search step.

    ``results`` holds ``(query, passages)`` pairs in the order the queries were issued. The text
    is the body of the observation turn (:func:`observation_message`); it is the same in training
    (verl tool) and evaluation (agent loop).
    """
    if error is not None:
        return f"Error: {error}"
    blocks = []
    for query, passages in results:
        body = format_passages(passages) if passages else "(no results)"
        blocks.append(f"Results for {json.dumps(query, ensure_ascii=False)}:\n{body}")
    return "\n\n".join(blocks)


def observation_message(text: str) -> dict[str, str]:
    """The chat message that shows one observation to the model: a user turn whose content is
    ``<tool_response>\\n{text}\\n</tool_response>``, for every backbone (as the authors send it;
    never a ``tool`` message, whose rendering differs between chat templates).

    >>> observation_message("Results")["content"]
    '<tool_response>\\nResults\\n</tool_response>'
    """
    return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}


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
