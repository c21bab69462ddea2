"""``agent``: one agent turn, the same in training rollouts and evaluation."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictInt, StringConstraints

from spader.config.sections.base import Section, _once

__all__ = [
    "AgentConfig",
]


class AgentConfig(Section):
    """One agent turn, the same in training rollouts and evaluation (docs/method.md, "Prompt and
    format")."""

    max_turns: StrictInt = Field(16, ge=1, le=10**4, description="assistant turns per episode")
    max_turn_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="cap on new tokens per assistant turn; null: none, a turn may use the episode's "
        "remaining token budget (as the authors' training)",
    )
    regenerations: StrictInt = Field(
        0,
        ge=0,
        le=100,
        description="a malformed turn is sampled again up to this many times before it counts "
        "(R3-RAG's original: 3); 0: every turn is sampled once",
    )
    max_tool_response_chars: StrictInt = Field(
        11000, ge=1, le=2**30, description="observation cap in characters"
    )
    max_queries_per_call: StrictInt | None = Field(
        10,
        ge=1,
        le=2**20,
        description="queries of one tool call beyond this are not run (they still count in q_t); null: "
        "every query runs (the authors' code)",
    )
    stop: Annotated[list[Literal["</tool_call>", "</answer>"]], AfterValidator(_once)] = Field(
        default_factory=lambda: ["</tool_call>", "</answer>"],
        description="a turn ends right after the first of these closing tags to occur (kept; a set: "
        "their order and repeats mean nothing); [] : no stop string, a turn runs to the model's end "
        "of turn or the budget (the authors' code)",
    )
    parser: Literal["spader", "authors"] = Field(
        "spader",
        description="how turns and answers are read: spader (a turn's call is its first, ended by its "
        "closing tag; the answer is the last turn's last <answer>, a JSON list of strings) or authors "
        "(a turn's call is its last <tool_call>; a turn without one ends the episode; the answer is "
        "the last <answer> anywhere, read as JSON, else a Python literal, else the raw string)",
    )
    observation_format: Literal["spader", "authors"] = Field(
        "spader",
        description="observation text: spader (numbered passages per query, lowest-ranked dropped to "
        "fit max_tool_response_chars) or authors (the authors' search server's JSON with the queries "
        "echoed and each title repeated, indent 2, capped at 10,000 characters with a System Note, "
        "then cut to its first max_tool_response_chars characters; their error messages)",
    )
    turn_boundary: Literal["template", "authors"] = Field(
        "template",
        description="what follows an assistant turn before its observation: template (the chat "
        "template's closing tokens the model did not write, e.g. Qwen3's newline after <|im_end|>) or "
        "authors (nothing: the observation turn right after the last generated token, as the authors' "
        "training appends it)",
    )
    prompt_template: Annotated[str, StringConstraints(min_length=1)] | None = Field(
        None,
        description="the prompt: a packaged template by name (default, authors: the authors' "
        "wording) or a template file (one {question} placeholder); null: default",
    )
    prompt_role: Literal["system", "user"] = Field(
        "system",
        description="how the prompt is sent: system (the paper's structured system prompt: the "
        "template's text before the line holding {question} is a system message, that line the "
        "user turn) or user (the whole prompt as one user message, as the authors' code sends it)",
    )
