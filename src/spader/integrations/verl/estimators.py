"""verl advantage estimators: every advantage of the method registry that names a function
(:attr:`spader.methods.Advantage.function`, pure torch with verl's estimator signature) is
registered with verl under its estimator name (:func:`register_methods`), and ``spader_grpo``
(verl's GRPO on the terminal reward, the ``grpo`` baseline) is defined here, since it is verl's own
computation with failed episodes left out of the groups
(:func:`spader.methods.spader.advantage.peer_groups`).
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

from spader.methods import ADVANTAGES, resolve
from spader.methods.spader.advantage import peer_groups

__all__ = ["GRPO", "register_methods", "spader_grpo_advantage"]

GRPO = "spader_grpo"


def register_methods() -> tuple[str, ...]:
    """Register the estimator function of every registered advantage that names one (plug-in
    methods included); returns the estimator names registered.

    Raises:
        spader.methods.MethodError: a function path cannot be imported.
        ValueError: an estimator name is taken by another function.
    """
    names = []
    for spec in ADVANTAGES.values():
        if spec.function is not None:
            register_adv_est(spec.estimator)(resolve(spec.function))
            names.append(spec.estimator)
    return tuple(names)


@register_adv_est(GRPO)
def spader_grpo_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """verl's GRPO outcome advantage (``compute_grpo_outcome_advantage``, unchanged, with
    ``algorithm.norm_adv_by_std_in_grpo``) over groups without the trajectories that have no
    generated token (:func:`peer_groups`)."""
    if index is None:
        raise ValueError("spader_grpo needs the prompt uid of each trajectory (non_tensor_batch['uid'])")
    _, uids = peer_groups(index, response_mask, GRPO)
    norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    return compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=uids,
        norm_adv_by_std_in_grpo=norm,
        config=config,
    )
