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
that the message ends with the question. Packaged templates are named by their file's stem:
``default`` and ``authors`` (the user-content prefix of the authors' published code, verbatim).

How the filled template reaches the model (``agent.prompt_role``, :data:`PROMPT_ROLES`): as the
paper's "structured system prompt" (``system``: the instructions, everything before the line that
holds ``{question}``, are a system message, and that line with what follows is the user turn), or
as one user message (``user``, as the authors' code sends it).

Observations come in two formats (``agent.observation_format``): the project's numbered passages
(:func:`fit_observation`), and the authors' (:func:`fit_authors_observation`): their search
server's JSON of the results, capped by the server at :data:`AUTHORS_SERVER_CHARS` characters
with a ``System Note``, then cut by their verl fork to its first ``max_chars`` characters.
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
    "AUTHORS_SERVER_CHARS",
    "DEFAULT_TEMPLATE_NAME",
    "DEFAULT_TEMPLATE_PATH",
    "OBSERVATION_FORMATS",
    "PLACEHOLDER",
    "PROMPT_ROLES",
    "PROMPT_TEMPLATE",
    "PROMPT_VERSION",
    "PromptTemplate",
    "build_messages",
    "build_user_prompt",
    "checked_template",
    "error_observation",
    "fit_authors_observation",
    "fit_observation",
    "format_observation",
    "format_passages",
    "load_template",
    "observation_message",
    "packaged_templates",
]

DEFAULT_TEMPLATE_PATH = Path(__file__).resolve().with_name("prompts") / "default.txt"
#: How summaries name the default template: its place in the package.
DEFAULT_TEMPLATE_NAME = "spader/core/prompts/default.txt"
PLACEHOLDER = "{question}"
#: How the prompt is sent (``agent.prompt_role``): ``system`` (the paper: the instructions as a
#: system message, the question as the user turn) or ``user`` (one user message, the authors' code).
PROMPT_ROLES = ("system", "user")


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt template: ``text`` with one :data:`PLACEHOLDER`, read from ``source``, sent as
    ``role`` says (:data:`PROMPT_ROLES`; the default is ``agent.prompt_role``'s)."""

    text: str
    source: str = "<string>"
    role: str = "system"

    def __post_init__(self):
        count = self.text.count(PLACEHOLDER)
        if count != 1:
            raise ValueError(
                f"prompt template {self.source}: needs exactly one {PLACEHOLDER} placeholder, found {count}"
            )
        if self.role not in PROMPT_ROLES:
            raise ValueError(f"prompt role must be one of {PROMPT_ROLES}, got {self.role!r}")

    @property
    def version(self) -> str:
        """12 hex digits of the sha256 of the text: the rerun param of the rules that use it."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:12]

    def user_prompt(self, question: str) -> str:
        """The template filled with one question."""
        return self.text.replace(PLACEHOLDER, question)

    def messages(self, question: str) -> list[dict[str, str]]:
        """Chat messages for one episode's start: with role ``system``, the instructions (the text
        before the line holding the placeholder) as a system message and that line onwards as the
        user turn; with ``user`` (or a template with nothing before that line), one user turn.

        >>> t = PromptTemplate("Answer.\n\nQuestion: {question}")
        >>> t.messages("Q?")
        [{'role': 'system', 'content': 'Answer.'}, {'role': 'user', 'content': 'Question: Q?'}]
        >>> PromptTemplate(t.text, role="user").messages("Q?")
        [{'role': 'user', 'content': 'Answer.\n\nQuestion: Q?'}]
        """
        if self.role == "system":
            line = self.text.rfind("\n", 0, self.text.index(PLACEHOLDER)) + 1
            instructions = self.text[:line].rstrip()
            if instructions:
                return [
                    {"role": "system", "content": instructions},
                    {"role": "user", "content": self.text[line:].replace(PLACEHOLDER, question)},
                ]
        return [{"role": "user", "content": self.user_prompt(question)}]


def packaged_templates() -> dict[str, Path]:
    """The packaged templates by name (their file's stem): ``default``, ``authors``."""
    return {f.stem: f for f in sorted(DEFAULT_TEMPLATE_PATH.parent.glob("*.txt"))}


def load_template(path: str | os.PathLike | None = None, role: str | None = None) -> PromptTemplate:
    """Read a template: a packaged one by name (``authors``), a file, or the project's default
    when ``path`` is None; sent as ``role`` says (None: the default, ``agent.prompt_role``'s).

    Raises:
        ValueError: the file is not UTF-8 text or lacks a single ``{question}`` (message names it).
        FileNotFoundError: no such file.
    """
    # the package's own templates are named by their place in the package, not by where this
    # machine installed it (the name reaches the evaluation summaries, which stay relocatable)
    packaged = packaged_templates()
    if path is None or str(path) in packaged:
        name = "default" if path is None else str(path)
        source = DEFAULT_TEMPLATE_NAME.replace("default.txt", f"{name}.txt")
        path = packaged[name]
    else:
        source, path = str(path), Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"prompt template {source}: not UTF-8 text ({exc})") from exc
    if role is None:
        return PromptTemplate(text.rstrip("\n"), source=source)
    return PromptTemplate(text.rstrip("\n"), source=source, role=role)


def checked_template(prompt: Mapping[str, Any] | None) -> PromptTemplate:
    """The prompt template a job was planned with: ``prompt["path"]`` (None: the project's
    default) sent as ``prompt["role"]`` (``agent.prompt_role``), verified against
    ``prompt["version"]`` when given.

    Raises:
        ValueError: the file changed since the workflow computed the version (names the file).
    """
    prompt = prompt or {}
    template = load_template(prompt.get("path"), prompt.get("role"))
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
    """Chat messages for one episode's start (:meth:`PromptTemplate.messages`)."""
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


#: Observation formats (``agent.observation_format``).
OBSERVATION_FORMATS = ("spader", "authors")


def observation_message(text: str, fmt: str = "spader") -> dict[str, str]:
    """The chat message that shows one observation to the model: a user turn, for every backbone
    (as the authors send it; never a ``tool`` message, whose rendering differs between chat
    templates). Its content is ``<tool_response>\\n{text}\\n</tool_response>``; in the authors'
    format ``text`` is the whole content already (:func:`fit_authors_observation`,
    :func:`error_observation`).

    >>> observation_message("Results")["content"]
    '<tool_response>\\nResults\\n</tool_response>'
    """
    if fmt == "authors":
        return {"role": "user", "content": text}
    if fmt != "spader":
        raise ValueError(f"observation format must be one of {OBSERVATION_FORMATS}, got {fmt!r}")
    return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}


def error_observation(
    error: str, fmt: str = "spader", max_chars: int | None = None, content: str | None = None
) -> str:
    """The observation of a call that ran no search (a malformed call, a refused request): the
    project's ``Error: <why>``, or in the authors' format the message itself between
    ``<tool_response>`` tags, as their evaluation shows it (their parser's and their tool's
    messages, :mod:`spader.core.parsing`), or ``content`` when given (the whole observation their
    training shows instead: :func:`spader.core.parsing.authors_training_call`); cut to
    ``max_chars`` as an observation is."""
    if fmt == "authors":
        return _authors_cut(
            f"<tool_response>{error}</tool_response>" if content is None else content, max_chars
        )
    text = format_observation([], error=error)
    return text if max_chars is None else text[:max_chars]


#: The authors' search server caps a response at this many characters (their tool config's max_chars).
AUTHORS_SERVER_CHARS = 10000
_AUTHORS_CUT = "...(truncated)"


def _authors_cut(text: str, max_chars: int | None) -> str:
    """Their verl fork's cut of a long tool response (``tool_response_truncate_side: left``): the
    first ``max_chars`` characters and a ``...(truncated)`` mark."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + _AUTHORS_CUT


def _authors_document(passage: Mapping[str, Any]) -> dict[str, str]:
    """A passage as their server returns it: the title, and ``contents`` as stored in the chunk
    dump, the title again followed by the text."""
    title, text = str(passage.get("title", "")), str(passage.get("text", ""))
    return {"title": title, "contents": f"{title} {text}" if title else text}


def _authors_server_cap(
    queries: Sequence[str], documents: Sequence[Sequence[dict]], max_chars: int
) -> tuple[list[list[int]], bool]:
    """Their server's ``truncate_results``: the documents kept (indices per query) and whether
    any was dropped. The size of the skeleton (the queries with empty lists, dumped with indent 2)
    plus, rank by rank across the queries, the size of each document dumped on its own, until the
    first that does not fit."""
    skeleton = [{"query": q, "documents": []} for q in queries]
    used = len(json.dumps(skeleton, indent=2, ensure_ascii=False))
    ranked = sorted(
        ((r, q) for q, docs in enumerate(documents) for r in range(len(docs))), key=lambda x: (x[0], x[1])
    )
    kept: list[list[int]] = [[] for _ in queries]
    for r, q in ranked:
        size = len(json.dumps(documents[q][r], indent=2, ensure_ascii=False))
        if used + size > max_chars:
            return [sorted(k) for k in kept], True
        kept[q].append(r)
        used += size
    return [sorted(k) for k in kept], False


def fit_authors_observation(
    queries: Sequence[str],
    passages: Sequence[Sequence[dict]],
    max_chars: int,
    *,
    context: str = "training",
) -> tuple[str, list[list[dict]]]:
    """The observation of one search step in the authors' format, and the passages it shows.

    Their search server returns ``{"result": [{"query", "documents": [{"title", "contents"}]}],
    "truncation_warning"}`` (the queries echoed, ``contents`` repeating the title), keeping
    documents rank by rank across queries within :data:`AUTHORS_SERVER_CHARS` characters and adding
    ``System Note: Retrieval results truncated at 10000 characters.`` when it dropped one. Their
    training tool shows the whole response dumped with indent 2 (``context="training"``), their
    evaluation tool the result list dumped with indent 2 and the note on a line after it
    (``"evaluation"``), both inside ``<tool_response>`` tags without newlines; their verl fork then
    keeps the first ``max_chars`` characters.

    Returns:
        ``(content, shown)``: the observation message's whole content, and per query the passages
        the server kept whose text is complete in it (discovery counts only those).
    """
    documents = [[_authors_document(p) for p in ps] for ps in passages]
    kept, truncated = _authors_server_cap(queries, documents, AUTHORS_SERVER_CHARS)
    result = [{"query": q, "documents": [documents[i][r] for r in kept[i]]} for i, q in enumerate(queries)]
    note = f"System Note: Retrieval results truncated at {AUTHORS_SERVER_CHARS} characters."
    if context == "training":
        response: dict[str, Any] = {"result": result}
        if truncated:
            response["truncation_warning"] = note
        body = json.dumps(response, indent=2, ensure_ascii=False)
    elif context == "evaluation":
        body = json.dumps(result, indent=2, ensure_ascii=False) + (f"\n{note}" if truncated else "")
    else:
        raise ValueError(f"context must be training or evaluation, got {context!r}")
    full = f"<tool_response>{body}</tool_response>"
    content = _authors_cut(full, max_chars)
    shown = [[passages[i][r] for r in kept[i]] for i in range(len(queries))]
    if content != full:  # the cut went through the response: only documents wholly before it count
        head = content[:max_chars]
        shown = [
            [p for p, d in zip(ps, (documents[i][r] for r in kept[i]), strict=True) if _complete(d, head)]
            for i, ps in enumerate(shown)
        ]
    return content, shown


def _complete(document: Mapping[str, str], head: str) -> bool:
    return json.dumps(document["contents"], ensure_ascii=False) in head


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
