"""GRPO (docs/method.md, "Ablations and baselines"): the terminal reward only (the F1 of a valid
answer, ``variants.<name>.invalid_format_reward`` for an invalid format; verl's own reward path,
:mod:`spader.integrations.verl.reward`) trained with verl's trajectory-level GRPO, failed episodes
left out of the groups (verl estimator ``spader_grpo``, defined in the verl integration since it is
verl's own computation).

The terminal reward is this folder's; every method whose variants train without step rewards
(GRPO, PPO) uses it, and a variant of it belongs to the method of its advantage.
"""

from __future__ import annotations

from spader.methods import Advantage, Method, Reward, register

__all__ = ["METHOD"]

METHOD = register(
    Method(
        name="grpo",
        description="the terminal reward with verl's GRPO",
        rewards=(Reward(name="terminal", description="the terminal F1 only (-1 for an invalid format)"),),
        advantages=(
            Advantage(
                name="grpo",
                estimator="spader_grpo",
                rewards=("terminal", "step"),
                description="verl's GRPO without failed episodes as peers",
            ),
        ),
        verl_config="grpo",
    )
)
