"""A small policy trained in the search world with the project's own rewards and advantages.

The policy is tabular: a softmax over the actions (``BROAD``, ``FACET_1..F``, ``STOP``) for every
history of earlier search actions (the state is the question and the actions so far; the policy
does not read the observations, so what it learns is *which* searches to make, in which order, and
when to stop). It is trained by a plain policy gradient: every decision step ``t`` of trajectory
``i`` adds ``A_t(i) * grad log pi(a_t | s_t)``, averaged over the batch's steps, to the logits.

The rewards and advantages are the project's functions, called as the verl trainer calls them:
:func:`spader.core.rewards.group_step_rewards` (search-step rewards then the terminal reward, per
group of rollouts of one question), :func:`spader.core.rewards.terminal_reward` (GRPO's reward),
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
from spader.mechanisms.world import BROAD, Question, World, WorldSpec, make_world

__all__ = ["ARMS", "Arm", "Run", "TrainSpec", "train_arm"]


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
    """Training settings (fixed before any claim was measured; docs/mechanisms.md).

    Attributes:
        iterations: policy-gradient updates. questions: questions per batch. group: rollouts per
        question (G). lr: step size on the logits. max_turns: decision steps per episode (the
        last one must answer). gamma: SPA's discount. cost: tool cost per query. train_questions,
        test_questions: the world's questions per seed. test_group: rollouts per held-out
        question in the final evaluation.
    """

    iterations: int = 60
    questions: int = 16
    group: int = 8
    lr: float = 10.0
    max_turns: int = 4
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
        credit: per batch, the mean over trajectories of (mean advantage of the search steps that
            found a new gold entity) - (mean advantage of those that found none), over the
            trajectories that have both (NaN when none has).
        final: metrics of the trained policy on the held-out questions (:func:`evaluate`).
    """

    arm: str
    seed: int
    curve: list[float] = field(default_factory=list)
    credit: list[float] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)


class _Tree:
    """Histories of search actions (length 0 .. max_turns - 1) numbered as tree nodes."""

    def __init__(self, searches: int, depth: int):
        child = []
        frontier, count = [0], 1
        child.append([-1] * searches)
        for _ in range(depth):
            nxt = []
            for node in frontier:
                for a in range(searches):
                    child[node][a] = count
                    child.append([-1] * searches)
                    nxt.append(count)
                    count += 1
            frontier = nxt
        self.child = np.array(child, dtype=np.int64)
        self.size = count


def _popcount(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 8), axis=-1).sum(axis=-1).astype(np.int64)


@dataclass
class _Batch:
    """Rollouts of one batch (B episodes, up to T steps)."""

    question: np.ndarray  # (B,) index into the question list
    node: np.ndarray  # (B, T) state of each step, -1 past the end
    action: np.ndarray  # (B, T)
    steps: np.ndarray  # (B,) decision steps taken
    cut: np.ndarray  # (B,) cut off by the turn budget (invalid)
    page: np.ndarray  # (B, T) page shown by a search step, -1 for none
    new: np.ndarray  # (B, T) new gold entities found by the step
    pages_seen: np.ndarray  # (B,) bitmask of pages shown
    gold_seen: np.ndarray  # (B,) bitmask of gold entities shown


def _rollout(
    theta: np.ndarray,
    tree: _Tree,
    spec: WorldSpec,
    bits: np.ndarray,
    question: np.ndarray,
    max_turns: int,
    rng: np.random.Generator,
) -> _Batch:
    b = len(question)
    node = np.zeros(b, dtype=np.int64)
    n_broad = np.zeros(b, dtype=np.int64)
    pages_seen = np.zeros(b, dtype=np.int64)
    gold_seen = np.zeros(b, dtype=np.int64)
    active = np.ones(b, dtype=bool)
    out = _Batch(
        question=question,
        node=np.full((b, max_turns), -1, dtype=np.int64),
        action=np.full((b, max_turns), -1, dtype=np.int64),
        steps=np.zeros(b, dtype=np.int64),
        cut=np.zeros(b, dtype=bool),
        page=np.full((b, max_turns), -1, dtype=np.int64),
        new=np.zeros((b, max_turns), dtype=np.int64),
        pages_seen=pages_seen,
        gold_seen=gold_seen,
    )
    for t in range(max_turns):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        logits = theta[node[idx]]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        a = (rng.random((idx.size, 1)) > np.cumsum(p, axis=1)[:, :-1]).sum(axis=1)
        out.node[idx, t], out.action[idx, t], out.steps[idx] = node[idx], a, t + 1
        searching = a != spec.stop
        active[idx[~searching]] = False
        s, a = idx[searching], a[searching]
        if t == max_turns - 1:  # the budget is spent: the search is not run, the episode is invalid
            out.cut[s] = True
            active[s] = False
            break
        page = np.where(a == BROAD, n_broad[s], spec.broad_pages + a - 1)
        page = np.where((a == BROAD) & (n_broad[s] >= spec.broad_pages), -1, page)  # no page left
        shown = np.where(page >= 0, bits[question[s], np.maximum(page, 0)], 0)
        out.new[s, t] = _popcount(shown & ~gold_seen[s])
        gold_seen[s] |= shown
        pages_seen[s] |= np.where(page >= 0, np.left_shift(1, np.maximum(page, 0)), 0)
        out.page[s, t] = page
        n_broad[s] += a == BROAD
        node[s] = tree.child[node[s], a]
    return out


def _page_sets(questions: Sequence[Question]) -> list[list[frozenset[int]]]:
    """Per question and page, the set of gold entity indices the page shows (the step's hits)."""
    return [
        [frozenset(i for i in range(int(b).bit_length()) if int(b) >> i & 1) for b in q.gold_bits]
        for q in questions
    ]


def _final_f1(questions: Sequence[Question], batch: _Batch) -> list[float | None]:
    """Answer F1 of every episode, ``None`` for one the budget cut off (invalid format)."""
    return [
        None if cut else questions[q].answer_scores(seen)[2]
        for q, seen, cut in zip(
            batch.question.tolist(), batch.pages_seen.tolist(), batch.cut.tolist(), strict=True
        )
    ]


_NOTHING: frozenset[int] = frozenset()


def _step_rewards(
    arm: Arm,
    questions: Sequence[Question],
    page_sets: Sequence[Sequence[frozenset[int]]],
    batch: _Batch,
    f1: Sequence[float | None],
    group: int,
    cost: float,
) -> np.ndarray:
    """(B, T) reward of every decision step: the project's reward functions, one call per group."""
    b, t_max = batch.node.shape
    rewards = np.zeros((b, t_max))
    question, steps, pages = batch.question.tolist(), batch.steps.tolist(), batch.page.tolist()
    for start in range(0, b, group):
        rows = range(start, start + group)
        n_search = [steps[i] - 1 for i in rows]
        if arm.reward == "terminal":
            per = [[0.0] * n + [terminal_reward(f1[i])] for i, n in zip(rows, n_search, strict=True)]
        else:
            shown = page_sets[question[start]]
            hits = [
                [shown[p] if p >= 0 else _NOTHING for p in pages[i][:n]]
                for i, n in zip(rows, n_search, strict=True)
            ]
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


def _advantages(arm: Arm, rewards: np.ndarray, batch: _Batch, group: int, gamma: float) -> np.ndarray:
    b, t_max = rewards.shape
    mask = torch.from_numpy((np.arange(t_max)[None, :] < batch.steps[:, None]).astype(np.float64))
    r = torch.from_numpy(rewards)
    groups = torch.from_numpy(np.arange(b) // group)
    if arm.advantage == "spa":
        adv = step_peer_advantage(r, mask, groups, gamma=gamma)
    else:
        adv = trajectory_peer_advantage(r, mask, groups)
    return adv.numpy()


def _credit(adv: np.ndarray, batch: _Batch) -> float:
    """Mean over trajectories of (mean advantage of finding search steps - of the others)."""
    t = np.arange(adv.shape[1])[None, :]
    search = t < (batch.steps - 1)[:, None]
    found = search & (batch.new > 0)
    empty = search & (batch.new == 0)
    both = found.any(axis=1) & empty.any(axis=1)
    if not both.any():
        return float("nan")
    mean_found = (adv * found).sum(axis=1)[both] / found.sum(axis=1)[both]
    mean_empty = (adv * empty).sum(axis=1)[both] / empty.sum(axis=1)[both]
    return float(np.mean(mean_found - mean_empty))


def _bits_table(questions: Sequence[Question]) -> np.ndarray:
    return np.stack([q.gold_bits for q in questions])


def evaluate(
    theta: np.ndarray, tree: _Tree, world: World, spec: TrainSpec, rng: np.random.Generator
) -> dict[str, float]:
    """Metrics of the policy ``theta`` on the held-out questions, ``test_group`` rollouts each.

    Returns:
        ``f1`` (answer F1, 0 for an invalid answer), ``recall_rare`` / ``recall_head`` (share of
        the rare / head gold entities the answer names, 0 for an invalid answer), ``searches``
        (search steps run per episode), ``low_yield`` (search steps that found no new gold entity,
        per episode), ``invalid`` (share of episodes cut off by the budget), ``broad`` (broad
        searches per episode; the rest are facet searches), ``group_rare`` (share of a question's
        rare entities that at least one of its ``test_group`` rollouts surfaced).
    """
    qs = world.test
    bits = _bits_table(qs)
    question = np.repeat(np.arange(len(qs)), spec.test_group)
    batch = _rollout(theta, tree, world.spec, bits, question, spec.max_turns, rng)
    f1 = np.array([0.0 if x is None else x for x in _final_f1(qs, batch)])
    head_bits = np.array([sum(1 << k for k in np.flatnonzero(q.head)) for q in qs], dtype=np.int64)
    all_bits = np.array([(1 << q.n_gold) - 1 for q in qs], dtype=np.int64)
    rare_bits = all_bits & ~head_bits
    named = np.where(batch.cut, 0, batch.gold_seen)
    qi = batch.question
    searches = batch.steps - 1  # the answer turn, or the cut-off turn whose search did not run
    ran = np.arange(spec.max_turns)[None, :] < searches[:, None]
    group_seen = np.bitwise_or.reduce(batch.gold_seen.reshape(len(qs), spec.test_group), axis=1)
    action = np.where(ran, batch.action, -1)
    return {
        "f1": float(f1.mean()),
        "recall_rare": float(np.mean(_popcount(named & rare_bits[qi]) / _popcount(rare_bits[qi]))),
        "recall_head": float(np.mean(_popcount(named & head_bits[qi]) / _popcount(head_bits[qi]))),
        "searches": float(searches.mean()),
        "low_yield": float(((batch.new == 0) & ran).sum(axis=1).mean()),
        "invalid": float(batch.cut.mean()),
        "broad": float((action == BROAD).sum(axis=1).mean()),
        "group_rare": float(np.mean(_popcount(group_seen & rare_bits) / _popcount(rare_bits))),
    }


def train_arm(arm: Arm | str, seed: int, spec: TrainSpec | None = None, world: World | None = None) -> Run:
    """Train ``arm`` on the world of ``seed`` and evaluate it on the held-out questions.

    The world, the order of the training questions and the sampling noise depend only on ``seed``,
    so every arm of one seed sees the same questions (paired comparisons).
    """
    arm = ARMS[arm] if isinstance(arm, str) else arm
    spec = spec or TrainSpec()
    world = world or make_world(
        seed, train_questions=spec.train_questions, test_questions=spec.test_questions
    )
    tree = _Tree(world.spec.actions - 1, spec.max_turns - 1)
    theta = np.zeros((tree.size, world.spec.actions))
    rng = np.random.default_rng([seed, 0x7A1])
    bits = _bits_table(world.train)
    page_sets = _page_sets(world.train)
    run = Run(arm.name, seed)
    for _ in range(spec.iterations):
        chosen = rng.choice(len(world.train), size=spec.questions, replace=False)
        question = np.repeat(chosen, spec.group)
        batch = _rollout(theta, tree, world.spec, bits, question, spec.max_turns, rng)
        f1 = _final_f1(world.train, batch)
        rewards = _step_rewards(arm, world.train, page_sets, batch, f1, spec.group, spec.cost)
        adv = _advantages(arm, rewards, batch, spec.group, spec.gamma)
        run.curve.append(float(np.mean([0.0 if x is None else x for x in f1])))
        run.credit.append(_credit(adv, batch))
        # plain policy gradient: sum over steps of A * grad log pi(a | s), averaged over the steps
        valid = batch.node >= 0
        nodes, actions, a_t = batch.node[valid], batch.action[valid], adv[valid]
        logits = theta[nodes]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        g = -p * a_t[:, None]
        g[np.arange(len(actions)), actions] += a_t
        grad = np.zeros_like(theta)
        np.add.at(grad, nodes, g)
        theta += spec.lr * grad / len(actions)
    run.final = evaluate(theta, tree, world, spec, np.random.default_rng([seed, 0xE7A]))
    return run
