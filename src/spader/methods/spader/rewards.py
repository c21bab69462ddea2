"""SPADER's step rewards in training: the settings a verl config carries (``algorithm.gamma`` and
``algorithm.spader``, set at launch from ``training.gamma``, ``variants.<name>.alpha/beta/cost/cost_per``
and ``training.divergences`` by :func:`spader.methods.spader.verl_settings`; every key is required,
the defaults are the configuration model's) and the step rewards of one training step
(:class:`SpaderStepRewards`, what the ``spader_sync`` trainer mode calls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from spader.core.advantage import EPS_PLACEMENTS
from spader.core.rewards import COST_PER, NOVELTY, StepRewardWeights, cost_warmup_scale
from spader.methods.spader.densify import densify_rewards
from spader.methods.steps import N_GOLD_KEY, StepBatch, parse_step_records

__all__ = ["SpaderSettings", "SpaderStepRewards"]


@dataclass(frozen=True)
class SpaderSettings:
    """Reward and advantage settings of a SPADER variant.

    Attributes:
        gamma: discount per decision step (``algorithm.gamma``).
        alpha, beta, cost: entity-reward weights and tool cost.
        cost_per: what the tool cost counts, ``call`` (paper) or ``query`` (authors' code).
        novelty: ``inverse`` (paper) or ``exp_decay`` (authors' code).
        free_steps, ramp_steps: tool-cost warm-up (authors' code); None when off.
        epsilon: where the advantage spread's epsilon goes, ``outside`` (paper) or
            ``inside_sqrt`` (authors' code), see :data:`spader.core.advantage.EPS_PLACEMENTS`.
    """

    gamma: float
    alpha: float
    beta: float
    cost: float
    cost_per: str
    novelty: str
    free_steps: int | None
    ramp_steps: int | None
    epsilon: str

    def __post_init__(self):
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"algorithm.gamma must lie in [0, 1], got {self.gamma}")
        for name in ("alpha", "beta", "cost"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.spader.{name} must be >= 0, got {getattr(self, name)}")
        if self.cost_per not in COST_PER:
            raise ValueError(f"algorithm.spader.cost_per must be one of {COST_PER}, got {self.cost_per!r}")
        if self.novelty not in NOVELTY:
            raise ValueError(f"algorithm.spader.novelty must be one of {NOVELTY}, got {self.novelty!r}")
        if self.epsilon not in EPS_PLACEMENTS:
            raise ValueError(
                f"algorithm.spader.epsilon must be one of {EPS_PLACEMENTS}, got {self.epsilon!r}"
            )
        if (self.free_steps is None) != (self.ramp_steps is None):
            raise ValueError("algorithm.spader.cost_warmup needs both free_steps and ramp_steps")

    @classmethod
    def from_config(cls, cfg: Any) -> SpaderSettings:
        """Read from a full verl config (DictConfig or nested mapping); errors name the key."""
        algorithm = cfg["algorithm"]
        block = algorithm.get("spader")
        if block is None:
            raise ValueError("algorithm.spader is missing: the SPADER trainer mode and estimators need it")
        warmup = block.get("cost_warmup")
        if warmup is not None and not isinstance(warmup, Mapping) and not hasattr(warmup, "keys"):
            raise ValueError(f"algorithm.spader.cost_warmup must be null or a mapping, got {warmup!r}")
        try:
            return cls(
                gamma=float(algorithm["gamma"]),
                alpha=float(block["alpha"]),
                beta=float(block["beta"]),
                cost=float(block["cost"]),
                cost_per=str(block["cost_per"]),
                novelty=str(block["novelty"]),
                free_steps=None if warmup is None else int(warmup["free_steps"]),
                ramp_steps=None if warmup is None else int(warmup["ramp_steps"]),
                epsilon=str(block["epsilon"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ValueError) and str(exc).startswith("algorithm."):
                raise
            raise ValueError(f"algorithm.spader is malformed ({type(exc).__name__}: {exc})") from exc

    def cost_scale(self, global_step: int) -> float:
        """Tool-cost multiplier at training step ``global_step`` (1 without a warm-up)."""
        if self.free_steps is None:
            return 1.0
        return cost_warmup_scale(global_step, free_steps=self.free_steps, ramp_steps=self.ramp_steps)

    def step_weights(self, global_step: int) -> StepRewardWeights:
        """The search-step reward's hyperparameters at training step ``global_step``."""
        return StepRewardWeights(
            self.alpha, self.beta, self.cost, self.novelty, self.cost_scale(global_step), self.cost_per
        )


class SpaderStepRewards:
    """SPADER's dense step rewards of one training step (:func:`densify_rewards` with the
    variant's weights at that step)."""

    def __init__(self, settings: SpaderSettings):
        self.settings = settings

    @classmethod
    def from_config(cls, cfg: Any) -> SpaderStepRewards:
        """From a full verl config (the ``algorithm.gamma`` and ``algorithm.spader`` blocks)."""
        return cls(SpaderSettings.from_config(cfg))

    def __call__(self, batch: StepBatch) -> tuple[Tensor, dict[str, float]]:
        records = [
            parse_step_records(e, where=f"trajectory {key}")
            for e, key in zip(batch.extra, batch.keys, strict=False)
        ]
        n_gold = [(e or {}).get(N_GOLD_KEY) for e in batch.extra]
        dense, stats = densify_rewards(
            batch.response_mask,
            batch.terminal,
            batch.uids,
            records,
            n_gold,
            self.settings.step_weights(batch.step),
            skip=batch.skip,
        )
        stats.extra["cost_scale"] = self.settings.cost_scale(batch.step)
        return dense, stats.metrics()
