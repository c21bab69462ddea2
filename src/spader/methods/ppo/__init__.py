"""PPO (docs/method.md, "Ablations and baselines"): the terminal reward with a critic and verl's
token-level GAE (verl's own estimator ``gae``, gamma = lambda = 1 as verl's defaults). StepSearch
trains its step rewards with the same advantage.
"""

from __future__ import annotations

from spader.methods import Advantage, Method, register

__all__ = ["METHOD"]

METHOD = register(
    Method(
        name="ppo",
        description="the terminal reward with a critic and verl's GAE",
        advantages=(
            Advantage(
                name="gae",
                estimator="gae",
                rewards=("terminal", "stepsearch"),
                description="PPO with a critic (verl's GAE)",
            ),
        ),
        verl_config="ppo",
    )
)
