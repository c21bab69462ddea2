"""The verl settings of the configured device: ``training.device`` and
``training.rollout_backend`` checked against each other, and the overrides that select them (a CPU
run also gets what a CPU can serve). Used by the launch (:mod:`spader.training.run`) and by the plan
(:mod:`spader.planning.plan`), which composes the same config a job will run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spader.config.model import TrainingConfig

#: ``training.device`` -> (verl platform selected with ``VERL_PLATFORM``, rollout backends it runs).
DEVICES = {"cuda": ("nvidia", ("sglang",)), "cpu": ("cpu", ("transformers",))}


def _section(training: Any) -> Mapping[str, Any]:
    """The ``training`` section as a mapping (a :class:`spader.config.TrainingConfig` or a rule's
    plain dict)."""
    return training.model_dump() if hasattr(training, "model_dump") else training


def check_device(training: TrainingConfig | Mapping[str, Any]) -> tuple[str, str]:
    """``(training.device, training.rollout_backend)``, checked against each other.

    Raises:
        ValueError: an unknown device, or a rollout backend that device cannot run (the message
            names both keys).
    """
    training = _section(training)
    device = training["device"]
    backend = training["rollout_backend"]
    if device not in DEVICES:
        raise ValueError(f"config key 'training.device' must be one of {sorted(DEVICES)}, got {device!r}")
    allowed = DEVICES[device][1]
    if backend not in allowed:
        raise ValueError(
            f"config key 'training.rollout_backend' is {backend!r}, but training.device {device!r} runs "
            f"{' or '.join(allowed)} rollouts (sglang needs GPUs; the transformers replica is the CPU one)"
        )
    return device, backend


def device_overrides(
    training: TrainingConfig | Mapping[str, Any],
    *,
    threads: int,
    workers: int,
    private_ray: bool = True,
    nnodes: int = 1,
) -> list[str]:
    """verl overrides of the configured device and rollout backend.

    A GPU run only names them. A CPU run also gets what the CPU can serve: verl's platform
    ``cpu`` and FSDP engines on gloo (attention and padding are the project YAMLs' sdpa without
    packed micro-batches, as on GPUs), fp32 compute without torch.compile (it needs a compiler
    and minutes of warm-up), one tensor-parallel rank per rollout replica served by
    ``transformers``, and one TransferQueue storage unit, reward worker and agent-loop worker per
    node (each is a process; a small machine gains nothing from eight; verl places agent-loop
    workers round-robin over the nodes, so every node runs rollouts and searches its own replica).

    Args:
        training: ``config["training"]``.
        threads: the job's threads (torch threads of the rollout server).
        workers: training processes (``trainer.n_gpus_per_node``, set by :func:`job_overrides`).
        private_ray: verl starts its own Ray instance (a CPU run then advertises its logical
            device slots there; a cluster's nodes declare theirs when they start).
        nnodes: nodes verl trains on (a CPU run has one agent-loop worker on each).
    Returns:
        Override strings.
    """
    training = _section(training)
    device, backend = check_device(training)
    out = [f"trainer.device={device}", f"actor_rollout_ref.rollout.name={backend}", *_step_limit(training)]
    if device != "cpu":
        return out
    return out + _cpu_overrides(threads=threads, workers=workers, private_ray=private_ray, nnodes=nnodes)


def _step_limit(training: Mapping[str, Any]) -> list[str]:
    """The overrides that end the run after ``training.max_steps`` steps (none when it is unset)."""
    if not training.get("max_steps"):
        return []
    # verl stops at the first of the two limits: as many epochs as steps always leaves the
    # step limit (each epoch has at least one step) to end the run
    steps = int(training["max_steps"])
    return [
        f"trainer.total_training_steps={steps}",
        f"trainer.total_epochs={max(steps, int(training['epochs']))}",
    ]


def _cpu_overrides(*, threads: int, workers: int, private_ray: bool, nnodes: int) -> list[str]:
    """The overrides of a CPU run beyond its device and rollout backend (see :func:`device_overrides`)."""
    out: list[str] = []
    fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    if private_ray:
        # one logical device slot per training worker (see spader.integrations.verl.cpu.platform);
        # the CPU slots come with job_overrides' ray_cpus (ray_cpu_slots)
        out.append(f"+ray_kwargs.ray_init.num_gpus={int(workers)}")
    out += [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"++actor_rollout_ref.rollout.engine_kwargs.transformers={{threads:{int(threads)}}}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"actor_rollout_ref.rollout.agent.num_workers={max(1, int(nnodes))}",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
    ]
    for role in ("actor", "ref"):
        out += [
            f"actor_rollout_ref.{role}.use_torch_compile=false",
            f"actor_rollout_ref.{role}.fsdp_config.use_torch_compile=false",
            f"++actor_rollout_ref.{role}.fsdp_config.mixed_precision={fp32}",
        ]
    # verl shards a forward-only (reference) FSDP2 model with CPUOffloadPolicy(pin_memory=True)
    # (verl/workers/engine/fsdp/transformer_impl.py, FSDPEngine._build_fsdp_module), and pinning
    # host memory needs an accelerator. Built as a trainable engine instead, the reference model
    # is sharded without offload; verl then also builds it an optimizer, which is never stepped.
    out += [
        "actor_rollout_ref.ref.fsdp_config.forward_only=false",
        "++actor_rollout_ref.ref.optim=${actor_rollout_ref.actor.optim}",
    ]
    return out
