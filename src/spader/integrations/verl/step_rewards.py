"""The step rewards of a variant inside verl's trainer, for every method alike.

``algorithm.step_reward`` names the step rewards of the variant's reward in the method registry
(:attr:`spader.methods.Reward.step_reward`); :func:`make_step_rewards` builds them from the
reward's factory (:attr:`spader.methods.Reward.step_rewards`, a pure
:class:`spader.methods.steps.StepRewards`) and wraps them in the TransferQueue I/O of the
``spader_sync`` trainer mode (:class:`TransferQueueStepRewards`): before verl's advantage, read
the step's batch, compute the dense token rewards, write them back as ``rm_scores``. A method from
outside the repository plugs in the same way.
"""

from __future__ import annotations

from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.workers.utils.padding import response_to_nested

from spader.methods import REWARDS, resolve
from spader.methods.steps import StepBatch, StepRewards

__all__ = ["TransferQueueStepRewards", "check_step_rewards", "make_step_rewards", "step_reward_kind"]

_FIELDS = ["uid", "response_mask", "rm_scores", "extra_fields"]


def step_reward_kind(cfg: Any) -> str:
    """``algorithm.step_reward`` of a full verl config, one the registry knows.

    Raises:
        ValueError: it is missing or unknown (naming the registered ones).
    """
    known = {r.step_reward: r for r in REWARDS.values() if r.step_reward is not None}
    kind = cfg["algorithm"].get("step_reward")
    if kind not in known:
        raise ValueError(
            f"algorithm.step_reward must be one of {sorted(known)} (the spader_sync trainer mode's step "
            f"rewards), got {kind!r}"
        )
    return str(kind)


def _padded(t: torch.Tensor, value) -> torch.Tensor:
    return t.to_padded_tensor(value) if t.is_nested else t


class TransferQueueStepRewards:
    """A method's step rewards over TransferQueue: reads a step's batch, replaces its
    ``rm_scores`` by the dense rewards, returns their metrics."""

    def __init__(self, rewards: StepRewards):
        self.rewards = rewards

    def __call__(self, batch, global_step: int) -> dict[str, float]:
        """Replace the batch's ``rm_scores`` (verl's ``KVBatchMeta``) by the dense step rewards."""
        wanted = [*_FIELDS, *getattr(self.rewards, "fields", ())]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=wanted)
        stored_mask = data["response_mask"]
        view = StepBatch(
            response_mask=_padded(stored_mask, 0),
            terminal=_padded(data["rm_scores"], 0.0).sum(dim=1),
            uids=[str(u) for u in data["uid"]],
            extra=list(data["extra_fields"]),
            info=[dict(i or {}) for i in data["extra_info"]] if "extra_info" in wanted else [],
            skip=[bool(tag.get("is_padding", False)) for tag in batch.tags],
            keys=list(batch.keys),
            step=global_step,
        )
        dense, metrics = self.rewards(view)
        # TransferQueue hands back a regular tensor when every sample has the same length
        rm_scores = response_to_nested(dense, stored_mask) if stored_mask.is_nested else dense
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"rm_scores": rm_scores}, batch_size=len(batch)),
        )
        return metrics


def make_step_rewards(cfg: Any) -> TransferQueueStepRewards:
    """The step rewards a full verl config selects (``algorithm.step_reward``), built once when
    the trainer starts, so that malformed settings fail before any GPU work."""
    kind = step_reward_kind(cfg)
    (reward,) = [r for r in REWARDS.values() if r.step_reward == kind]
    return TransferQueueStepRewards(resolve(reward.step_rewards)(cfg))


def check_step_rewards(cfg: Any) -> None:
    """The checks of a config's step rewards that verl cannot make (the registry's
    :attr:`spader.methods.Reward.checks` of the reward ``algorithm.step_reward`` names).

    Raises:
        ValueError naming the key.
    """
    kind = step_reward_kind(cfg)
    (reward,) = [r for r in REWARDS.values() if r.step_reward == kind]
    if reward.checks is not None:
        resolve(reward.checks)(cfg)
