"""What every config section shares: the :class:`Section` base (unknown keys are errors, numbers
are finite), the bounds of keys without a natural limit, the name types, and small helpers."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints

from spader.datasets import FILE_NAME_PATTERN, NAME_PATTERN, registry

__all__ = [
    "DATASETS",
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_INITIAL_K",
    "MAX_SECONDS",
    "MAX_SEED",
    "PROMPTING",
    "Device",
    "FileName",
    "Name",
    "Section",
    "model_kind",
]

#: The datasets (the registry, :mod:`spader.datasets`: the paper's four, then those of entry
#: points), in table order.
DATASETS = tuple(registry())
#: Prompting methods: evaluated with the backbone as released (or warm-started), never trained.
PROMPTING = ("rag", "react")
#: Most BM25 candidates per query the retrieval service reranks (``retrieval.initial_k``, the
#: evidence search's ``depth``); reranking cost grows linearly with it.
MAX_INITIAL_K = 1000
#: Bounds of keys without a natural limit: seeds (a 32-bit unsigned integer, what numpy and torch
#: accept everywhere), counts, sizes in bytes, durations.
MAX_SEED = 2**32 - 1
MAX_COUNT = 10**9
MAX_BYTES = 2**50
MAX_SECONDS = 7 * 24 * 3600.0


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
#: A release file's name: a plain file name (``.`` and ``..`` name directories).
FileName = Annotated[str, StringConstraints(pattern=FILE_NAME_PATTERN)]
Device = Annotated[str, StringConstraints(pattern=r"^(cpu|cuda:[0-9]+)$")]


def _once(items: list[Any]) -> list[Any]:
    """A list the code reads as a set, each item once (a repeat means nothing; the order given is
    kept for display, params compare it sorted: ``spader.infra.rerun_keys.LISTS``)."""
    return list(dict.fromkeys(items))


class Section(BaseModel):
    """A config section: unknown keys are errors, numbers are finite, values are checked on
    assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


def model_kind(name: str) -> str:
    """``tiny`` (``tiny:<kind>``, built locally), ``path`` (a local path) or ``hub`` (a hub id).

    >>> model_kind("tiny:qwen3"), model_kind("Qwen/Qwen3-8B"), model_kind("./weights")
    ('tiny', 'hub', 'path')
    """
    if name.startswith("tiny:"):
        return "tiny"
    if os.path.exists(name) or name.startswith(("/", "./", "../")):
        return "path"
    return "hub"


def _unique(items: list[Any], key: str) -> None:
    seen = set()
    for item in items:
        if item in seen:
            raise ValueError(f"{key}: '{item}' is listed twice")
        seen.add(item)
