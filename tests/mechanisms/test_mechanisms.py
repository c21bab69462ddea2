"""The controlled search world, its trainer and the claims' logic (docs/mechanisms.md).

The claims themselves are measured by ``bench/mechanisms.py`` over 100 seeds, outside the tests;
here: the world has what every claim needs (observations in the policy's state, facets that differ
in yield, room to stop, a tool cost on an empty search), the arms call the project's functions,
what holds by construction holds as a formula, the verdicts can say "no", and the docs' verdicts
are those of the committed held-out record.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import spader.mechanisms.train as train
from spader.core.advantage import step_peer_advantage, trajectory_peer_advantage
from spader.core.metrics import prf
from spader.core.rewards import group_step_rewards
from spader.mechanisms.claims import (
    CALIBRATION,
    CLAIMS,
    HELD_OUT,
    METRICS,
    Claim,
    disagreements,
    effect,
    verdict,
)
from spader.mechanisms.train import ARMS, TrainSpec, n_states, state_index, train_arm
from spader.mechanisms.world import ACTIONS, BROAD, LEAD, STOP, make_world

REPO = Path(__file__).resolve().parents[2]
SMALL = TrainSpec(iterations=3, questions=4, group=4, train_questions=8, test_questions=4, test_group=4)


@pytest.fixture(scope="module")
def world():
    return make_world(3000, train_questions=48, test_questions=0)


def test_facets_differ_in_yield_and_leads_point_at_the_rich_ones(world):
    """Rich facets hold 3-5 rare entities, poor ones 0-1; a rare entity is on its facet's page far
    more often than elsewhere; a facet that the broad pages name (a lead) is rich far more often
    than a facet picked at random."""
    spec = world.spec
    sizes, lead_rich, rare_own, rare_broad = [], [], [], []
    for q in world.train:
        size = np.bincount(q.facet_of[~q.head], minlength=spec.facets)
        sizes += size.tolist()
        broad_named = int(np.bitwise_or.reduce(q.facet_bits[: spec.broad_pages]))
        lead_rich += [size[f] >= spec.rich[0] for f in range(spec.facets) if broad_named >> f & 1]
        for e in np.flatnonzero(~q.head):
            rare_own.append(bool(q.gold_bits[spec.broad_pages + q.facet_of[e]] >> int(e) & 1))
            rare_broad.append(any(q.gold_bits[p] >> int(e) & 1 for p in range(spec.broad_pages)))
    rich = np.array(sizes) >= spec.rich[0]
    assert set(np.array(sizes)[rich]) <= set(range(3, 6)) and set(np.array(sizes)[~rich]) <= {0, 1}
    assert 0.15 < rich.mean() < 0.45
    assert np.mean(lead_rich) > rich.mean() + 0.4
    assert np.mean(rare_own) > 0.5 > 0.25 > np.mean(rare_broad)


def test_the_answer_score_is_the_projects_metric_on_every_set_of_pages(world):
    for q in world.train[:3]:
        table = q.f1_table()
        assert len(table) == 1 << len(q.pages)
        for seen in range(len(table)):
            assert table[seen] == pytest.approx(q.answer_scores(seen)[2], abs=1e-12)
        everything = len(table) - 1
        named = [g for k, g in enumerate(q.gold) if any(p >> k & 1 for p in q.gold_bits)]
        named += [d for k, d in enumerate(q.distractors) if any(p >> k & 1 for p in q.distractor_bits)]
        assert q.answer_scores(everything) == prf(named, [[g] for g in q.gold])


def test_the_state_is_what_the_searches_returned(world):
    """Each step's state is recomputed from the pages the episode has seen: broad pages read, facets
    a seen page named and not yet searched (leads), facets never named (blind), whether the last
    search found a new gold entity; and an action is available exactly when the state allows it."""
    spec, tables = world.spec, train._Tables(world.train)
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(n_states(spec), len(ACTIONS)))  # a random policy visits many states
    batch = train._rollout(theta, spec, tables, np.repeat(np.arange(len(world.train)), 4), rng)
    checked = 0
    for i, qi in enumerate(batch.question):
        q, seen_pages, gold, searched = world.train[qi], [], 0, 0
        last_empty = 0
        for t in range(batch.steps[i]):
            named = int(np.bitwise_or.reduce([q.facet_bits[p] for p in seen_pages] or [0]))
            full = (1 << spec.facets) - 1
            leads, blind = named & ~searched & full, ~named & ~searched & full
            broad = sum(p < spec.broad_pages for p in seen_pages)
            expected = state_index(spec, broad, bin(leads).count("1"), bin(blind).count("1"), last_empty)
            assert batch.state[i, t] == expected
            assert list(batch.avail[i, t]) == [broad < spec.broad_pages, leads > 0, blind > 0, True]
            a, page = batch.action[i, t], batch.page[i, t]
            if a == STOP or page < 0:
                break
            if a == BROAD:
                assert page == broad
            else:
                f = page - spec.broad_pages
                assert (leads if a == LEAD else blind) >> f & 1
                searched |= 1 << f
            new = int(q.gold_bits[page]) & ~gold
            assert batch.new[i, t] == bin(new).count("1")
            gold |= int(q.gold_bits[page])
            last_empty = int(new == 0)
            seen_pages.append(page)
            checked += 1
    assert checked > 500 and len(set(batch.state[batch.state >= 0].tolist())) > 30


def test_an_episode_has_room_to_stop_and_is_cut_off_at_its_budget(world):
    """More searches exist than fit (so stopping is a choice), and a policy that never stops is cut
    off at its last turn: the search is not run and the answer is invalid."""
    spec = world.spec
    assert spec.broad_pages + spec.facets > spec.max_turns - 1 >= 5
    theta = np.zeros((n_states(spec), len(ACTIONS)))
    theta[:, STOP] = -50.0
    batch = train._rollout(theta, spec, train._Tables(world.train), np.arange(8), np.random.default_rng(1))
    assert batch.cut.all() and (batch.steps == spec.max_turns).all()
    assert (batch.page[:, -1] == -1).all() and (batch.page[:, :-1] >= 0).all()
    assert train._final_f1(world.train, batch) == [None] * 8


@pytest.mark.parametrize("arm", ["spader", "no_np", "no_ig", "grpo"])
def test_a_search_that_finds_nothing_new_costs_the_tool_cost(world, arm):
    """A step-reward arm pays ``cost / |E_GT|`` for a search that found no new gold entity (as in
    the paper, per search call); GRPO's search steps earn 0 and its answer the terminal F1 only."""
    spec = world.spec
    theta = np.zeros((n_states(spec), len(ACTIONS)))
    theta[:, STOP] = -3.0  # long episodes: their late searches often find nothing new
    rng = np.random.default_rng(2)
    batch = train._rollout(theta, spec, train._Tables(world.train), np.repeat(np.arange(8), 8), rng)
    f1 = train._final_f1(world.train, batch)
    rewards = train.step_rewards(ARMS[arm], world.train, train._page_sets(world.train), batch, f1, 8, 0.01)
    assert batch.cut.any() and not batch.cut.all()
    n_gold = np.array([q.n_gold for q in world.train])[batch.question]
    searches = batch.steps - 1
    ran = np.arange(spec.max_turns)[None, :] < searches[:, None]
    empty = ran & (batch.new == 0)
    assert empty.sum() > 10
    expected = 0.0 if arm == "grpo" else -0.01 / np.broadcast_to(n_gold[:, None], empty.shape)[empty]
    np.testing.assert_allclose(rewards[empty], expected, atol=1e-15)
    finding = ran & (batch.new > 0)
    assert (rewards[finding] > 0).all() if arm != "grpo" else (rewards[finding] == 0).all()
    answer = rewards[np.arange(len(f1)), batch.steps - 1]
    np.testing.assert_allclose(answer, [-1.0 if x is None else x for x in f1])


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
    expected = {
        "spader": {"step_peer_advantage", "group_step_rewards"},
        "no_spa": {"trajectory_peer_advantage", "group_step_rewards"},
        "no_np": {"step_peer_advantage", "group_step_rewards"},
        "no_ig": {"step_peer_advantage", "group_step_rewards"},
        "grpo": {"trajectory_peer_advantage", "terminal_reward"},
    }
    for arm, names in expected.items():
        calls.clear()
        train_arm(arm, 3, SMALL)
        assert set(calls) == names, arm
        assert calls[next(iter(n for n in names if "advantage" in n))] == SMALL.iterations


def test_a_seed_reproduces_its_run():
    world = make_world(11, train_questions=SMALL.train_questions, test_questions=SMALL.test_questions)
    a, b = train_arm("spader", 11, SMALL), train_arm("spader", 11, SMALL, world)
    assert a.curve == b.curve and a.final == b.final  # the world, too, depends only on the seed
    assert train_arm("spader", 12, SMALL, world).final != a.final
    assert set(a.final) | {"f1_auc"} == set(METRICS)


# What holds by construction: formulas of the method, not claims about what it achieves.


def test_a_trajectory_level_advantage_gives_every_step_the_same_credit_spa_does_not():
    """The trajectory-level advantage is constant over a trajectory's steps (so its contrast of
    finding and empty steps is 0 by definition); SPA's follows the step's future return."""
    rewards = torch.tensor([[0.5, 0.0, 0.6], [0.1, 0.4, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float64)
    groups = torch.zeros(3, dtype=torch.int64)
    traj = trajectory_peer_advantage(rewards, mask, groups)
    for row, m in zip(traj, mask, strict=True):
        assert len(set(row[m.bool()].tolist())) == 1
    spa = step_peer_advantage(rewards, mask, groups, gamma=0.9)
    assert len(set(spa[0].tolist())) == 3


def test_a_groups_novelty_premium_sums_to_beta_per_distinct_entity():
    """Summed over a group, the premium beta / N(e) of every trajectory that found e is beta times
    the number of distinct entities the group found, whatever the rollouts do: an identity, so
    the premium a group collects is no evidence of anything."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        group, n_gt = 8, 12
        hits = [[set(rng.choice(n_gt, size=rng.integers(0, 4), replace=False).tolist()) for _ in range(3)]
                for _ in range(group)]  # fmt: skip
        rewards = group_step_rewards(
            hits, [[1] * 3] * group, [0.0] * group, n_gt, alpha=0.0, beta=4.0, cost=0.0
        )
        distinct = set().union(*(s for h in hits for s in h))
        assert sum(sum(r[:-1]) for r in rewards) * n_gt == pytest.approx(4.0 * len(distinct))


# The verdicts and the bench


def test_a_verdict_can_say_holds_contradicted_or_no_evidence():
    assert verdict(0.01, 0.2) == "holds"
    assert verdict(-0.2, -0.01) == "contradicted"
    assert verdict(-0.01, 0.2) == verdict(-np.inf, np.inf) == "no evidence"


def test_a_claims_effect_is_a_paired_difference_with_an_interval_from_the_sign_flip_test():
    claim = Claim("x", "x", "spader", "grpo", "f1", "holds")
    seeds = range(40)
    rng = np.random.default_rng(3)
    base = rng.normal(0.5, 0.2, size=40)  # shared by the pair: paired, it cancels

    def results(shift):
        return {
            "spader": {s: {"f1": base[s] + shift + rng.normal(0, 0.01)} for s in seeds},
            "grpo": {s: {"f1": base[s]} for s in seeds},
        }

    up, down, flat = effect(results(0.02), claim), effect(results(-0.02), claim), effect(results(0.0), claim)
    assert up.n == 40 and up.lo > 0 and verdict(up.lo, up.hi) == "holds"
    assert verdict(down.lo, down.hi) == "contradicted" and down.mean == pytest.approx(-0.02, abs=0.005)
    assert flat.lo < 0 < flat.hi


def test_the_bench_fails_only_where_a_documented_effect_does_not_come_out_again():
    claims = [Claim(n, n, "spader", "grpo", "f1", d) for n, d in
              (("a", "holds"), ("b", "contradicted"), ("c", "no evidence"))]  # fmt: skip
    ok = {"a": "holds", "b": "contradicted", "c": "holds"}
    assert disagreements(ok, claims) == []
    assert disagreements({**ok, "a": "no evidence"}, claims) == ["a: no evidence, documented as holds"]
    assert disagreements({**ok, "b": "no evidence"}, claims) == ["b: no evidence, documented as contradicted"]
    assert disagreements({**ok, "c": "contradicted"}, claims) == []


def _bench():
    spec = importlib.util.spec_from_file_location("bench_mechanisms", REPO / "bench" / "mechanisms.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


def test_the_bench_writes_its_claims_and_exits_by_the_documented_verdicts(tmp_path, capsys):
    """On three seeds and a tiny trainer (the logic, not the numbers): the JSON file's ``claims``
    list holds one object per claim with the fields the docs name, the record one row per claim,
    and the exit status is 1 exactly when a documented effect does not come out."""
    bench = _bench()
    out = tmp_path / "claims.json"
    argv = ["--seeds", "3", "--seed-offset", "7", "--json", str(out), "--records", str(tmp_path)]
    status = bench.main(argv, spec=SMALL)
    claims = json.loads(out.read_text())["claims"]
    assert [c["name"] for c in claims] == [c.name for c in CLAIMS]
    for c in claims:
        assert {"name", "metric", "verdict", "documented", "diff", "lo", "hi", "seeds"} <= set(c)
        assert c["seeds"] == 3 and c["verdict"] == "no evidence"  # 3 seeds cannot bound an effect
    assert status == (1 if disagreements({c["name"]: c["verdict"] for c in claims}) else 0)
    (record,) = tmp_path.glob("*-mechanisms.yaml")
    rows = yaml.safe_load(record.read_text())["rows"]
    assert [r["id"] for r in rows] == [c.name for c in CLAIMS]
    assert "no evidence" in capsys.readouterr().out


def test_the_docs_verdicts_are_those_of_the_committed_held_out_run():
    """docs/mechanisms.md quotes the claims table of the latest bench record over the held-out seeds
    (bench/report.py check holds the rendering); its verdicts are the documented ones, over at
    least 100 seeds disjoint from the calibration seeds."""
    records = sorted((REPO / "bench" / "records").glob("*-mechanisms*.yaml"))
    block = f"{HELD_OUT.start}-{HELD_OUT.stop - 1}"
    held = [
        r
        for r in map(lambda p: yaml.safe_load(p.read_text()), records)
        if f"claims-{block}" in (r.get("tables") or {})
    ]
    assert held, f"no record of bench/mechanisms.py over seeds {block}"
    latest = max(held, key=lambda r: str(r["written"]))
    found = {row["id"]: row["numbers"] for row in latest["rows"]}
    assert set(found) == {c.name for c in CLAIMS}
    for c in CLAIMS:
        assert found[c.name]["verdict"] == c.documented, c.name
        assert found[c.name]["seeds"] >= 100 and found[c.name]["first_seed"] == HELD_OUT.start
    assert not set(HELD_OUT) & set(CALIBRATION) and len(HELD_OUT) >= 100
    page = (REPO / "docs" / "mechanisms.md").read_text()
    assert f"<!-- bench: bench/mechanisms.py table=claims-{block} -->" in page
