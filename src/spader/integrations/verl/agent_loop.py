"""Agent loop ``spader_tool_agent`` and tool parser ``spader`` for verl's multi-turn rollout.

The tool parser reads the agent's text protocol with ``spader.core.parsing`` (the same parser as
evaluation): a turn with ``<tool_call>["q1", "q2"]</tool_call>`` (and no ``<answer>``) becomes one
call of the ``search`` tool with ``{"queries": [...]}``; a malformed call still becomes a call with
``{"queries": [], "error": why}`` so the model sees the error as its observation (as in
evaluation); an ``<answer>`` or a turn without a call ends the episode.

The agent loop is verl's ``ToolAgentLoop`` with three additions, all through public hooks:

* the chat template gets no tool schemas: the user prompt (``spader.core.prompt``) already describes the
  protocol, and evaluation renders the conversation without tools too;
* the search tool receives the row's ground-truth entities in ``create_kwargs["entities"]``
  (from ``reward_model.ground_truth``), so the data export does not have to copy them into
  ``tools_kwargs``;
* the text of the last assistant turn (the part inside the response budget) is kept in the
  rollout's extra fields (:data:`spader.core.densify.FINAL_TURN_KEY`) for the terminal reward.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.utils.ray_utils import get_event_loop

from spader.core.densify import FINAL_TURN_KEY
from spader.core.parsing import parse_turn
from spader.integrations.verl.reward import gold_entities
from spader.integrations.verl.tool_config import TOOL_NAME

__all__ = ["AGENT_LOOP", "PARSER", "SpaderToolAgentLoop", "SpaderToolParser"]

log = logging.getLogger(__name__)

PARSER = "spader"
AGENT_LOOP = "spader_tool_agent"
_TOOL_CALL_BLOCK = "<tool_call>"


def _tool_name(tools) -> str:
    names = [t.function.name for t in (tools or [])]
    if TOOL_NAME in names or not names:
        return TOOL_NAME
    return names[0]


@ToolParser.register(PARSER)
class SpaderToolParser(ToolParser):
    """``<tool_call>["q1", "q2"]</tool_call>`` -> one ``search`` call with ``{"queries": [...]}``."""

    async def extract_tool_calls(
        self, responses_ids: list[int], tools=None
    ) -> tuple[str, list[FunctionCall]]:
        """Decode one assistant turn and return ``(content, calls)`` as verl's parsers do."""
        loop = get_event_loop()
        text = await loop.run_in_executor(
            None, lambda: self.tokenizer.decode(responses_ids, skip_special_tokens=False)
        )
        turn = parse_turn(text)
        if turn.kind != "search":
            return text, []
        call = turn.tool_call
        args: dict[str, Any] = {"queries": call.queries}
        if call.error is not None:
            args = {"queries": [], "error": call.error}
        # like hermes: the call itself is carried by the message's tool_calls, not by its content
        content = text[: text.rfind(_TOOL_CALL_BLOCK)]
        return content, [FunctionCall(name=_tool_name(tools), arguments=json.dumps(args, ensure_ascii=False))]


@register(AGENT_LOOP)
class SpaderToolAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` for the SPADER protocol (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the prompt describes the tool; no tool system prompt from the chat template
        self.tool_schemas = []

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        """Run one episode; the search tool gets the row's ground truth in its create kwargs."""
        reward_model = kwargs.get("reward_model") or {}
        entities = gold_entities(reward_model.get("ground_truth"))
        tools_kwargs = dict(kwargs.get("tools_kwargs") or {})
        for name in self.tools:
            per_tool = dict(tools_kwargs.get(name) or {})
            create = dict(per_tool.get("create_kwargs") or {})
            create.setdefault("entities", entities)
            per_tool["create_kwargs"] = create
            tools_kwargs[name] = per_tool
        kwargs["tools_kwargs"] = tools_kwargs
        return await super().run(sampling_params, **kwargs)

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        turn_ids = list(agent_data.response_ids)
        # the response is cut at response_length; only the part inside it is the trained turn
        overflow = len(agent_data.response_mask) - self.response_length
        if overflow > 0:
            turn_ids = turn_ids[: max(0, len(turn_ids) - overflow)]
        agent_data.extra_fields[FINAL_TURN_KEY] = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(turn_ids, skip_special_tokens=False)
        )
        return state
