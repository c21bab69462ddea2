"""v1 trainer mode ``spader_sync``: verl's sync trainer plus step-reward densification.

verl 0.9.1's reward path is scalar: the rollout's reward (our terminal reward, see
:mod:`.reward`) sits on the last response token of ``rm_scores``. SPADER's search-step rewards
depend on the whole group (``N(e)`` counts the group's trajectories that found ``e``), so they can
only be computed once the group is complete, in the trainer. This mode overrides the one method
that runs there, :meth:`SpaderTrainerSync._compute_advantage`: it reads ``rm_scores``,
``response_mask``, ``uid`` and the search tool's records (``extra_fields``) from TransferQueue,
writes back dense ``rm_scores`` (each step's reward on the last token of its assistant run, see
:func:`spader.core.densify.densify_rewards`) and hands over to verl's own ``_compute_advantage``, which
dispatches to the registered estimator. Selected with ``trainer.v1.trainer_mode=spader_sync``.
"""

from __future__ import annotations

import logging

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.workers.utils.padding import response_to_nested

from spader.core.densify import N_GOLD_KEY, densify_rewards, parse_step_records
from spader.integrations.verl.baselines import make_step_rewards
from spader.integrations.verl.metrics import episode_metrics
from spader.integrations.verl.settings import SpaderSettings
from spader.integrations.verl.turn_gae import critic_values

__all__ = ["SpaderTrainerSync", "densify_tq_batch"]

log = logging.getLogger(__name__)

MODE = "spader_sync"


def _padded(t: torch.Tensor, value) -> torch.Tensor:
    return t.to_padded_tensor(value) if t.is_nested else t


def densify_tq_batch(batch, settings: SpaderSettings, global_step: int) -> dict[str, float]:
    """Replace the batch's ``rm_scores`` in TransferQueue by the dense SPADER step rewards.

    Args:
        batch: verl's ``KVBatchMeta`` of the step (keys, partition, tags).
        settings: the variant's reward settings.
        global_step: current training step (drives the optional tool-cost warm-up).
    Returns:
        Metrics of the densification (``spader/...``).
    """
    fields = ["uid", "response_mask", "rm_scores", "extra_fields"]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    stored_mask = data["response_mask"]
    response_mask = _padded(stored_mask, 0)
    terminal = _padded(data["rm_scores"], 0.0).sum(dim=1)
    uids = [str(u) for u in data["uid"]]
    extra = list(data["extra_fields"])
    records = [
        parse_step_records(e, where=f"trajectory {key}") for e, key in zip(extra, batch.keys, strict=False)
    ]
    n_gold = [(e or {}).get(N_GOLD_KEY) for e in extra]
    skip = [bool(tag.get("is_padding", False)) for tag in batch.tags]
    scale = settings.cost_scale(global_step)
    dense, stats = densify_rewards(
        response_mask,
        terminal,
        uids,
        records,
        n_gold,
        alpha=settings.alpha,
        beta=settings.beta,
        cost=settings.cost,
        novelty=settings.novelty,
        cost_scale=scale,
        skip=skip,
    )
    stats.extra["cost_scale"] = scale
    # TransferQueue hands back a regular tensor when every sample has the same length
    rm_scores = response_to_nested(dense, stored_mask) if stored_mask.is_nested else dense
    out = TensorDict({"rm_scores": rm_scores}, batch_size=len(batch))
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)
    return stats.metrics()


@register_trainer(MODE)
class SpaderTrainerSync(PPOTrainerSync):
    """verl's synchronous PPO trainer with SPADER's dense step rewards."""

    def __init__(self, config):
        # fail before any GPU work when the variant's settings are malformed; a baseline's step
        # rewards (algorithm.step_reward: stepsearch, r3rag) replace SPADER's (.baselines)
        self.step_rewards = make_step_rewards(config)
        self.spader = SpaderSettings.from_config(config) if self.step_rewards is None else None
        super().__init__(config)

    # verl's base class switches replay buffer, refill and checkpoint behaviour on
    # ``trainer_mode == "sync"``; the mode name only selects this class, the behaviour is "sync".
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        if value != MODE:
            raise ValueError(
                f"{type(self).__name__} is selected by trainer.v1.trainer_mode={MODE}, got {value!r}"
            )

    def _compute_advantage(self, batch, metrics: dict):
        """Densify the step rewards, then run verl's advantage computation."""
        with torch.no_grad():
            if self.step_rewards is not None:
                metrics.update(self.step_rewards(batch, self.global_steps))
            else:
                metrics.update(densify_tq_batch(batch, self.spader, self.global_steps))
        with critic_values(self.config.algorithm.adv_estimator, batch):
            result = super()._compute_advantage(batch, metrics)
        with torch.no_grad():
            metrics.update(
                episode_metrics(batch, tq.kv_batch_get)
            )  # valid-format rate, searches, advantage spread
        return result
