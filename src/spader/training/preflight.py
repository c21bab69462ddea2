"""Checks that run before any GPU work of a training job, each failing with a message that says
what is wrong and where to fix it.

* the backbone and the variant are in the config (and the variant is one the backbone trains);
* the base model directory exists and holds a Hugging Face model;
* the GPUs the backbone asks for are visible to this process (GPU runs; ``training.device: cpu``
  needs none);
* the installed verl is the version this project pins;
* the NVIDIA driver runs the `gpu` extra's CUDA 13 stack (driver 580 or newer; GPU runs);
* a gated hub model (Llama-3.1) whose weights are not here yet has a hub token to fetch them;
* the job's memory plan fits its GPUs (:func:`check_job_memory`, after the launch is composed:
  :mod:`spader.training.plan` on the job's own verl config and model shape);
* the retrieval service answers ``/health``.

:func:`static_checks` runs the first six together and reports every failure at once; the memory
plan runs once the launch is composed, the service check once the job has started the service.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from spader.models import gated
from spader.models.gated import GATED_MODELS, hub_token_configured
from spader.training import VERL_VERSION

log = logging.getLogger(__name__)

__all__ = [
    "GATED_MODELS",
    "MIN_DRIVER",
    "PreflightError",
    "check_driver",
    "check_gpus",
    "check_hub_token",
    "check_job_memory",
    "check_memory",
    "check_model_dir",
    "check_retrieval",
    "check_verl_version",
    "driver_version",
    "gpu_memory_gib",
    "hub_token_configured",
    "select",
    "static_checks",
]

#: Oldest NVIDIA driver series that runs the `gpu` extra: torch 2.11 and sglang 0.5.14 are CUDA 13
#: builds, and CUDA 13.0 needs a 580 driver (docs/gpu.md).
MIN_DRIVER = 580


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
            f"verl is not installed; training needs verl=={expected} (pip install -c requirements/gpu-lock.txt -e '.[gpu]')"
        ) from None
    if installed != expected:
        raise PreflightError(
            f"verl {installed} is installed but this project is pinned to verl=={expected} "
            "(pyproject.toml); install the pinned version: pip install -c requirements/gpu-lock.txt -e '.[gpu]'"
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


def driver_version() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``), or None when it cannot be read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not run %s: %s", exe, exc)
        return None
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        log.warning("%s exited %d: %s", exe, proc.returncode, (proc.stderr or proc.stdout).strip()[:300])
        return None
    return lines[0]


def check_driver(version: str | None = None, *, minimum: int = MIN_DRIVER) -> str | None:
    """The NVIDIA driver is of the ``minimum`` series or newer; returns its version (None when it
    cannot be read: the GPU check then says whether torch sees the GPUs).

    Raises:
        PreflightError: an older driver (torch would see no GPU, sglang's kernels would not load).
    """
    version = version if version is not None else driver_version()
    if version is None:
        log.warning("NVIDIA driver version unknown (no nvidia-smi); the gpu extra needs %d or newer", minimum)
        return None
    try:
        major = int(version.split(".")[0])
    except ValueError:
        log.warning("unreadable NVIDIA driver version %r", version)
        return version
    if major < minimum:
        raise PreflightError(
            f"NVIDIA driver {version} is older than the {minimum} series that the gpu extra's CUDA 13 "
            f"stack needs (torch 2.11, sglang 0.5.14; docs/gpu.md): update the driver or run on another node"
        )
    return version


def check_hub_token(
    model: str, model_dir: str | os.PathLike | None = None, *, environ: Mapping[str, str] | None = None
) -> None:
    """:func:`spader.models.gated.check_hub_token` (the download rule runs it too) as a preflight check.

    Raises:
        PreflightError: naming the model, its licence page and where the token goes.
    """
    try:
        gated.check_hub_token(model, model_dir, environ=environ)
    except gated.HubTokenError as exc:
        raise PreflightError(str(exc)) from None


def static_checks(
    *,
    backbone: str,
    model: str,
    model_dir: str | os.PathLike,
    gpus: int,
    available_gpus: int | None = None,
    verl_version: str = VERL_VERSION,
    device: str = "cuda",
    driver: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Run the model, GPU, driver, hub-token and verl-version checks; raise one error listing every
    failure.

    ``device`` is ``training.device``: a ``cpu`` run needs no GPU, so the GPU and driver checks are
    skipped. ``driver`` replaces the version ``nvidia-smi`` reports (tests).

    Returns:
        The installed verl version.
    """
    problems: list[str] = []
    installed = ""
    checks: list = [
        lambda: check_model_dir(model_dir, backbone=backbone, model=model),
        lambda: check_hub_token(model, model_dir, environ=environ),
    ]
    if device != "cpu":
        # the driver first: with an older one torch sees no GPU, and its message says why
        checks += [
            lambda: check_driver(driver),
            lambda: check_gpus(gpus, backbone=backbone, available=available_gpus),
        ]
    try:
        installed = check_verl_version(verl_version)
    except PreflightError as exc:
        problems.append(str(exc))
    for check in checks:
        try:
            check()
        except PreflightError as exc:
            problems.append(str(exc))
    if problems:
        raise PreflightError("training cannot start:\n  " + "\n  ".join(problems))
    return installed


def gpu_memory_gib() -> float | None:
    """Memory of the smallest visible GPU in GiB (None without CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return None
        return min(
            torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())
        ) / float(1 << 30)
    except Exception as exc:  # noqa: BLE001  (any CUDA error: the plan then uses the configured size)
        log.warning("could not read the GPUs' memory: %s", exc)
        return None


def _plain(value: Any) -> dict:
    if value is None:
        return {}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return dict(value)


def check_memory(
    *,
    name: str,
    model: str,
    model_dir: str | os.PathLike | None,
    verl_config: Any,
    training_gpus: int,
    retrieval: Mapping[str, Any] | None = None,
    judge: Mapping[str, Any] | None = None,
    judge_model_dir: str | os.PathLike | None = None,
    capacity_gib: float | None = None,
):
    """The job's memory plan (:mod:`spader.training.plan`) on its own composed config and model
    shape, logged line by line; the jobs it checks are returned.

    Args:
        name: the job's name in the log.
        model, model_dir: the backbone (its ``config.json`` gives the shape).
        verl_config: the composed verl config (DictConfig or resolved mapping).
        training_gpus: GPUs verl shards over.
        retrieval: the job's retrieval settings (its reranker sits on every GPU of the job).
        judge, judge_model_dir: a judge the job serves on its node (``judge.gpus`` of it).
        capacity_gib: memory of one GPU; default: what the visible GPUs report, else
            ``hardware.gpu_memory_gib``'s default.

    Raises:
        PreflightError: a job does not fit (the message holds the plan and what to change).
    """
    from omegaconf import OmegaConf

    from spader.config.model import HardwareConfig
    from spader.training.plan import judge_job, load_shape, reranker_gib, reranker_on_gpus, training_job

    capacity = capacity_gib or gpu_memory_gib() or HardwareConfig().gpu_memory_gib
    resolved = (
        OmegaConf.to_container(verl_config, resolve=True)
        if OmegaConf.is_config(verl_config)
        else dict(verl_config)
    )
    reranker = reranker_gib(retrieval) if reranker_on_gpus(retrieval) else 0.0
    jobs = [
        training_job(
            name,
            load_shape(model, model_dir),
            resolved,
            gpus=training_gpus,
            capacity=capacity,
            reranker=reranker,
        )
    ]
    if judge:
        judge_shape = load_shape(str(judge.get("model")), judge_model_dir)
        jobs.append(judge_job(f"{name} judge", judge_shape, judge, capacity=capacity, reranker=reranker))
    for job in jobs:
        for line in job.lines():
            log.info("memory plan: %s", line)
    bad = [job for job in jobs if not job.fits]
    if bad:
        text = "\n".join(line for job in bad for line in job.lines())
        raise PreflightError(
            f"the job does not fit in {capacity:.1f} GiB per GPU:\n{text}\nlower "
            "training.ppo_micro_batch_size_per_gpu or training.gpu_memory_utilization, or offload the "
            "optimizer state (config/verl, docs/gpu.md); `python -m spader.training.plan` plans every job"
        )
    return jobs


def check_job_memory(job: Any, verl_config: Any, *, capacity_gib: float | None = None):
    """:func:`check_memory` of a :class:`spader.training.run.TrainJob` and its composed config
    (nothing for a CPU run)."""
    if str(getattr(job, "device", "cuda")) == "cpu":
        return []
    baseline = getattr(job, "baseline", None)
    judge_gpus = int(getattr(baseline, "judge_gpus", 0) or 0)
    judge_node = bool(getattr(job, "judge_node", False))
    per_node = int(job.workers) - (0 if judge_node else judge_gpus)
    training_gpus = int(getattr(job, "train_nodes", 1) or 1) * per_node
    spec = job.backbone_spec
    model = str(
        (spec.get("model") if isinstance(spec, Mapping) else getattr(spec, "model", None)) or job.model_dir
    )
    retrieval = _plain(getattr(job, "retrieval", None))
    if retrieval.get("reranker") is not None and getattr(job, "reranker_path", None):
        retrieval["reranker"] = {**retrieval["reranker"], "path": str(job.reranker_path)}
    return check_memory(
        name=f"train {job.backbone}/{job.variant}",
        model=model,
        model_dir=job.model_dir,
        verl_config=verl_config,
        training_gpus=training_gpus,
        retrieval=retrieval,
        judge=_plain(getattr(job, "judge", None)) if judge_gpus else None,
        judge_model_dir=getattr(job, "judge_model_dir", None),
        capacity_gib=capacity_gib,
    )
