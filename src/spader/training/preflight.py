"""Checks that run before any GPU work of a training job, each failing with a message that says
what is wrong and where to fix it.

* the backbone and the variant are in the config (and the variant is one the backbone trains);
* the base model directory exists and holds a Hugging Face model;
* the GPUs the backbone asks for are visible to this process (GPU runs; ``training.device: cpu``
  needs none);
* the installed verl is the version this project pins;
* the retrieval service answers ``/health``.

:func:`static_checks` runs the first four together and reports every failure at once; the
service check runs once the job has started the service.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from spader.training import VERL_VERSION

log = logging.getLogger(__name__)

__all__ = [
    "PreflightError",
    "check_gpus",
    "check_model_dir",
    "check_retrieval",
    "check_verl_version",
    "select",
    "static_checks",
]


class PreflightError(RuntimeError):
    """A training job cannot start; the message names the problem and the config key or path."""


def select(config: Mapping[str, Any], backbone: str, variant: str) -> tuple[dict, dict]:
    """The backbone's and the variant's config entries.

    Raises:
        PreflightError: the backbone or variant is not in the config, or the backbone does not
            list the variant.
    """
    backbones = config.get("backbones") or {}
    variants = config.get("variants") or {}
    if backbone not in backbones:
        raise PreflightError(
            f"backbone {backbone!r} is not in the config (config key 'backbones' has: {', '.join(backbones) or 'none'})"
        )
    if variant not in variants:
        raise PreflightError(
            f"variant {variant!r} is not in the config (config key 'variants' has: {', '.join(variants) or 'none'})"
        )
    trained = list(backbones[backbone].get("variants") or [])
    if variant not in trained:
        raise PreflightError(
            f"backbone {backbone!r} does not train variant {variant!r} "
            f"(config key 'backbones.{backbone}.variants': {trained})"
        )
    return dict(backbones[backbone]), dict(variants[variant])


def check_model_dir(model_dir: str | os.PathLike, *, backbone: str, model: str) -> None:
    """The base model directory exists and holds ``config.json`` (a Hugging Face model)."""
    path = Path(model_dir)
    where = f"config key 'backbones.{backbone}.model' is {model!r}"
    if not path.exists():
        raise PreflightError(f"base model path {path} does not exist ({where})")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise PreflightError(
            f"base model path {path} is not a Hugging Face model directory: no config.json ({where})"
        )


def visible_gpus() -> int:
    """CUDA devices visible to this process (``CUDA_VISIBLE_DEVICES`` applies)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(requested: int, *, backbone: str, available: int | None = None) -> None:
    """The node has at least the GPUs the backbone asks for.

    Args:
        requested: ``backbones.<backbone>.gpus``.
        backbone: the backbone's name (for the message).
        available: visible CUDA devices; None counts them with torch.
    """
    if available is None:
        available = visible_gpus()
    key = f"config key 'backbones.{backbone}.gpus'"
    if requested < 1:
        raise PreflightError(
            f"{key} is {requested}: a GPU run needs at least 1 (or set training.device: cpu)"
        )
    if available < requested:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise PreflightError(
            f"{requested} GPU(s) requested ({key}) but {available} available to this job "
            f"(CUDA_VISIBLE_DEVICES={visible if visible is not None else 'unset'}); "
            "run it on a node with enough GPUs or lower the request"
        )
    if available > requested:
        log.info("%d GPUs visible, training uses %d (%s)", available, requested, key)


def check_verl_version(expected: str = VERL_VERSION) -> str:
    """The installed verl is the pinned release; returns its version."""
    try:
        installed = metadata.version("verl")
    except metadata.PackageNotFoundError:
        raise PreflightError(
            f"verl is not installed; training needs verl=={expected} (pip install -e '.[gpu]')"
        ) from None
    if installed != expected:
        raise PreflightError(
            f"verl {installed} is installed but this project is pinned to verl=={expected} "
            "(pyproject.toml); install the pinned version: pip install -e '.[gpu]'"
        )
    return installed


def check_retrieval(base_url: str, *, timeout: float = 30.0) -> dict:
    """The retrieval service at ``base_url`` answers ``/health``; returns its answer."""
    from spader.retrieval.client import RetrievalClient

    try:
        with RetrievalClient(base_url, timeout=timeout, retries=0) as client:
            health = client.health()
    except Exception as exc:  # any failure means the rollouts would get no search results
        raise PreflightError(f"retrieval service at {base_url} is not healthy: {exc}") from exc
    if isinstance(health, Mapping) and health.get("status") not in (None, "ok"):
        raise PreflightError(
            f"retrieval service at {base_url} is not healthy: /health returned {dict(health)}"
        )
    return dict(health) if isinstance(health, Mapping) else {"health": health}


def static_checks(
    *,
    backbone: str,
    model: str,
    model_dir: str | os.PathLike,
    gpus: int,
    available_gpus: int | None = None,
    verl_version: str = VERL_VERSION,
    device: str = "cuda",
) -> str:
    """Run the model, GPU and verl-version checks; raise one error listing every failure.

    ``device`` is ``training.device``: a ``cpu`` run needs no GPU, so the GPU check is skipped.

    Returns:
        The installed verl version.
    """
    problems: list[str] = []
    installed = ""
    try:
        installed = check_verl_version(verl_version)
    except PreflightError as exc:
        problems.append(str(exc))
    try:
        check_model_dir(model_dir, backbone=backbone, model=model)
    except PreflightError as exc:
        problems.append(str(exc))
    if device != "cpu":
        try:
            check_gpus(gpus, backbone=backbone, available=available_gpus)
        except PreflightError as exc:
            problems.append(str(exc))
    if problems:
        raise PreflightError("training cannot start:\n  " + "\n  ".join(problems))
    return installed
