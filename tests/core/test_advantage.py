"""Step-wise peer advantage: docs/method.md's worked example, token mapping, properties, loop reference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_reference import reference_token_advantages

from spader.core.advantage import (
    discounted_returns,
    place_step_rewards,
    segment_steps,
    standardize_in_groups,
    step_peer_advantage,
    step_rewards_from_tokens,
    steps_to_tokens,
    trajectory_peer_advantage,
)

# docs/method.md, "Worked example (gamma 0.9, one group of 3)"
REWARDS = torch.tensor([[0.5, 0.2, 0.6], [0.1, 0.4, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float64)
GROUP = torch.tensor([3, 3, 3])


def test_worked_example_returns():
    returns = discounted_returns(REWARDS, MASK, 0.9)
    expected = torch.tensor([[1.166, 0.74, 0.6], [0.46, 0.4, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(returns, expected, atol=1e-12)


def test_worked_example_advantages():
    adv = step_peer_advantage(REWARDS, MASK, GROUP, gamma=0.9)
    expected = torch.tensor(
        [[1.3013, 1.1903, 1.4142], [-0.1710, 0.0661, 0.0], [-1.1303, 0.0, 0.0]], dtype=torch.float64
    )
    assert torch.allclose(adv, expected, atol=5e-5)


def test_worked_example_in_token_space():
    # A: 2 assistant tokens, 1 obs, 1 assistant, 2 obs, 2 assistant; B: 1, obs, 3, pad; C: 2 + pad
    mask = torch.tensor(
        [
            [1, 1, 0, 1, 0, 0, 1, 1],
            [1, 0, 1, 1, 1, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
        ]
    )
    steps = segment_steps(mask)
    assert steps.count.tolist() == [3, 2, 1]
    dense = place_step_rewards(REWARDS.float(), steps, mask.size(1))
    assert dense.tolist()[0] == pytest.approx([0, 0.5, 0, 0.2, 0, 0, 0, 0.6])
    assert dense.tolist()[1] == pytest.approx([0.1, 0, 0, 0, 0.4, 0, 0, 0])
    step_r = step_rewards_from_tokens(dense, steps)
    adv = steps_to_tokens(step_peer_advantage(step_r, steps.mask, GROUP, gamma=0.9), steps)
    a, b, c = 1.3013, -0.1710, -1.1303
    expected = [
        [a, a, 0, 1.1903, 0, 0, 1.4142, 1.4142],
        [b, 0, 0.0661, 0.0661, 0.0661, 0, 0, 0],
        [c, c, 0, 0, 0, 0, 0, 0],
    ]
    assert adv.tolist() == [pytest.approx(row, abs=5e-5) for row in expected]


@pytest.mark.parametrize(
    "mask, index, count",
    [
        ([0, 0, 0], [-1, -1, -1], 0),  # padding row
        ([1, 1, 1], [0, 0, 0], 1),  # single answer turn filling the budget
        ([1, 0, 1, 0, 1], [0, -1, 1, -1, 2], 3),  # one-token runs
        ([0, 1, 1, 0], [-1, 0, 0, -1], 1),  # a response that starts with a masked token
    ],
)
def test_segment_steps_table(mask, index, count):
    steps = segment_steps(torch.tensor([mask]))
    assert steps.index.tolist() == [index]
    assert steps.count.tolist() == [count]


def test_segment_steps_respects_the_valid_region():
    # an assistant-marked token outside the valid (non-padding) region is not a step
    steps = segment_steps(torch.tensor([[1, 0, 1, 1]]), valid_mask=torch.tensor([[1, 1, 1, 0]]))
    assert steps.index.tolist() == [[0, -1, 1, -1]]


def test_reward_on_a_masked_last_token_counts_for_the_last_step():
    # verl puts the scalar score on the last response token; after truncation it is an observation token
    steps = segment_steps(torch.tensor([[1, 1, 0, 1, 0, 0]]))
    token_r = torch.tensor([[0.0, 0.3, 0.0, 0.0, 0.0, 0.7]])
    assert step_rewards_from_tokens(token_r, steps).tolist() == [[pytest.approx(0.3), pytest.approx(0.7)]]


def test_singleton_group_and_equal_returns_give_zero():
    r = torch.tensor([[0.3, 0.1], [0.2, 0.2], [0.2, 0.2]])
    m = torch.ones(3, 2)
    adv = step_peer_advantage(r, m, torch.tensor([0, 1, 1]), gamma=0.9)
    assert adv.abs().max().item() == 0.0


def test_equal_values_give_exact_zero_despite_rounding():
    # mean of three 0.1s is not exactly 0.1 in float32; eps must not amplify the rounding error
    x = torch.full((3, 1), 0.1)
    assert standardize_in_groups(x, torch.zeros(3, dtype=torch.int64)).abs().max().item() == 0.0


def test_trajectory_level_variant_uses_the_summed_return():
    # sums 1.3, 0.5, 0.0 -> standardized, broadcast over each trajectory's steps
    adv = trajectory_peer_advantage(REWARDS, MASK, GROUP)
    totals = torch.tensor([1.3, 0.5, 0.0], dtype=torch.float64)
    z = (totals - totals.mean()) / (totals.std(unbiased=False) + 1e-6)
    assert torch.allclose(adv, z.unsqueeze(1) * MASK)


# ---------------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------------


@st.composite
def batches(draw, max_b=10, max_s=6):
    b = draw(st.integers(1, max_b))
    s = draw(st.integers(1, max_s))
    lengths = draw(st.lists(st.integers(0, s), min_size=b, max_size=b))
    rewards = draw(
        st.lists(
            st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=s, max_size=s),
            min_size=b,
            max_size=b,
        )
    )
    groups = draw(st.lists(st.integers(0, 3), min_size=b, max_size=b))
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(s)] for n in lengths], dtype=torch.float64)
    r = torch.tensor(rewards, dtype=torch.float64) * mask
    return r, mask, torch.tensor(groups, dtype=torch.int64)


GAMMA = st.floats(0.0, 1.0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(batches(), GAMMA)
def test_standardized_scores_have_zero_group_mean_and_masked_steps_are_zero(batch, gamma):
    r, mask, groups = batch
    returns = discounted_returns(r, mask, gamma)
    z = standardize_in_groups(returns * mask, groups)
    for g in groups.unique():
        assert z[groups == g].mean(dim=0).abs().max().item() < 1e-9
    adv = step_peer_advantage(r, mask, groups, gamma=gamma)
    assert torch.equal(adv, z * mask)
    assert (adv[mask == 0] == 0).all()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(batches(), GAMMA)
def test_group_mean_of_advantages_is_zero_where_all_members_are_active(batch, gamma):
    # the masked advantages sum to zero exactly at steps where no member has terminated yet
    r, mask, groups = batch
    adv = step_peer_advantage(r, mask, groups, gamma=gamma)
    for g in groups.unique():
        rows = groups == g
        active = mask[rows].min(dim=0).values == 1
        assert adv[rows][:, active].mean(dim=0).abs().max().item() < 1e-9 if active.any() else True


@settings(max_examples=40, deadline=None, derandomize=True)
@given(batches(), GAMMA)
def test_singleton_groups_are_zero(batch, gamma):
    r, mask, _ = batch
    unique = torch.arange(r.size(0))
    assert step_peer_advantage(r, mask, unique, gamma=gamma).abs().max().item() == 0.0


@settings(max_examples=40, deadline=None, derandomize=True)
@given(batches(), GAMMA, st.randoms(use_true_random=False))
def test_permuting_group_members_permutes_the_output(batch, gamma, rnd):
    r, mask, groups = batch
    perm = list(range(r.size(0)))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    adv = step_peer_advantage(r, mask, groups, gamma=gamma)
    adv_p = step_peer_advantage(r[perm], mask[perm], groups[perm], gamma=gamma)
    assert torch.allclose(adv_p, adv[perm], atol=1e-9)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(batches(), GAMMA, st.floats(0.01, 100.0))
def test_scaling_rewards_leaves_advantages_unchanged(batch, gamma, c):
    r, mask, groups = batch
    # eps = 0 makes the invariance exact; with eps > 0 it holds up to eps / sigma
    adv = step_peer_advantage(r, mask, groups, gamma=gamma, eps=0.0)
    adv_c = step_peer_advantage(r * c, mask, groups, gamma=gamma, eps=0.0)
    assert torch.allclose(adv, adv_c, atol=1e-6)


def _random_token_batch(gen: torch.Generator, b: int, length: int, n_groups: int):
    """Responses of alternating assistant/observation runs with right padding and random rewards."""
    mask = torch.zeros(b, length, dtype=torch.int64)
    for i in range(b):
        pos, valid = 0, int(torch.randint(0, length + 1, (1,), generator=gen))
        assistant = True
        while pos < valid:
            run = int(torch.randint(1, 5, (1,), generator=gen))
            if assistant:
                mask[i, pos : min(pos + run, valid)] = 1
            pos += run
            assistant = not assistant
    rewards = torch.randn(b, length, generator=gen, dtype=torch.float64)
    rewards = rewards * (torch.rand(b, length, generator=gen) < 0.2)  # sparse, also on masked tokens
    groups = torch.randint(0, n_groups, (b,), generator=gen)
    return rewards, mask, groups


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("trajectory_level", [False, True])
def test_vectorised_equals_the_loop_reference(seed, trajectory_level):
    gen = torch.Generator().manual_seed(seed)
    b, length = [(1, 5), (4, 17), (9, 40), (16, 64), (12, 33), (20, 80)][seed]
    rewards, mask, groups = _random_token_batch(gen, b, length, n_groups=1 + seed % 4)
    gamma = [0.9, 1.0, 0.5, 0.0, 0.99, 0.7][seed]
    steps = segment_steps(mask)
    step_r = step_rewards_from_tokens(rewards, steps)
    if trajectory_level:
        adv = trajectory_peer_advantage(step_r, steps.mask.double(), groups)
    else:
        adv = step_peer_advantage(step_r, steps.mask.double(), groups, gamma=gamma)
    got = steps_to_tokens(adv, steps)
    expected = reference_token_advantages(
        rewards.tolist(), mask.tolist(), groups.tolist(), gamma=gamma, trajectory_level=trajectory_level
    )
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-9)


def test_inside_sqrt_epsilon_is_the_authors_spread():
    """Option ``inside_sqrt``: (G - mu) / sqrt(var + eps) (sigma floored at sqrt(eps) = 1e-3)."""
    returns = discounted_returns(REWARDS, MASK, 0.9)
    mu = (returns * MASK).mean(dim=0)
    var = ((returns * MASK - mu) ** 2).mean(dim=0)
    expected = (returns - mu) / torch.sqrt(var + 1e-6) * MASK
    got = step_peer_advantage(REWARDS, MASK, GROUP, gamma=0.9, eps_placement="inside_sqrt")
    assert torch.allclose(got, expected, atol=1e-12)
    # the default (paper) differs from it, and a spread far below 1e-3 shows the floor
    assert not torch.allclose(got, step_peer_advantage(REWARDS, MASK, GROUP, gamma=0.9), rtol=0, atol=1e-9)
    tiny = torch.tensor([1e-5, 0.0], dtype=torch.float64)
    pair = torch.tensor([0, 0])
    assert standardize_in_groups(tiny, pair, eps_placement="inside_sqrt")[0].item() == pytest.approx(
        5e-6 / (25e-12 + 1e-6) ** 0.5
    )
    assert standardize_in_groups(tiny, pair)[0].item() == pytest.approx(5e-6 / (5e-6 + 1e-6))
    traj = trajectory_peer_advantage(REWARDS, MASK, GROUP, eps_placement="inside_sqrt")
    assert traj.shape == REWARDS.shape
    with pytest.raises(ValueError, match="eps_placement must be one of"):
        standardize_in_groups(tiny, pair, eps_placement="both")
