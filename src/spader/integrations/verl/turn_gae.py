"""verl advantage estimator ``r3rag_turn_gae``: GAE restricted to each assistant turn (R3-RAG).

Each assistant turn is its own episode (R3-RAG trains every step as a separate sample): GAE with
gamma = lambda = 1 inside the turn, bootstrap 0 at its end, critic values per token
(:func:`spader.methods.r3rag.scoring.turn_gae`), then the advantages are whitened over the batch with verl's
``masked_whiten``, as its ``gae`` does.

verl 0.9.1's ``compute_advantage`` hands the critic values to its built-in ``gae`` only; a
registered estimator receives the rewards, the response mask, the uids and the config. So the
``spader_sync`` trainer mode reads the batch's values from TransferQueue around verl's advantage
step (:func:`critic_values`, a no-op for every other estimator) and the estimator takes them from
there; they are the same padded rows in the same order verl's own step reads.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import transfer_queue as tq
from verl.trainer.ppo.core_algos import register_adv_est
from verl.utils import torch_functional as verl_F

from spader.methods.r3rag.scoring import turn_gae

__all__ = ["TURN_GAE", "critic_values", "turn_gae_advantage"]

TURN_GAE = "r3rag_turn_gae"

_VALUES: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "spader_critic_values", default=None
)


@contextlib.contextmanager
def critic_values(estimator: str, batch) -> Iterator[None]:
    """While verl computes the advantage of ``batch``, make its critic values available to
    :func:`turn_gae_advantage` (only when ``estimator`` is :data:`TURN_GAE`)."""
    if estimator != TURN_GAE:
        yield
        return
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["values"])
    values = data["values"]
    token = _VALUES.set(values.to_padded_tensor(0.0) if values.is_nested else values)
    try:
        yield
    finally:
        _VALUES.reset(token)


@register_adv_est(TURN_GAE)
def turn_gae_advantage(token_level_rewards, response_mask, config=None, values=None, **kwargs):
    """Per-turn GAE advantages, whitened over the batch.

    Args:
        token_level_rewards: (B, L) rewards (step rewards on turn ends, minus the KL penalty).
        response_mask: (B, L) 1 on assistant tokens.
        config: verl's ``algorithm`` config (gamma and lam must be 1: the estimator is defined there).
        values: (B, L) critic values; by default those :func:`critic_values` provides.
    Returns:
        ``(advantages, returns)``, both (B, L).
    """
    if config is not None:
        for key in ("gamma", "lam"):
            if config.get(key) is not None and float(config.get(key)) != 1.0:
                raise ValueError(
                    f"{TURN_GAE} is GAE with gamma = lam = 1; algorithm.{key} is {config.get(key)}"
                )
    if values is None:
        values = _VALUES.get()
    if values is None:
        raise ValueError(
            f"{TURN_GAE} needs the critic's values: train with critic.enable=true and "
            "trainer.v1.trainer_mode=spader_sync (which hands them to the estimator)"
        )
    values = values.to(token_level_rewards.device)
    if values.shape != token_level_rewards.shape:
        raise ValueError(
            f"critic values {tuple(values.shape)} do not match the rewards {tuple(token_level_rewards.shape)}"
        )
    with torch.no_grad():
        advantages, returns = turn_gae(token_level_rewards, values, response_mask)
        # verl's whitening, then 0 off the assistant tokens (the loss masks them anyway)
        advantages = verl_F.masked_whiten(advantages, response_mask) * response_mask
    return advantages, returns
