"""One conversation as token ids: what training's verl agent loop builds, built the same way for
evaluation (docs/method.md, "One turn").

A conversation is never re-rendered through the chat template after its first prompt. It is the
prompt's ids, extended turn by turn with

* the ids the model generated (up to and including the token that completes the first stop tag,
  :func:`turn_token_count`),
* the template's turn-closing tokens the model did not write itself (:func:`missing_closing`:
  Qwen3's ``<|im_end|>`` and newline after a turn that stopped at ``</tool_call>``, only the
  newline after a turn that ended with ``<|im_end|>``; nothing after Llama-3.1's ``<|eot_id|>``;
  nothing at all with ``agent.turn_boundary: authors``, as the authors' training appends the
  observation right after the last generated token),
* the observation as a user turn ``<tool_response>\\n...\\n</tool_response>``
  (:func:`spader.core.prompt.observation_message`), tokenized on its own as the difference
  between a two-message conversation with and without it, the assistant header of the next turn
  included (:func:`observation_ids`). This is how verl's continuous-token builder appends a
  non-tool message in training, so the two loops hold the same ids turn by turn (a test checks it
  with the real Qwen3 and Llama-3.1 templates).

No tool schemas reach the chat template (``tools`` absent: Llama-3.1 renders a function-calling
preamble for any list, an empty one included) and no message is ever rendered with the ``tool``
role (Llama-3.1's template JSON-escapes such a message's content in an ``ipython`` turn).

The observation's text is tokenized as text: a passage holding ``<|im_start|>`` or
``<|eot_id|>`` gets the ordinary tokens of those characters, never the special token a tokenizer
would make of them in a rendered conversation (:func:`observation_ids`); the template's own
special tokens around it are kept.

The authors' evaluation script instead sends the whole message list to a chat-completions server
every turn, so the history is rendered again through the chat template each time, from the
turns' texts (``evaluation.loop: authors``, :class:`RenderedConversation`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from spader.core.prompt import observation_message
from spader.infra.tokenizers import backend_copy

__all__ = [
    "Conversation",
    "RenderedConversation",
    "missing_closing",
    "observation_ids",
    "render_ids",
    "text_safe_ids",
    "turn_closing_ids",
    "turn_token_count",
]

_MARKER = "SPADERTURNMARKER"
_TEXT_MARKER = "SPADEROBSERVATIONTEXTMARKER"
# The fixed context an observation turn is rendered after (its own ids are the difference).
_PREFIX = ({"role": "system", "content": "system"}, {"role": "user", "content": "user"})


def _ids(tokenized: Any) -> list[int]:
    """Token ids of ``apply_chat_template(tokenize=True)`` in any transformers version (a list, a
    ``BatchEncoding`` or a nested list)."""
    ids = tokenized
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"] if isinstance(ids, dict) else ids.input_ids
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = list(ids)
    if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])
    return [int(i) for i in ids]


def render_ids(tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` rendered by the model's chat template (no tool schemas), as the
    training loop renders the first prompt."""
    return _ids(
        tokenizer.apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
    )


@functools.lru_cache(maxsize=8)
def turn_closing_ids(tokenizer) -> tuple[int, ...]:
    """The tokens the chat template writes after an assistant message's content (Qwen3:
    ``<|im_end|>`` and a newline; Llama-3.1: ``<|eot_id|>``)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARKER}],
        tokenize=False,
        add_generation_prompt=False,
    )
    suffix = text.rsplit(_MARKER, 1)[-1] if _MARKER in text else ""
    return tuple(tokenizer.encode(suffix, add_special_tokens=False)) if suffix else ()


def missing_closing(ids: Sequence[int], closing: Sequence[int]) -> list[int]:
    """The part of ``closing`` a turn ending with ``ids`` still lacks: everything after the longest
    start of ``closing`` the turn already ends with.

    >>> missing_closing([5, 7], [7, 9]), missing_closing([5, 7, 9], [7, 9]), missing_closing([5], [7, 9])
    ([9], [], [7, 9])
    """
    closing = list(closing)
    for k in range(len(closing), 0, -1):
        if len(ids) >= k and list(ids[len(ids) - k :]) == closing[:k]:
            return closing[k:]
    return closing


@functools.lru_cache(maxsize=8)
def _prefix_ids(tokenizer) -> tuple[int, ...]:
    return tuple(render_ids(tokenizer, _PREFIX, add_generation_prompt=False))


@functools.lru_cache(maxsize=8)
def _added_tokens(tokenizer) -> tuple[re.Pattern | None, re.Pattern | None]:
    """Patterns of the tokenizer's added tokens (all of them; the special ones alone), longest
    first: a tokenizer splits its input at every added token before anything else."""

    def pattern(contents: list[str]) -> re.Pattern | None:
        contents = sorted(set(filter(None, contents)), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, contents))) if contents else None

    added = list(getattr(tokenizer, "added_tokens_decoder", {}).values())
    specials = [a.content for a in added if getattr(a, "special", False)]
    specials += list(getattr(tokenizer, "all_special_tokens", []) or [])
    return pattern([a.content for a in added] + specials), pattern(specials)


@functools.lru_cache(maxsize=8)
def _text_backend(tokenizer):
    """A private copy of a fast tokenizer's Rust backend that reads special-token strings as text,
    or None for a tokenizer without one (:func:`spader.infra.tokenizers.backend_copy`).

    ``split_special_tokens=True`` on the tokenizer itself would switch its shared backend to
    reading special tokens as text for the length of the call, and verl's agent loop runs every
    episode's tokenizer calls in one thread pool.
    """
    text = backend_copy(tokenizer)
    if text is not None:
        text.encode_special_tokens = True
    return text


def _encode(tokenizer, text: str, *, specials_as_text: bool = False) -> list[int]:
    if not text:
        return []
    backend = _text_backend(tokenizer) if specials_as_text else None
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=False).ids)
    kwargs = {"split_special_tokens": True} if specials_as_text else {}
    return _ids(tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"])


def text_safe_ids(
    tokenizer,
    context: Sequence[dict],
    message: Callable[[str], dict],
    text: str,
    *,
    add_generation_prompt: bool,
) -> list[int]:
    """Ids of ``context`` and ``message(text)`` rendered by the chat template, where ``text`` is
    tokenized as text: special-token strings in it do not become special tokens. Everything else
    is tokenized as :func:`render_ids` tokenizes it.

    A tokenizer cuts its input at added tokens before anything else, so the rendered conversation
    is encoded in three parts: up to the last added token before ``text``, from there to the first
    added token after it (special tokens read as text), and the rest. Without a special-token string
    in ``text`` the ids equal :func:`render_ids`'s.

    Raises:
        ValueError: the template does not render ``text`` verbatim.
    """
    messages = [*context, message(text)]
    _, specials = _added_tokens(tokenizer)
    if specials is None or not specials.search(text):
        return render_ids(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    marked = [*context, message(_TEXT_MARKER)]
    rendered_marked = tokenizer.apply_chat_template(
        marked, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    before, found, after = rendered_marked.partition(_TEXT_MARKER)
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not found or rendered != before + text + after:
        raise ValueError("the chat template does not render the observation text verbatim")
    boundaries, _ = _added_tokens(tokenizer)
    start, end = len(before), len(before) + len(text)
    left = max((m.end() for m in boundaries.finditer(rendered, 0, start)), default=0)
    following = boundaries.search(rendered, end)
    right = following.start() if following else len(rendered)
    return (
        _encode(tokenizer, rendered[:left])
        + _encode(tokenizer, rendered[left:right], specials_as_text=True)
        + _encode(tokenizer, rendered[right:])
    )


def observation_ids(tokenizer, text: str, fmt: str = "spader") -> list[int]:
    """Ids of one observation turn and of the next assistant header: the user message
    ``<tool_response>\\n{text}\\n</tool_response>`` (:func:`spader.core.prompt.observation_message`,
    in observation format ``fmt``) rendered after a fixed two-message context, minus that context.
    ``text`` (passages, queries, errors) is tokenized as text: a special-token string in it never
    becomes a special token (:func:`text_safe_ids`).

    Raises:
        ValueError: the template renders the context differently once a message follows it.
    """
    prefix = list(_prefix_ids(tokenizer))
    full = text_safe_ids(
        tokenizer, _PREFIX, lambda t: observation_message(t, fmt), text, add_generation_prompt=True
    )
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template does not render an observation turn as an append-only suffix")
    return full[len(prefix) :]


def turn_token_count(tokenizer, token_ids: Sequence[int], stop: Sequence[str]) -> int:
    """How many of ``token_ids`` one turn keeps: up to the token that completes the first stop
    tag (all of them when no tag occurs).

    Whether a prefix's text contains a tag is monotonic in the prefix length, so a binary search
    over prefix decodes finds the token in O(log n) decodes.
    """
    token_ids = list(token_ids)
    if not stop or not token_ids:
        return len(token_ids)

    def done(n: int) -> bool:
        text = tokenizer.decode(token_ids[:n], skip_special_tokens=False)
        return any(tag in text for tag in stop)

    if not done(len(token_ids)):
        return len(token_ids)
    lo, hi = 1, len(token_ids)  # done(hi) holds
    while lo < hi:
        mid = (lo + hi) // 2
        if done(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class Conversation:
    """One episode's ids: the prompt, then generated turns, closings and observations.

    Attributes:
        ids: the whole conversation so far (what the next turn is generated from).
        prompt_tokens: length of the first prompt (what follows is the response, as in training).
        generated: one flag per id after the prompt, True for ids the model generated.
    """

    def __init__(self, tokenizer, prompt_ids: Sequence[int], fmt: str = "spader", boundary: str = "template"):
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.boundary = boundary
        self.ids = [int(i) for i in prompt_ids]
        self.prompt_tokens = len(self.ids)
        self.generated: list[bool] = []

    @property
    def response_tokens(self) -> int:
        """Ids after the first prompt (generated and observation tokens), training's response."""
        return len(self.ids) - self.prompt_tokens

    def _extend(self, ids: Sequence[int], generated: bool) -> None:
        self.ids.extend(int(i) for i in ids)
        self.generated.extend([generated] * len(ids))

    def add_turn(self, ids: Sequence[int]) -> None:
        """Ids the model generated for one turn (already cut after the first stop tag)."""
        self._extend(ids, True)

    def close_turn(self) -> list[int]:
        """Append the template's closing tokens the last turn lacks; returns them. With
        ``boundary="authors"`` (``agent.turn_boundary``) nothing: the observation follows the last
        generated token, as the authors' training appends it."""
        if self.boundary == "authors":
            return []
        tail = missing_closing(self.ids, turn_closing_ids(self.tokenizer))
        self._extend(tail, False)
        return tail

    def observation(self, text: str) -> list[int]:
        """The ids :meth:`add_observation` would append for ``text`` (to check the budget first)."""
        return observation_ids(self.tokenizer, text, self.fmt)

    def add_observation(self, ids: Sequence[int]) -> None:
        """Append an observation turn's ids (:meth:`observation`), next assistant header included."""
        self._extend(ids, False)


class RenderedConversation:
    """One episode as the authors' evaluation script holds it: a message list rendered through the
    chat template before every turn (with the assistant header), each turn kept as the text a
    chat-completions server returns (its ids decoded without special tokens). Re-rendering may
    change earlier tokens (Qwen3's template rewrites the reasoning of a turn), so the ids are not
    an append-only record; budgets count the rendered length.

    The same interface as :class:`Conversation` (``ids``, ``prompt_tokens``, ``response_tokens``,
    ``add_turn``, ``close_turn``, ``observation``, ``add_observation``).
    """

    def __init__(self, tokenizer, messages: Sequence[dict], fmt: str = "spader"):
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.messages = [dict(m) for m in messages]
        self.ids = render_ids(tokenizer, self.messages, add_generation_prompt=True)
        self.prompt_tokens = len(self.ids)
        self._pending: dict | None = None

    @property
    def response_tokens(self) -> int:
        return len(self.ids) - self.prompt_tokens

    def add_turn(self, ids: Sequence[int]) -> None:
        """The turn as the server's message content; the history rendered without a header."""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        self.ids = render_ids(self.tokenizer, self.messages, add_generation_prompt=False)

    def close_turn(self) -> list[int]:
        """Nothing to add: the template closes every rendered turn itself."""
        return []

    def observation(self, text: str) -> list[int]:
        """The ids the history grows by with the observation and the next header (their number is
        what the budget checks)."""
        message = observation_message(text, self.fmt)
        self._pending = message
        full = render_ids(self.tokenizer, [*self.messages, message], add_generation_prompt=True)
        return full[len(self.ids) :] if len(full) > len(self.ids) else []

    def add_observation(self, ids: Sequence[int]) -> None:
        """Append the observation of the last :meth:`observation` call and render the history with
        the next assistant header."""
        if self._pending is None:
            raise RuntimeError("add_observation without observation()")
        self.messages.append(self._pending)
        self._pending = None
        self.ids = render_ids(self.tokenizer, self.messages, add_generation_prompt=True)
