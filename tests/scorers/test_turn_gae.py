"""R3-RAG's per-turn GAE against the loop reference, and as verl's registered estimator."""

from __future__ import annotations

import pytest
import torch
from baseline_reference import reference_turn_gae, reference_whiten

pytest.importorskip("verl")

from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from spader.integrations.verl import plugin  # noqa: F401  (registration)
from spader.integrations.verl.turn_gae import TURN_GAE, critic_values, turn_gae_advantage
from spader.methods.r3rag.scoring import turn_gae, turn_returns


def random_batch(seed: int, b: int = 6, length: int = 40):
    """Responses of alternating assistant/observation runs, right-padded; rewards on every token
    (step rewards plus a per-token KL penalty, as verl hands them over)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, length, dtype=torch.int64)
    for i in range(b):
        pos, assistant = 0, True
        end = int(torch.randint(1, length + 1, (1,), generator=g))
        while pos < end:
            n = int(torch.randint(1, 6, (1,), generator=g))
            mask[i, pos : min(pos + n, end)] = int(assistant)
            pos += n
            assistant = not assistant
    rewards = torch.randn(b, length, generator=g, dtype=torch.float64) * mask
    values = torch.randn(b, length, generator=g, dtype=torch.float64)
    return rewards, values, mask


@pytest.mark.parametrize("seed", range(5))
def test_matches_the_loop_reference(seed):
    rewards, values, mask = random_batch(seed)
    adv, ret = turn_gae(rewards, values, mask)
    ref_adv, ref_ret = reference_turn_gae(rewards.tolist(), values.tolist(), mask.tolist())
    assert adv.tolist() == [pytest.approx(r, abs=1e-9) for r in ref_adv]
    assert ret.tolist() == [pytest.approx(r, abs=1e-9) for r in ref_ret]
    whitened, _ = turn_gae_advantage(rewards, mask, values=values)
    expected = reference_whiten(ref_adv, mask.tolist())
    assert whitened.tolist() == [pytest.approx(r, abs=1e-6) for r in expected]


def test_later_turns_are_not_carried_back():
    # two turns: the first one's return holds only its own rewards
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 2.0]])
    assert turn_returns(rewards, mask).tolist() == [[0.5, 0.5, 0.0, 2.0, 2.0]]
    # with verl's whole-response GAE (gamma = lam = 1) the first turn would see 2.5
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    _, verl_returns = compute_gae_advantage_return(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)
    assert verl_returns[0, 0].item() == pytest.approx(2.5)


def test_registered_with_verl_and_fed_by_the_trainer_mode(fake_tq):
    assert get_adv_estimator_fn(TURN_GAE) is turn_gae_advantage
    rewards, values, mask = random_batch(11, b=3, length=12)
    keys = [f"u_{i}_0" for i in range(3)]
    fake_tq.put_samples(keys, [{"values": values[i]} for i in range(3)])
    batch = KVBatchMeta(keys=keys, tags=[{}] * 3, partition_id="train")
    config = OmegaConf.create({"gamma": 1.0, "lam": 1.0})
    with critic_values(TURN_GAE, batch):
        adv, _ = get_adv_estimator_fn(TURN_GAE)(
            token_level_rewards=rewards, response_mask=mask, config=config
        )
    direct, _ = turn_gae_advantage(rewards, mask, values=values)
    assert torch.equal(adv, direct)
    with critic_values("gae", batch), pytest.raises(ValueError, match="needs the critic's values"):
        turn_gae_advantage(rewards, mask, config=config)


def test_refuses_a_discount():
    rewards, values, mask = random_batch(3, b=2, length=8)
    with pytest.raises(ValueError, match=r"algorithm.gamma is 0.9"):
        turn_gae_advantage(rewards, mask, values=values, config=OmegaConf.create({"gamma": 0.9, "lam": 1.0}))
    with pytest.raises(ValueError, match="do not match"):
        turn_gae_advantage(rewards, mask, values=values[:, :-1])
