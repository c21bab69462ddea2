"""Per-step training metrics of the agent that verl does not log itself.

verl's trainer logs the mean reward, response lengths, KL, entropy, step times and the min/mean/max
of the advantages of every step, but nothing about the episodes as episodes. :func:`episode_metrics`
reads what the rollouts left in TransferQueue and adds, under ``episode/``:

* ``format_valid`` - share of trajectories whose final turn is a well-formed answer (the reward
  function's own verdict, ``reward_extra_info.format_valid``);
* ``f1`` - mean answer F1 of the batch (0 for invalid answers);
* ``searches`` - search steps per trajectory (the search tool's step records, failed ones included);
* ``searches_answered`` - search steps per trajectory the service answered (no error observation:
  not a malformed call, not a service that failed or could not be reached); ``search_errors`` - the
  batch's search steps the service failed ("search service unavailable"), and ``call_errors`` -
  those whose call the tool refused (the policy's malformed or empty call);
* ``entities`` - distinct gold entities the search steps of a trajectory surfaced;
* ``failed`` - trajectories whose episode failed for an infrastructure reason (scored 0, no peer
  in any group: the estimators leave them out of their groups' statistics);
* ``advantage_std`` - spread of the token advantages over the trained (assistant) tokens;
* ``turns_closed`` - share of the assistant turns that end at a closing tag (``agent.stop``), and
  ``turns_cut`` - share the rollout engine ran past the tag (the agent loop cut them: an engine
  that does not stop at the stop strings);
* ``rollout_seeds``, ``rollout_seed_min``, ``rollout_seed_max`` - the distinct seeds the rollout
  engines sampled the batch with, as each server reported its own (one per replica);
* ``seconds/generate``, ``seconds/search``, ``seconds/reward`` - time the batch's episodes spent
  waiting for generation, for the search tool and for the reward (verl's per-episode timers,
  summed over the episodes: episodes run concurrently, so these add up to more than the step's
  rollout time).

The trainer mode calls it after verl's advantage computation, when every field is there.
"""

from __future__ import annotations

import logging
import math

import torch

__all__ = ["SEED_FIELD", "TURN_STATS", "episode_metrics"]

log = logging.getLogger(__name__)

#: A rollout server's ``TokenOutput.extra_fields`` key for the seed its engine samples with (the
#: project's sglang server and the CPU replica report it); the agent loop keeps it per episode.
SEED_FIELD = "rollout_seed"
#: Per-episode turn counters the agent loop keeps in the extra fields: turns generated, turns that
#: end at a closing tag, turns the server ran past the tag (cut by the agent loop).
TURN_STATS = ("spader_turns", "spader_turns_closed", "spader_turns_cut")


def _padded(t: torch.Tensor, value) -> torch.Tensor:
    return t.to_padded_tensor(value) if t.is_nested else t


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


def _entities(steps) -> int:
    """Distinct gold entities the search steps of one trajectory surfaced (their ``hits``)."""
    return len({h for step in steps or [] for h in (step or {}).get("hits") or []})


def _steps(extra) -> list:
    from spader.methods.steps import STEPS_KEY

    return list((extra or {}).get(STEPS_KEY) or [])


def _error(step, service: bool | None = None) -> bool:
    """A step record whose search returned an error observation (``service``: one the service
    failed, or, False, one whose call the tool refused; None: either)."""
    from spader.integrations.verl.search_tool import SERVICE_ERROR

    error = str((step or {}).get("error") or "")
    if not error or service is None:
        return bool(error)
    return error.startswith(SERVICE_ERROR) == service


def episode_metrics(batch, kv_batch_get, *, prefix: str = "episode/") -> dict[str, float]:
    """Episode-level metrics of one training batch read from TransferQueue.

    Args:
        batch: verl's ``KVBatchMeta`` of the step (padding rows, tagged ``is_padding``, are left out).
        kv_batch_get: TransferQueue's ``kv_batch_get`` (the trainer's, so a test can replace it).
    Returns:
        ``{prefix + name: value}`` (see the module docstring); NaN where a field is missing.
    """
    from spader.methods.steps import FAILURE_KEY, STEPS_KEY

    data = kv_batch_get(
        keys=batch.keys,
        partition_id=batch.partition_id,
        select_fields=["extra_fields", "advantages", "response_mask", "metrics"],
    )
    keep = [not tag.get("is_padding", False) for tag in batch.tags]
    present = set(data.keys())

    def rows(name: str) -> list:
        return [v for v, k in zip(list(data[name]), keep, strict=True) if k] if name in present else []

    extra = rows("extra_fields")
    info = [(e or {}).get("reward_extra_info") or {} for e in extra]
    out = {
        "format_valid": _mean([float(i["format_valid"]) for i in info if "format_valid" in i]),
        "f1": _mean([float(i["f1"]) for i in info if "f1" in i]),
        "searches": _mean([float(len((e or {}).get(STEPS_KEY) or [])) for e in extra]),
        "searches_answered": _mean([float(sum(not _error(st) for st in _steps(e))) for e in extra]),
        "search_errors": float(sum(_error(st, service=True) for e in extra for st in _steps(e))),
        "call_errors": float(sum(_error(st, service=False) for e in extra for st in _steps(e))),
        "failed": float(sum(bool((e or {}).get(FAILURE_KEY)) for e in extra)),
        "entities": _mean([float(_entities((e or {}).get(STEPS_KEY))) for e in extra]),
    }
    turns, closed, cut = (sum(int((e or {}).get(k) or 0) for e in extra) for k in TURN_STATS)
    out["turns_closed"] = closed / turns if turns else math.nan
    out["turns_cut"] = cut / turns if turns else math.nan
    seeds = {int(e[SEED_FIELD]) for e in extra if (e or {}).get(SEED_FIELD) is not None}
    out["rollout_seeds"] = float(len(seeds))
    out["rollout_seed_min"] = float(min(seeds)) if seeds else math.nan
    out["rollout_seed_max"] = float(max(seeds)) if seeds else math.nan
    timers = [t or {} for t in rows("metrics")]
    for name, key in (
        ("generate", "generate_sequences"),
        ("search", "tool_calls"),
        ("reward", "compute_score"),
    ):
        out[f"seconds/{name}"] = float(sum(float(t.get(key) or 0.0) for t in timers)) if timers else math.nan
    out["advantage_std"] = math.nan
    if {"advantages", "response_mask"} <= present:
        mask = _padded(data["response_mask"], 0).bool()
        adv = _padded(data["advantages"], 0.0)
        kept = torch.tensor(keep, dtype=torch.bool)
        trained = adv[kept][mask[kept]]
        out["advantage_std"] = float(trained.std(unbiased=False)) if trained.numel() else math.nan
    return {prefix + k: v for k, v in out.items()}
