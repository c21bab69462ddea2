"""Agent loop ``spader_tool_agent`` and tool parser ``spader`` for verl's multi-turn rollout.

The tool parser reads the agent's text protocol with ``spader.core.parsing`` (the same parser as
evaluation): a turn that ends with ``<tool_call>["q1", "q2"]</tool_call>`` becomes one call of the
``search`` tool with ``{"queries": [...]}``; a malformed call still becomes a call with
``{"queries": [], "error": why}`` so the model sees the error as its observation (as in
evaluation); an ``<answer>`` or a turn without a call ends the episode.

The agent loop is verl's ``ToolAgentLoop`` with these additions, all through public hooks:

* one turn, the same as in evaluation (config ``spader_agent``, from config.yaml ``agent``):
  every generation request carries ``stop`` (the closing action tags), ``no_stop_trim`` and
  ``max_new_tokens`` (the response budget left, or the per-turn cap when one is set) in sglang's
  sampling params; tokens a server returns after the first stop tag are dropped before the turn
  is recorded (:class:`TurnEndingServer`);
* the observation is a user turn ``<tool_response>\\n...\\n</tool_response>``
  (:func:`spader.core.prompt.observation_message`) for every backbone, as the authors send it,
  never a ``tool`` message (Llama-3.1's template JSON-escapes that one in an ``ipython`` turn);
  before it, the chat template's turn-closing tokens the model did not write are inserted (mask 0,
  like verl's other boundary tokens; :func:`spader.agent.conversation.missing_closing`; with
  ``spader_agent.turn_boundary: authors`` nothing is, as in the authors' training), and the
  turn is tokenized on its own, as verl's continuous-token builder tokenizes an appended user
  message, except that the observation's text is tokenized as text (a passage holding
  ``<|im_start|>`` never becomes a special token: :func:`spader.agent.conversation.observation_ids`).
  Evaluation builds its conversations with the same function
  (:class:`spader.agent.conversation.Conversation`), so the two loops hold the same ids turn by turn;
* the chat template gets no tool schemas (``tools`` absent, not an empty list: Llama-3.1's
  template renders a function-calling preamble for any list): the user prompt
  (``spader.core.prompt``) describes the protocol, and evaluation renders the same prompt;
* every response ends on a token the model generated: tokens the loop added after the last
  generated one (the closing tokens of a turn whose observation then overflowed the response
  budget) are dropped, so the terminal reward verl writes on the last response token sits on a
  generated token, which GAE reads (it skips ``response_mask == 0`` tokens);
* optionally (``spader_agent.regenerations``, R3-RAG's original), a malformed turn is sampled
  again up to that many times before it counts;
* the search tool receives the row's ground-truth entities in ``create_kwargs["entities"]``
  (from ``reward_model.ground_truth``), so the data export does not have to copy them into
  ``tools_kwargs``; with ``spader_agent.aliases: blind`` (the authors' code) each entity's alias
  list is one string (:func:`spader.core.metrics.alias_blind`);
* the authors' protocol (``spader_agent.parser: authors``, tool parser ``spader_authors``; an
  empty ``stop``): a turn runs to its end, its last ``<tool_call>`` is the call, and the
  observation is in ``spader_agent.observation_format``;
* the text of the last assistant turn (the part inside the response budget) is kept in the
  rollout's extra fields (:data:`spader.methods.steps.FINAL_TURN_KEY`) for the terminal reward;
* an episode that raises for any reason is returned as a failed episode (one masked token,
  :data:`spader.methods.steps.FAILURE_KEY` holding the reason) that scores 0, trains nothing and
  is no peer in any group (the estimators leave rows without a generated token out) - except a
  rollout engine that hangs or died: a generation that does not answer within
  ``spader_agent.rollout_timeout_s`` (config.yaml ``training.rollout_timeout_s``), or whose
  server is gone, raises :class:`RolloutEngineError`, which stops the training with that message
  instead of scoring every later episode 0;
* every turn is counted in the episode's extra fields (:data:`TURN_STATS`): turns, turns that end
  at a closing tag, turns the server ran past the tag (the loop cut them), and the seed the
  rollout engine samples with (:data:`SEED_FIELD`, as the server reports it), which the step's
  ``episode/`` metrics summarise (:mod:`.episode_metrics`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.utils.profiler import simple_timer
from verl.utils.ray_utils import get_event_loop

from spader.agent.conversation import missing_closing, observation_ids, turn_closing_ids, turn_token_count
from spader.config.model import AgentConfig
from spader.core.metrics import alias_blind
from spader.core.parsing import authors_training_call, malformed_turn, parse_turn
from spader.core.prompt import observation_message
from spader.integrations.verl.episode_metrics import SEED_FIELD, TURN_STATS
from spader.integrations.verl.reward import gold_entities
from spader.integrations.verl.tool_config import TOOL_NAME
from spader.methods.steps import FAILURE_KEY, FINAL_TURN_KEY

__all__ = [
    "AGENT_LOOP",
    "AUTHORS_PARSER",
    "PARSER",
    "SEED_FIELD",
    "TURN_STATS",
    "AuthorsToolParser",
    "RolloutEngineError",
    "SpaderToolAgentLoop",
    "SpaderToolParser",
    "TurnEndingServer",
    "end_on_generated",
    "turn_closing_ids",
    "turn_token_count",
]

log = logging.getLogger(__name__)

PARSER = "spader"
AUTHORS_PARSER = "spader_authors"
AGENT_LOOP = "spader_tool_agent"


class RolloutEngineError(RuntimeError):
    """The rollout engine hung or died: the training cannot go on (never a failed episode)."""


_TOOL_CALL_BLOCK = "<tool_call>"


def _tool_name(tools) -> str:
    names = [t.function.name for t in (tools or [])]
    if TOOL_NAME in names or not names:
        return TOOL_NAME
    return names[0]


@ToolParser.register(PARSER)
class SpaderToolParser(ToolParser):
    """``<tool_call>["q1", "q2"]</tool_call>`` -> one ``search`` call with ``{"queries": [...]}``."""

    parser = "spader"

    async def extract_tool_calls(
        self, responses_ids: list[int], tools=None
    ) -> tuple[str, list[FunctionCall]]:
        """Decode one assistant turn and return ``(content, calls)`` as verl's parsers do."""
        loop = get_event_loop()
        text = await loop.run_in_executor(
            None, lambda: self.tokenizer.decode(responses_ids, skip_special_tokens=False)
        )
        turn = parse_turn(text, parser=self.parser)
        if turn.kind != "search":
            return text, []
        call = turn.tool_call
        args: dict[str, Any] = {"queries": call.queries}
        if call.error is not None:
            args = {"queries": [], "error": call.error}
        # like hermes: the call itself is carried by the message's tool_calls, not by its content
        content = turn.text[: turn.text.rfind(_TOOL_CALL_BLOCK)]
        return content, [FunctionCall(name=_tool_name(tools), arguments=json.dumps(args, ensure_ascii=False))]


@ToolParser.register(AUTHORS_PARSER)
class AuthorsToolParser(SpaderToolParser):
    """The authors' training reading of a turn (:func:`spader.core.parsing.authors_training_call`):
    its last ``<tool_call>`` block is the call; a JSON scalar in it makes no call (the episode
    ends, as in their training); a malformed call comes back with the observation their training
    shows (``observation``, which the search tool shows in the authors' format)."""

    parser = "authors"

    async def extract_tool_calls(
        self, responses_ids: list[int], tools=None
    ) -> tuple[str, list[FunctionCall]]:
        loop = get_event_loop()
        text = await loop.run_in_executor(
            None, lambda: self.tokenizer.decode(responses_ids, skip_special_tokens=False)
        )
        call = authors_training_call(text)
        if call is None:
            return text, []
        args: dict[str, Any] = {"queries": call.queries}
        if call.error is not None:
            args = {"queries": [], "error": call.error, "observation": call.observation}
        content = text[: text.rfind(_TOOL_CALL_BLOCK)]
        return content, [FunctionCall(name=_tool_name(tools), arguments=json.dumps(args, ensure_ascii=False))]


class TurnEndingServer:
    """verl's server manager, with every generation cut after the first stop tag and bounded in time.

    sglang honours ``stop`` itself (and keeps the tag in ``output_ids`` with ``no_stop_trim``);
    this makes the turn end there whatever the server did (a backend that ignores ``stop``, a
    token that completes the tag and continues past it), so the recorded turn is exactly what the
    parser reads. A request that gets no answer within ``timeout_s`` seconds (a hung engine), or
    whose server actor is gone (a dead one), raises :class:`RolloutEngineError`. What happened to
    each request is kept in :attr:`last` (by request id) for the agent loop's turn counters. Every
    other attribute is the wrapped manager's.
    """

    def __init__(self, server, tokenizer, stop: tuple[str, ...], timeout_s: float | None = None):
        self._server, self._tokenizer, self._stop = server, tokenizer, tuple(stop)
        self._timeout_s = timeout_s
        self.last: dict[str, dict[str, Any]] = {}

    def __getattr__(self, name):
        return getattr(self._server, name)

    async def _answer(self, args, kwargs):
        try:
            return await asyncio.wait_for(self._server.generate(*args, **kwargs), self._timeout_s)
        except TimeoutError:
            raise RolloutEngineError(
                f"the rollout engine did not answer a generation request within {self._timeout_s:.0f} s: it hung "
                "or is overloaded beyond recovery; the training stops (config key training.rollout_timeout_s)"
            ) from None
        except Exception as exc:
            if _actor_gone(exc):
                raise RolloutEngineError(
                    f"the rollout engine died during a generation ({type(exc).__name__}: {str(exc)[:300]}); "
                    "the training stops"
                ) from exc
            raise

    async def generate(self, *args, **kwargs):
        """``server_manager.generate`` with the output cut after the first stop tag."""
        output = await self._answer(args, kwargs)
        ids = list(output.token_ids)
        keep = turn_token_count(self._tokenizer, ids, self._stop)
        record = {"cut": keep < len(ids), SEED_FIELD: (output.extra_fields or {}).get(SEED_FIELD)}
        request = kwargs.get("request_id")
        if request is not None:
            self.last[str(request)] = record
        if keep == len(ids):
            return output
        update: dict[str, Any] = {"token_ids": ids[:keep]}
        if output.log_probs is not None:
            update["log_probs"] = list(output.log_probs)[:keep]
        return output.model_copy(update=update)


def _actor_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says a Ray actor (a rollout server) died or cannot be reached."""
    try:
        import ray.exceptions as ray_errors
    except ImportError:  # pragma: no cover  (verl always brings Ray)
        return False
    return isinstance(exc, ray_errors.RayActorError | ray_errors.ActorUnavailableError)


def _turn_settings(config) -> tuple[AgentConfig, str, float | None]:
    """The turn settings of the ``spader_agent`` block (config.yaml ``agent``, passed at launch),
    read as the typed ``agent`` section (a key the block lacks takes the section's default), the
    alias mode of the training reward (``aliases``, from ``training.divergences``) and how long a
    generation may go unanswered (``rollout_timeout_s``, from ``training``).

    Raises:
        ValueError: a value out of its bounds (the message names ``spader_agent.<key>``).
    """
    from spader.config.model import TrainingConfig

    block = dict(config.get("spader_agent") or {})
    timeout = block.pop("rollout_timeout_s", TrainingConfig().rollout_timeout_s)
    aliases = str(block.pop("aliases", None) or "aware")
    if aliases not in ("aware", "blind"):
        raise ValueError(f"spader_agent.aliases must be aware or blind, got {aliases!r}")
    plain = {k: (list(v) if k == "stop" else v) for k, v in block.items()}
    try:
        agent = AgentConfig.model_validate(plain)
    except ValueError as exc:
        raise ValueError(f"spader_agent is invalid: {exc}".replace("\n", "; ")) from exc
    if timeout is not None and float(timeout) <= 0:
        raise ValueError(f"spader_agent.rollout_timeout_s must be null or > 0, got {timeout!r}")
    return agent, aliases, (None if timeout is None else float(timeout))


def end_on_generated(output: AgentLoopOutput) -> AgentLoopOutput:
    """The episode's output without the tokens after its last generated one.

    verl writes a rollout's scalar reward on the last response token; a token the loop inserted
    (mask 0) would carry it, and GAE skips such tokens. A response without any generated token
    (a failed episode) is returned as it is.
    """
    mask = list(output.response_mask)
    keep = len(mask)
    while keep and not mask[keep - 1]:
        keep -= 1
    if keep == 0 or keep == len(mask):
        return output
    update: dict[str, Any] = {"response_ids": list(output.response_ids)[:keep], "response_mask": mask[:keep]}
    if output.response_logprobs is not None:
        update["response_logprobs"] = list(output.response_logprobs)[:keep]
    return output.model_copy(update=update)


@register(AGENT_LOOP)
class SpaderToolAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` for the SPADER protocol (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # no tool schemas reach the chat template: `tools` absent, as in evaluation
        self.tool_schemas = None
        agent, self.aliases, timeout = _turn_settings(self.config)
        self.max_turn_tokens, self.stop = agent.max_turn_tokens, tuple(agent.stop)
        self.regenerations, self.parser = agent.regenerations, agent.parser
        self.observation_format = agent.observation_format
        self.turn_boundary = agent.turn_boundary
        self.server_manager = TurnEndingServer(self.server_manager, self.tokenizer, self.stop, timeout)
        self.closing_ids = list(turn_closing_ids(self.tokenizer))

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        """Run one episode; the search tool gets the row's ground truth in its create kwargs. The
        response ends on a generated token (:func:`end_on_generated`). An episode that raises comes
        back as a failed episode (see the module docstring)."""
        try:
            reward_model = kwargs.get("reward_model") or {}
            entities = gold_entities(reward_model.get("ground_truth"))
            if self.aliases == "blind":  # the authors' reward: one string per alias list
                entities = alias_blind(entities)
            tools_kwargs = dict(kwargs.get("tools_kwargs") or {})
            for name in self.tools:
                per_tool = dict(tools_kwargs.get(name) or {})
                create = dict(per_tool.get("create_kwargs") or {})
                create.setdefault("entities", entities)
                per_tool["create_kwargs"] = create
                tools_kwargs[name] = per_tool
            kwargs["tools_kwargs"] = tools_kwargs
            return end_on_generated(await super().run(sampling_params, **kwargs))
        except RolloutEngineError:
            raise  # the engine is gone or hung: the training stops with the message
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
        # verl's trainer reads every trajectory's weight versions as integers (the staleness
        # metrics of trainer_base._compute_metrics): without them one failed episode stops the
        # training. The synchronous trainer's rollouts of step k run on weights version k - 1.
        version = max(int(kwargs.get("global_steps") or 1) - 1, 0)
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids) or [filler],
            response_ids=[filler],
            response_mask=[0],
            response_logprobs=[0.0] if sampling_params.get("logprobs") else None,
            num_turns=1,
            metrics={},
            extra_fields={
                FAILURE_KEY: reason,
                FINAL_TURN_KEY: "",
                "turn_scores": [],
                "tool_rewards": [],
                "min_global_steps": version,
                "max_global_steps": version,
            },
        )

    async def _handle_pending_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any]
    ) -> AgentState:
        agent_data._active_tool_schemas = None  # also when a row selects tools
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        """One turn; a malformed one is sampled again up to ``regenerations`` times (the state of
        the episode is restored before each new sample)."""
        saved = (
            list(agent_data.prompt_ids),
            list(agent_data.response_mask),
            list(agent_data.response_logprobs),
            agent_data.assistant_turns,
            len(agent_data.messages),
        )
        for attempt in range(self.regenerations + 1):
            if attempt:
                agent_data.prompt_ids, agent_data.response_mask = list(saved[0]), list(saved[1])
                agent_data.response_logprobs, agent_data.assistant_turns = list(saved[2]), saved[3]
                del agent_data.messages[saved[4] :]
                agent_data.tool_calls = []
            state = await self._generate_turn(agent_data, sampling_params, ignore_termination)
            if attempt == self.regenerations or not malformed_turn(
                agent_data.extra_fields[FINAL_TURN_KEY], self.stop, self.parser
            ):
                break
        if attempt:
            agent_data.extra_fields["spader_regenerations"] = (
                int(agent_data.extra_fields.get("spader_regenerations", 0)) + attempt
            )
        return state

    async def _generate_turn(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool
    ) -> AgentState:
        left = self.response_length - len(agent_data.response_mask)
        budget = left if self.max_turn_tokens is None else min(self.max_turn_tokens, left)
        turn_params = {
            **sampling_params,
            # keep the tag in the turn: sglang otherwise trims it from the text (ids come back whole)
            "no_stop_trim": True,
            "max_new_tokens": max(1, budget),
        }
        if self.stop:  # no stop string (the authors' code): the turn runs to the end of turn
            turn_params["stop"] = list(self.stop)
        state = await super()._handle_generating_state(agent_data, turn_params, ignore_termination)
        turn_ids = list(agent_data.response_ids)
        # the response is cut at response_length; only the part inside it is the trained turn
        overflow = len(agent_data.response_mask) - self.response_length
        if overflow > 0:
            turn_ids = turn_ids[: max(0, len(turn_ids) - overflow)]
        text = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(turn_ids, skip_special_tokens=False)
        )
        agent_data.extra_fields[FINAL_TURN_KEY] = text
        served = self.server_manager.last.pop(str(agent_data.request_id), {})
        turns, closed, cut = (int(agent_data.extra_fields.get(k, 0)) for k in TURN_STATS)
        closed += int(text.rstrip().endswith(self.stop))
        agent_data.extra_fields.update(
            dict(zip(TURN_STATS, (turns + 1, closed, cut + int(bool(served.get("cut")))), strict=True))
        )
        if served.get(SEED_FIELD) is not None:
            agent_data.extra_fields[SEED_FIELD] = int(served[SEED_FIELD])
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        """Run the turn's call and append its observation as a user turn (see the module
        docstring); the episode ends when the observation does not fit in the response budget."""
        agent_data._active_tool_schemas = None
        # A turn that stopped at its tag lacks the template's closing tokens; the model did not
        # write them, so they carry no loss (mask 0, log-prob 0) like verl's boundary tokens.
        # (agent.turn_boundary: authors, as their training: nothing, the observation follows directly)
        closing = (
            missing_closing(agent_data.prompt_ids, self.closing_ids)
            if self.turn_boundary == "template"
            else []
        )
        if closing:
            agent_data.prompt_ids = [*agent_data.prompt_ids, *closing]
            agent_data.response_mask = [*agent_data.response_mask, *([0] * len(closing))]
            if agent_data.response_logprobs:
                agent_data.response_logprobs = [*agent_data.response_logprobs, *([0.0] * len(closing))]
        calls = agent_data.tool_calls[: self.max_parallel_calls]
        with simple_timer("tool_calls", agent_data.metrics):
            responses = await asyncio.gather(
                *(self._call_tool(call, agent_data.tools_kwargs, agent_data) for call in calls)
            )
        for _, reward, _ in responses:
            if reward is not None:
                agent_data.tool_rewards.append(reward)
        # the spader parser makes one call per turn; several would share one observation turn
        text = "\n\n".join(response.text or "" for response, _, _ in responses)
        agent_data.messages.append(observation_message(text, self.observation_format))
        # The turn's ids as verl's continuous-token builder renders a user message (the turn minus a
        # fixed context, next assistant header included), with the observation's text tokenized as
        # text: a passage holding "<|im_start|>" gets no special token (evaluation builds the same).
        ids = await self.loop.run_in_executor(
            None, lambda: observation_ids(self.tokenizer, text, self.observation_format)
        )
        mask = [*agent_data.response_mask, *([0] * len(ids))]
        if len(mask) >= self.response_length:
            return AgentState.TERMINATED
        agent_data.prompt_ids = [*agent_data.prompt_ids, *ids]
        agent_data.response_mask = mask
        if agent_data.response_logprobs:
            agent_data.response_logprobs = [*agent_data.response_logprobs, *([0.0] * len(ids))]
        agent_data.user_turns += 1
        return AgentState.GENERATING
