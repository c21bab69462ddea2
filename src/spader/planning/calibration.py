"""The GPU memory calibration record: what ``scripts/gpu_memory_calibration.py`` measured, read back
by the memory plan (``hardware.calibration``).

A record is a YAML file with one entry per model shape the script measured (a backbone's shape
with fewer decoder layers; the layer count is not part of the match). Each entry holds the
measured constants that replace the plan's estimated ones for that shape
(:class:`Measured`, :meth:`spader.planning.plan.Calibration`), the raw peaks they were derived
from and the plan's estimates for the same sizes, so a reader sees what moved:

* ``kept_bytes_per_token_layer``: the layer input activation checkpointing keeps, per token and
  decoder layer (the slope of the peak between two layer counts, everything else held fixed);
* ``backward_bytes_per_token``: the working set of one decoder layer's backward pass with its
  recomputed forward, per token (the intercept of the same two runs);
* ``forward_bytes_per_token``: one layer's forward working set without gradients (log-prob passes);
* ``mask_bytes_per_element``: what the padded path's attention mask adds, per element of
  micro-batch x length x length (the padded run less the unpadded one);
* ``logprobs``: the log-prob computation from the last hidden states through the output
  projection, per path (``fused``: verl's fused kernel through the lm_head module as the training
  runs it; ``full``: the (tokens x vocabulary) logits with verl's log-softmax) and pass
  (``update`` with gradients, ``update_entropy`` with the entropy checkpointed in the loss,
  ``forward`` without), as ``fixed_bytes + bytes_per_token x tokens`` fitted on two token counts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["KIND", "SHAPE_KEYS", "Calibration", "LogProbCost", "Measured", "load_calibration", "shape_key"]

#: The ``kind`` of a calibration record (a YAML file of another kind is refused).
KIND = "spader-gpu-memory-calibration"
#: What must agree between a record's shape and a job's for the record to apply (not the layers).
SHAPE_KEYS = (
    "vocab",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate",
    "tied",
    "qk_norm",
    "qkv_bias",
)


def shape_key(shape: Any) -> tuple:
    """The matching key of a :class:`spader.planning.plan.Shape` or of a record's ``shape`` mapping."""
    get = shape.get if isinstance(shape, Mapping) else lambda k: getattr(shape, k)
    return tuple(get(k) for k in SHAPE_KEYS)


@dataclass(frozen=True)
class LogProbCost:
    """Bytes of one log-prob computation: ``fixed_bytes + bytes_per_token x tokens``."""

    fixed_bytes: float
    bytes_per_token: float

    def gib(self, tokens: int) -> float:
        return (self.fixed_bytes + self.bytes_per_token * tokens) / float(1 << 30)


@dataclass(frozen=True)
class Measured:
    """The measured constants of one shape (see the module docstring)."""

    model: str
    device: str
    tokens: int
    kept_bytes_per_token_layer: float
    backward_bytes_per_token: float
    forward_bytes_per_token: float
    mask_bytes_per_element: float
    logprobs: dict[str, dict[str, LogProbCost]] = field(default_factory=dict)

    def logprob(self, path: str, kind: str) -> LogProbCost | None:
        return self.logprobs.get(path, {}).get(kind)


@dataclass(frozen=True)
class Calibration:
    """A loaded record: its path and its entries by shape key."""

    path: str
    entries: dict[tuple, Measured]

    def for_shape(self, shape: Any) -> Measured | None:
        return self.entries.get(shape_key(shape))


def _number(entry: Mapping[str, Any], key: str, where: str) -> float:
    try:
        value = float(entry[key])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: '{key}' is missing or not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{where}: '{key}' is not finite")
    return value


def load_calibration(path: str | os.PathLike) -> Calibration:
    """Read a record written by ``scripts/gpu_memory_calibration.py``.

    Raises:
        ValueError: not such a record, or an entry lacks a constant (the message names the file,
            the entry and the key).
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(
            f"hardware.calibration: {p} does not exist (write it with scripts/gpu_memory_calibration.py)"
        )
    with open(p, encoding="utf-8") as f:
        record = yaml.safe_load(f) or {}
    if not isinstance(record, Mapping) or record.get("kind") != KIND:
        raise ValueError(f"{p}: not a GPU memory calibration record (kind: {KIND})")
    entries: dict[tuple, Measured] = {}
    for i, entry in enumerate(record.get("shapes") or []):
        where = f"{p}: shapes[{i}]"
        shape = entry.get("shape") or {}
        missing = [k for k in SHAPE_KEYS if k not in shape]
        if missing:
            raise ValueError(f"{where}: shape lacks {', '.join(missing)}")
        constants = entry.get("measured") or {}
        logprobs: dict[str, dict[str, LogProbCost]] = {}
        for path_name, kinds in (constants.get("logprobs") or {}).items():
            logprobs[path_name] = {
                kind: LogProbCost(
                    _number(cost, "fixed_bytes", f"{where}.logprobs.{path_name}.{kind}"),
                    _number(cost, "bytes_per_token", f"{where}.logprobs.{path_name}.{kind}"),
                )
                for kind, cost in (kinds or {}).items()
            }
        entries[shape_key(shape)] = Measured(
            model=str(entry.get("model", "?")),
            device=str(record.get("device", "?")),
            tokens=int(_number(entry, "tokens", where)),
            kept_bytes_per_token_layer=_number(constants, "kept_bytes_per_token_layer", where),
            backward_bytes_per_token=_number(constants, "backward_bytes_per_token", where),
            forward_bytes_per_token=_number(constants, "forward_bytes_per_token", where),
            mask_bytes_per_element=_number(constants, "mask_bytes_per_element", where),
            logprobs=logprobs,
        )
    if not entries:
        raise ValueError(f"{p}: the record measured no shape")
    return Calibration(path=str(p), entries=entries)
