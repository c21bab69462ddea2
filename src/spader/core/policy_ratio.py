"""The importance ratio of the clipped objective, per token or per decision step (docs/method.md,
"SPA advantage", and "Known divergences").

The paper's objective (eq. 3) clips one ratio per decision step,
``rho_t = P(y_t | x_t) / P_old(y_t | x_t)``, the probability of the whole step ``y_t`` (the t-th
assistant run of the response) under the current and the rollout policy, and sums the clipped
terms over the steps of a trajectory, divided by the number of trajectories G:

    J = 1/G sum_i sum_t min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)

verl's objective (the authors' code) clips one ratio per token and averages over tokens
(``token-mean``). A step's log-ratio here is the sum of its tokens' ``log_prob - old_log_prob``
(clamped to +-20 as verl clamps a token's); its advantage is the mean of its tokens' advantages
(SPA and GRPO give every token of a step the same one; for a critic's per-token advantages it is
their mean); the dual clip bounds the term of a negative advantage as verl's vanilla loss does. :func:`step_ratio_loss` computes the paper's per-step terms; the verl plug-in
registers it as a policy loss (``training.policy_ratio: step``,
:mod:`spader.integrations.verl.policy_loss`), which sums them over each trajectory and averages
over the trajectories of the mini-batch.

Pure torch: the step table comes from :func:`spader.core.advantage.segment_steps`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from spader.core.advantage import segment_steps

__all__ = ["POLICY_RATIOS", "StepLoss", "step_ratio_loss"]

#: ``training.policy_ratio``: ``token`` (verl's per-token ratio, token-mean) or ``step`` (eq. 3).
POLICY_RATIOS = ("token", "step")
#: verl's clamp of a log-ratio before exponentiating it (its vanilla policy loss uses the same).
_LOG_RATIO_BOUND = 20.0


@dataclass(frozen=True)
class StepLoss:
    """The per-step clipped objective of one micro-batch, laid out for verl's loss aggregation.

    Attributes:
        loss: (B, L) the negated clipped term of each step on its last token, 0 elsewhere.
        mask: (B, L) bool, True on each step's last token (the positions ``loss`` fills).
        clipfrac: share of steps whose clipped term was the smaller one (0 without steps).
        clipfrac_lower: share of steps with a negative advantage cut by the dual clip.
        ppo_kl: the token-level mean of ``old_log_prob - log_prob`` over assistant tokens (verl's
            ``actor/ppo_kl``, the same quantity in both modes).
        steps: number of steps in the micro-batch.
    """

    loss: Tensor
    mask: Tensor
    clipfrac: Tensor
    clipfrac_lower: Tensor
    ppo_kl: Tensor
    steps: int


def step_ratio_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float,
    weights: Tensor | None = None,
) -> StepLoss:
    """The paper's per-step clipped terms (eq. 3) of a micro-batch (see the module docstring).

    Args:
        old_log_prob, log_prob, advantages: (B, L) per token; response_mask: (B, L) 1 (or True)
            on assistant tokens, whose maximal runs are the steps.
        clip_low, clip_high: the clip range ``[1 - clip_low, 1 + clip_high]``; clip_c: the
            dual-clip bound (> 1); weights: optional (B, L) rollout-correction weights, a step's
            term scaled by their mean over its tokens.

    >>> mask = torch.tensor([[1, 1, 0, 1]])
    >>> old = torch.zeros(1, 4)
    >>> new = torch.tensor([[0.1, 0.1, 5.0, -0.1]])
    >>> out = step_ratio_loss(old, new, torch.ones(1, 4), mask, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    >>> [round(v, 4) for v in out.loss[0].tolist()], out.mask[0].tolist(), out.clipfrac.item()
    ([0.0, -1.2, 0.0, -0.9048], [False, True, False, True], 0.5)
    """
    if clip_c <= 1.0:
        raise ValueError(f"the dual-clip bound must be > 1, got {clip_c}")
    mask = response_mask.bool()
    steps = segment_steps(mask)
    n = steps.rows.numel()
    run = steps.run_ids
    chosen = run >= 0
    ids = run[chosen]
    token_log_ratio = log_prob - old_log_prob

    def per_step(values: Tensor) -> Tensor:  # the sum of each step's tokens' values
        return torch.zeros(n, dtype=log_prob.dtype, device=log_prob.device).index_add(
            0, ids, values[chosen].to(log_prob.dtype)
        )

    tokens = per_step(torch.ones_like(log_prob)).clamp(min=1)
    adv = per_step(advantages) / tokens
    ratio = torch.exp(per_step(token_log_ratio).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
    term, clipped, dual = _clipped(ratio, adv, clip_low, clip_high, clip_c)
    if weights is not None:
        term = term * per_step(weights) / tokens
    where = (steps.rows, steps.ends)
    share = (lambda x: x.float().mean()) if n else (lambda x: torch.zeros((), device=log_prob.device))
    kl = -token_log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)[mask]
    return StepLoss(
        loss=torch.zeros_like(log_prob).index_put(where, term),
        mask=torch.zeros_like(mask).index_put(where, torch.ones(n, dtype=torch.bool, device=mask.device)),
        clipfrac=share(clipped).detach(),
        clipfrac_lower=share(dual).detach(),
        ppo_kl=(kl.mean() if kl.numel() else torch.zeros((), device=log_prob.device)).detach(),
        steps=n,
    )


def _clipped(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float, clip_c: float
) -> tuple[Tensor, Tensor, Tensor]:
    """verl's vanilla clipped term of each ratio and advantage (the loss, negated objective), and
    where the clip and the dual clip were used."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    pessimistic = torch.maximum(unclipped, clipped)
    bound = -adv * clip_c
    term = torch.where(adv < 0, torch.minimum(bound, pessimistic), pessimistic)
    return term, clipped > unclipped, (pessimistic > bound) & (adv < 0)
