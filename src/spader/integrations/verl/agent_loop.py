"""Agent loop ``spader_tool_agent`` and tool parser ``spader`` for verl's multi-turn rollout.

The tool parser reads the agent's text protocol with ``spader.core.parsing`` (the same parser as
evaluation): a turn that ends with ``<tool_call>["q1", "q2"]</tool_call>`` becomes one call of the
``search`` tool with ``{"queries": [...]}``; a malformed call still becomes a call with
``{"queries": [], "error": why}`` so the model sees the error as its observation (as in
evaluation); an ``<answer>`` or a turn without a call ends the episode.

The agent loop is verl's ``ToolAgentLoop`` with these additions, all through public hooks:

* one turn, the same as in evaluation (config ``spader_agent``, from config.yaml ``agent``):
  every generation request carries ``stop`` (the closing action tags), ``no_stop_trim`` and
  ``max_new_tokens`` (the per-turn cap, within the response budget left) in sglang's sampling
  params; tokens a server returns after the first stop tag are dropped before the turn is
  recorded (:class:`TurnEndingServer`); and when a turn ended at a stop tag rather than at the
  model's own end-of-turn token, the chat template's turn-closing tokens are inserted (mask 0,
  like verl's other boundary tokens), so the conversation is the template's rendering of the
  same messages evaluation renders;
* the chat template gets no tool schemas (``tools`` absent, not an empty list: Llama-3.1's
  template renders a function-calling preamble for any list): the user prompt
  (``spader.core.prompt``) describes the protocol, and evaluation renders the same prompt;
* the search tool receives the row's ground-truth entities in ``create_kwargs["entities"]``
  (from ``reward_model.ground_truth``), so the data export does not have to copy them into
  ``tools_kwargs``;
* the text of the last assistant turn (the part inside the response budget) is kept in the
  rollout's extra fields (:data:`spader.core.densify.FINAL_TURN_KEY`) for the terminal reward;
* an episode that raises for any reason is returned as a failed episode (one masked token,
  :data:`spader.core.densify.FAILURE_KEY` holding the reason) that scores 0 and trains nothing,
  instead of failing the whole rollout batch.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.utils.ray_utils import get_event_loop

from spader.core.densify import FAILURE_KEY, FINAL_TURN_KEY
from spader.core.parsing import TURN_END_TAGS, parse_turn
from spader.integrations.verl.reward import gold_entities
from spader.integrations.verl.tool_config import TOOL_NAME

__all__ = [
    "AGENT_LOOP",
    "PARSER",
    "SpaderToolAgentLoop",
    "SpaderToolParser",
    "TurnEndingServer",
    "turn_closing_ids",
    "turn_token_count",
]

log = logging.getLogger(__name__)

PARSER = "spader"
AGENT_LOOP = "spader_tool_agent"
_TOOL_CALL_BLOCK = "<tool_call>"
_MARKER = "SPADERTURNMARKER"


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
        content = turn.text[: turn.text.rfind(_TOOL_CALL_BLOCK)]
        return content, [FunctionCall(name=_tool_name(tools), arguments=json.dumps(args, ensure_ascii=False))]


def turn_token_count(tokenizer, token_ids: list[int], stop: tuple[str, ...] | list[str]) -> int:
    """How many of ``token_ids`` one turn keeps: up to the token that completes the first stop
    tag (all of them when no tag occurs).

    Whether a prefix's text contains a tag is monotonic in the prefix length, so a binary search
    over prefix decodes finds the token in O(log n) decodes.
    """
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


class TurnEndingServer:
    """verl's server manager, with every generation cut after the first stop tag.

    sglang honours ``stop`` itself (and keeps the tag in ``output_ids`` with ``no_stop_trim``);
    this makes the turn end there whatever the server did (a backend that ignores ``stop``, a
    token that completes the tag and continues past it), so the recorded turn is exactly what the
    parser reads. Every other attribute is the wrapped manager's.
    """

    def __init__(self, server, tokenizer, stop: tuple[str, ...]):
        self._server, self._tokenizer, self._stop = server, tokenizer, tuple(stop)

    def __getattr__(self, name):
        return getattr(self._server, name)

    async def generate(self, *args, **kwargs):
        """``server_manager.generate`` with the output cut after the first stop tag."""
        output = await self._server.generate(*args, **kwargs)
        ids = list(output.token_ids)
        keep = turn_token_count(self._tokenizer, ids, self._stop)
        if keep == len(ids):
            return output
        update: dict[str, Any] = {"token_ids": ids[:keep]}
        if output.log_probs is not None:
            update["log_probs"] = list(output.log_probs)[:keep]
        return output.model_copy(update=update)


def _turn_settings(config) -> tuple[int, tuple[str, ...]]:
    block = config.get("spader_agent")
    if block is None or block.get("max_turn_tokens") is None:
        raise ValueError(
            "spader_agent.max_turn_tokens is not set: the spader_tool_agent loop needs the per-turn "
            "token cap (config/verl/base.yaml, config.yaml agent.max_turn_tokens)"
        )
    stop = tuple(str(s) for s in (block.get("stop") or TURN_END_TAGS))
    return int(block["max_turn_tokens"]), stop


@register(AGENT_LOOP)
class SpaderToolAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` for the SPADER protocol (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # no tool schemas reach the chat template: `tools` absent, as in evaluation
        self.tool_schemas = None
        self.max_turn_tokens, self.stop = _turn_settings(self.config)
        self.server_manager = TurnEndingServer(self.server_manager, self.tokenizer, self.stop)
        self.closing_ids = list(turn_closing_ids(self.tokenizer))

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        """Run one episode; the search tool gets the row's ground truth in its create kwargs. An
        episode that raises comes back as a failed episode (see the module docstring)."""
        try:
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
        except Exception as exc:  # noqa: BLE001 (one bad episode must not fail the rollout batch)
            return await self._failed_episode(sampling_params, kwargs, exc)

    async def _failed_episode(self, sampling_params: dict[str, Any], kwargs: dict, exc: Exception):
        """A one-token, fully masked episode that records why it failed (scored 0)."""
        reason = f"{type(exc).__name__}: {exc}"
        log.error("episode failed, scored 0: %s", reason)
        try:
            prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]), tools=None)
        except Exception:  # noqa: BLE001 (the prompt itself may be what failed)
            prompt_ids = []
        filler = self.tokenizer.pad_token_id
        filler = self.tokenizer.eos_token_id if filler is None else filler
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids) or [filler],
            response_ids=[filler],
            response_mask=[0],
            response_logprobs=[0.0] if sampling_params.get("logprobs") else None,
            num_turns=1,
            metrics={},
            extra_fields={FAILURE_KEY: reason, FINAL_TURN_KEY: "", "turn_scores": [], "tool_rewards": []},
        )

    async def _handle_pending_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any]
    ) -> AgentState:
        agent_data._active_tool_schemas = None  # also when a row selects tools
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        left = self.response_length - len(agent_data.response_mask)
        turn_params = {
            **sampling_params,
            "stop": list(self.stop),
            # keep the tag in the turn: sglang otherwise trims it from the text (ids come back whole)
            "no_stop_trim": True,
            "max_new_tokens": max(1, min(self.max_turn_tokens, left)),
        }
        state = await super()._handle_generating_state(agent_data, turn_params, ignore_termination)
        turn_ids = list(agent_data.response_ids)
        # the response is cut at response_length; only the part inside it is the trained turn
        overflow = len(agent_data.response_mask) - self.response_length
        if overflow > 0:
            turn_ids = turn_ids[: max(0, len(turn_ids) - overflow)]
        agent_data.extra_fields[FINAL_TURN_KEY] = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(turn_ids, skip_special_tokens=False)
        )
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        agent_data._active_tool_schemas = None
        # A turn that stopped at its tag lacks the template's closing tokens; the model did not
        # write them, so they carry no loss (mask 0, log-prob 0) like verl's boundary tokens.
        if self.closing_ids and agent_data.prompt_ids[-1:] != self.closing_ids[:1]:
            n = len(self.closing_ids)
            agent_data.prompt_ids = [*agent_data.prompt_ids, *self.closing_ids]
            agent_data.response_mask = [*agent_data.response_mask, *([0] * n)]
            if agent_data.response_logprobs:
                agent_data.response_logprobs = [*agent_data.response_logprobs, *([0.0] * n)]
        return await super()._handle_processing_tools_state(agent_data)
