"""Dense step rewards of a batch: alignment of tool records with assistant runs, group rewards."""

import random

import pytest
import torch
from loop_reference import reference_dense_rewards

from spader.core.rewards import StepRewardWeights
from spader.methods.spader.densify import densify_rewards
from spader.methods.steps import StepRecord, parse_step_records

WEIGHTS = StepRewardWeights(alpha=1.0, beta=4.0, cost=0.01)


def test_hand_computed_group():
    # group "u" of two trajectories, |E_GT| = 2
    # t0: search (turn 1) finds {0} with 2 queries, then answers (F1 0.5)
    # t1: search (turn 1) finds {0, 1} with 1 query, search (turn 2) finds {1} again, then invalid (-1)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 0, 0], [1, 0, 0, 1, 0, 1, 1, 0]])
    records = [
        [StepRecord(turn=1, queries=2, hits=(0,))],
        [StepRecord(turn=1, queries=1, hits=(0, 1)), StepRecord(turn=2, queries=1, hits=(1,))],
    ]
    dense, stats = densify_rewards(mask, torch.tensor([0.5, -1.0]), ["u", "u"], records, [2, 2], WEIGHTS)
    r_e0 = 1 + 4 / 2  # found by both trajectories
    r_e1 = 1 + 4 / 1  # found by t1 only
    expected = [
        [0, (r_e0 - 0.01) / 2, 0, 0, 0.5, 0, 0, 0],  # 0.01 per search call
        [(r_e0 + r_e1 - 0.01) / 2, 0, 0, -0.01 / 2, 0, 0, -1.0, 0],
    ]
    assert dense.tolist() == [pytest.approx(row) for row in expected]
    assert (stats.trajectories, stats.search_steps, stats.new_entities) == (2, 3, 3)
    assert stats.missing_records == stats.dropped_records == 0


def test_groups_are_independent():
    # the same entity index in two different prompts is two different entities
    mask = torch.tensor([[1, 0, 1], [1, 0, 1]])
    records = [[StepRecord(1, 1, (0,))], [StepRecord(1, 1, (0,))]]
    dense, _ = densify_rewards(
        mask, torch.zeros(2), ["a", "b"], records, [1, 1], StepRewardWeights(alpha=0.0, beta=1.0, cost=0.0)
    )
    assert dense[:, 0].tolist() == [1.0, 1.0]  # unique finds in their own groups


def test_cut_off_episode_drops_the_record_of_its_last_turn():
    # the episode hit the length cap inside the observation of turn 2: run 2 is the last step and
    # gets the terminal reward only; its record has no search step to sit on
    mask = torch.tensor([[1, 0, 1, 0, 0]])
    records = [[StepRecord(1, 1, (0,)), StepRecord(2, 1, (1,))]]
    dense, stats = densify_rewards(mask, torch.tensor([-1.0]), ["u"], records, [2], WEIGHTS)
    assert dense.tolist() == [[pytest.approx((5 - 0.01) / 2), 0, -1.0, 0, 0]]
    assert stats.dropped_records == 1


def test_search_turn_without_a_record_finds_nothing_and_is_counted():
    mask = torch.tensor([[1, 0, 1, 0, 1]])
    records = [[StepRecord(2, 1, (0,))]]  # turn 1's tool call failed before recording
    dense, stats = densify_rewards(mask, torch.tensor([1.0]), ["u"], records, [1], WEIGHTS)
    assert dense.tolist() == [[0.0, 0, pytest.approx(5 - 0.01), 0, 1.0]]
    assert stats.missing_records == 1


def test_padding_rows_and_empty_responses_stay_zero():
    mask = torch.tensor([[0, 0], [1, 0], [0, 0]])
    records = [[StepRecord(1, 1, (0,))], [], []]
    dense, stats = densify_rewards(
        mask,
        torch.tensor([0.0, 0.7, 0.3]),
        ["p", "u", "v"],
        records,
        [1, 1, 1],
        WEIGHTS,
        skip=[True, False, False],
    )
    assert dense.tolist() == [[0, 0], [pytest.approx(0.7), 0], [0, 0]]
    assert stats.empty_responses == 1


def test_inconsistent_inputs_raise():
    mask = torch.tensor([[1, 0, 1], [1, 0, 1]])
    records = [[StepRecord(1, 1, (0,))], [StepRecord(1, 1, (0,))]]
    with pytest.raises(ValueError, match="disagree on the number of gold entities"):
        densify_rewards(mask, torch.zeros(2), ["u", "u"], records, [1, 2], WEIGHTS)
    with pytest.raises(ValueError, match="no trajectory recorded spader_n_gold"):
        densify_rewards(mask, torch.zeros(2), ["u", "u"], records, [None, None], WEIGHTS)
    with pytest.raises(ValueError, match="2 responses but 1 group ids"):
        densify_rewards(mask, torch.zeros(2), ["u"], records, [1, 1], WEIGHTS)


def test_parse_step_records_names_the_bad_record():
    good = {"spader_steps": [{"turn": 1, "queries": 2, "hits": [3], "error": None}]}
    assert parse_step_records(good) == [StepRecord(1, 2, (3,))]
    assert parse_step_records({}) == []
    with pytest.raises(ValueError, match=r"row 4\[0\].*queries"):
        parse_step_records({"spader_steps": [{"turn": 1}]}, where="row 4")
    with pytest.raises(ValueError, match="turn must be >= 1"):
        parse_step_records({"spader_steps": [{"turn": 0, "queries": 1}]})


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("novelty", "cost_per"), [("inverse", "call"), ("exp_decay", "query")])
def test_densify_equals_the_loop_reference(seed, novelty, cost_per):
    rnd = random.Random(seed)
    b, length, n_groups = 12, 40, 3
    masks, records, groups, n_gold = [], [], [], []
    gold_of = {g: rnd.randint(1, 6) for g in range(n_groups)}
    for _ in range(b):
        row, turn, pos, recs = [0] * length, 0, 0, []
        valid = rnd.randint(0, length)
        while pos < valid:
            run = rnd.randint(1, 4)
            row[pos : min(pos + run, valid)] = [1] * (min(pos + run, valid) - pos)
            turn += 1
            if rnd.random() < 0.85:  # occasionally a search turn leaves no record
                g_hits = tuple(rnd.sample(range(6), rnd.randint(0, 3)))
                recs.append((turn, rnd.randint(0, 4), g_hits))
            pos += run + rnd.randint(1, 5)
        g = rnd.randrange(n_groups)
        masks.append(row)
        groups.append(g)
        n_gold.append(gold_of[g])
        records.append([StepRecord(t, q, tuple(h for h in hs if h < gold_of[g])) for t, q, hs in recs])
    terminal = [rnd.choice([-1.0, 0.0, 0.25, 1.0]) for _ in range(b)]
    kw = dict(alpha=1.0, beta=4.0, cost=0.05, novelty=novelty, cost_scale=0.5, cost_per=cost_per)
    dense, _ = densify_rewards(
        torch.tensor(masks), torch.tensor(terminal), groups, records, n_gold, StepRewardWeights(**kw)
    )
    expected = reference_dense_rewards(masks, terminal, groups, records, n_gold, **kw)
    assert torch.allclose(dense, torch.tensor(expected, dtype=torch.float32), atol=1e-6)
