"""The verl command line of one training job, composed from the workflow config.

A launch is ``python -m spader.integrations.verl.main --config-path <config/verl> --config-name
<variant's YAML> <overrides...>``. The overrides come in three layers, later ones replacing
earlier ones key by key:

1. the method's: :func:`spader.integrations.verl.overrides.method_overrides` turns the variant
   (advantage, reward, alpha, beta, cost) into verl keys, and :func:`~spader.integrations.verl.overrides.training_overrides` every
   number of ``config["training"]`` (config.yaml is the single source of them: the verl YAMLs
   carry structure only);
2. the job's (:func:`job_overrides`): data files, base model, GPUs, CPUs for Ray, checkpoint
   directory, loggers, tool config; the device's
   (:func:`spader.integrations.verl.device.device_overrides`: ``training.device`` and
   ``training.rollout_backend`` select verl's platform and rollout backend, and a CPU run gets
   the sizes a CPU can serve); then the resume point
   (:func:`spader.training.checkpoints.resume_overrides`);
3. extra ones (the GPU smoke test shrinks the run with them).

The composed command is checked in-process with Hydra before anything starts
(:func:`compose_config`), and :func:`run_supervised` runs it as its own process group so that a
failure or a SIGTERM from the scheduler takes the whole Ray tree down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spader.config.model import TrainingConfig, VariantConfig
from spader.infra.procs import STOP_REQUEST_ENV, STOP_SIGNALS, Terminated, raise_on_signals, supervised_argv
from spader.integrations.verl.device import DEVICES, check_device
from spader.integrations.verl.hydra import hydra_value
from spader.methods import verl_yaml
from spader.training import ENTRY_MODULE

log = logging.getLogger(__name__)

__all__ = [
    "PLAIN_TRAINER_MODE",
    "LaunchPlan",
    "Terminated",
    "build_plan",
    "compose_config",
    "cpu_ray_slots",
    "device_env",
    "job_overrides",
    "log_stream",
    "merge_overrides",
    "override_key",
    "ray_cpu_slots",
    "run_supervised",
    "write_plan",
]

# Environment variables that verl reads inside Ray actors (its Tracking runs in the TaskRunner).
_RAY_ENV = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_ID",
    "VERL_FILE_LOGGER_PATH",
    "VERL_PLATFORM",
    "OMP_NUM_THREADS",
    STOP_REQUEST_ENV,  # the trainer checks it at every step boundary (spader.training.stop)
)

#: The project's trainer mode that replaces verl's ``sync`` (the terminal-reward variants): verl's
#: trainer and advantage, with checkpoints after their step's metrics and stop requests honoured
#: (``spader.integrations.verl.trainer.PlainTrainerSync``).
PLAIN_TRAINER_MODE = "spader_plain_sync"


def _section(training: Any) -> Mapping[str, Any]:
    """The ``training`` section as a mapping (a :class:`spader.config.TrainingConfig` or a rule's
    plain dict)."""
    return training.model_dump() if hasattr(training, "model_dump") else training


def override_key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` -> ``a.b``; ``~a.b`` -> ``a.b``)."""
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def merge_overrides(*layers: Iterable[str]) -> list[str]:
    """Concatenate override layers; a key set again in a later layer replaces the earlier one.

    Hydra applies a key given twice in list order and refuses to add a ``+key`` twice, so which
    layer wins is decided here, once, and logged.
    """
    merged: dict[str, str] = {}
    for layer in layers:
        for ov in layer:
            key = override_key(ov)
            if key in merged and merged[key] != ov:
                log.info("override %r replaces %r", ov, merged[key])
                del merged[key]  # keep layer order: the replacement goes where its layer puts it
            merged[key] = ov
    return list(merged.values())


def _absolute(p: str | os.PathLike) -> str:
    """``p`` made absolute, as a Hydra override value."""
    return hydra_value(os.path.abspath(p))


def _ray_env_overrides(env: Mapping[str, str]) -> list[str]:
    """The overrides that forward the variables of ``env`` Ray's runtime env needs (:data:`_RAY_ENV`)."""
    return [
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={hydra_value(env[name])}"
        for name in _RAY_ENV
        if name in env
    ]


def job_overrides(
    *,
    train_file: str | os.PathLike,
    val_file: str | os.PathLike,
    model_dir: str | os.PathLike,
    gpus: int,
    ray_cpus: int | None,
    ckpt_dir: str | os.PathLike,
    tool_config: str | os.PathLike,
    project: str,
    run_name: str,
    loggers: Sequence[str],
    env: Mapping[str, str],
    nnodes: int = 1,
    ray_address: str | None = None,
) -> list[str]:
    """The overrides that tie a verl run to this job (all paths made absolute).

    Args:
        train_file, val_file: the job's verl parquet inputs.
        model_dir: local directory of the base model.
        gpus: GPUs (training workers) per node; ``trainer.n_gpus_per_node``.
        ray_cpus: CPUs a private Ray instance advertises (:func:`ray_cpu_slots`; verl's YAML asks for
            a fixed number on SLURM); None when joining a running cluster, whose nodes declared theirs.
        ckpt_dir: ``trainer.default_local_dir``, inside the work directory Snakemake never deletes.
        tool_config: the search tool YAML written once the retrieval service is up.
        project, run_name: verl's ``trainer.project_name``/``experiment_name``.
        loggers: verl tracking backends, e.g. ``["console", "file", "mlflow"]``.
        env: variables verl's tracking reads; forwarded to the Ray runtime env as well.
        nnodes: nodes verl trains on (``trainer.nnodes``).
        ray_address: the running Ray cluster to join (``host:port``); None starts a private instance.

    Returns:
        Override strings.
    """
    return [
        f"data.train_files={_absolute(train_file)}",
        f"data.val_files={_absolute(val_file)}",
        f"actor_rollout_ref.model.path={_absolute(model_dir)}",
        f"trainer.nnodes={int(nnodes)}",
        f"trainer.n_gpus_per_node={int(gpus)}",
        f"trainer.default_local_dir={_absolute(ckpt_dir)}",
        f"trainer.project_name={hydra_value(project)}",
        f"trainer.experiment_name={hydra_value(run_name)}",
        f"trainer.logger={hydra_value(list(loggers))}",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={_absolute(tool_config)}",
        f"ray_kwargs.ray_init.num_cpus={'null' if ray_cpus is None else int(ray_cpus)}",
        # A private Ray instance per job, even on a node where someone ran `ray start`; or the
        # cluster the job started across its nodes (spader.training.ray_cluster).
        f"+ray_kwargs.ray_init.address={hydra_value(ray_address or 'local')}",
        # no dashboard: nothing of Ray listens for a browser (spader.training.ray_cluster)
        "+ray_kwargs.ray_init.include_dashboard=false",
        *_ray_env_overrides(env),
    ]


def ray_cpu_slots(*, workers: int, storage_units: int, threads: int) -> int:
    """Logical CPUs a Ray instance must advertise for verl's placement of a training run.

    Ray CPUs are scheduling tokens. verl asks for more of them than a job may have cores: its
    resource pool reserves a bundle of ``max_colocate_count`` (3) CPUs per training worker (GPU),
    TransferQueue's controller and each of its storage units hold one, each rollout server one,
    and one more lets the remaining actors be created. With fewer advertised (a GPU run given
    the job's ``--cores`` below ~34 on 8 GPUs, a CPU run on a small machine) those actors never
    start and the run waits forever.

    Args:
        workers: training processes (GPUs, or FSDP ranks on a CPU) the instance hosts.
        storage_units: TransferQueue storage units (``transfer_queue.backend.SimpleStorage
            .num_data_storage_units``; verl's default 8, one on a CPU run).
        threads: the job's threads (the floor).
    Returns:
        The ``num_cpus`` for ``ray.init`` (or ``ray start``).
    """
    return max(int(threads), 3 * workers + 1 + int(storage_units) + workers + 1)


def cpu_ray_slots(workers: int, threads: int) -> int:
    """:func:`ray_cpu_slots` of a CPU training run (one TransferQueue storage unit)."""
    return ray_cpu_slots(workers=workers, storage_units=1, threads=threads)


def device_env(training: TrainingConfig | Mapping[str, Any], *, threads: int, workers: int) -> dict[str, str]:
    """Environment of the verl process for the configured device (also forwarded to Ray).

    ``VERL_PLATFORM`` always comes from the config, never from the caller's environment. A CPU run
    also sets ``OMP_NUM_THREADS``: Ray would otherwise give every actor one thread, and training
    and rollouts alternate, so each may use the job's threads.
    """
    device, _ = check_device(training)
    env = {"VERL_PLATFORM": DEVICES[device][0]}
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(max(1, int(threads) // max(1, workers)))
    return env


@dataclass
class LaunchPlan:
    """A composed verl launch: what runs, with which overrides and environment."""

    config_dir: Path
    config_name: str
    overrides: list[str]
    env: dict[str, str] = field(default_factory=dict)
    entry: tuple[str, ...] = (sys.executable, "-m", ENTRY_MODULE)

    @property
    def argv(self) -> list[str]:
        """The full command line."""
        return [
            *self.entry,
            "--config-path",
            os.path.abspath(self.config_dir),
            "--config-name",
            self.config_name,
            *self.overrides,
        ]

    @property
    def config_overrides(self) -> list[str]:
        """The overrides that shape the training config (Hydra's own ``hydra.*`` left out)."""
        return [ov for ov in self.overrides if not override_key(ov).startswith("hydra.")]

    def get(self, key: str) -> str | None:
        """The raw value an override sets for ``key`` (None when no override sets it)."""
        for ov in self.overrides:
            if override_key(ov) == key and "=" in ov:
                return ov.split("=", 1)[1]
        return None

    def to_json(self) -> dict[str, Any]:
        return {"argv": self.argv, "env": dict(sorted(self.env.items()))}


def build_plan(
    *,
    variant: VariantConfig | Mapping[str, Any],
    training: TrainingConfig | Mapping[str, Any],
    config_dir: str | os.PathLike,
    job: Sequence[str],
    resume: Sequence[str],
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    entry: Sequence[str] | None = None,
) -> LaunchPlan:
    """Compose the launch of one variant: method overrides, then job, resume and extra ones.

    Args:
        variant: ``config["variants"][v]`` (its ``verl_config`` names the YAML in ``config_dir``).
        training: ``config["training"]``.
        config_dir: the project's verl YAML directory (``config/verl``).
        job: :func:`job_overrides`.
        resume: :func:`spader.training.checkpoints.resume_overrides`.
        extra: overrides applied last (the GPU smoke test).
        env: environment variables for the verl process.
        entry: the command before ``--config-path`` (default: ``python -m`` the verl entry point).

    Returns:
        The plan.
    """
    from spader.integrations.verl.overrides import method_overrides, training_overrides

    variant = variant.model_dump() if hasattr(variant, "model_dump") else variant
    training = _section(training)
    method = [*method_overrides(dict(variant), dict(training)), *training_overrides(training)]
    # verl's plain sync trainer saves before it logs and ignores stop requests; its drop-in does both
    method = [
        f"trainer.v1.trainer_mode={PLAIN_TRAINER_MODE}" if ov == "trainer.v1.trainer_mode=sync" else ov
        for ov in method
    ]
    plan = LaunchPlan(
        config_dir=Path(config_dir),
        config_name=verl_yaml(variant),
        overrides=merge_overrides(method, job, resume, extra),
        env=dict(env or {}),
    )
    if entry is not None:
        plan.entry = tuple(entry)
    return plan


def compose_config(plan: LaunchPlan):
    """Compose and validate the plan's training config in-process (a dry run of the launch).

    Uses the same Hydra composition as the entry point, so an unknown key, a bad value or a
    missing variant YAML fails here, before a retrieval service or GPU is touched.

    Returns:
        The composed ``DictConfig``.
    """
    from spader.integrations.verl.compose import compose, validate

    cfg = compose(plan.config_name, plan.config_overrides, config_dir=os.path.abspath(plan.config_dir))
    validate(cfg)
    return cfg


def _stop_supervisor(proc: subprocess.Popen, grace_s: float) -> None:
    """Ask the supervisor to stop verl's tree (SIGTERM: it SIGTERMs verl's group and every
    descendant, SIGKILLs survivors after ``grace_s``); kill the supervisor if it does not exit."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s + 15)
    except subprocess.TimeoutExpired:
        log.warning("the process supervisor did not exit %.0f s after SIGTERM; killing it", grace_s + 15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own group; verl gets its parent-death signal
        proc.wait()


def run_supervised(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    output=None,
    grace_s: float = 60.0,
    signals: Sequence[int] = STOP_SIGNALS,
    started=None,
) -> int:
    """Run ``argv`` under the process supervisor (:mod:`spader.infra.procs`) and return its exit code.

    Args:
        argv: the command.
        env: variables added to this process's environment.
        output: an open file (with a descriptor) that receives stdout and stderr, typically the
            job's log, shared with this process so the two never overwrite each other; None
            inherits this process's streams.
        grace_s: seconds between SIGTERM and SIGKILL when stopping the command's processes.
        signals: the signals that stop the command at once (a training job handles SIGTERM
            itself: it asks verl to stop at its next step boundary, ``spader.training.stop``).
        started: called with the supervisor's ``Popen`` once it runs (a watch that must be
            able to stop it; ``Popen.send_signal(SIGTERM)`` stops the whole tree).

    Each of ``signals`` received while waiting (and any exception) stops the whole tree - verl,
    Ray and its workers, which Ray puts in process groups of their own - before propagating as
    :class:`Terminated`. Should this process die without a chance to do so (SIGKILL, OOM killer),
    the supervisor gets its parent-death signal and stops the tree itself.
    """
    if output is not None:
        output.write("$ " + " ".join(argv) + "\n")
        output.flush()
    proc = subprocess.Popen(
        supervised_argv(argv, grace_s=grace_s),
        env={**os.environ, **env},
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        start_new_session=True,
    )
    try:
        with raise_on_signals(signals):
            if started is not None:
                started(proc)
            rc = proc.wait()
    except BaseException:
        _stop_supervisor(proc, grace_s)
        raise
    # The supervisor reports a stop signal it received itself as 128 + signal.
    return rc


def log_stream():
    """This process's stderr when it is a real file (``spader.infra.glue`` points it at the job's
    log), for :func:`run_supervised`'s ``output``; None otherwise (pytest capture and the like)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return sys.stderr


def write_plan(plan: LaunchPlan, path: str | os.PathLike) -> Path:
    """Record the exact launch (argv and added environment) as JSON."""
    path = Path(path)
    path.write_text(json.dumps(plan.to_json(), indent=2) + "\n")
    return path
