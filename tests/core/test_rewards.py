"""Diversity-aware rewards: hand-computed tables (docs/method.md, "Rewards")."""

import math

import pytest

from spader.core.rewards import (
    cost_warmup_scale,
    find_hits,
    group_step_rewards,
    novelty_premium,
    search_step_rewards,
    terminal_reward,
)

ENTITIES = [["Paris"], ["Saint-Malo Express", "Malo Express"], ["Lyon", "Lugdunum"], ["The Salt Orchard"]]


@pytest.mark.parametrize(
    "passages, expected",
    [
        (["Trains from Paris to Lyon."], {0, 2}),  # plain whole-word hits
        (["The Saintmalo Express leaves at noon"], {1}),  # hyphen deleted by norm_v1, as in the alias
        (["Comparisons: Parisian cafes"], set()),  # "paris" inside "parisian" is not a whole word
        (["An old name is LUGDUNUM."], {2}),  # second alias, case folded
        (["salt orchard (film)"], {3}),  # article dropped on both sides
        (["Ly", "on the map"], set()),  # no match across two passages
        (["", ""], set()),  # empty observation
        (["Paris", "Paris again"], {0}),  # an entity is hit once
    ],
)
def test_find_hits_table(passages, expected):
    assert find_hits(passages, ENTITIES) == expected


def test_find_hits_ignores_aliases_that_normalize_to_nothing():
    # an alias of pure punctuation would otherwise match every text
    assert find_hits(["anything at all"], [["!!!"], ["the"]]) == set()


# One group of three trajectories, |E_GT| = 4, alpha 1, beta 4, cost 0.01.
# traj 0: step 1 finds {0, 1} with 2 queries, step 2 finds {1, 2} with 1 query (1 is old)
# traj 1: step 1 finds {0} with 3 queries
# traj 2: step 1 finds nothing with 1 query, step 2 finds {3} with 2 queries
# N(0) = 2, N(1) = 1, N(2) = 1, N(3) = 1 -> R(0) = 1 + 4/2 = 3, R(1) = R(2) = R(3) = 5
HITS = [[{0, 1}, {1, 2}], [{0}], [set(), {3}]]
QUERIES = [[2, 1], [3], [1, 2]]
EXPECTED = [  # the paper's Cost(a_t): 0.01 per search call
    [(3 + 5 - 0.01) / 4, (5 - 0.01) / 4],
    [(3 - 0.01) / 4],
    [(0 - 0.01) / 4, (5 - 0.01) / 4],
]
EXPECTED_PER_QUERY = [  # the authors' code: 0.01 per query
    [(3 + 5 - 0.02) / 4, (5 - 0.01) / 4],
    [(3 - 0.03) / 4],
    [(0 - 0.01) / 4, (5 - 0.02) / 4],
]


def test_search_step_rewards_hand_computed():
    got = search_step_rewards(HITS, QUERIES, 4, alpha=1.0, beta=4.0, cost=0.01)
    assert [[pytest.approx(v) for v in row] for row in EXPECTED] == got
    per_query = search_step_rewards(HITS, QUERIES, 4, alpha=1.0, beta=4.0, cost=0.01, cost_per="query")
    assert [[pytest.approx(v) for v in row] for row in EXPECTED_PER_QUERY] == per_query
    # a call that issued no query (a malformed one) costs nothing either way
    for per in ("call", "query"):
        assert search_step_rewards([[set()]], [[0]], 1, alpha=1.0, beta=4.0, cost=0.5, cost_per=per) == [
            [0.0]
        ]
    with pytest.raises(ValueError, match="cost_per"):
        search_step_rewards(HITS, QUERIES, 4, alpha=1.0, beta=4.0, cost=0.01, cost_per="token")


def test_no_np_and_no_ig_ablations():
    # beta = 0: every new entity is worth alpha; alpha = 0: only the novelty premium counts
    no_np = search_step_rewards(HITS, QUERIES, 4, alpha=1.0, beta=0.0, cost=0.0)
    assert no_np == [[0.5, 0.25], [0.25], [0.0, 0.25]]
    no_ig = search_step_rewards(HITS, QUERIES, 4, alpha=0.0, beta=4.0, cost=0.0)
    assert no_ig == [[(2 + 4) / 4, 4 / 4], [2 / 4], [0.0, 4 / 4]]


def test_head_entity_found_by_all_gets_alpha_plus_beta_over_g():
    g = 4
    rewards = search_step_rewards([[{0}]] * g, [[0]] * g, 1, alpha=1.0, beta=4.0, cost=0.5)
    assert rewards == [[1.0 + 4.0 / g]] * g


def test_exp_decay_novelty_option():
    got = search_step_rewards(HITS, QUERIES, 4, alpha=1.0, beta=4.0, cost=0.0, novelty="exp_decay")
    r0 = 1 + 4 * math.exp(-1)  # found by two trajectories
    assert got[1] == [pytest.approx(r0 / 4)]
    assert got[0][0] == pytest.approx((r0 + 5) / 4)
    assert novelty_premium(1, novelty="exp_decay") == 1.0
    with pytest.raises(ValueError, match="novelty must be one of"):
        novelty_premium(2, novelty="log")


def test_cost_scale_multiplies_the_tool_cost():
    got = search_step_rewards(
        [[set()]], [[3]], 2, alpha=1.0, beta=4.0, cost=0.01, cost_scale=0.5, cost_per="query"
    )
    assert got == [[pytest.approx(-0.015 / 2)]]


@pytest.mark.parametrize(
    "step, expected",
    [(1, 0.0), (100, 0.0), (101, 0.01), (150, 0.5), (200, 1.0), (375, 1.0)],
)
def test_cost_warmup_schedule_of_the_authors_code(step, expected):
    # 100 free steps, then a 100-step linear ramp (docs/method.md, "Known divergences")
    assert cost_warmup_scale(step, free_steps=100, ramp_steps=100) == pytest.approx(expected)


def test_cost_warmup_without_ramp_is_a_step_function():
    assert [cost_warmup_scale(s, free_steps=3, ramp_steps=0) for s in (3, 4)] == [0.0, 1.0]


@pytest.mark.parametrize(
    "f1, invalid, expected",
    [(0.4, -1.0, 0.4), (None, -1.0, -1.0), (None, 0.0, 0.0), (0.0, -1.0, 0.0)],
)
def test_terminal_reward(f1, invalid, expected):
    # the empty answer [] is valid with F1 0 (last row); the authors' code gives 0 for invalid format
    assert terminal_reward(f1, invalid_format_reward=invalid) == expected


def test_group_step_rewards_appends_the_terminal_reward():
    got = group_step_rewards(HITS, QUERIES, [0.5, None, 1.0], 4, alpha=1.0, beta=4.0, cost=0.01)
    assert [len(r) for r in got] == [3, 2, 3]
    assert [r[-1] for r in got] == [0.5, -1.0, 1.0]
    assert got[0][:-1] == pytest.approx(EXPECTED[0])
    code = group_step_rewards(
        HITS, QUERIES, [0.5, None, 1.0], 4, alpha=1.0, beta=4.0, cost=0.01, invalid_format_reward=0.0
    )
    assert code[1][-1] == 0.0


def test_only_new_entities_of_a_trajectory_are_rewarded():
    # finding the same entity again at a later step earns nothing but still costs the queries
    got = search_step_rewards([[{0}, {0}, {0}]], [[1, 1, 1]], 1, alpha=1.0, beta=0.0, cost=0.1)
    assert got == [[pytest.approx(0.9), pytest.approx(-0.1), pytest.approx(-0.1)]]


@pytest.mark.parametrize(
    "hits, queries, n_gt, message",
    [
        ([[{0}]], [[1]], 0, "n_gt"),
        ([[{5}]], [[1]], 2, r"outside \[0, 2\)"),
        ([[{0}]], [[1, 2]], 1, "1 steps of hits but 2 steps of query counts"),
        ([[{0}]], [[-1]], 1, "query counts must be >= 0"),
        ([[{0}], []], [[1]], 1, "queries has 1"),
    ],
)
def test_bad_inputs_raise_clear_errors(hits, queries, n_gt, message):
    with pytest.raises(ValueError, match=message):
        search_step_rewards(hits, queries, n_gt, alpha=1.0, beta=1.0, cost=0.0)


def test_terminal_reward_rejects_out_of_range_f1():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        terminal_reward(1.5)


def test_passage_hits_matches_titles_and_texts_separately():
    from spader.core.rewards import passage_hits

    shown = [
        [{"title": "Salt Orchard", "text": "a film by Ilse Varga"}],
        [{"title": "Winter", "text": "Quay of the port"}],
    ]
    entities = [["The Salt Orchard"], ["Ilse Varga"], ["Winter Quay"], ["port"]]
    # "Winter" + "Quay" only span title and text: no hit; queries are not part of the input at all
    assert passage_hits(shown, entities) == {0, 1, 3}
    assert passage_hits([[]], entities) == set()
    assert passage_hits(shown, []) == set()


def test_gold_count_is_one_number_for_rewards_and_f1():
    from spader.core.metrics import gold_count, prf, unique_gold

    # a duplicate alias set (another spelling) and an entity that normalizes to nothing
    gold = [["The Salt Orchard", "Salt Orchard"], ["salt orchard", "SALT ORCHARD!"], ["?!"], ["Winter Quay"]]
    assert unique_gold(gold) == [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"]]
    assert gold_count(gold) == 2
    # recall divides by the same |E_GT|: one of two entities found
    assert prf(["Winter Quay"], gold)[1] == pytest.approx(1 / gold_count(gold))
    # and a step that finds one of them earns (alpha + beta) / |E_GT|, as F1 counts it
    hits = find_hits(["Winter Quay is a film."], unique_gold(gold))
    assert hits == {1}
    rewards = search_step_rewards([[hits]], [[0]], gold_count(gold), alpha=1.0, beta=0.0, cost=0.0)
    assert rewards == [[0.5]]
