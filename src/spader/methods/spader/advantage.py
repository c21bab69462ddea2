"""SPADER's advantages with verl's estimator signature: ``spader_spa`` (step-wise peer
advantage) and ``spader_traj`` (trajectory-level GRPO on the summed step rewards, the ``no_spa``
ablation). The verl integration registers them under these names (:data:`spader.methods.ADVANTAGES`).

A trajectory without any generated token (an episode that failed for an infrastructure reason,
:data:`spader.methods.steps.FAILURE_KEY`, or a padding row) is no peer: it gets its own group,
so it neither lowers the group mean nor widens the spread of its prompt's group, and its advantage
is 0 (:func:`peer_groups`). Each estimator logs how many it left out.

verl calls an estimator as ``fn(token_level_rewards=, response_mask=, config=, index=)``
(``verl.trainer.ppo.ray_trainer.compute_advantage``): no ``gamma`` argument (read from
``config.gamma``), and no attention mask, so the decision steps are recovered from
``response_mask`` alone (its zeros cover both observations and padding). The step rewards are the
token rewards summed per step: the ``spader_sync`` trainer mode puts each step's reward on the last
token of its assistant run.

Pure: torch, numpy and the core only.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from spader.core.advantage import (
    discounted_returns,
    segment_steps,
    step_peer_advantage,
    step_rewards_from_tokens,
    steps_to_tokens,
    trajectory_peer_advantage,
)

__all__ = ["SPA", "TRAJ", "peer_groups", "spader_spa_advantage", "spader_traj_advantage", "uid_groups"]

log = logging.getLogger(__name__)

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


def peer_groups(index, response_mask: torch.Tensor, estimator: str) -> tuple[torch.Tensor, np.ndarray]:
    """Group ids with every trajectory that has no generated token in a group of its own.

    Args:
        index: verl's ``index`` (prompt uids).
        response_mask: (B, L) 1 on generated tokens.
        estimator: the estimator's name (for the log line).
    Returns:
        ``(groups (B,) int64 tensor, uids (B,) object array)``: both put such a trajectory alone.
    """
    b = response_mask.size(0)
    groups = uid_groups(index, b, response_mask.device)
    empty = (response_mask.sum(dim=1) == 0).cpu().numpy()
    uids = np.asarray([str(u) for u in index], dtype=object)
    n = int(empty.sum())
    if n:
        log.warning(
            "%s: %d of %d trajectories have no generated token (failed episodes) and are left out of "
            "their groups' statistics",
            estimator,
            n,
            b,
        )
        rows = np.flatnonzero(empty)
        groups = groups.clone()
        groups[torch.as_tensor(rows, device=groups.device)] = torch.arange(
            int(groups.max()) + 1, int(groups.max()) + 1 + n, device=groups.device
        )
        for k, row in enumerate(rows):
            uids[row] = f"{uids[row]}\x1fno-peer-{k}"
    return groups, uids


def _eps_placement(config) -> str:
    """``algorithm.spader.epsilon`` (``training.divergences.epsilon``, set at launch)."""
    block = config.get("spader") if config is not None else None
    if block is None or block.get("epsilon") is None:
        raise ValueError(
            "the SPADER estimators read the spread's epsilon placement from algorithm.spader.epsilon, "
            "which is not set"
        )
    return str(block["epsilon"])


def _gamma(config) -> float:
    if config is None or config.get("gamma") is None:
        raise ValueError(
            "the SPADER estimators read the step discount from algorithm.gamma, which is not set"
        )
    return float(config.get("gamma"))


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
    groups, _ = peer_groups(index, response_mask, SPA)
    gamma = _gamma(config)
    adv = step_peer_advantage(step_r, mask, groups, gamma=gamma, eps_placement=_eps_placement(config))
    returns = discounted_returns(step_r, mask, gamma)
    return steps_to_tokens(adv, steps), steps_to_tokens(returns, steps)


def spader_traj_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """Trajectory-level advantage of the summed step rewards (see
    :func:`spader.core.advantage.trajectory_peer_advantage`); same arguments and returns as
    :func:`spader_spa_advantage`, ``returns`` being the summed reward on every assistant token."""
    steps = segment_steps(response_mask)
    step_r = step_rewards_from_tokens(token_level_rewards.float(), steps)
    mask = steps.mask.to(step_r.device)
    groups, _ = peer_groups(index, response_mask, TRAJ)
    adv = trajectory_peer_advantage(step_r, mask, groups, eps_placement=_eps_placement(config))
    total = (step_r * mask).sum(dim=1, keepdim=True) * mask
    return steps_to_tokens(adv, steps), steps_to_tokens(total, steps)
