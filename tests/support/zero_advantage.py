"""Advantage estimator ``test_zero_advantage`` for the negative control of the CPU learning test.

It returns zero advantages (and returns) for every token: the policy-gradient term vanishes, so a
run with it must not improve. Imported by verl in every process through
``VERL_USE_EXTERNAL_MODULES`` (the test sets it), like the project's own plug-in.
"""

import torch
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

NAME = "test_zero_advantage"


def zero_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **kwargs):
    """Zero advantages and returns, shaped like ``token_level_rewards`` (bs, L)."""
    zeros = torch.zeros_like(token_level_rewards)
    return zeros, zeros


if NAME not in ADV_ESTIMATOR_REGISTRY:
    register_adv_est(NAME)(zero_advantage)
