"""The agent's search/answer loop used for evaluation (docs/method.md, "Episode", "One turn").

One loop serves every method. ``react`` and the trained variants run up to ``max_turns``
assistant turns: a turn with ``<tool_call>`` runs its queries and the observation comes back as a
user turn ``<tool_response>\\n...\\n</tool_response>``; a turn with ``<answer>`` ends the episode;
a turn with neither ends it too (invalid format). ``rag`` starts with one retrieval for the
question itself, shown to the model exactly as a search step of its own, and then gives the model
one turn, which must answer.

A conversation is token ids, built as training's verl agent loop builds it
(:class:`spader.agent.conversation.Conversation`): the prompt's ids, then for every turn the ids
the model generated (cut after the first stop tag), the template's closing tokens it did not
write, and the observation turn's ids. Nothing is re-rendered through the chat template, so the
model sees in evaluation exactly the ids it saw in training.

Budgets are training's (config ``agent`` and ``evaluation.max_context_tokens``): a turn may use
what is left of the episode's token budget (or ``max_turn_tokens`` when a per-turn cap is set);
a turn that fills the budget, or an observation that does not fit in it, ends the episode
(``context_budget``), and a call in the last allowed turn is not run (``turn_budget``). Every
episode a token budget cut short is flagged (``budget_cut``). With ``evaluation.overflow:
end_episode`` (the authors' server) a turn whose cap does not fit in the context left is not
shrunk to fit: the request fails and the episode ends there, scored on what it wrote, and an
observation is appended whatever its size.

Episodes are advanced turn by turn in lock-step: the prompts of all running episodes go to the
engine together (each request with its own seed, derived from ``evaluation.seed``, the question
and the turn, so a sample does not depend on its batch) and all queries of a turn go to the search
service in one call. The parser is the project's single one (``spader.core.parsing``), also used
by training. Discovery of ground-truth entities per turn uses ``spader.core.matching`` on the
returned passages (never on the queries).

Nothing here raises on model output: malformed calls (unusable queries included) become error
observations, a missing or malformed answer becomes an invalid-format episode, a generation
failure is recorded on the episode (``status == "generation_error"``), and any other failure of
one episode (``status == "episode_error"``) ends that episode only, with its reason in
``error``; each scores 0 while the other episodes go on. Two failures stop the run: a search
service that stays unreachable after its retries (scoring against a dead search engine would be
wrong) and, with ``max_error_share`` set, more generation errors than that share of the episodes
(:class:`GenerationFailure`: the engine died or keeps failing).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm

from spader.agent.conversation import Conversation, RenderedConversation, render_ids, turn_token_count
from spader.agent.generation import Engine, Generation, Sampling
from spader.config.model import AgentConfig, EvaluationConfig, ServiceConfig
from spader.core.matching import passage_hits
from spader.core.metrics import unique_gold
from spader.core.parsing import AnswerParse, authors_answer, malformed_turn, parse_turn
from spader.core.prompt import (
    PromptTemplate,
    build_messages,
    error_observation,
    fit_authors_observation,
    fit_observation,
)

log = logging.getLogger(__name__)

__all__ = [
    "METHODS_PROMPTING",
    "AgentSettings",
    "Episode",
    "GenerationFailure",
    "Question",
    "SearchFn",
    "Step",
    "format_tool_call",
    "render_prompt",
    "request_seed",
    "run_episodes",
]

#: ``search(queries) -> passages per query``; each passage a dict with ``id``, ``title``, ``text``.
SearchFn = Callable[[list[str]], list[list[dict]]]

METHODS_PROMPTING = ("rag", "react")

#: Settings read from config ``agent`` (shared with training); the others come from ``evaluation``.
AGENT_KEYS = (
    "max_turns",
    "max_turn_tokens",
    "max_queries_per_call",
    "max_tool_response_chars",
    "stop",
    "regenerations",
    "parser",
    "observation_format",
)
#: Statuses of an episode that failed (scored 0; the authors' loop scores a generation error on
#: what it wrote and leaves an episode error out of the means).
FAILED = ("generation_error", "episode_error")


class SearchLimits(Protocol):
    """What the loop reads of the search service it queries (its longest accepted query)."""

    max_query_chars: int


class GenerationFailure(RuntimeError):
    """More episodes were lost to generation errors than ``max_error_share`` allows: the engine
    died or keeps failing, and an evaluation scored on what is left would be wrong."""


@dataclass(frozen=True)
class AgentSettings:
    """Budgets and decoding of the loop, built by :meth:`from_config` from the typed sections (the
    configuration model holds every default and description): ``max_turns``,
    ``max_turn_tokens``, ``max_queries_per_call``, ``max_tool_response_chars``, ``stop`` and
    ``regenerations``, ``parser``, ``observation_format`` and ``turn_boundary`` are ``agent.*``
    (the same in training); ``max_context_tokens`` (resolved), ``max_response_tokens``,
    ``overflow``, ``temperature``, ``top_p``, ``seed``, ``max_error_share`` and ``loop`` are
    ``evaluation.*``, and
    ``evaluation.max_turn_tokens`` replaces ``agent.max_turn_tokens`` when set; ``top_k``,
    ``min_p`` and ``repetition_penalty`` are off unless ``evaluation.generation_config`` fills
    them;
    ``max_query_chars`` is the search service's limit (``retrieval.service.max_query_chars``).
    ``max_error_share`` None never stops a run for generation errors (tests, benchmarks).
    """

    max_turns: int
    max_turn_tokens: int | None
    max_context_tokens: int
    max_response_tokens: int | None
    max_queries_per_call: int | None
    max_query_chars: int
    max_tool_response_chars: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    stop: tuple[str, ...]
    seed: int
    regenerations: int
    max_error_share: float | None
    parser: str
    observation_format: str
    loop: str
    turn_boundary: str
    overflow: str

    def __post_init__(self):
        positive = ("max_turns", "max_context_tokens", "max_query_chars", "max_tool_response_chars")
        for name in positive:
            if int(getattr(self, name)) < 1:
                section = "agent" if name in AGENT_KEYS else "evaluation"
                raise ValueError(f"{section}.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("max_turn_tokens", "max_queries_per_call", "max_response_tokens"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                section = "agent" if name in AGENT_KEYS else "evaluation"
                raise ValueError(f"{section}.{name} must be null or >= 1, got {value!r}")
        for name in ("parser", "observation_format", "loop"):
            if getattr(self, name) not in ("spader", "authors"):
                section = "evaluation" if name == "loop" else "agent"
                raise ValueError(f"{section}.{name} must be spader or authors, got {getattr(self, name)!r}")
        if self.turn_boundary not in ("template", "authors"):
            raise ValueError(f"agent.turn_boundary must be template or authors, got {self.turn_boundary!r}")
        if self.overflow not in ("shrink", "end_episode"):
            raise ValueError(f"evaluation.overflow must be shrink or end_episode, got {self.overflow!r}")
        if int(self.regenerations) < 0:
            raise ValueError(f"agent.regenerations must be >= 0, got {self.regenerations!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                "evaluation.temperature must be >= 0 and top_p in (0, 1], "
                f"got {self.temperature}, {self.top_p}"
            )
        if self.max_error_share is not None and not 0 <= self.max_error_share <= 1:
            raise ValueError(f"evaluation.max_error_share must lie in [0, 1], got {self.max_error_share}")
        object.__setattr__(self, "stop", tuple(self.stop))

    @classmethod
    def from_config(
        cls, evaluation: EvaluationConfig, agent: AgentConfig, service: ServiceConfig | SearchLimits
    ) -> AgentSettings:
        """The loop's settings from the typed sections: turn settings from ``agent``, decoding,
        context budget and error tolerance from ``evaluation``, the longest query from the
        retrieval ``service`` (its section, or the search settings the service runs with).

        Raises:
            ValueError: ``evaluation.max_context_tokens`` is null (the workflow resolves it to
                training's budget, :attr:`spader.config.Config.evaluation_context_tokens`).
        """
        if evaluation.max_context_tokens is None:
            raise ValueError(
                "evaluation.max_context_tokens is null: resolve it to training's max_prompt_length + "
                "max_response_length first (spader.config.Config.evaluation_context_tokens)"
            )
        turn_cap = (
            evaluation.max_turn_tokens if evaluation.max_turn_tokens is not None else agent.max_turn_tokens
        )
        return cls(
            max_turns=agent.max_turns,
            max_turn_tokens=turn_cap,
            max_queries_per_call=agent.max_queries_per_call,
            max_query_chars=service.max_query_chars,
            max_tool_response_chars=agent.max_tool_response_chars,
            stop=tuple(agent.stop),
            regenerations=agent.regenerations,
            parser=agent.parser,
            observation_format=agent.observation_format,
            max_context_tokens=evaluation.max_context_tokens,
            max_response_tokens=evaluation.max_response_tokens,
            temperature=evaluation.temperature,
            top_p=evaluation.top_p,
            # off: the configuration samples at temperature and top-p alone; the option
            # evaluation.generation_config fills them from the policy's file
            # (spader.evaluation.evaluate.loop_settings)
            top_k=-1,
            min_p=0.0,
            repetition_penalty=1.0,
            seed=evaluation.seed,
            max_error_share=evaluation.max_error_share,
            loop=evaluation.loop,
            turn_boundary=agent.turn_boundary,
            overflow=evaluation.overflow,
        )

    @property
    def sampling(self) -> Sampling:
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            stop=self.stop,
            seed=self.seed,
        )


@dataclass(frozen=True)
class Question:
    """One instance to run: ``gold`` (entities as alias lists) is used only to record discovery."""

    id: str
    question: str
    gold: list[list[str]] = field(default_factory=list)


@dataclass
class Step:
    """One assistant turn (``kind`` ``retrieval`` is rag's retrieval for the question).

    ``budget_cut`` is True when a token budget cut the turn's generation (its text has no stop
    tag); ``regenerated`` counts the malformed samples of the turn drawn again
    (``agent.regenerations``); ``observation`` is the text of the observation it received.
    """

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
    budget_cut: bool = False
    regenerated: int = 0
    observation: str | None = None


@dataclass
class Episode:
    """State and outcome of one question.

    ``status``: ``running`` while active, then ``answered`` (an ``<answer>`` turn, valid or not),
    ``no_action`` (a turn with neither tool call nor answer), ``turn_budget``, ``context_budget``,
    ``generation_error`` or ``episode_error`` (``error`` says why; both score 0, except in the
    authors' loop, which scores a generation error on what the episode wrote and leaves an
    episode error out of the means: :attr:`dropped`). ``conversation`` holds the ids the model saw;
    ``prompt_text`` the prompt's messages (system and user, joined by newlines). With the authors'
    parser the answer is the last ``<answer>`` of the episode's turns, whatever ended it.
    """

    question: Question
    conversation: Conversation | RenderedConversation | None = None
    steps: list[Step] = field(default_factory=list)
    status: str = "running"
    answer: AnswerParse | None = None
    error: str | None = None
    prompt_text: str = ""
    parser: str = "spader"
    loop: str = "spader"
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
    def budget_cut(self) -> bool:
        """Whether a token budget ended the episode: its context was full, or its last turn's
        generation was cut by its token budget."""
        return self.status == "context_budget" or bool(self.steps and self.steps[-1].budget_cut)

    @property
    def dropped(self) -> bool:
        """Left out of the means (the authors' loop drops an episode that failed otherwise than by a
        generation error)."""
        return self.loop == "authors" and self.status == "episode_error"

    @property
    def scored_despite_error(self) -> bool:
        return self.loop == "authors" and self.status == "generation_error"

    @property
    def format_valid(self) -> bool:
        if self.answer is None or not self.answer.valid:
            return False
        if self.parser == "authors":  # the last <answer> anywhere, whatever ended the episode
            return self.status not in FAILED or self.scored_despite_error
        return self.status == "answered"

    def assistant_text(self) -> str:
        """The episode's turns joined by newlines (the text the authors' parser reads)."""
        return "\n".join(s.text for s in self.steps if s.kind != "retrieval")

    @property
    def invalid_reason(self) -> str | None:
        if self.format_valid:
            return None
        if self.answer is not None and (self.status == "answered" or self.parser == "authors"):
            return self.answer.reason or self.status
        return self.status

    @property
    def predictions(self) -> list[str]:
        return list(self.answer.answers) if self.format_valid else []


def render_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` plus the assistant header (the model's chat template, no tool
    schemas): an episode's first prompt."""
    return render_ids(tokenizer, messages, add_generation_prompt=True)


def request_seed(seed: int, question_id: str, turn: int, attempt: int = 0) -> int:
    """The sampling seed of one generation request: a hash of the run's seed, the question, the
    turn and the attempt (regenerations), so a sample does not depend on what it is batched with.

    >>> request_seed(0, "q1", 0) == request_seed(0, "q1", 0) != request_seed(1, "q1", 0)
    True
    """
    digest = hashlib.sha256(f"{seed}\x1f{question_id}\x1f{turn}\x1f{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def format_tool_call(queries: Sequence[str]) -> str:
    """The text of a search step in the agent's protocol (used for rag's retrieval turn)."""
    return f"<tool_call>{json.dumps(list(queries), ensure_ascii=False)}</tool_call>"


def _observe(ep: Episode, step: Step, text: str, settings: AgentSettings) -> None:
    """Close the turn and append the observation, or end the episode when it does not fit in the
    token budget (as training's agent loop ends it)."""
    conv = ep.conversation
    conv.close_turn()
    ids = conv.observation(text)
    step.observation = text
    over_response = (
        settings.max_response_tokens is not None
        and conv.response_tokens + len(ids) >= settings.max_response_tokens
    )
    # end_episode: appended whatever its size (the authors' loop); the next request ends the episode
    over_context = settings.overflow == "shrink" and len(conv.ids) + len(ids) >= settings.max_context_tokens
    if over_context or over_response:
        ep.status = "context_budget"
        return
    conv.add_observation(ids)


def _record_passages(
    ep: Episode, step: Step, queries: list[str], passages: list[list[dict]], settings: AgentSettings
) -> None:
    """Observation of one search step; discovery counts only the passages it shows (as in
    training), matched on titles and texts, never on the queries. An observation the token
    budget has no room for shows nothing (the episode ends there, as in training)."""
    if settings.observation_format == "authors":
        text, shown = fit_authors_observation(
            queries, passages, settings.max_tool_response_chars, context="evaluation"
        )
    else:
        text, shown = fit_observation(queries, passages, settings.max_tool_response_chars)
    _observe(ep, step, text, settings)
    if ep.status == "context_budget":
        return
    step.passage_ids = [[str(p.get("id", "")) for p in ps] for ps in shown]
    hits = passage_hits(shown, ep.gold)
    step.hits = sorted(hits)
    step.new_entities = sorted(hits - ep._seen)
    ep._seen |= hits


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
        _observe(ep, step, _error_text(step.tool_error, settings), settings)
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


def _rag_retrieval(episodes: list[Episode], search: SearchFn, settings: AgentSettings, tokenizer) -> None:
    pending = []
    for ep in episodes:
        if ep.status != "running":
            continue
        query = ep.question.question.strip()[: settings.max_query_chars]
        text = format_tool_call([query])
        ep.conversation.add_turn(tokenizer.encode(text, add_special_tokens=False))
        step = Step(text=text, kind="retrieval", queries=[query], finish="forced")
        ep.steps.append(step)
        pending.append((ep, step))
    _run_searches(pending, search, settings)


def _error_text(error: str, settings: AgentSettings) -> str:
    return error_observation(error, settings.observation_format, settings.max_tool_response_chars)


def _apply_turn(ep: Episode, step: Step, last_turn: bool, full: bool, settings: AgentSettings) -> bool:
    """Classify the generated turn; returns True when its queries must be run now."""
    turn = parse_turn(step.text, settings.stop, settings.parser)
    step.kind = turn.kind
    if turn.kind in ("answer", "none"):
        ep.answer = turn.answer if settings.parser == "spader" else authors_answer(ep.assistant_text())
        ep.status = "answered" if turn.kind == "answer" else ("context_budget" if full else "no_action")
        return False
    call = turn.tool_call
    # the budget ends here: the call is not run (as in training's tool loop); the authors' evaluation
    # loop runs the call of its last turn too
    if full or (last_turn and settings.loop == "spader"):
        ep.status = "turn_budget" if last_turn and not full else "context_budget"
        step.skipped_queries = len(call.queries) if call and call.queries else 0
        return False
    if call.error is not None:
        step.tool_error = call.error
        _observe(ep, step, _error_text(call.error, settings), settings)
        return False
    # as training's tool: each query cut to what the service accepts, at most max_queries_per_call
    cap = settings.max_queries_per_call
    step.queries = [
        q[: settings.max_query_chars] for q in (call.queries if cap is None else call.queries[:cap])
    ]
    step.skipped_queries = len(call.queries) - len(step.queries)
    return True


@dataclass
class _Request:
    ep: Episode
    prompt: list[int]
    budget: int
    turn: int
    attempt: int = 0


def _generate(engine: Engine, requests: list[_Request], settings: AgentSettings) -> list[Generation]:
    """One engine call for ``requests``; an engine that raises fails each request's generation."""
    if not requests:
        return []
    seeds = [request_seed(settings.seed, r.ep.question.id, r.turn, r.attempt) for r in requests]
    try:
        gens = engine.generate(
            [r.prompt for r in requests], [r.budget for r in requests], settings.sampling, seeds
        )
        if len(gens) != len(requests):
            raise RuntimeError(f"the engine returned {len(gens)} generations for {len(requests)} prompts")
        return list(gens)
    except Exception as exc:  # noqa: BLE001 (recorded on every episode of the call, scored 0)
        log.error("generation failed for %d prompts: %s: %s", len(requests), type(exc).__name__, exc)
        return [Generation("", finish="error", error=f"{type(exc).__name__}: {exc}") for _ in requests]


def _turn_ids(gen: Generation, tokenizer, settings: AgentSettings) -> tuple[list[int], bool]:
    """The generated ids of one turn, cut after the first stop tag, and whether the token budget
    cut the turn (it ended at the budget before any tag)."""
    if gen.error is not None:
        raise RuntimeError(gen.error)
    ids = [int(i) for i in gen.token_ids]
    if not ids and gen.text:
        raise RuntimeError("the engine returned text without its token ids")
    keep = turn_token_count(tokenizer, ids, settings.stop)
    if keep < len(ids):
        return ids[:keep], False
    if not settings.stop:
        return ids, gen.finish == "length"
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return ids, gen.finish == "length" and not any(tag in text for tag in settings.stop)


def _check_errors(episodes: list[Episode], engine: Engine, settings: AgentSettings) -> None:
    if settings.max_error_share is None:
        return
    failed = sum(ep.status == "generation_error" for ep in episodes)
    if failed and failed > settings.max_error_share * len(episodes):
        reasons = sorted({str(ep.error) for ep in episodes if ep.status == "generation_error"})
        raise GenerationFailure(
            f"engine {getattr(engine, 'name', type(engine).__name__)!r}: {failed} of {len(episodes)} episodes "
            f"({failed / len(episodes):.1%}) lost to generation errors, more than evaluation.max_error_share="
            f"{settings.max_error_share} allows (first error: {reasons[0][:300]})"
        )


def _start_episodes(
    questions: Sequence[Question], tokenizer, settings: AgentSettings, template: PromptTemplate | None
) -> list[Episode]:
    """The episodes of ``questions`` with their prompts rendered (a template error fails one)."""
    episodes = [Episode(question=q, parser=settings.parser, loop=settings.loop) for q in questions]
    for ep in episodes:
        try:
            messages = build_messages(ep.question.question, template)
            ep.prompt_text = "\n".join(m["content"] for m in messages)
            if settings.loop == "authors":  # the history is rendered again before every turn
                ep.conversation = RenderedConversation(tokenizer, messages, settings.observation_format)
            else:
                prompt = render_prompt(tokenizer, messages)
                ep.conversation = Conversation(
                    tokenizer, prompt, settings.observation_format, settings.turn_boundary
                )
        except Exception as exc:  # noqa: BLE001 (a template error is this episode's failure)
            ep.status, ep.error = "generation_error", f"chat template failed: {type(exc).__name__}: {exc}"
    return episodes


def _turn_requests(episodes: list[Episode], turn: int, settings: AgentSettings) -> list[_Request]:
    """The generation requests of the running episodes; one with no room left ends (context_budget)."""
    requests = []
    for ep in episodes:
        if ep.status != "running":
            continue
        context_room = settings.max_context_tokens - len(ep.conversation.ids)
        room = context_room
        if settings.max_response_tokens is not None:  # training's response budget after the prompt
            room = min(room, settings.max_response_tokens - ep.conversation.response_tokens)
        cap = settings.max_turn_tokens
        # end_episode: a request whose cap does not fit in the context fails (the authors' server)
        refused = settings.overflow == "end_episode" and cap is not None and cap > context_room
        if room <= 0 or refused:
            ep.status = "context_budget"
            continue
        requests.append(
            _Request(ep, list(ep.conversation.ids), room if cap is None else min(cap, room), turn)
        )
    return requests


def _generate_turn(
    engine: Engine, requests: list[_Request], tokenizer, turn: int, settings: AgentSettings
) -> list[Generation]:
    """The generations of ``requests``, malformed turns generated again up to ``regenerations`` times."""
    gens = _generate(engine, requests, settings)
    for attempt in range(1, settings.regenerations + 1):
        again = [
            i
            for i, (req, gen) in enumerate(zip(requests, gens, strict=True))
            if gen.error is None
            and malformed_turn(_decode(gen, tokenizer, settings), settings.stop, settings.parser)
        ]
        if not again:
            break
        redo = [
            _Request(requests[i].ep, requests[i].prompt, requests[i].budget, turn, attempt) for i in again
        ]
        for i, gen in zip(again, _generate(engine, redo, settings), strict=True):
            gens[i] = gen
            requests[i].attempt = attempt
    return gens


def _record_turn(
    requests: list[_Request], gens: list[Generation], tokenizer, last_turn: bool, settings: AgentSettings
) -> list[tuple[Episode, Step]]:
    """Record each generation as its episode's step; returns the (episode, step) pairs to search."""
    pending = []
    for req, gen in zip(requests, gens, strict=True):
        ep = req.ep
        step = Step(text="", kind="none", prompt_tokens=len(req.prompt), finish=gen.finish)
        step.regenerated = req.attempt
        ep.steps.append(step)
        if gen.error is not None:
            ep.status, ep.error, step.kind = "generation_error", gen.error, "error"
            continue
        try:
            ids, cut = _turn_ids(gen, tokenizer, settings)
            step.text = tokenizer.decode(ids, skip_special_tokens=False)
            step.completion_tokens, step.budget_cut = len(ids), cut
            ep.conversation.add_turn(ids)
            full = len(ep.conversation.ids) >= settings.max_context_tokens or (
                settings.max_response_tokens is not None
                and ep.conversation.response_tokens >= settings.max_response_tokens
            )
            if _apply_turn(ep, step, last_turn=last_turn, full=full, settings=settings):
                pending.append((ep, step))
        except Exception as exc:  # noqa: BLE001 (this episode's failure, scored 0)
            ep.fail("reading the turn", exc)
    return pending


def _finish_episodes(episodes: list[Episode], settings: AgentSettings) -> None:
    """Close the episodes still running (turn_budget) and read the authors' answer where due."""
    for ep in episodes:  # only reachable when the loop ran out of turns with nothing generated
        if ep.status == "running":
            ep.status = "turn_budget"
        if settings.parser == "authors" and ep.answer is None and ep.status != "episode_error":
            # the last <answer> of the turns, whatever ended the episode (their script scores what
            # an episode wrote, also one a generation error stopped)
            ep.answer = authors_answer(ep.assistant_text())


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
    Raises:
        GenerationFailure: more generation errors than ``settings.max_error_share`` allows.
    """
    tokenizer = engine.tokenizer
    episodes = _start_episodes(questions, tokenizer, settings, template)
    _check_errors(episodes, engine, settings)
    if method == "rag":
        _rag_retrieval(episodes, search, settings, tokenizer)
        turns = 1
    else:
        turns = settings.max_turns
    bar = tqdm(total=len(episodes), desc=f"{method} episodes", unit="ep", disable=not progress)
    for turn in range(turns):
        if not any(ep.status == "running" for ep in episodes):
            break
        requests = _turn_requests(episodes, turn, settings)
        gens = _generate_turn(engine, requests, tokenizer, turn, settings)
        pending = _record_turn(requests, gens, tokenizer, turn == turns - 1, settings)
        _check_errors(episodes, engine, settings)
        _run_searches(pending, search, settings)
        done = sum(ep.status != "running" for ep in episodes)
        bar.update(done - bar.n)
        log.info(
            "turn %d: %d episodes generated, %d searched, %d/%d finished",
            turn + 1,
            len(requests),
            len(pending),
            done,
            len(episodes),
        )
    _finish_episodes(episodes, settings)
    bar.update(len(episodes) - bar.n)
    bar.close()
    return episodes


def _decode(gen: Generation, tokenizer, settings: AgentSettings) -> str:
    try:
        ids, _ = _turn_ids(gen, tokenizer, settings)
    except Exception:  # noqa: BLE001 (a broken generation is handled where it is recorded)
        return ""
    return tokenizer.decode(ids, skip_special_tokens=False)
