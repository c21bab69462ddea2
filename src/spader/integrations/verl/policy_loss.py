"""The paper's step-level importance ratio as a verl policy loss (``training.policy_ratio: step``).

verl's actor picks its policy loss by ``actor_rollout_ref.actor.policy_loss.loss_mode`` from
``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY`` and calls it on each micro-batch with the
padded ``old_log_prob``, ``log_prob``, ``advantages`` and ``response_mask`` (assistant tokens),
the actor config and the global batch sizes in ``config.global_batch_info``. ``token`` keeps
verl's ``vanilla`` loss (one clipped ratio per token, ``token-mean``); ``step`` selects
:data:`LOSS_MODE`, the paper's eq. 3: one clipped ratio per decision step
(:func:`spader.core.policy_ratio.step_ratio_loss`), each step's term on its last token, summed
over the trajectory and averaged over the mini-batch's trajectories (verl's
``seq-mean-token-sum`` aggregation over those positions, which divides by the mini-batch's
trajectory count and scales for data parallelism as verl does). The KL and entropy terms keep the
actor's ``loss_agg_mode`` (token-mean). Metrics: ``actor/pg_clipfrac`` is the share of clipped
steps, ``actor/ppo_kl`` the token-level mean as verl reports it, ``actor/pg_steps`` the steps of
the micro-batch.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

from spader.core.policy_ratio import step_ratio_loss
from spader.integrations.verl.overrides import POLICY_LOSS_MODES

__all__ = ["LOSS_MODE", "step_policy_loss"]

#: The policy loss of ``training.policy_ratio: step`` in verl's registry.
LOSS_MODE = POLICY_LOSS_MODES["step"]


@register_policy_loss(LOSS_MODE)
def step_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's policy-loss signature; ``loss_agg_mode`` is not read (eq. 3 sums over steps and
    averages over trajectories whatever the actor's mode, which still aggregates the KL loss)."""
    if config is None:
        raise ValueError(f"policy loss {LOSS_MODE} needs the actor config")
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    out = step_ratio_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        clip_low=low,
        clip_high=high,
        clip_c=config.clip_ratio_c,
        weights=rollout_is_weights,
    )
    batch = dict(getattr(config, "global_batch_info", None) or {})
    pg_loss = agg_loss(
        loss_mat=out.loss,
        loss_mask=out.mask,
        loss_agg_mode="seq-mean-token-sum",
        dp_size=batch.get("dp_size") or 1,
        global_batch_size=batch.get("global_batch_size"),
    )
    return pg_loss, {
        "actor/pg_clipfrac": out.clipfrac.item(),
        "actor/ppo_kl": out.ppo_kl.item(),
        "actor/pg_clipfrac_lower": out.clipfrac_lower.item(),
        "actor/pg_steps": float(out.steps),
    }
