"""The paper's claims as mechanism tests in the controlled search world (docs/mechanisms.md).

Every arm is trained with the project's own rewards and advantages on the test's seeds (0..19,
0..39 for a claim that needs 40), and each claim's paired effect over those seeds is held to the
bound set on the calibration seeds 1000..1199 (``spader.mechanisms.claims.CLAIMS``: a floor for
a claim that holds in this world, a ceiling for one that does not). ``bench/mechanisms.py`` runs
the same on any other seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import spader.mechanisms.train as train
from spader.core.metrics import prf
from spader.mechanisms.claims import CALIBRATION, CLAIMS, effect, run_arms
from spader.mechanisms.train import ARMS, TrainSpec, train_arm
from spader.mechanisms.world import WorldSpec, make_world


@pytest.fixture(scope="module")
def results():
    """Every arm on seeds 0..19, and the arms of the claims that need 40 seeds on 20..39 too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (128, 4) tensors: more threads only add overhead
    try:
        out = run_arms(range(20))
        wide = {c.arm for c in CLAIMS if c.seeds > 20} | {c.against for c in CLAIMS if c.seeds > 20}
        more = run_arms(range(20, max(c.seeds for c in CLAIMS)), arms=sorted(wide))
    finally:
        torch.set_num_threads(threads)
    for arm, per_seed in more.items():
        out[arm].update(per_seed)
    return out


def test_the_world_has_the_papers_head_and_tail():
    """Head entities come with the broad query's first page, rare ones with their facet's page
    and seldom otherwise; a page's entities are what the project's matcher finds in its text, an
    answer's score is the project's metric."""
    spec = WorldSpec()
    world = make_world(7, train_questions=40, test_questions=0)
    head_broad, rare_broad, rare_facet = [], [], []
    for q in world.train:
        rare = np.flatnonzero(~q.head)
        for e in range(q.n_gold):
            in_broad = bool(q.gold_bits[0] >> e & 1)
            (head_broad if q.head[e] else rare_broad).append(in_broad)
        for k, e in enumerate(rare):
            rare_facet.append(bool(q.gold_bits[spec.broad_pages + k % spec.facets] >> int(e) & 1))
        assert q.answer_scores(0) == (0.0, 0.0, 0.0)
        everything = (1 << len(q.pages)) - 1
        named = [g for k, g in enumerate(q.gold) if any(p >> k & 1 for p in q.gold_bits)]
        named += [d for k, d in enumerate(q.distractors) if any(p >> k & 1 for p in q.distractor_bits)]
        assert q.answer_scores(everything) == prf(named, [[g] for g in q.gold])
    assert np.mean(head_broad) > 0.5 > 0.2 > np.mean(rare_broad)
    assert np.mean(rare_facet) > 0.6


def test_the_arms_call_the_projects_reward_and_advantage_functions(monkeypatch):
    """SPA for spader and its reward ablations, the trajectory-level advantage for no_spa and GRPO;
    the step rewards for all but GRPO, whose rewards are terminal_reward's alone."""
    calls: dict[str, int] = {}

    def spy(name):
        real = getattr(train, name)

        def wrapped(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(train, name, wrapped)

    for name in ("step_peer_advantage", "trajectory_peer_advantage", "group_step_rewards", "terminal_reward"):
        spy(name)
    spec = TrainSpec(iterations=2, questions=2, group=4, train_questions=4, test_questions=2)
    expected = {
        "spader": {"step_peer_advantage", "group_step_rewards"},
        "no_spa": {"trajectory_peer_advantage", "group_step_rewards"},
        "no_np": {"step_peer_advantage", "group_step_rewards"},
        "no_ig": {"step_peer_advantage", "group_step_rewards"},
        "grpo": {"trajectory_peer_advantage", "terminal_reward"},
    }
    for arm, names in expected.items():
        calls.clear()
        train_arm(arm, 3, spec)
        assert set(calls) == names, arm
        assert calls[next(iter(n for n in names if "advantage" in n))] == spec.iterations


def test_a_seed_reproduces_its_run():
    spec = TrainSpec(iterations=4, train_questions=16, test_questions=8)
    world = make_world(11, train_questions=16, test_questions=8)
    a, b = train_arm("spader", 11, spec), train_arm("spader", 11, spec, world)
    assert a.curve == b.curve and a.final == b.final  # the world, too, depends only on the seed
    assert train_arm("spader", 12, spec, world).final != a.final


def test_trajectory_level_advantages_give_every_step_of_a_trajectory_the_same_credit(results):
    """The contrast of finding and empty steps is exactly 0 under a trajectory-level advantage
    (no_spa, GRPO), so the credit claim compares SPA against a true zero."""
    for arm in ("no_spa", "grpo"):
        assert all(m["credit"] == 0.0 for m in results[arm].values())
    assert all(m["credit"] != 0.0 for m in results["spader"].values())


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.name for c in CLAIMS])
def test_claim(results, claim):
    """A claim that holds in this world: its mean effect over the test's seeds reaches the floor
    (>= 0). One that does not: the effect stays under the ceiling (the docs would be wrong)."""
    e = effect(results, claim, seeds=range(claim.seeds))
    assert e.n == claim.seeds and not set(range(claim.seeds)) & set(CALIBRATION)
    assert math.isfinite(claim.bound) and claim.source
    report = f"{claim.name}: {e.mean:+.4f} [{e.lo:+.4f}, {e.hi:+.4f}] p={e.p:.4f}, bound {claim.bound:+.4f}"
    if claim.holds:
        assert claim.bound >= 0
        assert e.mean >= claim.bound, report
    else:
        assert e.mean <= claim.bound, report


def test_every_arm_is_trained():
    assert set(ARMS) == {"spader", "no_spa", "no_np", "no_ig", "grpo"}
    assert {c.arm for c in CLAIMS} | {c.against for c in CLAIMS} <= set(ARMS)
