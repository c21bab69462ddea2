"""The agent's search/answer loop used for evaluation (docs/method.md, "Episode", "Prompt and format").

One loop serves every method. ``react`` and the trained variants run up to ``max_turns``
assistant turns: a turn with ``<tool_call>`` runs its queries and the observation comes back as a
tool message; a turn with ``<answer>`` ends the episode; a turn with neither ends it too (invalid
format). ``rag`` starts with one retrieval for the question itself, shown to the model exactly as
a search step of its own, and then gives the model one turn, which must answer.

Episodes are advanced turn by turn in lock-step: the prompts of all running episodes go to the
engine together and all queries of a turn go to the search service in one call. The prompt, the
observation format and the parser are the project's single ones (``spader.core.prompt``,
``spader.core.parsing``), also used by training. Discovery of ground-truth entities per turn uses
``spader.core.matching.find_hits`` on the returned passages (never on the queries).

One turn is the same as in training (config ``agent``: ``max_turns``, ``max_turn_tokens``,
``max_tool_response_chars``, ``max_queries_per_call``, ``stop``): generation stops after the first
stop tag or the per-turn token cap, and the same parser reads the turn up to that tag.

Nothing here raises on model output: malformed calls (unusable queries included) become error
observations, a missing or malformed answer becomes an invalid-format episode, a generation
failure is recorded on the episode (``status == "generation_error"``), and any other failure of
one episode (``status == "episode_error"``) ends that episode only, with its reason in
``error``; each scores 0 while the other episodes go on. Only a search service that stays
unreachable after its retries stops the run: scoring against a dead search engine would be wrong.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from tqdm.auto import tqdm

from spader.agent.generation import Engine, Sampling
from spader.core.matching import passage_hits
from spader.core.metrics import unique_gold
from spader.core.parsing import TURN_END_TAGS, AnswerParse, parse_turn
from spader.core.prompt import PromptTemplate, build_messages, fit_observation, format_observation

log = logging.getLogger(__name__)

__all__ = [
    "METHODS_PROMPTING",
    "AgentSettings",
    "Episode",
    "Question",
    "SearchFn",
    "Step",
    "render_prompt",
    "run_episodes",
]

#: ``search(queries) -> passages per query``; each passage a dict with ``id``, ``title``, ``text``.
SearchFn = Callable[[list[str]], list[list[dict]]]

METHODS_PROMPTING = ("rag", "react")


#: Settings read from config ``agent`` (shared with training); the others come from ``evaluation``.
AGENT_KEYS = ("max_turns", "max_turn_tokens", "max_queries_per_call", "max_tool_response_chars", "stop")


@dataclass(frozen=True)
class AgentSettings:
    """Budgets and decoding of the loop: the turn settings of ``config["agent"]`` (the same in
    training) and the decoding and context budget of ``config["evaluation"]``."""

    max_turns: int = 16
    max_turn_tokens: int = 1024
    max_context_tokens: int = 16384
    max_queries_per_call: int = 10
    max_query_chars: int = 1000  # the search service's limit (retrieval.service.max_query_chars)
    max_tool_response_chars: int = 11000
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = TURN_END_TAGS
    seed: int = 0

    def __post_init__(self):
        positive = (
            "max_turns",
            "max_turn_tokens",
            "max_context_tokens",
            "max_queries_per_call",
            "max_query_chars",
            "max_tool_response_chars",
        )
        for name in positive:
            if int(getattr(self, name)) < 1:
                section = "agent" if name in AGENT_KEYS else "evaluation"
                raise ValueError(f"{section}.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                "evaluation.temperature must be >= 0 and top_p in (0, 1], "
                f"got {self.temperature}, {self.top_p}"
            )
        object.__setattr__(self, "stop", tuple(self.stop))

    @classmethod
    def from_config(
        cls, evaluation: Mapping[str, Any], agent: Mapping[str, Any] | None = None
    ) -> AgentSettings:
        """The loop's keys: turn settings from ``config["agent"]``, decoding and the context budget
        from ``config["evaluation"]`` (engine/GPU keys are ignored here)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in evaluation.items() if k in names and k not in AGENT_KEYS}
        values.update({k: v for k, v in (agent or {}).items() if k in names and k in AGENT_KEYS})
        return cls(**values)

    @property
    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, stop=self.stop, seed=self.seed)


@dataclass(frozen=True)
class Question:
    """One instance to run: ``gold`` (entities as alias lists) is used only to record discovery."""

    id: str
    question: str
    gold: list[list[str]] = field(default_factory=list)


@dataclass
class Step:
    """One assistant turn (``kind`` ``retrieval`` is rag's retrieval for the question)."""

    text: str
    kind: str
    queries: list[str] = field(default_factory=list)  # queries run at this step
    skipped_queries: int = 0  # beyond max_queries_per_call, or not run because the budget ended
    tool_error: str | None = None
    passage_ids: list[list[str]] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)  # gold entities in this step's passages
    new_entities: list[int] = field(default_factory=list)  # hits not seen at an earlier step
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish: str = ""


@dataclass
class Episode:
    """State and outcome of one question.

    ``status``: ``running`` while active, then ``answered`` (an ``<answer>`` turn, valid or not),
    ``no_action`` (a turn with neither tool call nor answer), ``turn_budget``, ``context_budget``,
    ``generation_error`` or ``episode_error`` (``error`` says why; both score 0).
    """

    question: Question
    messages: list[dict]
    steps: list[Step] = field(default_factory=list)
    status: str = "running"
    answer: AnswerParse | None = None
    error: str | None = None
    _seen: set[int] = field(default_factory=set, repr=False)
    _gold: list[list[str]] | None = field(default=None, repr=False)

    @property
    def gold(self) -> list[list[str]]:
        """The question's distinct gold entities (:func:`spader.core.metrics.unique_gold`), the
        list discovery indices refer to, as in training's search tool."""
        if self._gold is None:
            self._gold = unique_gold(self.question.gold)
        return self._gold

    def fail(self, stage: str, exc: BaseException) -> None:
        """End this episode as ``episode_error`` with the reason (it scores 0)."""
        self.status, self.error = "episode_error", f"{stage}: {type(exc).__name__}: {exc}"
        log.warning("episode %s failed at %s", self.question.id, self.error)

    @property
    def format_valid(self) -> bool:
        return self.status == "answered" and self.answer is not None and self.answer.valid

    @property
    def invalid_reason(self) -> str | None:
        if self.format_valid:
            return None
        if self.status == "answered" and self.answer is not None:
            return self.answer.reason
        return self.status

    @property
    def predictions(self) -> list[str]:
        return list(self.answer.answers) if self.format_valid else []


def render_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the conversation so far plus the assistant header (the model's chat template)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _record_passages(
    ep: Episode, step: Step, queries: list[str], passages: list[list[dict]], settings
) -> None:
    """Observation of one search step; discovery counts only the passages it shows (as in
    training), matched on titles and texts, never on the queries."""
    text, shown = fit_observation(queries, passages, settings.max_tool_response_chars)
    step.passage_ids = [[str(p.get("id", "")) for p in ps] for ps in shown]
    hits = passage_hits(shown, ep.gold)
    step.hits = sorted(hits)
    step.new_entities = sorted(hits - ep._seen)
    ep._seen |= hits
    ep.messages.append({"role": "tool", "content": text})


def _rejected(exc: BaseException) -> bool:
    """Whether a search failure is the request's fault (the service answered 4xx, or the queries
    could not even be encoded), not the service's: such a step becomes an error observation."""
    status = getattr(exc, "status", None)
    return isinstance(exc, ValueError) or (isinstance(status, int) and 400 <= status < 500)


def _search_one(ep: Episode, step: Step, search: SearchFn, settings: AgentSettings) -> None:
    """One episode's step searched on its own: a rejected request is that episode's error
    observation; a service that stays down raises (the run must not go on without search)."""
    try:
        results = search(step.queries)
    except Exception as exc:
        if not _rejected(exc):
            raise
        step.tool_error = f"the search service rejected the queries ({type(exc).__name__}: {exc})"
        ep.messages.append({"role": "tool", "content": format_observation([], error=step.tool_error)})
        return
    if len(results) != len(step.queries):
        raise RuntimeError(f"search returned {len(results)} result lists for {len(step.queries)} queries")
    _record_passages(ep, step, step.queries, results, settings)


def _run_searches(pending: list[tuple[Episode, Step]], search: SearchFn, settings: AgentSettings) -> None:
    """All queries of one turn in one call to the search service; when the service rejects that
    request, each episode's queries again on their own, so one bad step costs only its episode."""
    flat = [q for _, step in pending for q in step.queries]
    if not flat:
        return
    try:
        results = search(flat)
    except Exception as exc:
        if not _rejected(exc):
            raise
        log.warning("search rejected a batch of %d queries (%s); searching per episode", len(flat), exc)
        for ep, step in pending:
            _search_one(ep, step, search, settings)
        return
    if len(results) != len(flat):
        raise RuntimeError(f"search returned {len(results)} result lists for {len(flat)} queries")
    at = 0
    for ep, step in pending:
        n = len(step.queries)
        try:
            _record_passages(ep, step, step.queries, results[at : at + n], settings)
        except Exception as exc:  # noqa: BLE001 (this episode's failure, scored 0)
            ep.fail("recording search results", exc)
        at += n


def _rag_retrieval(episodes: list[Episode], search: SearchFn, settings: AgentSettings) -> None:
    pending = []
    for ep in episodes:
        query = ep.question.question.strip()[: settings.max_query_chars]
        text = format_tool_call([query])
        ep.messages.append({"role": "assistant", "content": text})
        step = Step(text=text, kind="retrieval", queries=[query], finish="forced")
        ep.steps.append(step)
        pending.append((ep, step))
    _run_searches(pending, search, settings)


def format_tool_call(queries: Sequence[str]) -> str:
    """The text of a search step in the agent's protocol (used for rag's retrieval turn)."""
    return f"<tool_call>{json.dumps(list(queries), ensure_ascii=False)}</tool_call>"


def _apply_turn(ep: Episode, step: Step, last_turn: bool, settings: AgentSettings) -> bool:
    """Classify the generated turn; returns True when its queries must be run now."""
    turn = parse_turn(step.text, settings.stop)
    step.text, step.kind = turn.text, turn.kind  # the turn ends at its first stop tag
    ep.messages.append({"role": "assistant", "content": step.text})
    if turn.kind in ("answer", "none"):
        ep.answer = turn.answer
        ep.status = "answered" if turn.kind == "answer" else "no_action"
        return False
    call = turn.tool_call
    if last_turn:  # the budget ends here: the call is not run (as in training's tool loop)
        ep.status = "turn_budget"
        step.skipped_queries = len(call.queries) if call and call.queries else 0
        return False
    if call.error is not None:
        step.tool_error = call.error
        ep.messages.append({"role": "tool", "content": format_observation([], error=call.error)})
        return False
    # as training's tool: each query cut to what the service accepts, at most max_queries_per_call
    step.queries = [q[: settings.max_query_chars] for q in call.queries[: settings.max_queries_per_call]]
    step.skipped_queries = len(call.queries) - len(step.queries)
    return True


def run_episodes(
    questions: Sequence[Question],
    engine: Engine,
    search: SearchFn,
    settings: AgentSettings,
    *,
    method: str = "react",
    progress: bool = True,
    template: PromptTemplate | None = None,
) -> list[Episode]:
    """Run one episode per question to completion.

    Args:
        questions: the instances (ids, question text, gold aliases for discovery).
        engine: a generation engine (``spader.agent.generation``).
        search: batched search function (``spader.agent.search.RetrievalSearch`` in real runs).
        settings: budgets and decoding.
        method: ``rag`` (one retrieval with the question, then one answer turn) or anything else
            (``react`` / a trained variant: the search loop up to ``settings.max_turns``).
        template: the user-prompt template (``agent.prompt_template``; default: the project's).
    Returns:
        The finished episodes, in the order of ``questions``.
    """
    episodes = [Episode(question=q, messages=build_messages(q.question, template)) for q in questions]
    if method == "rag":
        _rag_retrieval(episodes, search, settings)
        turns = 1
    else:
        turns = settings.max_turns
    bar = tqdm(total=len(episodes), desc=f"{method} episodes", unit="ep", disable=not progress)
    for turn in range(turns):
        running = [ep for ep in episodes if ep.status == "running"]
        if not running:
            break
        live, prompts, budgets = [], [], []
        for ep in running:
            try:
                ids = render_prompt(engine.tokenizer, ep.messages)
            except Exception as exc:  # noqa: BLE001 (a template error is this episode's failure)
                ep.status, ep.error = "generation_error", f"chat template failed: {type(exc).__name__}: {exc}"
                continue
            room = settings.max_context_tokens - len(ids)
            if room <= 0:
                ep.status = "context_budget"
                continue
            live.append(ep)
            prompts.append(ids)
            budgets.append(min(settings.max_turn_tokens, room))
        try:
            gens = engine.generate(prompts, budgets, settings.sampling) if prompts else []
            if len(gens) != len(prompts):
                raise RuntimeError(f"the engine returned {len(gens)} generations for {len(prompts)} prompts")
        except Exception as exc:  # noqa: BLE001 (recorded on every episode of the call, scored 0)
            log.error("generation failed for %d prompts: %s: %s", len(prompts), type(exc).__name__, exc)
            for ep in live:
                ep.status, ep.error = "generation_error", f"{type(exc).__name__}: {exc}"
            live, prompts, gens = [], [], []
        pending = []
        for ep, ids, gen in zip(live, prompts, gens, strict=True):
            step = Step(
                text=gen.text,
                kind="none",
                prompt_tokens=len(ids),
                completion_tokens=gen.completion_tokens,
                finish=gen.finish,
            )
            ep.steps.append(step)
            if gen.error is not None:
                ep.status, ep.error, step.kind = "generation_error", gen.error, "error"
                continue
            try:
                if _apply_turn(ep, step, last_turn=turn == turns - 1, settings=settings):
                    pending.append((ep, step))
            except Exception as exc:  # noqa: BLE001 (this episode's failure, scored 0)
                ep.fail("reading the turn", exc)
        _run_searches(pending, search, settings)
        done = sum(ep.status != "running" for ep in episodes)
        bar.update(done - bar.n)
        log.info(
            "turn %d: %d episodes generated, %d searched, %d/%d finished",
            turn + 1,
            len(live),
            len(pending),
            done,
            len(episodes),
        )
    for ep in episodes:  # only reachable when the loop ran out of turns with nothing generated
        if ep.status == "running":
            ep.status = "turn_budget"
    bar.update(len(episodes) - bar.n)
    bar.close()
    return episodes
