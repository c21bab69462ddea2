"""``hardware`` (the node the GPU jobs are planned for) and ``code_reruns`` (which code edits
rerun which stages)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictFloat, StrictInt

from spader.config.sections.base import Section

__all__ = [
    "GPU_MODELS",
    "CodeRerunsConfig",
    "HardwareConfig",
]


class CodeRerunsConfig(Section):
    """Whether a change to the code a stage runs reruns its jobs. Every computing rule has a
    fingerprint of its script and of the package modules it runs (docs/ARCHITECTURE.md, "Rerun
    semantics"); with a group switched off, its jobs keep the fingerprint of the code they ran
    (recorded with their outputs) and rerun only when a param or an input changes. The
    fingerprint of the code that actually ran is recorded either way (MLflow tag
    `code.fingerprint`). `spader stage-code affected <file>` lists the rules a change would
    rerun."""

    data: bool = Field(
        True, description="normalize_dataset, mix_training_set, export_rl_dataset, export_eval_set"
    )
    retrieval: bool = Field(True, description="build_bm25_index")
    models: bool = Field(True, description="build_tiny_model, warmstart_policy (tiny demo models)")
    scorers: bool = Field(True, description="build_evidence (StepSearch's evidence)")
    training: bool = Field(True, description="train_policy, export_checkpoint (GPU-days per variant)")
    evaluation: bool = Field(True, description="evaluate_policy, aggregate_results, compare_runs")


#: GPU models the plan knows the peak bf16 FLOP/s and memory bandwidth of
#: (``spader.planning.costs.GPUS``, with their sources).
GPU_MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200")


class HardwareConfig(Section):
    """The node the GPU jobs are planned for, and the assumptions of the plan's time model
    (``spader plan``, docs/gpu.md). A cluster's nodes must match ``cores`` and
    ``host_memory_gib`` (SLURM's ``--cpus-per-task`` and the cap of ``--mem``) and have at least
    ``backbones.<name>.gpus`` GPUs (``--gpus``)."""

    gpu: Literal[GPU_MODELS] = Field(  # type: ignore[valid-type]
        "A100-80GB",
        description="GPU model: its peak dense bf16 FLOP/s, memory and host-link bandwidth (the plan's "
        "table, spader.planning.costs.GPUS) drive the time estimates",
    )
    gpu_memory_gib: StrictFloat = Field(
        80,
        gt=0,
        le=1024,
        description="memory of one GPU in GiB; the memory plan fails a job whose per-GPU peak exceeds it "
        "(a training job's preflight uses the memory its GPUs report)",
    )
    gpus: StrictInt = Field(
        8,
        ge=1,
        le=64,
        description="GPUs of one node; a GPU job gets the node's cores and host memory in proportion to the "
        "GPUs it holds (a training job holds backbones.<name>.gpus, evaluation evaluation.gpus)",
    )
    cores: StrictInt = Field(
        64,
        ge=1,
        le=4096,
        description="CPU cores of one node that jobs may use: a GPU job's threads (SLURM --cpus-per-task) are "
        "this share of its GPUs; a cluster's nodes must have at least this many",
    )
    host_memory_gib: StrictFloat = Field(
        480,
        ge=1,
        le=65536,
        description="host memory of one node in GiB that jobs may use; the plan fails a training job whose "
        "host memory (pinned reference model, sglang's weight copies, offloaded states, processes) exceeds "
        "it, and a training job asks SLURM (--mem) for the plan's need with headroom, at most its share of this",
    )
    disk_gib: StrictFloat = Field(
        6000,
        ge=1,
        le=10_000_000,
        description="free space in GiB of the file system holding results/; the plan fails a training job "
        "whose work directory at its peak (checkpoints kept and those coexisting during an attempt) plus "
        "its export exceeds it",
    )
    mfu: StrictFloat = Field(
        0.4,
        ge=0.05,
        le=0.8,
        description="time model: share of the GPUs' peak dense bf16 FLOP/s that the training passes and the "
        "rollouts' prefill reach (model FLOPs utilisation; 0.35-0.45 is typical of FSDP training of 8B "
        "models with activation checkpointing)",
    )
    mfu_low: StrictFloat = Field(
        0.3,
        ge=0.05,
        le=0.8,
        description="time model: the MFU of the high end of the step and run times (mfu gives the low end; "
        "above mfu it counts as mfu)",
    )
    bandwidth_efficiency: StrictFloat = Field(
        0.6,
        ge=0.05,
        le=1,
        description="time model: share of the GPUs' memory bandwidth that decoding reaches (each decoding "
        "step reads the weights and the KV cache of its running sequences) and of the host link that "
        "offloaded states move at",
    )
    length_share: StrictFloat = Field(
        0.5,
        gt=0,
        le=1,
        description="time model: mean trajectory length (prompt, generated tokens and tool observations) as "
        "a share of max_prompt_length + max_response_length; lengths are modelled as uniform with this mean "
        "and the maximum as upper end (docs/gpu.md)",
    )
    length_share_high: StrictFloat = Field(
        0.65,
        gt=0,
        le=1,
        description="time model: the mean trajectory length's share of the high end of the step and run times "
        "(length_share gives the low end; below length_share it counts as length_share)",
    )
    generated_share: StrictFloat = Field(
        0.25,
        gt=0,
        le=1,
        description="time model: share of a trajectory's tokens the policy generates (decoded one by one); "
        "the rest (prompt, tool observations) is prefilled",
    )
    calibration: Annotated[str, Field(min_length=1)] | list[Annotated[str, Field(min_length=1)]] | None = (
        Field(
            None,
            description="records the plan reads back (one path or a list; told apart by content): a GPU memory "
            "calibration record written by scripts/gpu_memory_calibration.py (YAML), whose measured activation and "
            "log-prob constants replace the plan's estimates for the shapes it measured; and earlier trainings' "
            "measured records (a training's final.json, or the work directory / measured.jsonl of a run stopped "
            "after some steps), whose step time, host peak and checkpoint size replace the estimates of the same "
            "backbone x variant on the same hardware (its other variants scaled by measured/planned; docs/gpu.md); "
            "null: estimates",
        )
    )
