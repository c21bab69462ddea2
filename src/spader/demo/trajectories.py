"""Scripted agent trajectories on the demo world, the supervised data of the demo's warm start.

A scripted episode plays the agent's protocol the way a competent policy would, with real search
results (the caller's search function is the project's retrieval service or its backend):

1. ``<think>`` with a short plan, then a search step whose query is the question itself;
2. the observation exactly as the agent loop shows it (:func:`spader.core.prompt.fit_observation`,
   as the user turn of :func:`spader.core.prompt.observation_message`);
3. if that observation shows no gold entity (or, with ``retry_when="incomplete"``, not every
   gold entity) and ``max_searches`` allows, a second search step with the entity-bearing phrase
   of the question (a name such as "Ilse Varga") and its observation;
4. ``<think>``, then ``<answer>[...]</answer>`` listing the gold entities that occur in the
   observed passages (the one matcher, :func:`spader.core.rewards.passage_hits`), each written as
   the passages write it, in order of first appearance.

An episode whose searches show no gold entity at all is not kept (``kept`` is False): answering
it would teach either an empty answer or an answer from nowhere. With a turn budget (``fits``),
every assistant turn is written to fit it: a question too long to fit is searched by its name
instead, an answer keeps the names that fit (first seen first), and an episode whose first
search cannot fit is not kept; the evaluation loop would cut such a turn and parse it as invalid. Gold answers are used only to
choose what the script writes; nothing is written into the conversation that the passages do
not show.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from spader.core.prompt import build_messages, fit_observation, observation_message
from spader.core.rewards import passage_hits
from spader.core.text import normalize

log = logging.getLogger(__name__)

__all__ = [
    "ANSWER_THINK",
    "SEARCH_THINK",
    "Trajectory",
    "WorldSearch",
    "answer_text",
    "entity_phrases",
    "generated_questions",
    "load_questions",
    "script_trajectories",
    "search_text",
    "world_questions",
]

#: ``search(queries) -> passages per query`` (dicts with ``id``, ``title``, ``text``), as the loop's.
SearchFn = Callable[[list[str]], list[list[dict]]]

# Short on purpose: a turn must fit in the agent's token budget per turn (``agent.max_turn_tokens``,
# 48 in the demo), and every token spent on the plan is one fewer for queries and names.
SEARCH_THINK = "Search."
RETRY_THINK = "Search the name."
ANSWER_THINK = "Answer."

# A capitalised word (Unicode letters, inner apostrophes, hyphens, dots) or "&"; runs of them,
# possibly joined by "of"/"the"/"de", form a name.
_CAP = r"(?:[^\W\d_a-z][\w'’.\-]*|&)"
_NAME = re.compile(rf"{_CAP}(?:\s+(?:(?:of|the|de)\s+)?{_CAP})*")


@dataclass
class Trajectory:
    """One scripted episode.

    Attributes:
        id: the question's id.
        question: the question text.
        messages: the conversation (user prompt, assistant turns, tool observations) in the chat
            format the agent loop builds.
        answers: the entity names of the final answer (as the passages write them).
        found: indices of the gold entities the observations showed.
        searches: queries per search step.
        observations: the text of each observation (the body of its observation turn).
        kept: False when no search showed a gold entity (the episode is not training data).
    """

    id: str
    question: str
    messages: list[dict] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    found: list[int] = field(default_factory=list)
    searches: list[list[str]] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    kept: bool = True

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "kept": self.kept,
            "searches": self.searches,
            "answers": self.answers,
            "found": self.found,
            "observations": self.observations,
            "messages": self.messages,
        }


def entity_phrases(question: str) -> list[str]:
    """Capitalised names in ``question``, longest first (ties: first in the text).

    The question's first word is capitalised as a sentence start, not as a name, and is dropped
    from a name it begins ("Which films were directed by Ilse Varga?" -> ``["Ilse Varga"]``,
    "Films directed by Marta Velling" -> ``["Marta Velling"]``). Returns ``[]`` when the question
    names nothing.
    """
    out: list[str] = []
    text = question.strip()
    for m in _NAME.finditer(text):
        phrase = m.group(0)
        if m.start() == 0:  # sentence start: drop the first word
            parts = phrase.split(None, 1)
            phrase = parts[1] if len(parts) > 1 else ""
            phrase = re.sub(r"^(?:of|the|de)\s+", "", phrase)
        phrase = phrase.strip().rstrip(".")
        # a lone capitalised clause start after "or"/"and" ("... or Films directed by X")
        after = text[m.end() :].lstrip()
        if " " not in phrase and after[:1].islower() and text[: m.start()].rstrip().endswith((" or", " and")):
            continue
        if phrase and phrase != "&" and phrase not in out:
            out.append(phrase)
    return sorted(out, key=lambda p: -len(p))  # stable: ties keep text order


def search_text(queries: Sequence[str], think: str = SEARCH_THINK) -> str:
    """The assistant text of a search step in the agent's protocol."""
    return f"<think>{think}</think>\n<tool_call>{json.dumps(list(queries), ensure_ascii=False)}</tool_call>"


def answer_text(answers: Sequence[str], think: str = ANSWER_THINK) -> str:
    """The assistant text of the answer step in the agent's protocol."""
    return f"<think>{think}</think>\n<answer>{json.dumps(list(answers), ensure_ascii=False)}</answer>"


def _as_written(aliases: Sequence[str], texts: Sequence[str]) -> str:
    """The alias of an entity as the passages write it (literal match first, then up to norm_v1)."""
    for a in aliases:
        if any(a and a in t for t in texts):
            return a
    joined = " " + " | ".join(normalize(t) for t in texts) + " "
    for a in aliases:
        n = normalize(a)
        if n and f" {n} " in joined:
            return a
    return aliases[0]


def _first_position(aliases: Sequence[str], text: str) -> int:
    spots = [text.find(a) for a in aliases if a and a in text]
    return min(spots) if spots else len(text)


def _observe(traj: Trajectory, queries: list[str], results: list[list[dict]], max_chars: int, shown_all):
    text, shown = fit_observation(queries, results, max_chars)
    traj.messages.append(observation_message(text))
    traj.observations.append(text)
    shown_all.extend(p for ps in shown for p in ps)
    return text


def _plan(q, max_query_chars: int, first_queries: Sequence[str], fits) -> tuple[list[str], list[str], bool]:
    """``(first, retry, too_long)`` of question ``q``: the first search step's queries, the retry's
    (the names the first step did not search, two at most, as many as fit a turn), and whether the
    first step does not fit a turn."""
    phrases = entity_phrases(q.question)
    first = []
    if "question" in first_queries or not phrases:
        first.append(q.question.strip()[:max_query_chars])
    if "name" in first_queries and phrases and normalize(phrases[0]) != normalize(q.question):
        first.append(phrases[0][:max_query_chars])
    if not fits(search_text(first)) and phrases:  # too long for a turn: search the name
        first = [phrases[0][:max_query_chars]]
    too_long = not fits(search_text(first))
    # the retry searches the names the first step did not (two at most)
    retry = [p[:max_query_chars] for p in phrases if p not in first][:2]
    while retry and not fits(search_text(retry, RETRY_THINK)):
        retry.pop()
    return first, retry, too_long


def _search_step(
    trajs: list[Trajectory],
    shown: list[list],
    batch: list[tuple[int, list[str], str]],
    search,
    max_chars: int,
) -> None:
    """One search step of the episodes in ``batch`` (index, queries, plan), all in one ``search``
    call: each gets its search turn and its observation."""
    flat = [query for _, queries, _ in batch for query in queries]
    results = search(flat) if flat else []
    if len(results) != len(flat):
        raise RuntimeError(f"search returned {len(results)} result lists for {len(flat)} queries")
    at = 0
    for i, queries, think in batch:
        traj = trajs[i]
        traj.messages.append({"role": "assistant", "content": search_text(queries, think)})
        traj.searches.append(list(queries))
        _observe(traj, queries, results[at : at + len(queries)], max_chars, shown[i])
        at += len(queries)


def _answer(traj: Trajectory, gold, shown: list[dict], too_long: bool, fits) -> None:
    """Write the answer turn of ``traj``: the gold entities ``shown`` holds, as the passages write
    them, first seen first, as many as fit a turn; sets ``found``, ``answers`` and ``kept``."""
    texts = [s for p in shown for s in (p.get("title", ""), p.get("text", ""))]
    found = sorted(passage_hits([shown], gold))
    observed = "\n".join(traj.observations)
    names = [_as_written(gold[k], texts) for k in found]
    order = sorted(range(len(found)), key=lambda j: _first_position(gold[found[j]], observed))
    traj.found = [found[j] for j in order]
    traj.answers = list(dict.fromkeys(names[j] for j in order))
    while traj.answers and not fits(answer_text(traj.answers)):
        traj.answers.pop()  # the names that fit, first seen first
    traj.kept = bool(traj.answers) and not too_long
    traj.messages.append({"role": "assistant", "content": answer_text(traj.answers)})


RETRY_WHEN = ("none_found", "incomplete")


def _check_searches(max_searches: int, retry_when: str) -> None:
    if max_searches not in (1, 2):
        raise ValueError(f"max_searches must be 1 or 2, got {max_searches!r}")
    if retry_when not in RETRY_WHEN:
        raise ValueError(f"retry_when must be one of {RETRY_WHEN}, got {retry_when!r}")


def _searches_again(found, n_gold: int, retry_when: str) -> bool:
    """Whether an episode whose first search showed the gold entities ``found`` searches again."""
    return not found if retry_when == "none_found" else len(found) < n_gold


def script_trajectories(
    questions: Sequence,
    search: SearchFn,
    *,
    max_tool_response_chars: int = 11000,
    max_query_chars: int = 1000,
    max_searches: int = 2,
    first_queries: Sequence[str] = ("question",),
    retry_when: str = "none_found",
    template=None,
    fits: Callable[[str], bool] | None = None,
) -> list[Trajectory]:
    """Script one trajectory per question with real search results.

    Search steps of all questions go to ``search`` together (one call per step), as in the loop.

    Args:
        questions: objects with ``id``, ``question`` and ``gold`` (alias lists), e.g.
            :class:`spader.agent.loop.Question`.
        search: batched search function (the retrieval service through
            :class:`spader.agent.search.RetrievalSearch`, or the backend in process).
        max_tool_response_chars: observation budget (``evaluation.max_tool_response_chars``).
        max_query_chars: longest query the service accepts.
        max_searches: 1 or 2 search steps at most.
        retry_when: when the second step runs: ``"none_found"``, when the first showed no gold
            entity; ``"incomplete"``, when it did not show every gold entity.
        first_queries: what the first search step asks: ``"question"`` (the question itself)
            and/or ``"name"`` (its entity-bearing phrase); the second step asks for the names
            the first did not.
        template: the user-prompt template (default: the project's).
        fits: ``fits(assistant_text)`` is True when the text fits in one turn of the agent
            (``agent.max_turn_tokens`` of the policy's tokenizer); None: no limit.
    Returns:
        One :class:`Trajectory` per question, in order; ``kept`` says whether it is training data.
    """
    _check_searches(max_searches, retry_when)
    fits = fits or (lambda text: True)
    trajs, plans, shown = [], [], []
    for q in questions:
        if not q.gold:
            raise ValueError(f"question {q.id!r} has no gold entities to script an answer from")
        plans.append(_plan(q, max_query_chars, first_queries, fits))
        trajs.append(Trajectory(q.id, q.question, messages=build_messages(q.question, template)))
        shown.append([])
    _search_step(
        trajs, shown, [(i, p[0], SEARCH_THINK) for i, p in enumerate(plans)], search, max_tool_response_chars
    )
    if max_searches > 1:
        retry = [
            (i, plans[i][1], RETRY_THINK)
            for i, q in enumerate(questions)
            if plans[i][1] and _searches_again(passage_hits([shown[i]], q.gold), len(q.gold), retry_when)
        ]
        _search_step(trajs, shown, retry, search, max_tool_response_chars)
    for i, q in enumerate(questions):
        _answer(trajs[i], q.gold, shown[i], plans[i][2], fits)
    kept = sum(t.kept for t in trajs)
    log.info("scripted %d trajectories, %d show gold entities and are kept", len(trajs), kept)
    return trajs


def _mentions(names: Sequence[str], texts: Sequence[str]) -> bool:
    """True when one of ``names`` occurs as whole words in one of ``texts`` (up to norm_v1)."""
    padded = [f" {normalize(t)} " for t in texts]
    return any(n and any(f" {n} " in t for t in padded) for n in (normalize(x) for x in names))


def world_questions(world, exclude: Sequence) -> list:
    """Training questions of the demo world that share nothing with ``exclude``.

    Per topic of the world's training side (``world.topics``; the evaluation side's topics are
    never scripted): the list question in each dataset's wording (QAMPARI, WebQSP, QUEST) with the
    topic's objects as gold, and for each object the Mintaka-style question whose answer is the
    subject. A topic is left out when its subject or one of its objects is asked about or answered
    by an excluded question (the evaluation sets), so that no evaluation answer is learned in
    another wording; objects whose name two topics share (the two films called "Heat") get no
    one-answer question.

    Args:
        world: :class:`spader.demo.world.World`.
        exclude: questions (``question``, ``gold``) the warm start must not learn about.
    Returns:
        :class:`spader.agent.loop.Question` objects with ids ``world:<topic>:<n>``.
    """
    from spader.agent.loop import Question
    from spader.demo.releases import _MINTAKA_Q
    from spader.demo.world import KINDS

    banned = [q.question for q in exclude] + [a for q in exclude for aliases in q.gold for a in aliases]
    counts: dict[str, int] = {}
    for t in world.topics:
        for o in t.objects:
            counts[o.plain] = counts.get(o.plain, 0) + 1
    out = []
    for i, t in enumerate(world.topics):
        names = [t.subject.plain, *(o.plain for o in t.objects)]
        if _mentions(names, banned):
            continue
        gold = [[o.plain, *(a for a in [o.name, *o.aliases] if a != o.plain)] for o in t.objects]
        texts = [wording.format(s=t.subject.plain) for wording in KINDS[t.kind][2:5]]
        items = [(text, gold) for text in texts]
        items += [
            (_MINTAKA_Q[t.kind][0].format(o=o.plain), [[t.subject.plain]])
            for o in t.objects
            if counts[o.plain] == 1
        ]
        out += [Question(f"world:{i}:{n}", text, g) for n, (text, g) in enumerate(items)]
    return out


class WorldSearch:
    """Search over a generated world that is not in the corpus: a query that names one of the
    world's topics (its subject, or one of its objects for a one-answer question) gets that
    topic's passages (its objects' and its subject's) in an order fixed by the query, with
    ``distractors`` of the world's unrelated passages mixed in; any other query gets the
    unrelated passages alone.

    It scripts the warm start's episodes on worlds built with other seeds than the demo's
    (:func:`generated_questions`): their names never occur in the demo world, so an answer there
    can only be written by reading it in the observation.
    """

    def __init__(self, world, *, distractors: int = 1, seed: int = 0):
        import random

        self.rng_seed = seed
        self.distractors = distractors
        self._random = random
        by_title: dict[str, list[dict]] = {}
        for p in world.passages:
            by_title.setdefault(p.title, []).append({"id": p.id, "title": p.title, "text": p.text})
        self.topics = []
        names = set()
        for t in world.topics:
            titles = [o.plain for o in t.objects] + [t.subject.plain]
            names.update(titles)
            self.topics.append(([t.subject.plain, *(o.plain for o in t.objects)], [
                dict(p) for title in dict.fromkeys(titles) for p in by_title.get(title, [])
            ]))  # fmt: skip
        self.unrelated = [dict(p) for title, ps in by_title.items() if title not in names for p in ps]

    def _topic(self, query: str) -> list[dict]:
        padded = f" {normalize(query)} "
        for names, passages in self.topics:
            if any(f" {normalize(n)} " in padded for n in names):
                return passages
        return []

    def __call__(self, queries: list[str]) -> list[list[dict]]:
        out = []
        for q in queries:
            rng = self._random.Random(f"{self.rng_seed}:{q}")
            shown = list(self._topic(q))
            rng.shuffle(shown)
            for _ in range(self.distractors if self.unrelated else 0):
                shown.insert(rng.randrange(len(shown) + 1), dict(rng.choice(self.unrelated)))
            out.append([dict(p, score=float(len(shown) - k)) for k, p in enumerate(shown)])
        return out


def generated_questions(seeds: Sequence[int], exclude: Sequence) -> list[tuple[list, WorldSearch]]:
    """Questions of demo-like worlds generated with other seeds, with their search.

    Per seed: :func:`spader.demo.world.build_world` with that seed, its questions as
    :func:`world_questions` writes them (a topic that shares a name with an ``exclude`` question
    is left out, and so is any topic whose names the demo world uses on either side, so that the
    demo's own answers are never learned from these worlds), ids ``gen<seed>:<topic>:<n>``.

    Returns:
        ``(questions, search)`` per seed, ``search`` being the world's :class:`WorldSearch`.
    """
    from spader.agent.loop import Question
    from spader.demo.world import EVAL_TOPICS, SEED, build_world

    demo = build_world(SEED, n_eval=EVAL_TOPICS)
    demo_names = [e.plain for t in (*demo.topics, *demo.eval_topics) for e in (t.subject, *t.objects)]
    banned = [Question("demo", "", [[n] for n in demo_names])]
    out = []
    for seed in seeds:
        if seed == SEED:
            raise ValueError(f"generated world seed {seed} is the demo world's own")
        world = build_world(seed)
        questions = [
            Question(q.id.replace("world:", f"gen{seed}:", 1), q.question, q.gold)
            for q in world_questions(world, [*exclude, *banned])
        ]
        out.append((questions, WorldSearch(world, seed=seed)))
    return out


def load_questions(path: str | os.PathLike) -> list:
    """Training questions from a mix file (``results/{suite}/data/mix/train.jsonl``).

    Returns:
        :class:`spader.agent.loop.Question` objects (id, question, gold alias lists).
    Raises:
        spader.data.DataFormatError: naming the file (and line) when it is not a mix file.
        ValueError: when the file holds no question.
    """
    from spader.agent.loop import Question
    from spader.data.records import MIX_SCHEMA, read_records

    df = read_records(path, MIX_SCHEMA)
    out = [
        Question(r["id"], r["question"], [list(a) for a in r["answers"]]) for r in df.iter_rows(named=True)
    ]
    if not out:
        raise ValueError(f"{path}: the training mix holds no question to script")
    return out
