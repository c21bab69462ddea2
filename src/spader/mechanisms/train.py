"""A small policy trained in the search world with the project's own rewards and advantages.

The policy is tabular: a softmax over the actions available (``BROAD``, ``LEAD``, ``BLIND``,
``STOP``) for every **state**, and the state is what the agent has read in its observations so far
(docs/mechanisms.md, "The policy"): how many pages of the broad ranking it has read, for how many
facets not yet searched a passage it read has given a lead, how many it has never seen named, and
whether its last search found a gold entity it had not seen before. It is trained by a plain policy
gradient: every decision step ``t`` of trajectory ``i`` adds ``A_t(i) * grad log pi(a_t | s_t)``,
averaged over the batch's steps, to the logits.

The rewards and advantages are the project's functions, called as the verl trainer calls them:
:func:`spader.core.rewards.group_step_rewards` (search-step rewards then the terminal reward, per
group of rollouts of one question; every search call is one query and costs the tool cost),
:func:`spader.core.rewards.terminal_reward` (GRPO's reward),
:func:`spader.core.advantage.step_peer_advantage` (SPA) and
:func:`spader.core.advantage.trajectory_peer_advantage` (the trajectory-level advantage of
``no_spa`` and GRPO).

An episode has at most ``max_turns`` decision steps; a trajectory still searching at its last turn
is cut off by the budget: that turn's search is not run and the turn gets the invalid-format
reward (-1), as in training (docs/method.md, "Episode").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from spader.core.advantage import step_peer_advantage, trajectory_peer_advantage
from spader.core.rewards import group_step_rewards, terminal_reward
from spader.mechanisms.world import (
    ACTIONS,
    BLIND,
    BROAD,
    LEAD,
    STOP,
    SearchQuestion,
    SearchWorld,
    WorldSpec,
    make_world,
    popcount,
)

__all__ = ["ARMS", "Arm", "Run", "TrainSpec", "evaluate", "n_states", "state_index", "train_arm"]


@dataclass(frozen=True)
class Arm:
    """One trained variant (docs/method.md, "Ablations and baselines").

    Attributes:
        name: the variant's name. alpha, beta: the entity reward's weights. reward: ``step``
            (search-step rewards and the terminal F1) or ``terminal`` (F1 only). advantage:
            ``spa`` or ``trajectory``.
    """

    name: str
    alpha: float
    beta: float
    reward: str
    advantage: str


#: The arms, with the paper's reward weights.
ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("spader", 1.0, 4.0, "step", "spa"),
        Arm("no_spa", 1.0, 4.0, "step", "trajectory"),
        Arm("no_np", 1.0, 0.0, "step", "spa"),
        Arm("no_ig", 0.0, 4.0, "step", "spa"),
        Arm("grpo", 1.0, 4.0, "terminal", "trajectory"),
    )
}


@dataclass(frozen=True)
class TrainSpec:
    """Training settings (docs/mechanisms.md, "How the settings were fixed").

    Attributes:
        iterations: policy-gradient updates. questions: questions per batch. group: rollouts per
        question (G). lr: step size on the logits. gamma: SPA's discount. cost: tool cost per
        search call (one query each). train_questions, test_questions: the world's questions per
        seed. test_group: rollouts per held-out question in the final evaluation.
    """

    iterations: int = 120
    questions: int = 16
    group: int = 8
    lr: float = 10.0
    gamma: float = 0.9
    cost: float = 0.01
    train_questions: int = 64
    test_questions: int = 64
    test_group: int = 8


@dataclass
class Run:
    """What one arm's training on one seed measured.

    Attributes:
        curve: mean answer F1 (invalid answers 0) of each training batch.
        final: metrics of the trained policy on the held-out questions (:func:`evaluate`).
    """

    arm: str
    seed: int
    curve: list[float] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)


def n_states(spec: WorldSpec) -> int:
    """Size of the state table (:func:`state_index`; some combinations never occur)."""
    return (spec.broad_pages + 1) * (spec.facets + 1) ** 2 * 2


def state_index(spec: WorldSpec, broad, leads, blind, last_empty):
    """The state of the policy: broad pages read, facets with a lead not yet searched, facets never
    named and not yet searched, whether the last search found nothing new (0 before any search).
    The turn is implied: every search reads a new broad page or searches a new facet."""
    f = spec.facets + 1
    return ((broad * f + leads) * f + blind) * 2 + last_empty


#: set bits of a facet bitmask (at most 8 facets: WorldSpec checks)
_FACET_COUNT = np.array([bin(i).count("1") for i in range(1 << 8)], dtype=np.int64)


@dataclass
class _Batch:
    """Rollouts of one batch (B episodes, up to T steps)."""

    question: np.ndarray  # (B,) index into the question list
    state: np.ndarray  # (B, T) state of each step, -1 past the end
    action: np.ndarray  # (B, T)
    avail: np.ndarray  # (B, T, A) actions available at the step
    steps: np.ndarray  # (B,) decision steps taken
    cut: np.ndarray  # (B,) cut off by the turn budget (invalid)
    page: np.ndarray  # (B, T) page shown by a search step, -1 for none
    new: np.ndarray  # (B, T) new gold entities found by the step
    pages_seen: np.ndarray  # (B,) bitmask of pages shown
    gold_seen: np.ndarray  # (B,) bitmask of gold entities shown


def _probabilities(logits: np.ndarray, avail: np.ndarray) -> np.ndarray:
    """Softmax over the available actions (0 for the others)."""
    z = np.where(avail, logits, -np.inf)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _random_bit(mask: np.ndarray, facets: int, rng: np.random.Generator) -> np.ndarray:
    """One set bit of each (non-zero) ``mask``, uniformly at random."""
    keys = rng.random((len(mask), facets))
    keys[((mask[:, None] >> np.arange(facets)[None, :]) & 1) == 0] = -1.0
    return keys.argmax(axis=1)


class _Tables:
    """Per question (rows) and page (columns): gold entities and facets a page names, as bitmasks."""

    def __init__(self, questions: Sequence[SearchQuestion]):
        self.gold = np.stack([q.gold_bits for q in questions])
        self.facets = np.stack([q.facet_bits for q in questions])


def _rollout(
    theta: np.ndarray, spec: WorldSpec, tables: _Tables, question: np.ndarray, rng: np.random.Generator
) -> _Batch:
    b, t_max, full = len(question), spec.max_turns, (1 << spec.facets) - 1
    broad, searched, named, last_empty = (np.zeros(b, dtype=np.int64) for _ in range(4))
    active = np.ones(b, dtype=bool)
    out = _Batch(
        question=question,
        state=np.full((b, t_max), -1, dtype=np.int64),
        action=np.full((b, t_max), -1, dtype=np.int64),
        avail=np.zeros((b, t_max, len(ACTIONS)), dtype=bool),
        steps=np.zeros(b, dtype=np.int64),
        cut=np.zeros(b, dtype=bool),
        page=np.full((b, t_max), -1, dtype=np.int64),
        new=np.zeros((b, t_max), dtype=np.int64),
        pages_seen=np.zeros(b, dtype=np.int64),
        gold_seen=np.zeros(b, dtype=np.int64),
    )
    for t in range(t_max):
        i = np.flatnonzero(active)
        if i.size == 0:
            break
        leads, blind = named[i] & ~searched[i] & full, ~named[i] & ~searched[i] & full
        state = state_index(spec, broad[i], _FACET_COUNT[leads], _FACET_COUNT[blind], last_empty[i])
        avail = np.stack([broad[i] < spec.broad_pages, leads > 0, blind > 0, np.ones(i.size, bool)], axis=1)
        p = _probabilities(theta[state], avail)
        a = (rng.random((i.size, 1)) > np.cumsum(p, axis=1)[:, :-1]).sum(axis=1)
        out.state[i, t], out.action[i, t], out.avail[i, t], out.steps[i] = state, a, avail, t + 1
        searching = a != STOP
        active[i[~searching]] = False
        if t == t_max - 1:  # the budget is spent: the search is not run, the episode is invalid
            out.cut[i[searching]] = True
            break
        s, a, leads, blind = i[searching], a[searching], leads[searching], blind[searching]
        facet = np.where(
            a == LEAD, _random_bit(leads, spec.facets, rng), _random_bit(blind, spec.facets, rng)
        )
        page = np.where(a == BROAD, broad[s], spec.broad_pages + facet)
        shown = tables.gold[question[s], page]
        out.new[s, t] = popcount(shown & ~out.gold_seen[s])
        last_empty[s] = out.new[s, t] == 0
        out.gold_seen[s] |= shown
        out.pages_seen[s] |= np.left_shift(1, page)
        out.page[s, t] = page
        named[s] |= tables.facets[question[s], page]
        searched[s] |= np.where(a == BROAD, 0, np.left_shift(1, facet))
        broad[s] += a == BROAD
    return out


def _page_sets(questions: Sequence[SearchQuestion]) -> list[list[frozenset[int]]]:
    """Per question and page, the set of gold entity indices the page shows (the step's hits)."""
    return [
        [frozenset(i for i in range(int(b).bit_length()) if int(b) >> i & 1) for b in q.gold_bits]
        for q in questions
    ]


def _final_f1(questions: Sequence[SearchQuestion], batch: _Batch) -> list[float | None]:
    """Answer F1 of every episode, ``None`` for one the budget cut off (invalid format)."""
    return [
        None if cut else float(questions[q].f1_table()[seen])
        for q, seen, cut in zip(
            batch.question.tolist(), batch.pages_seen.tolist(), batch.cut.tolist(), strict=True
        )
    ]


def step_rewards(
    arm: Arm,
    questions: Sequence[SearchQuestion],
    page_sets: Sequence[Sequence[frozenset[int]]],
    batch: _Batch,
    f1: Sequence[float | None],
    group: int,
    cost: float,
) -> np.ndarray:
    """(B, T) reward of every decision step: the project's reward functions, one call per group.
    Every search call is one query, so a search that finds nothing new earns ``-cost / |E_GT|``."""
    b, t_max = batch.state.shape
    rewards = np.zeros((b, t_max))
    question, steps, pages = batch.question.tolist(), batch.steps.tolist(), batch.page.tolist()
    for start in range(0, b, group):
        rows = range(start, start + group)
        n_search = [steps[i] - 1 for i in rows]
        if arm.reward == "terminal":
            per = [[0.0] * n + [terminal_reward(f1[i])] for i, n in zip(rows, n_search, strict=True)]
        else:
            shown = page_sets[question[start]]
            hits = [[shown[p] for p in pages[i][:n]] for i, n in zip(rows, n_search, strict=True)]
            per = group_step_rewards(
                hits,
                [[1] * n for n in n_search],
                [f1[i] for i in rows],
                questions[question[start]].n_gold,
                alpha=arm.alpha,
                beta=arm.beta,
                cost=cost,
            )
        for i, r in zip(rows, per, strict=True):
            rewards[i, : len(r)] = r
    return rewards


def advantages(arm: Arm, rewards: np.ndarray, batch: _Batch, group: int, gamma: float) -> np.ndarray:
    """(B, T) advantages: SPA or the trajectory-level advantage of the project's core."""
    b, t_max = rewards.shape
    mask = torch.from_numpy((np.arange(t_max)[None, :] < batch.steps[:, None]).astype(np.float64))
    r = torch.from_numpy(rewards)
    groups = torch.from_numpy(np.arange(b) // group)
    if arm.advantage == "spa":
        adv = step_peer_advantage(r, mask, groups, gamma=gamma)
    else:
        adv = trajectory_peer_advantage(r, mask, groups)
    return adv.numpy()


def episode_outcomes(questions: Sequence[SearchQuestion], batch: _Batch) -> dict[str, np.ndarray]:
    """Per episode, what the user gets and what the search cost (docs/mechanisms.md, "Metrics").

    ``f1`` (0 for a cut-off episode), ``recall_rare`` / ``recall_head`` (share of the question's
    rare / head entities the answer names, 0 for a cut-off episode), ``searches`` (search steps
    run), ``empty`` (those that found no new gold entity), ``after_last`` (searches after the last
    one that found a new gold entity; all of them when none did), ``invalid`` (cut off), ``blind``
    and ``lead`` (facet searches of each kind).
    """
    f1 = np.array([0.0 if x is None else x for x in _final_f1(questions, batch)])
    rare = np.array([q.rare_bits for q in questions], dtype=np.int64)[batch.question]
    n_gold = np.array([q.n_gold for q in questions], dtype=np.int64)[batch.question]
    head = ((np.int64(1) << n_gold) - 1) & ~rare
    named = np.where(batch.cut, 0, batch.gold_seen)
    searches = batch.steps - 1  # the answer turn, or the cut-off turn whose search did not run
    ran = np.arange(batch.state.shape[1])[None, :] < searches[:, None]
    found = ran & (batch.new > 0)
    last = np.where(found.any(axis=1), batch.state.shape[1] - 1 - np.argmax(found[:, ::-1], axis=1), -1)
    action = np.where(ran, batch.action, -1)
    return {
        "f1": f1,
        "recall_rare": popcount(named & rare) / popcount(rare),  # every question has a rich facet
        "recall_head": popcount(named & head) / popcount(head),
        "searches": searches.astype(float),
        "empty": ((batch.new == 0) & ran).sum(axis=1).astype(float),
        "after_last": (searches - 1 - last).astype(float),
        "invalid": batch.cut.astype(float),
        "blind": (action == BLIND).sum(axis=1).astype(float),
        "lead": (action == LEAD).sum(axis=1).astype(float),
    }


def evaluate(
    theta: np.ndarray, world: SearchWorld, spec: TrainSpec, rng: np.random.Generator
) -> dict[str, float]:
    """Means over the held-out questions, ``test_group`` rollouts each, of
    :func:`episode_outcomes`."""
    question = np.repeat(np.arange(len(world.test)), spec.test_group)
    batch = _rollout(theta, world.spec, _Tables(world.test), question, rng)
    return {k: float(v.mean()) for k, v in episode_outcomes(world.test, batch).items()}


def _policy_gradient(theta: np.ndarray, batch: _Batch, adv: np.ndarray) -> np.ndarray:
    """Sum over steps of ``A * grad log pi(a | s)`` (masked softmax), averaged over the steps."""
    valid = batch.state >= 0
    states, actions, a_t = batch.state[valid], batch.action[valid], adv[valid]
    g = -_probabilities(theta[states], batch.avail[valid]) * a_t[:, None]
    g[np.arange(len(actions)), actions] += a_t
    grad = np.zeros_like(theta)
    np.add.at(grad, states, g)
    return grad / len(actions)


def train_arm(
    arm: Arm | str, seed: int, spec: TrainSpec | None = None, world: SearchWorld | None = None
) -> Run:
    """Train ``arm`` on the world of ``seed`` and evaluate it on the held-out questions.

    The world, the order of the training questions and the sampling noise depend only on ``seed``,
    so every arm of one seed sees the same questions (paired comparisons).
    """
    arm = ARMS[arm] if isinstance(arm, str) else arm
    spec = spec or TrainSpec()
    world = world or make_world(
        seed, train_questions=spec.train_questions, test_questions=spec.test_questions
    )
    theta = np.zeros((n_states(world.spec), len(ACTIONS)))
    rng = np.random.default_rng([seed, 0x7A2])
    tables, page_sets = _Tables(world.train), _page_sets(world.train)
    run = Run(arm.name, seed)
    for _ in range(spec.iterations):
        chosen = rng.choice(len(world.train), size=spec.questions, replace=False)
        batch = _rollout(theta, world.spec, tables, np.repeat(chosen, spec.group), rng)
        f1 = _final_f1(world.train, batch)
        rewards = step_rewards(arm, world.train, page_sets, batch, f1, spec.group, spec.cost)
        adv = advantages(arm, rewards, batch, spec.group, spec.gamma)
        run.curve.append(float(np.mean([0.0 if x is None else x for x in f1])))
        theta += spec.lr * _policy_gradient(theta, batch, adv)
    run.final = evaluate(theta, world, spec, np.random.default_rng([seed, 0xE7B]))
    return run
