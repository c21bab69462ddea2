"""verl advantage estimators ``spader_spa`` (step-wise peer advantage) and ``spader_traj``
(trajectory-level GRPO on the summed step rewards, the ``no_spa`` ablation).

verl calls a registered estimator as ``fn(token_level_rewards=, response_mask=, config=, index=)``
(``verl.trainer.ppo.ray_trainer.compute_advantage``): no ``gamma`` argument (read from
``config.gamma``), and no attention mask, so the decision steps are recovered from
``response_mask`` alone (its zeros cover both observations and padding). The step rewards are the
token rewards summed per step: the ``spader_sync`` trainer mode puts each step's reward on the last
token of its assistant run.
"""

from __future__ import annotations

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from spader.core.advantage import (
    discounted_returns,
    segment_steps,
    step_peer_advantage,
    step_rewards_from_tokens,
    steps_to_tokens,
    trajectory_peer_advantage,
)

__all__ = ["SPA", "TRAJ", "spader_spa_advantage", "spader_traj_advantage", "uid_groups"]

SPA = "spader_spa"
TRAJ = "spader_traj"


def uid_groups(index, batch_size: int, device: torch.device) -> torch.Tensor:
    """(B,) int64 group ids from verl's ``index`` (numpy object array of prompt uids).

    Without ``index`` every trajectory is its own group (all advantages 0), so a missing ``uid``
    fails loudly instead of training on nothing.
    """
    if index is None:
        raise ValueError("SPADER estimators need the prompt uid of each trajectory (non_tensor_batch['uid'])")
    if len(index) != batch_size:
        raise ValueError(f"index has {len(index)} uids for a batch of {batch_size}")
    _, inverse = np.unique(np.asarray([str(u) for u in index]), return_inverse=True)
    return torch.as_tensor(inverse, dtype=torch.int64, device=device)


def _eps_placement(config) -> str:
    """``algorithm.spader.epsilon`` (the paper's ``outside`` when the block or key is absent)."""
    block = config.get("spader") if config is not None else None
    return str(block.get("epsilon", "outside")) if block is not None else "outside"


def _gamma(config) -> float:
    if config is None or config.get("gamma") is None:
        raise ValueError(
            "the SPADER estimators read the step discount from algorithm.gamma, which is not set"
        )
    return float(config.get("gamma"))


@register_adv_est(SPA)
def spader_spa_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """SPA token advantages (see :func:`spader.core.advantage.step_peer_advantage`).

    Args:
        token_level_rewards: (B, L) float, step rewards on the step-end tokens.
        response_mask: (B, L) 1 on assistant tokens.
        index: (B,) prompt uids (the group key).
        config: verl's ``algorithm`` config (``gamma``, ``spader.epsilon``).
    Returns:
        ``(advantages, returns)``, both (B, L): the advantage of each token's step, and that step's
        discounted future return; 0 on observation and padding tokens.
    """
    steps = segment_steps(response_mask)
    step_r = step_rewards_from_tokens(token_level_rewards.float(), steps)
    mask = steps.mask.to(step_r.device)
    groups = uid_groups(index, token_level_rewards.size(0), token_level_rewards.device)
    gamma = _gamma(config)
    adv = step_peer_advantage(step_r, mask, groups, gamma=gamma, eps_placement=_eps_placement(config))
    returns = discounted_returns(step_r, mask, gamma)
    return steps_to_tokens(adv, steps), steps_to_tokens(returns, steps)


@register_adv_est(TRAJ)
def spader_traj_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """Trajectory-level advantage of the summed step rewards (see
    :func:`spader.core.advantage.trajectory_peer_advantage`); same arguments and returns as
    :func:`spader_spa_advantage`, ``returns`` being the summed reward on every assistant token."""
    steps = segment_steps(response_mask)
    step_r = step_rewards_from_tokens(token_level_rewards.float(), steps)
    mask = steps.mask.to(step_r.device)
    groups = uid_groups(index, token_level_rewards.size(0), token_level_rewards.device)
    adv = trajectory_peer_advantage(step_r, mask, groups, eps_placement=_eps_placement(config))
    total = (step_r * mask).sum(dim=1, keepdim=True) * mask
    return steps_to_tokens(adv, steps), steps_to_tokens(total, steps)
