"""Checks that run before any GPU work of a training job, each failing with a message that says
what is wrong and where to fix it.

* the backbone and the variant are in the config (and the variant is one the backbone trains);
* the base model directory exists and holds a Hugging Face model;
* the GPUs the backbone asks for are visible to this process (GPU runs; ``training.device: cpu``
  needs none);
* the installed verl is the version this project pins;
* the NVIDIA driver runs the `gpu` extra's CUDA 13 stack (driver 580 or newer; GPU runs);
* the C library is glibc 2.34 or newer (sglang's wheels are ``manylinux_2_34``; GPU runs);
* ``nvcc`` of CUDA 13 is there for flashinfer's kernels compiled at first use (``CUDA_HOME``,
  ``PATH`` or ``/usr/local/cuda``; GPU runs);
* a gated hub model (Llama-3.1) whose weights are not here yet has a hub token to fetch them;
* the job's memory plan fits its GPUs (:func:`check_job_memory`, after the launch is composed:
  :mod:`spader.planning.plan` on the job's own verl config and model shape);
* the retrieval service answers ``/health``.

:func:`static_checks` runs the first eight together and reports every failure at once; the memory
plan runs once the launch is composed, the service check once the job has started the service.
``python -m spader.training.preflight`` runs the environment's checks (driver, glibc, nvcc, GPUs,
verl, sglang) on their own, the first step of a GPU node's first hour (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from spader.infra.node import (
    MIN_DRIVER,
    NVCC_MAJOR,
    PreflightError,
    check_driver,
    check_nvcc,
    driver_version,
    glibc_version,
    nvcc_version,
)
from spader.models import gated
from spader.models.gated import GATED_MODELS, hub_token_configured
from spader.training import VERL_VERSION

log = logging.getLogger(__name__)

__all__ = [
    "GATED_MODELS",
    "HELP",
    "MIN_DRIVER",
    "MIN_GLIBC",
    "NVCC_MAJOR",
    "PreflightError",
    "add_arguments",
    "check_base_model_dir",
    "check_driver",
    "check_gated_access",
    "check_glibc",
    "check_gpus",
    "check_job_memory",
    "check_memory",
    "check_nvcc",
    "check_retrieval",
    "check_verl_version",
    "driver_version",
    "glibc_version",
    "gpu_memory_gib",
    "hub_token_configured",
    "job_costs",
    "launch_records",
    "main",
    "nvcc_version",
    "run",
    "select",
    "static_checks",
]

#: Oldest glibc the `gpu` extra installs on: sglang 0.5.14's wheels are built for manylinux_2_34.
MIN_GLIBC = (2, 34)


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


def check_base_model_dir(model_dir: str | os.PathLike, *, backbone: str, model: str) -> None:
    """The base model directory exists and holds ``config.json`` (a Hugging Face model)."""
    path = Path(model_dir)
    where = f"config key 'backbones.{backbone}.model' is {model!r}"
    if not path.exists():
        raise PreflightError(f"base model path {path} does not exist ({where})")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise PreflightError(
            f"base model path {path} is not a Hugging Face model directory: no config.json ({where})"
        )


def gpu_count() -> int:
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
        available = gpu_count()
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


def check_glibc(version: str | None = None, *, minimum: tuple[int, int] = MIN_GLIBC) -> str:
    """The C library is glibc ``minimum`` or newer; returns its version.

    Args:
        version: what ``os.confstr("CS_GNU_LIBC_VERSION")`` reports (``"glibc 2.36"``); read when None.
    Raises:
        PreflightError: no glibc, an unreadable version, or an older one.
    """
    version = version if version is not None else glibc_version()
    want = ".".join(map(str, minimum))
    found = re.fullmatch(r"\s*glibc\s+(\d+)\.(\d+).*", version or "")
    if not found:
        raise PreflightError(
            f"the C library is not a readable glibc ({version!r}); the gpu extra's wheels (sglang 0.5.14: "
            f"manylinux_2_{minimum[1]}) need glibc {want} or newer (docs/gpu.md)"
        )
    if (int(found.group(1)), int(found.group(2))) < minimum:
        raise PreflightError(
            f"{version.strip()} is older than glibc {want}, which the gpu extra's wheels need (sglang 0.5.14 is "
            f"built for manylinux_2_{minimum[1]}: RHEL 9, Ubuntu 22.04 or later); run on a newer system (docs/gpu.md)"
        )
    return version.strip()


def check_gated_access(
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
    glibc: str | None = None,
    nvcc: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Run the model, GPU, driver, glibc, nvcc, hub-token and verl-version checks; raise one error
    listing every failure.

    ``device`` is ``training.device``: a ``cpu`` run needs no GPU, so the GPU, driver, glibc and
    nvcc checks are skipped. ``driver``, ``glibc`` and ``nvcc`` replace what ``nvidia-smi``,
    ``os.confstr`` and ``nvcc --version`` report (tests).

    Returns:
        The installed verl version.
    """
    problems: list[str] = []
    installed = ""
    checks: list = [
        lambda: check_base_model_dir(model_dir, backbone=backbone, model=model),
        lambda: check_gated_access(model, model_dir, environ=environ),
    ]
    if device != "cpu":
        # the driver first: with an older one torch sees no GPU, and its message says why
        checks += [
            lambda: check_driver(driver),
            lambda: check_gpus(gpus, backbone=backbone, available=available_gpus),
            lambda: check_glibc(glibc),
            lambda: check_nvcc(nvcc),
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
    costs: Any = None,
):
    """The job's memory plan (:mod:`spader.planning.plan`) on its own composed config and model
    shape, with its time, save cadence, host memory and disk when ``costs`` (a
    :class:`spader.planning.plan.JobCosts`) is given, logged line by line; the jobs it checks are
    returned.

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
    from spader.planning.plan import judge_job, load_shape, reranker_gib, reranker_on_gpus, training_job

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
            costs=costs,
        )
    ]
    if judge:
        judge_shape = load_shape(str(judge.get("model")), judge_model_dir)
        jobs.append(judge_job(f"{name} judge", judge_shape, judge, capacity=capacity, reranker=reranker))
    _log_and_refuse(jobs, capacity)
    return jobs


def _log_and_refuse(jobs: Sequence[Any], capacity: float) -> None:
    """Log the plans of ``jobs`` line by line; raise :class:`PreflightError` when one does not fit."""
    for job in jobs:
        for line in job.lines():
            log.info("memory plan: %s", line)
    bad = [job for job in jobs if not job.fits]
    if any(job.phases and job.peak > capacity for job in bad):
        text = "\n".join(line for job in bad for line in job.lines())
        raise PreflightError(
            f"the job does not fit in {capacity:.1f} GiB per GPU:\n{text}\nlower "
            "training.ppo_micro_batch_size_per_gpu or training.gpu_memory_utilization, or offload the "
            "optimizer state (config/verl, docs/gpu.md); `spader plan` plans every job"
        )
    if bad:
        raise PreflightError("; ".join(f"{job.name}: {job.refusal}" for job in bad) + " (spader plan)")


def _rows(path: str | os.PathLike | None) -> int | None:
    """Rows of a parquet file (None when it cannot be read)."""
    try:
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:  # noqa: BLE001  (no file, not parquet: the plan then has no time)
        return None


def job_costs(job: Any) -> Any:
    """What the plan's time, cadence, host memory and disk need of a
    :class:`spader.training.run.TrainJob` (None without ``job.hardware`` or a readable training
    file): its steps from the rows of its training file, as verl's loader counts them."""
    from spader.planning.costs import Search, Workload
    from spader.planning.plan import JobCosts, reranker_on_gpus

    hardware = getattr(job, "hardware", None)
    rows = _rows(getattr(job, "train_file", None))
    if hardware is None or rows is None:
        return None
    training = job.training
    steps = training.max_steps or training.epochs * (rows // training.train_batch_size)
    retrieval = _plain(getattr(job, "retrieval", None))
    judge_gpus = int(getattr(job.scorer, "judge_gpus", 0) or 0)
    on_gpus = reranker_on_gpus(retrieval)
    replicas = job.training.nodes * job.backbone_spec.gpus if on_gpus else 0
    search = Search(replicas, int(retrieval["initial_k"])) if retrieval else None
    work = Workload(
        steps=int(steps), prompts=training.train_batch_size, rollouts=training.rollout_n,
        val_prompts=_rows(job.val_file) or 0, max_turns=job.agent.max_turns, nodes=job.train_nodes,
    )  # fmt: skip
    records, scale_from = launch_records(job, hardware)
    return JobCosts(
        hardware=hardware, workload=work, reranker_on_gpus=on_gpus,
        cache_bytes=int(retrieval["service"]["cache_bytes"]) if retrieval else 0,
        judge_gpus_on_node=0 if job.judge_node else judge_gpus, search=search,
        allocation_minutes=float(training.time_limit.estimate_minutes(job.variant)),
        warning_s=float(training.time_limit.warning_s), max_work_lost_minutes=float(training.max_work_lost_minutes),
        records=records, scale_from=scale_from,
    )  # fmt: skip


def launch_records(job: Any, hardware: Any) -> tuple[tuple, tuple | None]:
    """The measured records ``hardware.calibration`` names that plan this launch, as ``spader plan``
    reads them (paths relative to the workflow's directory, where the job runs): the job's own, and
    the factors of another variant of its backbone measured on the same GPU model (from that run's
    own estimate) for a job without one. A record that cannot be read stops the launch in one line."""
    from spader.planning.measured import load_records

    paths = getattr(hardware, "calibration", None)
    if not paths:
        return (), None
    try:
        records = load_records(paths)
    except ValueError as exc:
        raise PreflightError(f"hardware.calibration: {exc}") from None
    name = f"train {job.backbone}/{job.variant}"
    own = records.for_job(name)
    return own, None if own else records.scale_for(name, str(hardware.gpu))


def check_job_memory(job: Any, verl_config: Any, *, capacity_gib: float | None = None):
    """:func:`check_memory` of a :class:`spader.training.run.TrainJob` and its composed config, with
    its time, cadence, host memory and disk when the job knows its node's description (nothing for
    a CPU run)."""
    if str(getattr(job, "device", "cuda")) == "cpu":
        return []
    scorer = getattr(job, "scorer", None)
    judge_gpus = int(getattr(scorer, "judge_gpus", 0) or 0)
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
        costs=job_costs(job),
    )


def _sglang_version() -> str:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        raise PreflightError(
            "sglang is not installed: a GPU node installs the gpu extra "
            "(pip install -c requirements/gpu-lock.txt -e '.[gpu]'; docs/gpu.md)"
        ) from None


def _version_checks(*, gpu: bool) -> list[Any]:
    """The pinned verl (every training) and sglang (GPU runs) as node checks."""
    from spader.training.node import Check

    out = []
    try:
        out.append(Check("verl", "ok", check_verl_version()))
    except PreflightError as exc:
        out.append(Check("verl", "fail", str(exc)))
    if gpu:
        try:
            out.append(Check("sglang", "ok", _sglang_version()))
        except PreflightError as exc:
            out.append(Check("sglang", "fail", str(exc)))
    else:
        out.append(Check("sglang", "skip", "none needed without a GPU job"))
    return out


def _python_check() -> Any:
    from spader.training.node import Check

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if (3, 11) <= sys.version_info[:2] <= (3, 12):
        return Check("python", "ok", f"Python {version} ({sys.executable})")
    return Check(
        "python", "fail", f"Python {version} ({sys.executable}); the locks are for Python 3.11 and 3.12"
    )


HELP = (
    "check this node against a configuration's plan: glibc and the wheel tag, the driver, nvcc, the GPUs "
    "and their memory, host memory, disk, /dev/shm, verl and sglang (exit 1 naming what is short)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``spader preflight`` (``python -m spader.training.preflight``): ``--configfile``, ``--root``,
    ``--json``, ``--cpu``."""
    from spader.config.command import add_config_arguments

    add_config_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the checks and the node as JSON")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="this machine is not a GPU node: skip the GPU checks and hardware.*",
    )


def _planned(config: Any, root: Path) -> tuple[list, dict | None]:
    """The plan's jobs and the DAG's totals (none for a configuration without GPU jobs)."""
    from spader.planning.plan import dag_totals, load_record, plan_config

    jobs = plan_config(config, root / "config" / "verl", calibration=load_record(config, root))
    return jobs, (dag_totals(jobs, config) if jobs else None)


def run(args: argparse.Namespace, *, out: Callable[[str], Any] | None = None) -> int:
    """Run every check (none stops the others); exit 1 when one fails."""
    import json

    from spader.config.command import configured, repository
    from spader.training.node import measure_node, node_checks

    write = out or (lambda s: sys.stdout.write(s + "\n"))
    config = configured(args)
    root = repository(args)
    gpu = not args.cpu and (config.training.device == "cuda" or int(config.evaluation.gpus) > 0)
    node = measure_node(Path("results"), trees=[Path("results"), Path("resources")], gpus=gpu)
    jobs, totals = _planned(config, root) if gpu else ([], None)
    checks = [_python_check(), *node_checks(config, node, jobs, totals, gpu=gpu), *_version_checks(gpu=gpu)]
    failed = [c for c in checks if c.status == "fail"]
    if args.json:
        write(json.dumps({"checks": [c.to_json() for c in checks], "node": node.to_json(), "gpu_node": gpu,
                          "refused": [f"{c.name}: {c.detail}" for c in failed] or None}, indent=2))  # fmt: skip
    else:
        for check in checks:
            write(check.line())
        write(
            f"preflight: {len(failed)} of {len(checks)} check(s) failed"
            if failed
            else "preflight: every check passed"
        )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spader.training.preflight`` (an alias of ``spader preflight``)."""
    from spader.config.command import run_command

    return run_command("python -m spader.training.preflight", add_arguments, run, argv, description=HELP)


if __name__ == "__main__":
    sys.exit(main())
