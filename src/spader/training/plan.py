"""GPU memory plan: the per-GPU peak of every GPU job of the DAG, before any of them runs.

``python -m spader.training.plan [--configfile F ...]`` prints one entry per backbone x variant
(training), per backbone (evaluation), for R3-RAG's served judge and for StepSearch's evidence
job, each with its phases and their components in GiB, and exits 1 when a job's peak exceeds
``hardware.gpu_memory_gib``. Every training job runs the same plan on its own composed config in
its preflight (:func:`spader.training.preflight.check_memory`) and refuses to start when it does
not fit.

The plan is first order: parameter, gradient and optimizer bytes are exact for the shapes; the
activation, logits and runtime terms are estimates whose constants are stated below and measured
by ``scripts/gpu_memory_calibration.py`` on a GPU. docs/gpu.md explains each term and the
defaults it led to.

Where the numbers come from:

* the model's shape: ``config.json`` of the local model directory, or the copy of the real
  ``config.json`` shipped in ``spader/training/shapes/`` (no weights or hub access needed);
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
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """The plan of one GPU job: per phase, its components in GiB on its most loaded GPU."""

    name: str
    gpus: int
    capacity: float
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refused: str | None = None

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
    def fits(self) -> bool:
        return self.refused is None and self.peak <= self.capacity

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.name,
            "gpus": self.gpus,
            "capacity_gib": round(self.capacity, 2),
            "peak_gib": round(self.peak, 2),
            "peak_phase": self.peak_phase if self.phases else None,
            "margin_gib": round(self.margin, 2),
            "fits": self.fits,
            "refused": self.refused,
            "phases": {p: {k: round(v, 2) for k, v in c.items()} for p, c in self.phases.items()},
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """The job as text: a header, one line per phase with its components, the notes."""
        status = "fits" if self.fits else ("REFUSED" if self.refused else "DOES NOT FIT")
        head = (
            f"{self.name}: {self.gpus} GPU(s), peak {self.peak:.1f} of {self.capacity:.1f} GiB "
            f"({self.peak_phase if self.phases else '-'}), margin {self.margin:.1f} GiB: {status}"
        )
        out = [head]
        for phase, components in self.phases.items():
            parts = ", ".join(f"{k} {v:.1f}" for k, v in components.items() if round(v, 1) != 0)
            out.append(f"    {phase:<18} {self.total(phase):6.1f}  = {parts}")
        if self.refused:
            out.append(f"    refused: {self.refused}")
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
    weights = shape.params * (2 if reranker.get("fp16", True) else 4) / GIB
    tokens = reranker.get("max_batch_tokens") or int(reranker.get("batch_size", 64)) * int(
        reranker.get("max_length", 512)
    )
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
    shape: Shape, tokens: int, micro: int, seq: int, *, checkpointing: bool, padded: bool
) -> dict:
    """Activation terms of one training micro-batch (GiB): the layer inputs kept by activation
    checkpointing, one layer's working set in the backward pass, the sdpa attention mask."""
    c = CONSTANTS
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
    mask = micro * seq * seq / GIB if padded else 0.0
    return {
        "checkpoints" if checkpointing else "layer activations": kept,
        "layer backward": working,
        "mask": mask,
    }


def _logits(shape: Shape, tokens: int, m: VerlMemory, *, grad: bool, entropy: bool) -> float:
    """GiB of the log-prob computation over the vocabulary for ``tokens`` tokens."""
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


def training_job(
    name: str,
    shape: Shape,
    verl_cfg: Mapping[str, Any],
    *,
    gpus: int,
    capacity: float,
    reranker: float = 0.0,
) -> Job:
    """The plan of one training job on each of its ``gpus`` training GPUs (see docs/gpu.md).

    Args:
        name: the job's name in the output.
        shape: the backbone's shape.
        verl_cfg: the resolved verl config of the launch.
        gpus: GPUs verl trains on (the node's, less those of a served judge).
        capacity: GiB per GPU.
        reranker: GiB of the job's reranker replica on each training GPU (0: none there).
    """
    m = VerlMemory.from_verl(verl_cfg)
    job = Job(name=name, gpus=gpus, capacity=capacity)
    if gpus < 1:
        job.refused = "no GPU left for training"
        return job
    P, Pc = shape.params, shape.value_params
    per = GIB * gpus
    actor = {"params": P * m.param_bytes / per, "grads": P * 4 / per, "adam": P * 8 / per}
    critic = (
        {"params": Pc * m.param_bytes / per, "grads": Pc * 4 / per, "adam": Pc * 8 / per} if m.critic else {}
    )
    c = CONSTANTS
    verl_process = c["cuda_context"] + c["nccl"]
    sglang_process = c["cuda_context"] + (c["nccl"] if m.rollout_tp > 1 else 0.0)

    def resident(state: dict, param_off: bool, optim_off: bool, *, adam: bool = True) -> float:
        if not state:
            return 0.0
        return (0.0 if param_off else state["params"]) + (0.0 if optim_off or not adam else state["adam"])

    # sglang starts after verl built its models and before the first step (no Adam state yet)
    at_launch = resident(actor, m.actor_param_offload, True) + resident(critic, m.critic_param_offload, True)
    pre = capacity - verl_process - reranker - at_launch - sglang_process
    static, weights, kv = _sglang(shape, pre, m.rollout_fraction, m.rollout_tp)
    job.notes.append(
        f"sglang at launch: {pre:.1f} GiB free x {m.rollout_fraction} = {static:.1f} GiB static (weights "
        f"{weights:.1f}, KV {kv:.1f} = {_kv_tokens(shape, kv, m.rollout_tp):,} tokens per TP-{m.rollout_tp} replica)"
    )
    if kv <= 0:
        job.refused = (
            f"sglang's static share ({static:.1f} GiB) does not hold its weights ({weights:.1f} GiB)"
        )
    base = {"verl process": verl_process, "reranker": reranker}
    sglang_idle = (
        {"sglang idle": sglang_process + c["sglang_graphs"]}
        if m.free_cache_engine
        else {"sglang": sglang_process + static + c["sglang_graphs"]}
    )
    actor_resident = resident(actor, m.actor_param_offload, m.actor_optimizer_offload)
    critic_resident = resident(critic, m.critic_param_offload, m.critic_optimizer_offload)

    job.phases["rollout"] = {
        **base,
        "actor (resident)": actor_resident,
        **({"critic (resident)": critic_resident} if m.critic else {}),
        "sglang": sglang_process + static + c["sglang_graphs"] + c["sglang_activations"],
    }

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
    acts = _activations(shape, tokens, m.micro_batch, seq, checkpointing=m.grad_checkpointing, padded=padded)
    update = {
        "actor state": actor["params"] + actor["grads"] + actor["adam"],
        **({"critic (resident)": critic_resident} if m.critic else {}),
        **acts,
        "logits": _logits(shape, tokens, m, grad=True, entropy=m.entropy_in_loss),
        "gathered params": gathered_train,
    }
    update["allocator slack"] = c["allocator_slack"] * sum(update.values())
    job.phases["actor update"] = {**base, **sglang_idle, **update}
    job.phases["optimizer step"] = {
        **base,
        **sglang_idle,
        "actor state": update["actor state"],
        "adam temporaries": actor["params"] * 4 / m.param_bytes,
        **({"critic (resident)": critic_resident} if m.critic else {}),
    }
    lp_tokens = m.log_prob_micro_batch * seq
    layer_fwd = _activations(shape, lp_tokens, m.log_prob_micro_batch, seq, checkpointing=True, padded=padded)
    gathered_eval = (2 * (shape.head_params or shape.embedding_params) + 4 * shape.layer_params) / GIB
    forward = {
        "actor (resident)": resident(actor, False, m.actor_optimizer_offload),
        **({"critic (resident)": critic_resident} if m.critic else {}),
        "layer activations": layer_fwd["layer backward"] / c["layer_backward_factor"] + layer_fwd["mask"],
        "logits": _logits(shape, lp_tokens, m, grad=False, entropy=True),
        "gathered params": gathered_eval,
    }
    job.phases["log-probs"] = {**base, **sglang_idle, **forward}
    if m.critic:
        ctokens = m.critic_micro_batch * seq
        cacts = _activations(shape, ctokens, m.critic_micro_batch, seq, checkpointing=m.critic_grad_checkpointing,
                             padded=padded)  # fmt: skip
        cupdate = {
            "critic state": critic["params"] + critic["grads"] + critic["adam"],
            "actor (resident)": actor_resident,
            **cacts,
            "gathered params": (6 * shape.embedding_params / shape.layers + 10 * shape.layer_params) / GIB,
        }
        cupdate["allocator slack"] = c["allocator_slack"] * sum(cupdate.values())
        job.phases["critic update"] = {**base, **sglang_idle, **cupdate}
    if not m.fused:
        job.notes.append(
            "log-probs over the full logits: "
            f"{tokens * shape.vocab * 2 / GIB:.1f} GiB per (micro-batch x length x vocabulary) copy"
        )
    return job


def judge_job(name: str, shape: Shape, judge: Mapping[str, Any], *, capacity: float, reranker: float) -> Job:
    """R3-RAG's judge served by sglang on its GPUs of the training node (after the retrieval
    service, whose reranker replica may share them)."""
    job = Job(name=name, gpus=int(judge.get("gpus", 1)), capacity=capacity)
    tp = int(judge.get("tensor_parallel", 1))
    process = CONSTANTS["cuda_context"] + (CONSTANTS["nccl"] if tp > 1 else 0.0)
    pre = capacity - reranker - process
    static, weights, kv = _sglang(shape, pre, float(judge.get("mem_fraction", 0.85)), tp)
    job.phases["serving"] = {
        "reranker": reranker,
        "sglang": process + static + CONSTANTS["sglang_graphs"] + CONSTANTS["sglang_activations"],
    }
    job.notes.append(
        f"judge {shape.name}: {pre:.1f} GiB free at launch x {judge.get('mem_fraction', 0.85)} = {static:.1f} GiB "
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
    job = Job(name=name, gpus=int(evaluation.get("gpus", 1)), capacity=capacity)
    engine = evaluation.get("engine", "sglang")
    if engine == "sglang":
        tp = max(1, job.gpus)
        process = CONSTANTS["cuda_context"] + (CONSTANTS["nccl"] if tp > 1 else 0.0)
        pre = capacity - process
        static, weights, kv = _sglang(shape, pre, float(evaluation.get("gpu_memory_utilization", 0.7)), tp)
        job.phases["evaluation"] = {
            "sglang": process + static + CONSTANTS["sglang_graphs"] + CONSTANTS["sglang_activations"],
            "reranker": reranker,
        }
        job.notes.append(
            f"sglang: {pre:.1f} GiB free at launch x {evaluation.get('gpu_memory_utilization', 0.7)} = "
            f"{static:.1f} GiB static (weights {weights:.1f}, KV {kv:.1f} = {_kv_tokens(shape, kv, tp):,} tokens)"
        )
        if kv <= 0:
            job.refused = (
                f"sglang's static share ({static:.1f} GiB) does not hold its weights ({weights:.1f} GiB)"
            )
    else:  # the transformers engine: bf16 weights, a full KV cache per batch, the last logits
        batch, context = (
            int(evaluation.get("batch_size", 8)),
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
def _compose_resolved(
    verl_config: str, overrides: Sequence[str], config_dir: Path, cache: dict[str, dict]
) -> dict[str, Any]:
    """The resolved verl config. Variants whose YAML chains parse to the same documents and whose
    overrides differ only in the method's ``algorithm.*`` / ``reward.*`` values (which change no
    memory: the critic is switched by ``critic.enable`` in the YAMLs) share one composition, so the
    beta sweep and the ablations compose once."""
    import yaml

    from spader.config import verl_config_chain

    docs = []
    for path in verl_config_chain(verl_config, config_dir):
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        docs.append({k: v for k, v in doc.items() if k != "hydra"})
    key = hashlib.sha256(
        json.dumps(
            [docs, [o for o in overrides if not o.lstrip("+").startswith(("algorithm.", "reward."))]],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    if key not in cache:
        from omegaconf import OmegaConf

        from spader.integrations.verl.compose import compose

        cfg = compose(verl_config, [*overrides, "actor_rollout_ref.model.path=/plan"], config_dir=config_dir)
        cache[key] = OmegaConf.to_container(cfg, resolve=True)
    return cache[key]


def plan_config(
    config: Any, verl_config_dir: str | os.PathLike, *, models: Mapping[str, str] | None = None
) -> list[Job]:
    """Every GPU job of ``config`` (a :class:`spader.config.Config`).

    Args:
        config: the checked workflow config.
        verl_config_dir: the project's verl YAML directory.
        models: local model directories by hub id or backbone name, when at hand (their
            ``config.json`` is read instead of the shipped shape).
    """
    from spader.integrations.verl.overrides import config_overrides
    from spader.training.launch import device_overrides

    models = dict(models or {})
    capacity = float(config.hardware.gpu_memory_gib)
    retrieval = config.retrieval.model_dump(mode="json")
    training = config.training.model_dump(mode="json")
    agent = config.agent.model_dump(mode="json")
    judge = config.judge.model_dump(mode="json")
    evaluation = config.evaluation_params()  # the context budget resolved (training's when null)
    replica = reranker_gib(retrieval)
    cache: dict[str, dict] = {}
    jobs: list[Job] = []
    for b, spec in config.backbones.items():
        if training["device"] == "cuda" and spec.gpus > 0:
            shape = load_shape(spec.model, models.get(b) or models.get(spec.model))
            for v in spec.variants:
                nodes = config.training_nodes(v)  # variants.<v>.nodes, else training.nodes
                variant = config.variants[v].model_dump(mode="json")
                served = (
                    variant.get("reward") == "r3rag" and variant.get("judge") == "llm" and not judge["url"]
                )
                # verl shards over every training GPU of the job; a served judge takes GPUs of the
                # node (one node) or the last node (several)
                if served and nodes > 1:
                    gpus = (nodes - 1) * spec.gpus
                else:
                    gpus = nodes * spec.gpus - (int(judge["gpus"]) if served else 0)
                overrides = [
                    *config_overrides(variant, training, agent),
                    *device_overrides(training, threads=1, workers=gpus),
                ]
                cfg = _compose_resolved(variant["verl_config"], overrides, Path(verl_config_dir), cache)
                on_gpus = replica if reranker_on_gpus(retrieval) else 0.0
                jobs.append(
                    training_job(f"train {b}/{v}", shape, cfg, gpus=gpus, capacity=capacity, reranker=on_gpus)
                )
                if served:
                    judge_shape = load_shape(judge["model"], models.get(judge["model"]))
                    jobs.append(
                        judge_job(f"judge {b}/{v}", judge_shape, judge, capacity=capacity, reranker=on_gpus)
                    )
        if evaluation["gpus"] > 0:
            shape = load_shape(spec.model, models.get(b) or models.get(spec.model))
            jobs.append(
                evaluation_job(f"evaluate {b}/*", shape, evaluation, capacity=capacity, reranker=replica)
            )
    trains_stepsearch = any(
        config.variants[v].reward == "stepsearch" for s in config.backbones.values() for v in s.variants
    )
    if trains_stepsearch and config.stepsearch.evidence.gpus > 0:
        jobs.append(evidence_job("build_evidence", capacity=capacity, reranker=replica))
    return jobs


def main(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] | None = None) -> int:
    """``python -m spader.training.plan``: print the plan; exit 1 when a job does not fit."""
    parser = argparse.ArgumentParser(
        prog="python -m spader.training.plan", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--configfile",
        action="append",
        help="workflow config files, later ones overlaying earlier ones (default: config/config.yaml)",
    )
    parser.add_argument("--root", default=".", help="repository root (default: the current directory)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    write = out or (lambda s: sys.stdout.write(s + "\n"))
    from spader.config import load_config

    root = Path(args.root)
    verl_dir = root / "config" / "verl"
    config = load_config(
        *[root / c for c in (args.configfile or ["config/config.yaml"])], verl_config_dir=verl_dir
    )
    jobs = plan_config(config, verl_dir)
    bad = [j for j in jobs if not j.fits]
    if args.json:
        write(json.dumps({"jobs": [j.to_json() for j in jobs], "fits": not bad}, indent=2))
    else:
        write(f"GPU memory plan, {config.hardware.gpu_memory_gib:g} GiB per GPU (hardware.gpu_memory_gib):")
        for job in jobs:
            write("\n".join(job.lines()))
        if not jobs:
            write("no GPU jobs (training.device is cpu and evaluation.gpus is 0)")
        smallest = min((j.margin for j in jobs), default=None)
        if smallest is not None:
            write(f"smallest margin: {smallest:.1f} GiB; {len(bad)} of {len(jobs)} job(s) do not fit")
    return 1 if bad else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main())
