"""The plan of every GPU job of the DAG, before any of them runs: its per-GPU memory peak, and for a
training job its time, host memory per node, disk and what it asks a scheduler for.

``spader plan [--configfile F ...] [--json]`` (or ``python -m spader.planning.plan``) prints one
entry per backbone x variant (training), per backbone (evaluation), for R3-RAG's served judge and
for StepSearch's evidence job, each with its phases and their components in GiB, and exits 1 when a
job's peak exceeds ``hardware.gpu_memory_gib`` or a training job needs more host memory or disk than
the node described under ``hardware`` has. Every training job runs the GPU memory plan on its own
composed config in its preflight (:func:`spader.training.preflight.check_memory`) and refuses to
start when it does not fit; rule ``train_policy`` asks SLURM for the cores and host memory
:func:`job_request` gives.

The plan is first order: parameter, gradient and optimizer bytes are exact for the shapes; the
activation, logits and runtime terms are estimates whose constants are stated below, the
activation and log-prob ones replaced by measured ones when ``hardware.calibration`` names a record
of ``scripts/gpu_memory_calibration.py`` (:mod:`spader.planning.calibration`). Time, host memory
and disk: :mod:`spader.planning.costs`. docs/gpu.md explains each term and the defaults it led to.

Where the numbers come from:

* the model's shape: ``config.json`` of the local model directory, or the copy of the real
  ``config.json`` shipped in ``spader/planning/shapes/`` (no weights or hub access needed);
* the composed verl config (:func:`spader.integrations.verl.compose.compose` of the variant with
  config.yaml's overrides): FSDP sharding over the training GPUs, fp32 master weights, gradients
  and Adam state, offload flags, micro-batches, prompt + response length, activation
  checkpointing, the log-prob path (verl's fused kernels or the full logits), the entropy term,
  the critic, sglang's static fraction and tensor-parallel size;
* sglang 0.5.14's rule for its static memory: at launch it measures the GPU memory free before it
  loads anything (``pre_model_load_memory``, the minimum over its tensor-parallel ranks) and keeps
  ``mem_fraction_static`` of *that* for weights plus KV cache (``ModelRunnerKVCacheMixin.
  _profile_available_bytes``: KV pool = free after loading the weights - pre * (1 - fraction)).
  Whatever is resident before it starts (the actor's shards, a reranker) shrinks its share, and
  whatever verl allocates later (Adam state after the first step) comes on top of it;
* the reranker replica of the job's retrieval service (docs/retrieval.md: weights, activations of
  the largest pass at 0.0215 MiB per token, allocator slack, CUDA context: 3.9 GiB for
  bge-reranker-v2-m3 at 81,920 tokens per pass);
* the judge server and the evaluation engine (sglang with their own fractions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spader.config.command import add_config_arguments, configured, repository, run_command
from spader.config.model import RerankerConfig
from spader.methods import needs, verl_yaml
from spader.planning.calibration import Calibration, Measured
from spader.planning.measured import MeasuredRun, Records, load_records

log = logging.getLogger(__name__)

__all__ = [
    "CONSTANTS",
    "Job",
    "Shape",
    "VerlMemory",
    "evaluation_job",
    "evidence_job",
    "judge_job",
    "load_shape",
    "main",
    "plan_config",
    "reranker_gib",
    "reranker_on_gpus",
    "training_job",
]

GIB = float(1 << 30)
SHAPES_DIR = Path(__file__).with_name("shapes")

#: Constants of the plan that are not exact (GiB unless named otherwise). The calibration script
#: measures the activation coefficients; the rest come from measurements cited in docs/gpu.md.
CONSTANTS = {
    # CUDA context of one process on one GPU (measured 690 MiB for the reranker's process, H200)
    "cuda_context": 0.7,
    # NCCL communicator buffers of a process that runs collectives (FSDP, sglang tensor parallelism)
    "nccl": 0.5,
    # sglang's CUDA graphs, which stay allocated while verl has its weights and KV cache released
    "sglang_graphs": 1.5,
    # sglang's forward activations while generating (chunked prefill, sampling buffers)
    "sglang_activations": 1.0,
    # activations of one decoder layer per token, in bf16 elements: c_h * hidden + c_q * (heads x
    # head_dim) + c_kv * (kv heads x head_dim) + c_i * intermediate (norm inputs kept in fp32
    # count twice); the backward pass holds `layer_backward_factor` times one layer's share
    "layer_c_h": 12.0,
    "layer_c_q": 4.0,
    "layer_c_kv": 4.0,
    "layer_c_i": 4.0,
    "layer_backward_factor": 1.5,
    # tokens verl's fused log-prob kernel processes at once (FusedLinearForPPO's chunk_size)
    "fused_chunk_tokens": 512,
    # fp32 (chunk x vocabulary) buffers alive at once in the fused kernel (logits, softmax,
    # log-softmax or one-hot, gradient)
    "fused_chunk_buffers": 4,
    # PyTorch's caching allocator: reserved beyond the allocated peak, as a share of the training
    # process's tensors
    "allocator_slack": 0.05,
    # the reranker's activations per token of a pass (MiB) and its allocator slack (GiB), for
    # bge-reranker-v2-m3 (docs/retrieval.md); scaled by layers x hidden for another shape
    "reranker_mib_per_token": 0.0215,
    "reranker_slack": 0.5,
}


# ---------------------------------------------------------------------------------------------
# Model shapes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What the plan needs of a model's ``config.json``."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    encoder: bool = False
    positions: int = 0  # learned position embeddings (encoders)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], name: str) -> Shape:
        """From a ``config.json`` mapping (errors name the missing key and the model)."""
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            model_type = str(cfg.get("model_type", ""))
            return cls(
                name=name,
                vocab=int(cfg["vocab_size"]),
                hidden=hidden,
                layers=int(cfg["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate=int(cfg["intermediate_size"]),
                tied=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                qk_norm=model_type.startswith("qwen3"),
                encoder=model_type in ("xlm-roberta", "bert", "roberta"),
                positions=int(cfg.get("max_position_embeddings", 0))
                if model_type in ("xlm-roberta", "bert", "roberta")
                else 0,
            )
        except KeyError as exc:
            raise ValueError(f"config.json of {name} has no {exc.args[0]!r}: not a model shape") from None

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer."""
        attention = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        if self.qkv_bias or self.encoder:
            attention += self.q_dim + 2 * self.kv_dim + (self.hidden if self.encoder else 0)
        if self.qk_norm:
            attention += 2 * self.head_dim
        if self.encoder:  # two linear layers with biases, two layer norms with biases
            return (
                attention
                + 2 * self.hidden * self.intermediate
                + self.intermediate
                + self.hidden
                + 4 * self.hidden
            )
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output projection to the vocabulary (0 when tied to the embedding)."""
        return 0 if self.tied or self.encoder else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters of the causal LM (or of the encoder with its scoring head)."""
        # an encoder's learned positions, token type, embedding norm and its scoring head
        extra = (
            (self.positions + 3) * self.hidden + self.hidden * self.hidden + 2 * self.hidden
            if self.encoder
            else 0
        )
        return (
            self.embedding_params + self.head_params + self.layers * self.layer_params + self.hidden + extra
        )

    @property
    def value_params(self) -> int:
        """Parameters of the critic built from this backbone (one output instead of the vocabulary)."""
        return self.params - self.head_params + self.hidden + 1

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes of one token over all layers (all tensor-parallel ranks together)."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def _shape_file(model: str) -> Path:
    return SHAPES_DIR / f"{model.replace('/', '--')}.json"


def load_shape(model: str, model_dir: str | os.PathLike | None = None) -> Shape:
    """The shape of ``model``: ``config.json`` of ``model_dir`` (or of ``model`` when it is a local
    directory), else the shipped copy for a hub id.

    Raises:
        ValueError: no local config and no shipped shape (the message lists the shipped ones).
    """
    for directory in (model_dir, model):
        if directory is not None and (Path(directory) / "config.json").is_file():
            with open(Path(directory) / "config.json", encoding="utf-8") as f:
                return Shape.from_config(json.load(f), str(model))
    path = _shape_file(model)
    if not path.is_file():
        known = sorted(p.stem.replace("--", "/") for p in SHAPES_DIR.glob("*.json"))
        raise ValueError(
            f"no shape for model {model!r}: give its local directory (with config.json) or add "
            f"{path.name} to {SHAPES_DIR} (shipped: {', '.join(known)})"
        )
    with open(path, encoding="utf-8") as f:
        return Shape.from_config(json.load(f), model)


# ---------------------------------------------------------------------------------------------
# What the composed verl config says about memory
# ---------------------------------------------------------------------------------------------
def _get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


@dataclass(frozen=True)
class VerlMemory:
    """The settings of a resolved verl config that decide its memory (see :meth:`from_verl`)."""

    micro_batch: int
    log_prob_micro_batch: int
    ref_micro_batch: int
    critic_micro_batch: int
    seq_len: int
    dynamic_bsz: bool = False
    max_token_len: int = 0
    remove_padding: bool = False
    grad_checkpointing: bool = True
    critic_grad_checkpointing: bool = True
    fused: bool = False
    entropy_in_loss: bool = False
    entropy_checkpointing: bool = False
    param_bytes: int = 4
    actor_param_offload: bool = False
    actor_optimizer_offload: bool = False
    critic: bool = False
    critic_param_offload: bool = False
    critic_optimizer_offload: bool = False
    rollout_fraction: float = 0.5
    rollout_tp: int = 1
    free_cache_engine: bool = True

    @classmethod
    def from_verl(cls, cfg: Mapping[str, Any]) -> VerlMemory:
        """From a resolved verl config (``OmegaConf.to_container(cfg, resolve=True)``)."""
        actor = _get(cfg, "actor_rollout_ref.actor", {})
        model = _get(cfg, "actor_rollout_ref.model", {})
        rollout = _get(cfg, "actor_rollout_ref.rollout", {})
        critic = _get(cfg, "critic", {})
        micro = int(_get(actor, "ppo_micro_batch_size_per_gpu", 1))
        backend = _get(model, "fused_kernel_options.impl_backend")
        return cls(
            micro_batch=micro,
            log_prob_micro_batch=int(_get(rollout, "log_prob_micro_batch_size_per_gpu", micro)),
            ref_micro_batch=int(_get(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", micro)),
            critic_micro_batch=int(_get(critic, "ppo_micro_batch_size_per_gpu", micro)),
            seq_len=int(_get(cfg, "data.max_prompt_length", 512))
            + int(_get(cfg, "data.max_response_length", 512)),
            dynamic_bsz=bool(_get(actor, "use_dynamic_bsz", False)),
            max_token_len=int(_get(actor, "ppo_max_token_len_per_gpu", 0)),
            remove_padding=bool(_get(model, "use_remove_padding", False)),
            grad_checkpointing=bool(_get(model, "enable_gradient_checkpointing", True)),
            critic_grad_checkpointing=bool(_get(critic, "model.enable_gradient_checkpointing", True)),
            # the backends whose forward the plug-in routes through the lm_head's FSDP2 unit
            fused=bool(_get(model, "use_fused_kernels", False)) and backend in ("torch", "liger"),
            entropy_in_loss=float(_get(actor, "entropy_coeff", 0) or 0) != 0
            or bool(_get(actor, "calculate_entropy", False)),
            entropy_checkpointing=bool(_get(actor, "entropy_checkpointing", False)),
            param_bytes=2
            if str(_get(actor, "fsdp_config.model_dtype", "fp32")) in ("bf16", "bfloat16")
            else 4,
            actor_param_offload=bool(_get(actor, "fsdp_config.param_offload", False)),
            actor_optimizer_offload=bool(_get(actor, "fsdp_config.optimizer_offload", False)),
            critic=bool(_get(critic, "enable", False)),
            critic_param_offload=bool(_get(critic, "fsdp.param_offload", False)),
            critic_optimizer_offload=bool(_get(critic, "fsdp.optimizer_offload", False)),
            rollout_fraction=float(_get(rollout, "gpu_memory_utilization", 0.5)),
            rollout_tp=int(_get(rollout, "tensor_model_parallel_size", 1)),
            free_cache_engine=bool(_get(rollout, "free_cache_engine", True)),
        )


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------
@dataclass
class Job:
    """The plan of one GPU job: per phase, its components in GiB on its most loaded GPU; for a
    training job also its time, host memory per node and disk (:mod:`spader.planning.costs`)."""

    name: str
    gpus: int
    capacity: float
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refused: str | None = None
    #: which of the plan's inexact terms were measured (a calibration record) or estimated
    constants: dict[str, str] = field(default_factory=dict)
    #: host memory per node: the steady terms and the model-loading transient (GiB), and the node's
    host: dict[str, dict[str, float]] = field(default_factory=dict)
    host_capacity: float | None = None
    #: the work directory's peak and the export (GiB), and the file system's space
    disk: dict[str, float] = field(default_factory=dict)
    disk_capacity: float | None = None
    #: per actor path (padded, packed): seconds of a step by phase, hours of the run by part
    time: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    path: str | None = None  # the actor path the job's config runs
    #: threads and memory the job asks a scheduler for (SLURM --cpus-per-task, --mem)
    threads: int | None = None
    mem_mb: int | None = None
    #: GiB the finished job leaves in results/ (checkpoints kept, export)
    kept_gib: float | None = None
    #: the variant whose training run this job is (identical settings share one run)
    run_of: str | None = None
    #: the high end of the time range, as ``time`` (the low end)
    time_high: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: the save cadence and what an end of the allocation can cost (spader.planning.costs.Cadence)
    cadence: Any = None
    #: the named inputs of the time model, both ends
    assumptions: dict[str, Any] = field(default_factory=dict)
    #: GiB of one checkpoint (actor and critic with their optimizer states)
    final_checkpoint_gib: float | None = None
    #: what the job runs on, as a measured record must say to apply (spader.planning.measured)
    ran_on: dict[str, Any] | None = None
    planned_steps: int | None = None
    #: where the step time comes from: ``measured (<record>, N steps)``, ``scaled from measured
    #: <b>/<v> (xF)`` or ``estimated``; the measured/estimated factors (low, high end)
    time_source: str | None = None
    time_factor: tuple[float, float] | None = None
    #: the plan's estimates that measured figures replaced (step seconds, host and checkpoint GiB)
    estimated: dict[str, Any] = field(default_factory=dict)

    def total(self, phase: str) -> float:
        return sum(self.phases[phase].values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> float:
        return self.total(self.peak_phase) if self.phases else 0.0

    @property
    def margin(self) -> float:
        return self.capacity - self.peak

    @property
    def host_gib(self) -> float | None:
        """Host memory of the most loaded node: the larger of the steady state and model loading."""
        return max(sum(t.values()) for t in self.host.values()) if self.host else None

    @property
    def host_phase(self) -> str | None:
        return max(self.host, key=lambda k: sum(self.host[k].values())) if self.host else None

    @property
    def disk_gib(self) -> float | None:
        return sum(self.disk.values()) if self.disk else None

    def step_minutes(self, path: str | None = None, end: str = "low") -> float | None:
        times = (self.time if end == "low" else self.time_high).get(path or self.path or "")
        return sum(times["step"].values()) / 60 if times else None

    def run_hours(self, path: str | None = None, end: str = "low") -> float | None:
        times = (self.time if end == "low" else self.time_high).get(path or self.path or "")
        return sum(times["run"].values()) if times else None

    @property
    def problems(self) -> list[str]:
        """Host memory or disk the node lacks (one line each, naming the key)."""
        out = []
        if (
            self.host_capacity is not None
            and self.host_gib is not None
            and self.host_gib > self.host_capacity
        ):
            out.append(
                f"host memory: needs {self.host_gib:.1f} GiB per node ({self.host_phase}), "
                f"hardware.host_memory_gib is {self.host_capacity:g}"
            )
        if (
            self.disk_capacity is not None
            and self.disk_gib is not None
            and self.disk_gib > self.disk_capacity
        ):
            out.append(
                f"disk: needs {self.disk_gib:.1f} GiB for its work directory and export, "
                f"hardware.disk_gib is {self.disk_capacity:g}"
            )
        if self.cadence is not None and self.cadence.refused:
            out.append(f"time limit: {self.cadence.refused}")
        return out

    @property
    def refusal(self) -> str | None:
        """Why the plan refuses the job (one line), or None when it fits."""
        reasons = ([self.refused] if self.refused else []) + self.problems
        if self.phases and self.peak > self.capacity:
            reasons.insert(
                0, f"GPU memory: peak {self.peak:.1f} GiB ({self.peak_phase}) of {self.capacity:.1f}"
            )
        return "; ".join(reasons) or None

    @property
    def status(self) -> str:
        """``fits``, or what does not: the GPU memory, or the first other reason."""
        if self.fits:
            return "fits"
        if self.refused:
            return "REFUSED"
        if self.phases and self.peak > self.capacity:
            return "DOES NOT FIT in GPU memory"
        return f"REFUSED ({self.problems[0].split(':', 1)[0]})"

    @property
    def fits(self) -> bool:
        return self.refused is None and self.peak <= self.capacity and not self.problems

    def to_json(self) -> dict[str, Any]:
        out = {
            "job": self.name,
            "gpus": self.gpus,
            "capacity_gib": round(self.capacity, 2),
            "peak_gib": round(self.peak, 2),
            "peak_phase": self.peak_phase if self.phases else None,
            "margin_gib": round(self.margin, 2),
            "fits": self.fits,
            "refused": self.refusal,
            "problems": self.problems,
            "phases": {p: {k: round(v, 2) for k, v in c.items()} for p, c in self.phases.items()},
            "constants": dict(self.constants),
            "notes": list(self.notes),
        }
        if self.host:
            out["host_gib"] = round(self.host_gib, 1)
            out["host_phase"] = self.host_phase
            out["host_terms"] = {p: {k: round(v, 2) for k, v in t.items()} for p, t in self.host.items()}
            out["host_capacity_gib"] = self.host_capacity
        if self.disk:
            out["disk_gib"] = round(self.disk_gib, 1)
            out["disk_terms"] = {k: round(v, 1) for k, v in self.disk.items()}
            out["disk_capacity_gib"] = self.disk_capacity
        if self.time:
            out.update(self._time_json())
        if self.threads is not None:
            out["threads"] = self.threads
            out["mem_mb"] = self.mem_mb
        return out

    def _time_lines(self) -> list[str]:
        other = [p for p in self.time if p != self.path]
        step = self.time[self.path]["step"]
        parts = ", ".join(f"{k} {v / 60:.1f}" for k, v in step.items() if round(v / 60, 1) != 0)
        high = bool(self.time_high)

        def span(p: str | None = None) -> str:
            low = f"{self.step_minutes(p):.1f}"
            return f"{low}-{self.step_minutes(p, 'high'):.1f}" if high else low

        def hours(p: str | None = None) -> str:
            low = f"{self.run_hours(p):.1f}"
            return f"{low}-{self.run_hours(p, 'high'):.1f}" if high else low

        out = [
            f"    time ({self.path})    {span()} min per step (low end: {parts}); run {hours()} h"
            + "".join(f"; {p}: {span(p)} min per step, {hours(p)} h" for p in other),
            f"    time from          {self.time_source or 'estimated'}",
        ]
        if self.cadence is not None:
            c = self.cadence
            how = (
                f"the stop at {c.stop_before_minutes:.0f} min before the limit saves the step in flight"
                if c.covered
                else f"a step and its save outlast the warning window: the job stops {c.stop_before_minutes:.0f} "
                "min before its limit"
            )
            out.append(
                f"    saves              every {c.save_every_steps} step(s) ({c.save_minutes:.1f} min each); "
                f"a lost allocation costs at most {c.max_work_lost_minutes:.1f} min; {how}"
            )
        return out

    def _time_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "time_source": self.time_source,
            "step_minutes": round(self.step_minutes(), 2),
            "run_hours": round(self.run_hours(), 1),
        }
        if self.estimated:
            out["estimated"] = dict(self.estimated)
        if self.time_high:
            out["step_minutes_range"] = [
                round(self.step_minutes(), 2),
                round(self.step_minutes(end="high"), 2),
            ]
            out["run_hours_range"] = [round(self.run_hours(), 1), round(self.run_hours(end="high"), 1)]
        if self.cadence is not None:
            out["save_every_steps"] = self.cadence.save_every_steps
            out["max_work_lost_minutes"] = round(self.cadence.max_work_lost_minutes, 1)
            out["cadence"] = self.cadence.to_json()
        out["paths"] = {
            p: {
                "step_minutes": round(self.step_minutes(p), 2),
                "run_hours": round(self.run_hours(p), 1),
                **({"step_minutes_range": [round(self.step_minutes(p), 2), round(self.step_minutes(p, "high"), 2)],
                    "run_hours_range": [round(self.run_hours(p), 1), round(self.run_hours(p, "high"), 1)],
                    "step_seconds_high": {k: round(v, 1) for k, v in self.time_high[p]["step"].items()}}
                   if p in self.time_high else {}),
                "step_seconds": {k: round(v, 1) for k, v in t["step"].items()},
                "run_hours_by_part": {k: round(v, 2) for k, v in t["run"].items()},
            }
            for p, t in self.time.items()
        }  # fmt: skip
        if self.assumptions:
            out["assumptions"] = self.assumptions
        return out

    def lines(self) -> list[str]:
        """The job as text: a header, one line per phase with its components, time, host memory and
        disk, the notes."""
        head = (
            f"{self.name}: {self.gpus} GPU(s), peak {self.peak:.1f} of {self.capacity:.1f} GiB "
            f"({self.peak_phase if self.phases else '-'}), margin {self.margin:.1f} GiB: {self.status}"
        )
        out = [head]
        for phase, components in self.phases.items():
            parts = ", ".join(f"{k} {v:.1f}" for k, v in components.items() if round(v, 1) != 0)
            out.append(f"    {phase:<18} {self.total(phase):6.1f}  = {parts}")
        if self.time:
            out += self._time_lines()
        if self.host:
            for phase, terms in self.host.items():
                parts = ", ".join(f"{k} {v:.1f}" for k, v in terms.items() if round(v, 1) != 0)
                out.append(f"    host ({phase})  {sum(terms.values()):6.1f} GiB per node = {parts}")
        if self.disk:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in self.disk.items())
            out.append(f"    disk               {self.disk_gib:6.1f} GiB = {parts}")
        if self.threads is not None:
            out.append(f"    asks for           {self.threads} threads, {self.mem_mb} MB host memory")
        if self.refused:
            out.append(f"    refused: {self.refused}")
        out += [f"    refused: {p}" for p in self.problems]
        out += [f"    note: {n}" for n in self.notes]
        return out


def reranker_gib(retrieval: Mapping[str, Any] | None, *, on_gpu: bool = True) -> float:
    """One reranker replica on a GPU (0 without a reranker): weights, activations of the largest
    pass (``max_batch_tokens``, else ``batch_size x max_length``), allocator slack, CUDA context."""
    reranker = dict((retrieval or {}).get("reranker") or {})
    model = reranker.get("model")
    if not model or not on_gpu:
        return 0.0
    try:
        shape = load_shape(str(model), reranker.get("path"))
    except ValueError:
        shape = load_shape("BAAI/bge-reranker-v2-m3")
    section = RerankerConfig.model_validate({k: v for k, v in reranker.items() if k != "path"})
    weights = shape.params * (2 if section.fp16 else 4) / GIB
    tokens = section.max_batch_tokens or section.batch_size * section.max_length
    scale = (shape.layers * shape.hidden) / (24 * 1024)
    activations = CONSTANTS["reranker_mib_per_token"] * scale * int(tokens) / 1024
    return weights + activations + CONSTANTS["reranker_slack"] + CONSTANTS["cuda_context"]


def reranker_on_gpus(retrieval: Mapping[str, Any] | None) -> bool:
    """Whether a training job's reranker has a replica on each of its GPUs (devices null: one per
    GPU of the job, spader.retrieval.service.reranker_on_job_gpus)."""
    reranker = dict((retrieval or {}).get("reranker") or {})
    if not reranker.get("model"):
        return False
    devices = reranker.get("devices")
    if devices is None:
        return True
    devices = [devices] if isinstance(devices, str) else list(devices)
    return any(str(d).startswith("cuda") for d in devices)


def _sglang(shape: Shape, pre: float, fraction: float, tp: int) -> tuple[float, float, float]:
    """sglang 0.5.14's static memory on one GPU: ``(static, weights, kv)`` in GiB, for ``pre`` GiB
    free at launch (see the module docstring)."""
    static = fraction * pre
    weights = shape.params * 2 / tp / GIB
    return static, weights, static - weights


def _kv_tokens(shape: Shape, kv_gib: float, tp: int) -> int:
    per_gpu = shape.kv_bytes_per_token() / min(tp, shape.kv_heads)
    return max(0, int(kv_gib * GIB / per_gpu))


def _activations(
    shape: Shape, tokens: int, micro: int, seq: int, *, checkpointing: bool, padded: bool,
    measured: Measured | None = None,
) -> dict:  # fmt: skip
    """Activation terms of one training micro-batch (GiB): the layer inputs kept by activation
    checkpointing, one layer's working set in the backward pass, the sdpa attention mask; from a
    calibration record's measured constants when one measured this shape (checkpointing on)."""
    c = CONSTANTS
    mask_bytes = measured.mask_bytes_per_element if measured is not None else 1.0
    mask = micro * seq * seq * mask_bytes / GIB if padded else 0.0
    if measured is not None and checkpointing:
        return {
            "checkpoints": shape.layers * tokens * measured.kept_bytes_per_token_layer / GIB,
            "layer backward": tokens * measured.backward_bytes_per_token / GIB,
            "mask": mask,
        }
    per_token_layer = 2 * (
        c["layer_c_h"] * shape.hidden + c["layer_c_q"] * shape.q_dim + c["layer_c_kv"] * shape.kv_dim
        + c["layer_c_i"] * shape.intermediate
    )  # fmt: skip
    layer = tokens * per_token_layer / GIB
    if checkpointing:
        kept = shape.layers * tokens * shape.hidden * 2 / GIB
        working = c["layer_backward_factor"] * layer
    else:
        kept, working = shape.layers * layer, c["layer_backward_factor"] * layer - layer
    return {
        "checkpoints" if checkpointing else "layer activations": kept,
        "layer backward": working,
        "mask": mask,
    }


def _forward_activations(shape: Shape, tokens: int, micro: int, seq: int, *, padded: bool,
                         measured: Measured | None = None) -> float:  # fmt: skip
    """GiB of one layer's forward activations without gradients (the log-prob passes) and the mask."""
    acts = _activations(shape, tokens, micro, seq, checkpointing=True, padded=padded, measured=None)
    mask = _activations(shape, tokens, micro, seq, checkpointing=True, padded=padded, measured=measured)[
        "mask"
    ]
    if measured is not None:
        return tokens * measured.forward_bytes_per_token / GIB + mask
    return acts["layer backward"] / CONSTANTS["layer_backward_factor"] + mask


def _logits(
    shape: Shape, tokens: int, m: VerlMemory, *, grad: bool, entropy: bool, measured: Measured | None = None
) -> float:
    """GiB of the log-prob computation over the vocabulary for ``tokens`` tokens (measured by a
    calibration record for this shape and path when it holds one)."""
    if measured is not None:
        # the fused kernel always computes the entropy; the full path's entropy in the loss was
        # measured checkpointed (entropy_checkpointing), the only way the configs run it
        if not grad:
            kind = "forward"
        elif m.fused or not entropy:
            kind = "update"
        else:
            kind = "update_entropy" if m.entropy_checkpointing else None
        cost = measured.logprob("fused" if m.fused else "full", kind) if kind else None
        if cost is not None:
            return cost.gib(tokens)
    if m.fused:
        chunk = CONSTANTS["fused_chunk_buffers"] * CONSTANTS["fused_chunk_tokens"] * shape.vocab * 4
        extra = (shape.vocab * shape.hidden * 2 + tokens * shape.hidden * 2) if grad else 0
        return (chunk + extra + tokens * 8) / GIB
    full = tokens * shape.vocab * 2  # bf16 (tokens x vocabulary) logits
    if grad:
        # logits, verl's copy of the unpadded rows, the gradient; the entropy term keeps its
        # softmax and product unless it is recomputed (entropy_checkpointing)
        n = 3 + ((1 if m.entropy_checkpointing else 2) if entropy else 0)
    else:
        # logits with the entropy's softmax and product alive at once, or logits and the copy
        n = 3 if entropy else 2
    return n * full / GIB


def _resident(state: dict, param_off: bool, optim_off: bool, *, adam: bool = True) -> float:
    """GiB of a model's sharded ``state`` left on the GPU by its offload flags."""
    if not state:
        return 0.0
    return (0.0 if param_off else state["params"]) + (0.0 if optim_off or not adam else state["adam"])


def _sharded_state(params: int, param_bytes: int, per: float) -> dict[str, float]:
    """GiB per GPU of a model's parameters, fp32 gradients and Adam state, ``per`` bytes to a GiB x GPUs."""
    return {"params": params * param_bytes / per, "grads": params * 4 / per, "adam": params * 8 / per}


def _constant_sources(
    m: VerlMemory, measured: Measured | None, calibration_path: str | None
) -> dict[str, str]:
    """Where each group of the plan's constants comes from (a calibration record or the estimates)."""
    source = f"measured ({calibration_path}, {measured.device})" if measured is not None else "estimated"
    return {
        "kept inputs, layer working sets, mask": source,
        "log-probs": source
        if measured is not None and measured.logprob("fused" if m.fused else "full", "update") is not None
        else "estimated",
        "CUDA context, NCCL, sglang runtime, gathered parameters, allocator slack": "estimated",
    }


def _sglang_at_launch(job: Job, shape: Shape, m: VerlMemory, pre: float) -> tuple[float, int]:
    """(GiB of sglang's static share, KV tokens per replica) from the ``pre`` GiB free at its launch;
    notes them on ``job`` and refuses it when the share does not hold the weights."""
    static, weights, kv = _sglang(shape, pre, m.rollout_fraction, m.rollout_tp)
    kv_tokens = _kv_tokens(shape, kv, m.rollout_tp)
    job.notes.append(
        f"sglang at launch: {pre:.1f} GiB free x {m.rollout_fraction} = {static:.1f} GiB static (weights "
        f"{weights:.1f}, KV {kv:.1f} = {kv_tokens:,} tokens per TP-{m.rollout_tp} replica)"
    )
    if kv <= 0:
        job.refused = (
            f"sglang's static share ({static:.1f} GiB) does not hold its weights ({weights:.1f} GiB)"
        )
    return static, kv_tokens


def _memory_phases(job: Job, shape: Shape, m: VerlMemory, *, capacity: float, reranker: float,
                   measured: Measured | None) -> tuple[int, int]:  # fmt: skip
    """Fill ``job``'s phases; returns (KV tokens per sglang replica, tokens of an update micro-batch)."""
    per = GIB * job.gpus
    actor = _sharded_state(shape.params, m.param_bytes, per)
    critic = _sharded_state(shape.value_params, m.param_bytes, per) if m.critic else {}
    c = CONSTANTS
    verl_process = c["cuda_context"] + c["nccl"]
    sglang_process = c["cuda_context"] + (c["nccl"] if m.rollout_tp > 1 else 0.0)
    # sglang starts after verl built its models and before the first step (no Adam state yet)
    at_launch = _resident(actor, m.actor_param_offload, True) + _resident(
        critic, m.critic_param_offload, True
    )
    pre = capacity - verl_process - reranker - at_launch - sglang_process
    static, kv_tokens = _sglang_at_launch(job, shape, m, pre)
    base = {"verl process": verl_process, "reranker": reranker}
    sglang_idle = (
        {"sglang idle": sglang_process + c["sglang_graphs"]}
        if m.free_cache_engine
        else {"sglang": sglang_process + static + c["sglang_graphs"]}
    )
    actor_resident = _resident(actor, m.actor_param_offload, m.actor_optimizer_offload)
    critic_resident = _resident(critic, m.critic_param_offload, m.critic_optimizer_offload)
    critic_part = {"critic (resident)": critic_resident} if m.critic else {}
    job.phases["rollout"] = {
        **base,
        "actor (resident)": actor_resident,
        **critic_part,
        "sglang": sglang_process + static + c["sglang_graphs"] + c["sglang_activations"],
    }
    idle = {**base, **sglang_idle}
    tokens = _update_phases(job, shape, m, actor, critic_part, idle, measured=measured)
    _log_prob_phase(job, shape, m, actor, critic_part, idle, measured=measured)
    if m.critic:
        _critic_phase(job, shape, m, critic, actor_resident, idle, measured=measured)
    return kv_tokens, tokens


def _update_phases(job: Job, shape: Shape, m: VerlMemory, actor: dict[str, float], critic_part: dict[str, float],
                   idle: dict[str, float], *, measured: Measured | None) -> int:  # fmt: skip
    """Fill ``job``'s actor update and optimizer step; returns the tokens of an update micro-batch."""
    c = CONSTANTS
    seq = m.seq_len
    padded = not m.remove_padding
    if m.dynamic_bsz and padded:
        job.refused = (
            "use_dynamic_bsz caps the real tokens of a micro-batch, but the padded path pads every "
            "sequence to the longest: the padded tokens are not bounded (set "
            "ppo_micro_batch_size_per_gpu instead)"
        )
    tokens = m.max_token_len if m.dynamic_bsz and not padded else m.micro_batch * seq
    gathered_train = (8 * shape.head_params + 4 * shape.layer_params) / GIB
    if shape.tied:
        gathered_train = (6 * shape.embedding_params + 4 * shape.layer_params) / GIB
    acts = _activations(shape, tokens, m.micro_batch, seq, checkpointing=m.grad_checkpointing, padded=padded,
                        measured=measured)  # fmt: skip
    update = {
        "actor state": actor["params"] + actor["grads"] + actor["adam"],
        **critic_part,
        **acts,
        "logits": _logits(shape, tokens, m, grad=True, entropy=m.entropy_in_loss, measured=measured),
        "gathered params": gathered_train,
    }
    update["allocator slack"] = c["allocator_slack"] * sum(update.values())
    job.phases["actor update"] = {**idle, **update}
    job.phases["optimizer step"] = {
        **idle,
        "actor state": update["actor state"],
        "adam temporaries": actor["params"] * 4 / m.param_bytes,
        **critic_part,
    }
    return tokens


def _log_prob_phase(job: Job, shape: Shape, m: VerlMemory, actor: dict[str, float], critic_part: dict[str, float],
                    idle: dict[str, float], *, measured: Measured | None) -> None:  # fmt: skip
    """Fill ``job``'s log-prob phase (the forward passes without gradients)."""
    seq = m.seq_len
    lp_tokens = m.log_prob_micro_batch * seq
    gathered_eval = (2 * (shape.head_params or shape.embedding_params) + 4 * shape.layer_params) / GIB
    forward = {
        "actor (resident)": _resident(actor, False, m.actor_optimizer_offload),
        **critic_part,
        "layer activations": _forward_activations(
            shape, lp_tokens, m.log_prob_micro_batch, seq, padded=not m.remove_padding, measured=measured
        ),
        "logits": _logits(shape, lp_tokens, m, grad=False, entropy=True, measured=measured),
        "gathered params": gathered_eval,
    }
    job.phases["log-probs"] = {**idle, **forward}


def _critic_phase(job: Job, shape: Shape, m: VerlMemory, critic: dict[str, float], actor_resident: float,
                  idle: dict[str, float], *, measured: Measured | None) -> None:  # fmt: skip
    """Fill ``job``'s critic update."""
    seq = m.seq_len
    ctokens = m.critic_micro_batch * seq
    cacts = _activations(shape, ctokens, m.critic_micro_batch, seq, checkpointing=m.critic_grad_checkpointing,
                         padded=not m.remove_padding, measured=measured)  # fmt: skip
    cupdate = {
        "critic state": critic["params"] + critic["grads"] + critic["adam"],
        "actor (resident)": actor_resident,
        **cacts,
        "gathered params": (6 * shape.embedding_params / shape.layers + 10 * shape.layer_params) / GIB,
    }
    cupdate["allocator slack"] = CONSTANTS["allocator_slack"] * sum(cupdate.values())
    job.phases["critic update"] = {**idle, **cupdate}


def training_job(
    name: str,
    shape: Shape,
    verl_cfg: Mapping[str, Any],
    *,
    gpus: int,
    capacity: float,
    reranker: float = 0.0,
    measured: Measured | None = None,
    calibration_path: str | None = None,
    costs: JobCosts | None = None,
) -> Job:
    """The plan of one training job on each of its ``gpus`` training GPUs (see docs/gpu.md).

    Args:
        name: the job's name in the output.
        shape: the backbone's shape.
        verl_cfg: the resolved verl config of the launch.
        gpus: GPUs verl trains on (the node's, less those of a served judge).
        capacity: GiB per GPU.
        reranker: GiB of the job's reranker replica on each training GPU (0: none there).
        measured: a calibration record's constants for this shape (None: the estimates).
        calibration_path: the record it came from, or the record that holds no entry for this shape.
        costs: what the time, host and disk models need beyond the verl config (None: the GPU
            memory alone).
    """
    m = VerlMemory.from_verl(verl_cfg)
    job = Job(name=name, gpus=gpus, capacity=capacity)
    if gpus < 1:
        job.refused = "no GPU left for training"
        return job
    job.constants = _constant_sources(m, measured, calibration_path)
    if measured is None and calibration_path:
        job.notes.append(
            f"calibration record {calibration_path} has no entry for {shape.name}'s shape: estimates used"
        )
    kv_tokens, tokens = _memory_phases(job, shape, m, capacity=capacity, reranker=reranker, measured=measured)
    if not m.fused:
        job.notes.append(
            "log-probs over the full logits: "
            f"{tokens * shape.vocab * 2 / GIB:.1f} GiB per (micro-batch x length x vocabulary) copy"
        )
    if costs is not None:
        _plan_costs(job, shape, m, verl_cfg, costs, kv_tokens=max(1, kv_tokens))
    return job


@dataclass(frozen=True)
class JobCosts:
    """What a training job's time, host memory and disk need beyond its verl config."""

    hardware: Any  # the config's ``hardware`` section (spader.config.model.HardwareConfig)
    workload: Any  # spader.planning.costs.Workload
    reranker_on_gpus: bool = False
    cache_bytes: int = 0
    judge_shape: Shape | None = None
    judge: Mapping[str, Any] | None = None
    judge_gpus_on_node: int = 0
    #: the retrieval service's reranker replicas and BM25 candidates (spader.planning.costs.Search)
    search: Any = None
    #: the allocation: its time limit (minutes; None: no cadence planned), the warning window
    #: (training.time_limit.warning_s) and the bound on the work an end of it may lose
    allocation_minutes: float | None = None
    warning_s: float = 1800.0
    max_work_lost_minutes: float = 60.0
    #: earlier trainings' measured records of this job (spader.planning.measured; applied when they
    #: ran on the same hardware), and ``(<b>/<v>, low, high)``: the measured/estimated factors of
    #: another variant of the backbone, for a job that has no record of its own
    records: tuple[MeasuredRun, ...] = ()
    scale_from: tuple[str, float, float] | None = None


def _checkpoint_bytes(shape: Shape, m: VerlMemory, run: Any) -> float:
    """Bytes of one checkpoint: the actor's shards and Adam's moments, the critic's likewise."""
    actor = shape.params * (m.param_bytes + (8 if run.saves_optimizer else 0))
    critic = (
        shape.value_params * (m.param_bytes + (8 if run.critic_saves_optimizer else 0)) if m.critic else 0
    )
    return float(actor + critic)


def _path_times(job: Job, shape: Shape, m: VerlMemory, run: Any, jc: JobCosts, *, kv_tokens: int,
                path: str, end: str) -> tuple[dict[str, float], float]:  # fmt: skip
    """(seconds of a step by phase, seconds of one validation) on ``path`` at ``end`` of the range."""
    from spader.planning import costs

    work, hw = jc.workload, jc.hardware
    inputs = costs.TimeInputs.of(hw, end)
    step = costs.step_time(
        shape, m, run, work, hw, gpus=job.gpus, kv_tokens=kv_tokens, padded=path == "padded",
        judge_shape=jc.judge_shape, judge=jc.judge, inputs=inputs, search=jc.search,
    )  # fmt: skip
    validation = costs.rollout_seconds(
        shape, trajectories=work.val_prompts * run.val_rollouts, replicas=job.gpus // max(1, m.rollout_tp),
        tp=m.rollout_tp, kv_tokens=kv_tokens, lengths=costs.Lengths.from_share(m.seq_len, inputs.length_share),
        spec=costs.GPUS[hw.gpu], hardware=hw, max_turns=work.max_turns, inputs=inputs, search=jc.search,
    )  # fmt: skip
    return step, sum(validation.values())


def _assumptions(job: Job, shape: Shape, m: VerlMemory, jc: JobCosts, kv_tokens: int) -> dict[str, Any]:
    """The named inputs of the job's time model, both ends (shown by ``spader plan --json``)."""
    from spader.planning import costs

    hw, work = jc.hardware, jc.workload
    spec = costs.GPUS[hw.gpu]
    replicas = job.gpus // max(1, m.rollout_tp)
    out: dict[str, Any] = {}
    for end in ("low", "high"):
        inputs = costs.TimeInputs.of(hw, end)
        lengths = costs.Lengths.from_share(m.seq_len, inputs.length_share)
        demand = costs.kv_demand(work.trajectories, replicas, lengths)
        out[end] = {
            "mfu": inputs.mfu,
            "length_share": inputs.length_share,
            "lengths_tokens": [round(lengths.low), round(lengths.high)],
            "generated_share": float(hw.generated_share),
            "kv_demand_tokens_per_replica": round(demand),
            "kv_pool_tokens_per_replica": kv_tokens,
            "kv_demand_over_pool": round(demand / max(1, kv_tokens), 2),
            "retracted_prefilled_again": inputs.retraction and demand > kv_tokens,
            "search_seconds_per_turn": round(
                costs.search_seconds(jc.search, inputs, trajectories=work.trajectories, spec=spec)
                + costs.TIME_CONSTANTS["turn_wait_s"], 2
            ),
            "searching_turns": inputs.searching_turns,
            "queries_per_call": inputs.queries_per_call,
            "distinct_share": inputs.distinct_share,
        }  # fmt: skip
    search = jc.search
    out["search"] = {
        "reranker_replicas": search.replicas if search else 0,
        "pairs_per_query": search.pairs_per_query if search else 0,
        "pairs_per_s_per_replica": round(spec.rerank_pairs_per_s),
        "source": "bench/reranker_gpu.py (4,576 pairs/s, one H200) scaled by the bf16 peak; the query "
        "stream of bench/retrieval.py (docs/benchmarks.md)",
    }
    return out


def _plan_costs(job: Job, shape: Shape, m: VerlMemory, verl_cfg: Mapping[str, Any], jc: JobCosts, *,
                kv_tokens: int) -> None:  # fmt: skip
    """Fill ``job``'s time (both actor paths, both ends of the range), save cadence, host memory and
    disk (:mod:`spader.planning.costs`)."""
    from spader.planning import costs

    run = costs.RunSettings.from_verl(verl_cfg)
    work, hw = jc.workload, jc.hardware
    job.path = "packed" if m.remove_padding else "padded"
    job.ran_on = {"gpu": hw.gpu, "gpus": job.gpus, "gpus_per_node": job.gpus // max(1, work.nodes),
                  "nodes": work.nodes, "path": job.path}  # fmt: skip
    job.planned_steps = work.steps
    checkpoint = _checkpoint_bytes(shape, m, run)
    ends = {(path, end): _path_times(job, shape, m, run, jc, kv_tokens=kv_tokens, path=path, end=end)
            for path in ("padded", "packed") for end in ("low", "high")}  # fmt: skip
    record = _measured_times(job, ends, jc)
    if record is not None and record.checkpoint_gib:
        job.estimated["checkpoint_gib"] = round(checkpoint / GIB, 2)
        checkpoint = record.checkpoint_gib * GIB
    if jc.allocation_minutes is not None:
        job.cadence = costs.save_cadence(
            step_minutes=sum(ends[(job.path, "high")][0].values()) / 60, save_minutes=costs.save_minutes(checkpoint),
            warning_s=jc.warning_s, allocation_minutes=jc.allocation_minutes,
            bound_minutes=jc.max_work_lost_minutes, save_freq=run.save_freq,
        )  # fmt: skip
    every = job.cadence.save_every_steps if job.cadence else None
    for (path, end), (step, validation) in ends.items():
        times = job.time if end == "low" else job.time_high
        times[path] = {
            "step": step,
            "run": costs.run_hours(sum(step.values()), validation, work, run, checkpoint, save_every=every),
        }
    job.assumptions = _assumptions(job, shape, m, jc, kv_tokens)
    steady, loading = costs.host_terms(
        shape, m, run, work, gpus=job.gpus, reranker_on_gpus=jc.reranker_on_gpus, cache_bytes=jc.cache_bytes,
        judge_gpus_on_node=jc.judge_gpus_on_node,
    )  # fmt: skip
    job.host = {"training": steady, "model loading": loading}
    job.host_capacity = float(hw.host_memory_gib)
    job.disk = costs.disk_terms(shape, m, run, work)
    job.disk_capacity = float(hw.disk_gib)
    job.kept_gib = costs.kept_after(shape, m, run, work)
    job.final_checkpoint_gib = checkpoint / GIB
    if record is not None:
        _measured_host_and_disk(job, record, estimated_checkpoint=_checkpoint_bytes(shape, m, run) / GIB)


#: verl's phases of a measured step (spader.training.measure.PHASES) under the plan's names; the
#: search wait is part of generation, the save is counted apart (run hours, cadence)
MEASURED_PHASES = {
    "generation": "rollout", "reward": "reward", "old_log_prob": "old log-probs",
    "reference": "reference log-probs", "values": "critic values", "advantage": "advantage",
    "update_critic": "critic update", "update_actor": "actor update", "update_weights": "weight sync",
}  # fmt: skip


def _measured_step(record: MeasuredRun, seconds: float) -> dict[str, float]:
    """A step of ``seconds`` by phase, from a record's median phases (``other``: the rest of the
    step; phases that sum to more are scaled down to it)."""
    phases = {MEASURED_PHASES[k]: v for k, v in record.phase_seconds.items() if k in MEASURED_PHASES}
    total = sum(phases.values())
    if not phases:
        return {"step (measured)": seconds}
    if total > seconds:
        return {k: v * seconds / total for k, v in phases.items()}
    return {**phases, "other (measured)": seconds - total}


def _measured_times(job: Job, ends: dict, jc: JobCosts) -> MeasuredRun | None:
    """Replace the estimated step times of ``ends`` (``(path, end) -> (step by phase, validation)``)
    by a record of the job that ran on its hardware (its path measured; the other path scaled by the
    same factor), or scale them by another variant's factors (``jc.scale_from``); notes say which,
    and why a record does not apply. Returns the record applied."""
    record = None
    for r in jc.records:
        why = r.mismatch(job.ran_on or {})
        if why:
            job.notes.append(why)
        elif record is None:
            record = r
    estimate = {end: sum(ends[(job.path, end)][0].values()) for end in ("low", "high")}
    if record is not None:
        factor = (record.step_seconds[0] / estimate["low"], record.step_seconds[1] / estimate["high"])
        job.estimated["step_seconds"] = [round(estimate["low"], 1), round(estimate["high"], 1)]
        job.time_source = f"measured ({record.path}, {record.steps} steps)"
        if record.planned_steps is not None and record.planned_steps != job.planned_steps:
            job.notes.append(f"{record.path} measured a run of {record.planned_steps} planned steps; this plan "
                             f"has {job.planned_steps}: its run hours count {job.planned_steps} steps")  # fmt: skip
    elif jc.scale_from is not None:
        source, *factor = jc.scale_from
        job.estimated["step_seconds"] = [round(estimate["low"], 1), round(estimate["high"], 1)]
        job.time_source = f"scaled from measured {source} (x{factor[0]:.2f})"
        job.notes.append(f"step times scaled from measured {source}: x{factor[0]:.2f} (low end), "
                         f"x{factor[1]:.2f} (high end) of the plan's estimates")  # fmt: skip
    else:
        job.time_source = "estimated"
        return None
    job.time_factor = (factor[0], factor[1])
    for (path, end), (step, validation) in list(ends.items()):
        f = factor[0] if end == "low" else factor[1]
        ends[(path, end)] = ({k: v * f for k, v in step.items()}, validation)
    if record is not None:
        for end, seconds in zip(("low", "high"), record.step_seconds, strict=True):
            ends[(job.path, end)] = (_measured_step(record, seconds), ends[(job.path, end)][1])
    return record


def _measured_host_and_disk(job: Job, record: MeasuredRun, *, estimated_checkpoint: float) -> None:
    """A record's host peak and checkpoint size in place of the estimates (kept in ``job.estimated``)."""
    if record.host_gib:
        job.estimated["host_gib"] = round(job.host_gib or 0.0, 1)
        job.host = {"measured": {"peak host memory (measured)": float(record.host_gib)}}
    if record.checkpoint_gib and estimated_checkpoint:
        ratio = record.checkpoint_gib / estimated_checkpoint
        export = job.disk.get("export (bf16)", 0.0)
        job.disk = {(k if k == "export (bf16)" else f"{k} x {ratio:.2f} measured"): (v if k == "export (bf16)" else v * ratio)
                    for k, v in job.disk.items()}  # fmt: skip
        job.kept_gib = ((job.kept_gib or 0.0) - export) * ratio + export
    job.notes.append(
        f"measured by {record.path}: step {record.step_seconds[0]:.0f}-{record.step_seconds[1]:.0f} s"
        + (f", host peak {record.host_gib:.1f} GiB (estimated {job.estimated['host_gib']:.1f})" if record.host_gib else "")
        + (f", checkpoint {record.checkpoint_gib:.1f} GiB (estimated {estimated_checkpoint:.1f})"
           if record.checkpoint_gib else "")
    )  # fmt: skip


def judge_job(name: str, shape: Shape, judge: Mapping[str, Any], *, capacity: float, reranker: float) -> Job:
    """R3-RAG's judge served by sglang on its GPUs of the training node (after the retrieval
    service, whose reranker replica may share them)."""
    job = Job(name=name, gpus=int(judge["gpus"]), capacity=capacity)
    tp = int(judge["tensor_parallel"])
    process = CONSTANTS["cuda_context"] + (CONSTANTS["nccl"] if tp > 1 else 0.0)
    pre = capacity - reranker - process
    static, weights, kv = _sglang(shape, pre, float(judge["mem_fraction"]), tp)
    job.phases["serving"] = {
        "reranker": reranker,
        "sglang": process + static + CONSTANTS["sglang_graphs"] + CONSTANTS["sglang_activations"],
    }
    job.notes.append(
        f"judge {shape.name}: {pre:.1f} GiB free at launch x {judge['mem_fraction']} = {static:.1f} GiB "
        f"static (weights {weights:.1f}, KV {kv:.1f} = {_kv_tokens(shape, kv, tp):,} tokens per replica)"
    )
    if kv <= 0:
        job.refused = (
            f"the judge's static share ({static:.1f} GiB) does not hold its weights ({weights:.1f} GiB)"
        )
    return job


def evaluation_job(
    name: str, shape: Shape, evaluation: Mapping[str, Any], *, capacity: float, reranker: float
) -> Job:
    """An evaluation job on its first GPU: the engine, then the retrieval service's reranker
    (sglang is built first and sizes its share before the reranker loads)."""
    job = Job(name=name, gpus=int(evaluation["gpus"]), capacity=capacity)
    engine = evaluation["engine"]
    if engine == "sglang":
        tp = max(1, job.gpus)
        process = CONSTANTS["cuda_context"] + (CONSTANTS["nccl"] if tp > 1 else 0.0)
        pre = capacity - process
        static, weights, kv = _sglang(shape, pre, float(evaluation["gpu_memory_utilization"]), tp)
        job.phases["evaluation"] = {
            "sglang": process + static + CONSTANTS["sglang_graphs"] + CONSTANTS["sglang_activations"],
            "reranker": reranker,
        }
        job.notes.append(
            f"sglang: {pre:.1f} GiB free at launch x {evaluation['gpu_memory_utilization']} = "
            f"{static:.1f} GiB static (weights {weights:.1f}, KV {kv:.1f} = {_kv_tokens(shape, kv, tp):,} tokens)"
        )
        if kv <= 0:
            job.refused = (
                f"sglang's static share ({static:.1f} GiB) does not hold its weights ({weights:.1f} GiB)"
            )
    else:  # the transformers engine: bf16 weights, a full KV cache per batch, the last logits
        batch, context = (
            int(evaluation["batch_size"]),
            int(evaluation["max_context_tokens"]),
        )
        job.phases["evaluation"] = {
            "process": CONSTANTS["cuda_context"],
            "weights": shape.params * 2 / GIB,
            "kv cache": batch * context * shape.kv_bytes_per_token() / GIB,
            "logits": batch * shape.vocab * 4 / GIB,
            "reranker": reranker,
        }
    return job


def evidence_job(name: str, *, capacity: float, reranker: float) -> Job:
    """StepSearch's evidence job: the reranker alone on its GPU."""
    job = Job(name=name, gpus=1, capacity=capacity)
    job.phases["reranking"] = {"reranker": reranker}
    return job


# ---------------------------------------------------------------------------------------------
# The whole DAG
# ---------------------------------------------------------------------------------------------
#: Resolved compositions of this process, by :func:`_compose_resolved`'s key.
_COMPOSED: dict[str, dict[str, Any]] = {}


def _composition_cache_dir() -> Path:
    """Where resolved compositions are kept between processes (the user's cache directory, beside
    the code facts of spader.infra.stage_code): a workflow start plans its training jobs without
    composing again. An unreadable or unwritable cache only makes a start slower."""
    from spader.infra.stage_code import code_cache_dir

    return code_cache_dir().parent / "verl-compositions-v1"


def _compose_resolved(
    verl_config: str, overrides: Sequence[str], config_dir: Path, cache: dict[str, dict] | None = None
) -> dict[str, Any]:
    """The resolved verl config. Variants whose YAML chains parse to the same documents and whose
    overrides differ only in the method's ``algorithm.*`` / ``reward.*`` values (which change no
    memory: the critic is switched by ``critic.enable`` in the YAMLs) share one composition, so the
    beta sweep and the ablations compose once. Kept for the process and in the user's cache
    directory, keyed by the documents, the overrides, the installed verl and the composing code."""
    import importlib.metadata

    import yaml

    import spader.integrations.verl.compose as composing
    from spader.config import verl_config_chain

    cache = _COMPOSED if cache is None else cache
    docs = []
    for path in verl_config_chain(verl_config, config_dir):
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        docs.append({k: v for k, v in doc.items() if k != "hydra"})
    key = hashlib.sha256(
        json.dumps(
            [
                docs,
                [o for o in overrides if not o.lstrip("+").startswith(("algorithm.", "reward."))],
                importlib.metadata.version("verl"),
                hashlib.sha256(Path(composing.__file__).read_bytes()).hexdigest(),
            ],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    if key in cache:
        return cache[key]
    stored = _composition_cache_dir() / f"{key}.json"
    try:
        cache[key] = json.loads(stored.read_text(encoding="utf-8"))
        return cache[key]
    except (OSError, ValueError):
        pass
    from omegaconf import OmegaConf

    cfg = composing.compose(
        verl_config, [*overrides, "actor_rollout_ref.model.path=/plan"], config_dir=config_dir
    )
    cache[key] = OmegaConf.to_container(cfg, resolve=True)
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        tmp = stored.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache[key], default=str), encoding="utf-8")
        os.replace(tmp, stored)
    except OSError as exc:
        log.debug("composition cache not written (%s)", exc)
    return cache[key]


def load_record(config: Any, root: str | os.PathLike = ".") -> Records | None:
    """The records ``hardware.calibration`` names (relative paths: under ``root``): a GPU memory
    calibration record and earlier trainings' measured records (:mod:`spader.planning.measured`)."""
    paths = config.hardware.calibration
    if not paths:
        return None
    return load_records(paths, root)


def _records(calibration: Calibration | Records | None) -> Records:
    if isinstance(calibration, Records):
        return calibration
    return Records(memory=calibration)


def planned_steps(config: Any) -> int:
    """Optimizer steps of a training run: ``training.max_steps``, else the epochs over the mix at
    ``train_batch_size`` prompts per step (verl's training loader drops the last partial batch)."""
    if config.training.max_steps:
        return int(config.training.max_steps)
    prompts = sum(config.mix.counts.model_dump().values())
    return int(config.training.epochs) * (prompts // int(config.training.train_batch_size))


def job_request(job: Job, hardware: Any, gpus_per_node: int) -> tuple[int, int]:
    """(threads, MB) a training job asks a scheduler for on each node: its share of the node's
    cores (the GPUs it holds of ``hardware.gpus``), and the plan's host memory with
    ``HOST_CONSTANTS['request_headroom']``, at most its share of ``hardware.host_memory_gib``."""
    from spader.planning.costs import HOST_CONSTANTS

    share = min(1.0, gpus_per_node / int(hardware.gpus))
    threads = max(1, int(int(hardware.cores) * share))
    cap = float(hardware.host_memory_gib) * share
    need = (job.host_gib or 0.0) * (1 + HOST_CONSTANTS["request_headroom"])
    return threads, math.ceil(min(need, cap) * 1024)


@dataclass(frozen=True)
class _PlanInputs:
    """What the training jobs of one config's plan share (the config's sections as the rules get them)."""

    config: Any
    verl_config_dir: str | os.PathLike
    models: dict[str, str]
    calibration: Records
    capacity: float
    retrieval: dict[str, Any]
    training: dict[str, Any]
    agent: dict[str, Any]
    judge: dict[str, Any]
    replica: float
    steps: int
    val_prompts: int


def _job_costs(inputs: _PlanInputs, variant: str, *, nodes: int, served: bool, judge_shape: Shape | None,
               node_gpus: int, records: tuple = (), scale_from: tuple | None = None) -> JobCosts:  # fmt: skip
    """What training ``variant``'s job of ``nodes`` nodes of ``node_gpus`` GPUs (serving the judge or
    not) needs for its time, host memory and disk; its measured ``records`` or the factors of another
    variant (``scale_from``)."""
    from spader.planning.costs import Search, Workload

    training, agent, judge, retrieval = inputs.training, inputs.agent, inputs.judge, inputs.retrieval
    verl_nodes = nodes - 1 if served and nodes > 1 else nodes
    limit = inputs.config.training.time_limit
    on_gpus = reranker_on_gpus(retrieval)
    return JobCosts(
        search=Search(replicas=nodes * node_gpus if on_gpus else 0, pairs_per_query=int(retrieval["initial_k"])),
        allocation_minutes=float(limit.estimate_minutes(variant)),
        warning_s=float(limit.warning_s),
        max_work_lost_minutes=float(training["max_work_lost_minutes"]),
        hardware=inputs.config.hardware,
        workload=Workload(
            steps=inputs.steps, prompts=int(training["train_batch_size"]), rollouts=int(training["rollout_n"]),
            val_prompts=inputs.val_prompts, max_turns=int(agent["max_turns"]), nodes=verl_nodes,
        ),
        reranker_on_gpus=reranker_on_gpus(retrieval),
        cache_bytes=int(retrieval["service"]["cache_bytes"]),
        judge_shape=judge_shape,
        judge=judge if served else None,
        judge_gpus_on_node=int(judge["gpus"]) if served and nodes == 1 else 0,
        records=records, scale_from=scale_from,
    )  # fmt: skip


def _variant_jobs(inputs: _PlanInputs, b: str, spec: Any, v: str, shape: Shape, measured: Measured | None,
                  run_of: str | None, scale_from: tuple | None = None) -> list[Job]:  # fmt: skip
    """The plan of training backbone ``b`` (``spec``) with variant ``v``, and of the judge it serves;
    ``run_of``: the variant whose run it shares; ``scale_from``: another variant's measured factors."""
    from spader.integrations.verl.device import device_overrides
    from spader.integrations.verl.overrides import config_overrides

    config, judge, calibration = inputs.config, inputs.judge, inputs.calibration
    nodes = config.training_nodes(v)  # variants.<v>.nodes, else training.nodes
    variant = config.variants[v].model_dump(mode="json")
    served = config.variants[v].serves_judge and not judge["url"]
    # verl shards over every training GPU of the job; a served judge takes GPUs of the
    # node (one node) or the last node (several)
    if served and nodes > 1:
        gpus = (nodes - 1) * spec.gpus
    else:
        gpus = nodes * spec.gpus - (int(judge["gpus"]) if served else 0)
    overrides = [
        *config_overrides(variant, inputs.training, inputs.agent),
        *device_overrides(inputs.training, threads=1, workers=gpus),
    ]
    cfg = _compose_resolved(verl_yaml(variant), overrides, Path(inputs.verl_config_dir))
    on_gpus = inputs.replica if reranker_on_gpus(inputs.retrieval) else 0.0
    judge_shape = load_shape(judge["model"], inputs.models.get(judge["model"])) if served else None
    job = training_job(
        f"train {b}/{v}", shape, cfg, gpus=gpus, capacity=inputs.capacity, reranker=on_gpus,
        measured=measured, calibration_path=calibration.path,
        costs=_job_costs(inputs, v, nodes=nodes, served=served, judge_shape=judge_shape, node_gpus=spec.gpus,
                         records=calibration.for_job(f"train {b}/{v}", run_of and f"train {b}/{run_of}"),
                         scale_from=scale_from),
    )  # fmt: skip
    job.host_capacity = float(config.hardware.host_memory_gib) * min(
        1.0, spec.gpus / int(config.hardware.gpus)
    )
    job.threads, job.mem_mb = job_request(job, config.hardware, spec.gpus)
    if spec.gpus > int(config.hardware.gpus):
        job.refused = (
            f"backbones.{b}.gpus is {spec.gpus}, more than the {config.hardware.gpus} GPUs of a node "
            "(hardware.gpus); give the job more nodes (training.nodes) instead"
        )
    job.run_of = run_of if run_of != v else None
    if job.run_of:
        job.notes.append(f"the workflow trains it once with {job.run_of} (identical settings)")
    if not served:
        return [job]
    return [job, judge_job(f"judge {b}/{v}", judge_shape, judge, capacity=inputs.capacity, reranker=on_gpus)]


def _backbone_training_jobs(inputs: _PlanInputs, b: str, spec: Any, only: Callable[[str, str], bool] | None
                            ) -> list[Job]:  # fmt: skip
    """The plans of backbone ``b``'s training jobs (those ``only`` keeps) and of the judges they serve."""
    from spader.integrations.verl.overrides import shared_training_runs

    config, models = inputs.config, inputs.models
    shape = load_shape(spec.model, models.get(b) or models.get(spec.model))
    measured = inputs.calibration.for_shape(shape)
    runs = shared_training_runs(
        spec.variants, {k: x.model_dump(mode="json") for k, x in config.variants.items()}, inputs.training,
        inputs.verl_config_dir,
    )  # fmt: skip
    names = [v for v in spec.variants if only is None or only(b, v)]
    # the variants with measured records first: the others are scaled by the first one measured
    planned: dict[str, list[Job]] = {}
    scale = None
    for v in sorted(
        names, key=lambda v: not inputs.calibration.for_job(f"train {b}/{v}", f"train {b}/{runs.get(v)}")
    ):
        planned[v] = _variant_jobs(inputs, b, spec, v, shape, measured, runs.get(v), scale_from=scale)
        factor = planned[v][0].time_factor
        if scale is None and factor is not None and planned[v][0].time_source.startswith("measured"):
            scale = (f"{b}/{v}", *factor)
            # a variant planned before the factor was known (its own record did not apply)
            for w in [w for w in planned if planned[w][0].time_source == "estimated"]:
                planned[w] = _variant_jobs(inputs, b, spec, w, shape, measured, runs.get(w), scale_from=scale)
    return [j for v in names for j in planned[v]]


def plan_config(
    config: Any,
    verl_config_dir: str | os.PathLike,
    *,
    models: Mapping[str, str] | None = None,
    calibration: Calibration | Records | None = None,
    only: Callable[[str, str], bool] | None = None,
) -> list[Job]:
    """Every GPU job of ``config`` (a :class:`spader.config.Config`).

    Args:
        config: the checked workflow config.
        verl_config_dir: the project's verl YAML directory.
        models: local model directories by hub id or backbone name, when at hand (their
            ``config.json`` is read instead of the shipped shape).
        calibration: the records ``hardware.calibration`` names (:func:`load_record`; or a GPU
            memory calibration record alone), or None.
        only: ``(backbone, variant) -> bool``: plan only these training jobs (and no other job).
    """
    models = dict(models or {})
    capacity = float(config.hardware.gpu_memory_gib)
    retrieval = config.retrieval.model_dump(mode="json")
    training = config.training.model_dump(mode="json")
    agent = config.agent.model_dump(mode="json")
    judge = config.judge.model_dump(mode="json")
    evaluation = config.evaluation_params()  # the context budget resolved (training's when null)
    replica = reranker_gib(retrieval)
    val_prompts = int(config.mix.val_per_dataset) * sum(
        1 for n in config.mix.counts.model_dump().values() if n > 0
    )
    inputs = _PlanInputs(
        config, verl_config_dir, models, _records(calibration), capacity, retrieval, training, agent, judge, replica,
        planned_steps(config), val_prompts,
    )  # fmt: skip
    jobs: list[Job] = []
    for b, spec in config.backbones.items():
        if training["device"] == "cuda" and spec.gpus > 0:
            jobs.extend(_backbone_training_jobs(inputs, b, spec, only))
        if evaluation["gpus"] > 0 and only is None:
            shape = load_shape(spec.model, models.get(b) or models.get(spec.model))
            own = config.evaluation_params(b)  # the backbone's context budget
            jobs.append(evaluation_job(f"evaluate {b}/*", shape, own, capacity=capacity, reranker=replica))
    trains_stepsearch = any(
        needs(config.variants[v].reward, "evidence") for s in config.backbones.values() for v in s.variants
    )
    if trains_stepsearch and config.stepsearch.evidence.gpus > 0 and only is None:
        jobs.append(evidence_job("build_evidence", capacity=capacity, reranker=replica))
    return jobs


def dag_totals(jobs: Sequence[Job], config: Any) -> dict[str, Any]:
    """What the DAG's training runs cost together (variants that share a run count once): GPU-hours,
    wall hours one after another (low and high end), and the disk the whole DAG needs
    (:func:`dag_disk`)."""
    train = [j for j in jobs if j.name.startswith("train ") and j.time and j.run_of is None]
    node_gpus = {b: spec.gpus * int(config.training.nodes) for b, spec in config.backbones.items()}
    gpu_hours = {
        end: sum(j.run_hours(end=end) * node_gpus[j.name.split()[1].split("/")[0]] for j in train)
        for end in ("low", "high")
        if all(j.run_hours(end=end) is not None for j in train)
    }
    wall = {
        end: sum(j.run_hours(end=end) for j in train)
        for end in ("low", "high")
        if all(j.run_hours(end=end) is not None for j in train)
    }
    out: dict[str, Any] = {
        "training_runs": len(train),
        "gpu_hours": round(gpu_hours.get("low", 0.0)),
        "wall_hours": round(wall.get("low", 0.0), 1),
        "kept_gib": round(sum(j.kept_gib or 0.0 for j in train)),
    }
    if "high" in wall:
        out["gpu_hours_range"] = [round(gpu_hours["low"]), round(gpu_hours["high"])]
        out["wall_hours_range"] = [round(wall["low"], 1), round(wall["high"], 1)]
    if train:
        out.update(dag_disk(train, config))
    return out


def hub_snapshot_gib(model: str, models: Mapping[str, str], *, dtype_bytes: int = 2) -> float:
    """GiB of a hub model's snapshot: its weights (Meta's Llama repositories ship them twice, the
    ``original/`` consolidated copy beside the safetensors)."""
    try:
        shape = load_shape(model, models.get(model))
    except ValueError:
        return 0.0
    copies = 2 if model.startswith("meta-llama/") else 1
    return copies * shape.params * dtype_bytes / GIB


def _dag_keepers(train: Sequence[Job], config: Any, models: Mapping[str, str]) -> dict[str, float]:
    """What every job of the DAG keeps once it ran (GiB): downloads, index, data, the trainings'
    exports and the checkpoints the retention rule leaves."""
    from spader.planning.costs import DATA_GIB

    keep = bool(config.training.keep_checkpoints)
    keepers: dict[str, float] = {}
    corpus = config.corpus
    if not (corpus.archive or corpus.prebuilt_index):
        keepers["corpus dump"] = DATA_GIB["corpus dump"]
    if not corpus.prebuilt_index:
        keepers["BM25 index"] = DATA_GIB["BM25 index"]
    keepers["data, evaluations, MLflow"] = DATA_GIB["data, evaluations, MLflow"]
    trained = {j.name.split()[1].split("/")[0] for j in train}
    for b in sorted(trained):
        keepers[f"model {config.backbones[b].model}"] = hub_snapshot_gib(config.backbones[b].model, models)
    if any(config.variants[j.name.split("/")[1]].serves_judge and not config.judge.url for j in train):
        keepers[f"model {config.judge.model}"] = hub_snapshot_gib(config.judge.model, models)
    reranker = config.retrieval.reranker.model
    if reranker:
        keepers[f"model {reranker}"] = hub_snapshot_gib(reranker, models, dtype_bytes=4)
    for j in train:
        export = j.disk.get("export (bf16)", 0.0)
        checkpoints = (j.kept_gib or 0.0) - export if keep else (j.final_checkpoint_gib or 0.0)
        what = "checkpoints kept" if keep else "final checkpoint"
        keepers[f"{j.name.removeprefix('train ')} ({what} and export)"] = checkpoints + export
    return keepers


def dag_disk(train: Sequence[Job], config: Any, models: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The disk the whole DAG needs (GiB): what every job keeps (:func:`_dag_keepers`), plus one
    training at its peak beside a finished training's checkpoints that its export has not yet
    deleted (``training.keep_checkpoints`` false); refused (one line, naming the total and the
    largest keepers) when it exceeds ``hardware.disk_gib``."""
    keepers = _dag_keepers(train, config, models or {})
    keep = bool(config.training.keep_checkpoints)
    kept = {j.name: j.kept_gib or 0.0 for j in train}
    final = {j.name: (kept[j.name] - j.disk.get("export (bf16)", 0.0)) if keep else (j.final_checkpoint_gib or 0.0)
             for j in train}  # fmt: skip
    # the running training's checkpoints at its peak, beyond the final one counted among the keepers
    running = max((j.disk_gib or 0.0) - j.disk.get("export (bf16)", 0.0) - final[j.name] for j in train)
    awaiting = 0.0 if keep else max(kept[n] - final[n] - j.disk.get("export (bf16)", 0.0)
                                    for n, j in ((j.name, j) for j in train))  # fmt: skip
    total = sum(keepers.values()) + running + awaiting
    capacity = float(config.hardware.disk_gib)
    largest = sorted(keepers.items(), key=lambda kv: -kv[1])[:3]
    refused = None
    if total > capacity:
        refused = (
            f"disk: the DAG needs {total:,.0f} GiB (what its jobs keep {sum(keepers.values()):,.0f}, largest: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in largest)
            + f"; a training at its peak {running:,.0f} and a finished one's checkpoints until its export "
            f"{awaiting:,.0f}), hardware.disk_gib is {capacity:g}"
        )
    return {
        "disk_gib": round(total, 1),
        "disk_capacity_gib": capacity,
        "disk_keepers": {k: round(v, 1) for k, v in sorted(keepers.items(), key=lambda kv: -kv[1])},
        "disk_running_gib": round(running, 1),
        "disk_awaiting_export_gib": round(awaiting, 1),
        "disk_refused": refused,
    }


HELP = "the GPU memory plan of a configuration: every GPU job's per-GPU peak (exit 1 when one does not fit)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``spader plan`` (``python -m spader.planning.plan``): ``--configfile``, ``--root``, ``--json``."""
    add_config_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def _refusals(jobs: Sequence[Job], totals: Mapping[str, Any]) -> list[str]:
    """Every reason the plan refuses (one line each, naming the job or the DAG)."""
    out = [f"{j.name}: {j.refusal}" for j in jobs if not j.fits]
    if totals.get("disk_refused"):
        out.append(f"the DAG: {totals['disk_refused']}")
    return out


def _summary_lines(jobs: Sequence[Job], totals: Mapping[str, Any], refusals: Sequence[str]) -> list[str]:
    """The text plan's closing lines: the DAG's runs, time and disk, the margins, the verdict."""
    out = []
    if totals["training_runs"]:
        hours = totals.get("wall_hours_range", [totals["wall_hours"]] * 2)
        gpu_hours = totals.get("gpu_hours_range", [totals["gpu_hours"]] * 2)
        out.append(
            f"training, {totals['training_runs']} runs: ~{gpu_hours[0]:,}-{gpu_hours[1]:,} GPU-hours, "
            f"~{hours[0]:,}-{hours[1]:,} hours one after another"
        )
        keepers = list(totals["disk_keepers"].items())[:3]
        out.append(
            f"disk of the DAG: {totals['disk_gib']:,.0f} of {totals['disk_capacity_gib']:g} GiB (hardware.disk_gib): "
            f"what its jobs keep, largest "
            + ", ".join(f"{k} {v:,.0f}" for k, v in keepers)
            + f"; a training at its peak {totals['disk_running_gib']:,.0f} more"
        )
    smallest = min((j.margin for j in jobs), default=None)
    if smallest is not None:
        gpu_bad = sum(1 for j in jobs if j.phases and j.peak > j.capacity)
        out.append(
            f"smallest GPU memory margin: {smallest:.1f} GiB ({gpu_bad} of {len(jobs)} job(s) over their GPUs' "
            "memory)"
        )
    fits = "the plan fits: every job" + (" and the DAG's disk" if "disk_gib" in totals else "")
    out.append("the plan refuses: " + "; ".join(refusals) if refusals else fits)
    return out


def run(args: argparse.Namespace, *, out: Callable[[str], Any] | None = None) -> int:
    """Print the plan of the configuration ``args`` names; exit 1 when a job or the DAG does not fit."""
    write = out or (lambda s: sys.stdout.write(s + "\n"))
    config = configured(args)
    root = repository(args)
    calibration = load_record(config, root)  # a bad record: one line (ValueError)
    jobs = plan_config(config, root / "config" / "verl", calibration=calibration)
    totals = dag_totals(jobs, config)
    refusals = _refusals(jobs, totals)
    hw = config.hardware
    if args.json:
        write(json.dumps({"jobs": [j.to_json() for j in jobs], "dag": totals, "fits": not refusals,
                          "refused": refusals or None}, indent=2))  # fmt: skip
        return 1 if refusals else 0
    write(
        f"Plan for nodes of {hw.gpus} x {hw.gpu} ({hw.gpu_memory_gib:g} GiB per GPU), {hw.cores} cores, "
        f"{hw.host_memory_gib:g} GiB host memory, {hw.disk_gib:g} GiB disk (hardware.*); time from "
        f"{hw.mfu:g} to {hw.mfu_low:g} MFU, trajectories {hw.length_share:g} to {hw.length_share_high:g} of the "
        f"maximum length ({hw.generated_share:g} generated), {hw.bandwidth_efficiency:g} of the memory bandwidth; "
        + (calibration.describe() if calibration else "no calibration record (estimates)")
        + ":"
    )
    for job in jobs:
        write("\n".join(job.lines()))
    if not jobs:
        write("no GPU jobs (training.device is cpu and evaluation.gpus is 0)")
    for line in _summary_lines(jobs, totals, refusals):
        write(line)
    return 1 if refusals else 0


def main(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] | None = None) -> int:
    """``python -m spader.planning.plan`` (an alias of ``spader plan``)."""
    return run_command(
        "python -m spader.planning.plan",
        add_arguments,
        lambda args: run(args, out=out),
        argv,
        description=HELP,
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main())
