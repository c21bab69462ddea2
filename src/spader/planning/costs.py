"""Time, host memory and disk of a training job: the second half of the plan
(:mod:`spader.planning.plan` holds the GPU memory; docs/gpu.md states the model and its
assumptions).

**Time** (``step_minutes``, ``run_hours``) is first order, from counted work and a stated rate:

* the training passes count FLOPs: ``2 x`` matmul parameters per token of every pass (old
  log-probs, reference log-probs, the actor's update as forward + backward + the forward that
  activation checkpointing recomputes, the same for the critic), on the tokens the path computes:
  the padded path pads every micro-batch to its longest sequence and runs sdpa with an explicit
  mask, which computes the whole (length x length) square; the packed path computes the real
  tokens and half the square (a causal variable-length kernel). They run at ``hardware.mfu`` of the
  GPUs' peak dense bf16 FLOP/s (:data:`GPUS`);
* the rollouts' decoding is bound by memory bandwidth: every decoding step of a replica reads its
  weights once and the KV cache of its running sequences, at ``hardware.bandwidth_efficiency`` of
  the GPU's bandwidth; as many steps as the longest trajectory generates tokens, or more when the
  KV pool does not hold every sequence of the replica at once; the prompt and tool observations
  are prefilled (compute-bound, at ``hardware.mfu``); each turn of the longest trajectory waits
  for its search (:data:`TIME_CONSTANTS`);
* R3-RAG's served judge decodes its verdicts after the rollouts, ``judge.concurrency`` at a time;
* offloaded states and the reference model's pinned parameters cross the host link every step;
* trajectory lengths: uniform with mean ``hardware.length_share`` of the maximum, the maximum as
  upper end; ``hardware.generated_share`` of their tokens are generated.

**Host memory** (``host_gib``, per node) follows verl 0.9.1's code: the reference model is FSDP2
with ``CPUOffloadPolicy(pin_memory=True)`` (``FSDPEngine._build_fsdp_module`` for a forward-only
engine), its shards pinned in host memory in its ``model_dtype``; sglang runs with
``enable_weights_cpu_backup`` in verl's hybrid mode (``SGLangHttpServer``), so every tensor-
parallel rank keeps a pinned copy of its bf16 weights while verl trains (torch_memory_saver's
backup); offloaded parameters and optimizer states wait in host memory; every process has its own
footprint (:data:`HOST_CONSTANTS`). Model loading adds a transient: the rank that loads the
weights holds the whole model on the CPU (every rank for a tied model).

**Disk** (``disk_gib``): verl's checkpoint manager saves a step's shards before it deletes the
oldest (``ensure_checkpoint_capacity`` keeps ``max_ckpt_to_keep - 1`` before a save; with 1 it keeps
the old one until the new one is written), and it only deletes what its own process saved: the
checkpoints an earlier attempt left (``spader.training.checkpoints.prune_checkpoints`` keeps that
attempt's ``max_actor_ckpt_to_keep``) stay until the next attempt starts. An actor checkpoint is
its ``model_dtype`` shards and Adam's two fp32 moments; the export is the bf16 model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DATA_GIB",
    "GPUS",
    "HOST_CONSTANTS",
    "RERANK_PAIRS_PER_S",
    "SEARCH_RANGE",
    "TIME_CONSTANTS",
    "Cadence",
    "GpuSpec",
    "Lengths",
    "RunSettings",
    "Search",
    "TimeInputs",
    "Workload",
    "disk_terms",
    "host_terms",
    "save_cadence",
    "search_seconds",
    "step_time",
]

GIB = float(1 << 30)


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense bf16 tensor FLOP/s, memory bandwidth and host link of one GPU (SXM form factor)."""

    tflops: float
    memory_gbps: float
    host_link_gbps: float
    source: str

    @property
    def rerank_pairs_per_s(self) -> float:
        """Pairs one reranker replica scores per second on this GPU: :data:`RERANK_PAIRS_PER_S`
        measured on an H200, scaled by the dense bf16 peak (the cross-encoder is compute-bound;
        bench/retrieval.py's projection does the same for the A100)."""
        return RERANK_PAIRS_PER_S * self.tflops / RERANK_MEASURED_TFLOPS


#: GPUs the time model knows (``hardware.gpu``). Dense bf16 (NVIDIA quotes H100/H200 with
#: sparsity: half of it here); host link: PCIe per direction (gen4 x16: 32 GB/s, gen5 x16: 64 GB/s).
GPUS = {
    "A100-40GB": GpuSpec(
        312.0, 1555.0, 32.0, "NVIDIA A100 datasheet (SXM4): BF16 312 TFLOPS, 1,555 GB/s, PCIe gen4"
    ),
    "A100-80GB": GpuSpec(
        312.0, 2039.0, 32.0, "NVIDIA A100 datasheet (SXM4 80GB): BF16 312 TFLOPS, 2,039 GB/s, PCIe gen4"
    ),
    "H100-80GB": GpuSpec(
        989.5,
        3350.0,
        64.0,
        "NVIDIA H100 datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 3.35 TB/s, PCIe gen5",
    ),
    "H200": GpuSpec(
        989.5,
        4800.0,
        64.0,
        "NVIDIA H200 datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 4.8 TB/s, PCIe gen5",
    ),
}

#: Pairs per second of one bge-reranker-v2-m3 replica on one H200 (fp16/bf16, pairs of mean 160
#: tokens, batches of 512): bench/reranker_gpu.py, 2026-11-30 (docs/benchmarks.md), and the dense
#: bf16 peak of the GPU it was measured on; other GPUs scale with their peak (:class:`GpuSpec`).
RERANK_PAIRS_PER_S = 4576.0
RERANK_MEASURED_TFLOPS = 989.5

#: The search load of a training step, low and high end, from the rollout-shaped query stream of
#: bench/retrieval.py (2026-12-01: 2-3 searching turns per trajectory, 2-3 queries per call, 0-60%
#: repeated queries, which the service's cache answers without reranking): searching turns per
#: trajectory, queries per call, the share of distinct queries.
SEARCH_RANGE = {
    "searching_turns": (2.0, 3.0),
    "queries_per_call": (2.0, 3.0),
    "distinct_share": (0.5, 1.0),
}

#: Stated constants of the time model.
TIME_CONSTANTS = {
    # seconds each turn of a step's longest trajectory waits between its generations beyond the
    # reranking (:func:`search_seconds`): BM25 of its queries, the HTTP round trip, the agent
    # loop's bookkeeping
    "turn_wait_s": 0.5,
    # fixed seconds per step: the weight sync from the actor to sglang, sglang's sleep and wake,
    # the optimizer step (memory-bound, tens of ms for an 8B model), rewards and advantages
    "step_overhead_s": 10.0,
    # R3-RAG's judge: tokens of one request (template, question, reasoning, queries, 512 characters
    # of observation) and of its reply (the verdict and a short evaluation)
    "judge_prompt_tokens": 400,
    "judge_reply_tokens": 200,
    # checkpoints are written at this rate (GB/s, all ranks of the job together)
    "checkpoint_write_gbps": 2.0,
    # one start of the job: Ray, model loading and sharding, sglang's start and CUDA graphs
    "startup_minutes": 10.0,
}

#: What the DAG keeps besides its trainings and models (GiB): the corpus dump (docs/data.md: about
#: 6.4 GB compressed), its BM25 index with the raw passages stored (docs/running.md: ~25 GB), the
#: datasets, evaluations and the MLflow store (under 1 GB each).
DATA_GIB = {"corpus dump": 6.4e9 / GIB, "BM25 index": 25e9 / GIB, "data, evaluations, MLflow": 3.0}

#: Stated constants of the host memory model (GiB).
HOST_CONSTANTS = {
    # resident memory of a process that drives a GPU (CUDA runtime and kernels, torch, NCCL,
    # pinned staging buffers): verl's workers, sglang's schedulers, the retrieval service
    "gpu_process": 3.0,
    # a Python process without a GPU: data loader, agent loop and reward workers, sglang's
    # tokenizer and detokenizer, Ray's GCS, raylet and dashboard, the trainer, the service's main
    "cpu_process": 0.5,
    # the retrieval service's JVM heap (spader.retrieval.jvm's default -Xmx for search)
    "jvm_heap": 4.0,
    # bytes per token of a step's batch held by the trainer (ids, masks, positions, log-probs,
    # values, advantages, returns, rewards)
    "batch_bytes_per_token": 64.0,
    # share beyond the plan's host memory a job asks a scheduler for (the plan is first order)
    "request_headroom": 0.25,
}


# ---------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lengths:
    """Trajectory lengths uniform on ``[low, high]`` with mean ``share x maximum`` and ``high`` the
    maximum (``low = (2 share - 1) maximum``); below a share of one half, ``[0, 2 share maximum]``."""

    low: float
    high: float

    @classmethod
    def from_share(cls, maximum: int, share: float) -> Lengths:
        if share >= 0.5:
            return cls((2 * share - 1) * maximum, float(maximum))
        return cls(0.0, 2 * share * maximum)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def mean_square(self) -> float:
        a, b = self.low, self.high
        return (a * a + a * b + b * b) / 3

    def max_mean(self, k: int) -> float:
        """Expected longest of ``k`` lengths (a micro-batch padded to its longest)."""
        return self.low + (self.high - self.low) * k / (k + 1)

    def max_mean_square(self, k: int) -> float:
        """Expected square of the longest of ``k`` lengths."""
        a, w = self.low, self.high - self.low
        return a * a + 2 * a * w * k / (k + 1) + w * w * k / (k + 2)


# ---------------------------------------------------------------------------------------------
# What the time, host and disk models read of a job
# ---------------------------------------------------------------------------------------------
def _get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


@dataclass(frozen=True)
class RunSettings:
    """Settings of a resolved verl config the time, host and disk models read."""

    ppo_epochs: int = 1
    critic_ppo_epochs: int = 1
    reference: bool = True
    reference_param_bytes: int = 4
    dataloader_workers: int = 8
    agent_workers: int = 8
    reward_workers: int = 8
    save_freq: int = 100
    test_freq: int = 50
    val_before_train: bool = True
    val_rollouts: int = 1
    actor_keep: int | None = 2
    critic_keep: int | None = 2
    saves_optimizer: bool = True
    critic_saves_optimizer: bool = True

    @classmethod
    def from_verl(cls, cfg: Mapping[str, Any]) -> RunSettings:
        actor = _get(cfg, "actor_rollout_ref.actor", {})
        ref_dtype = str(_get(cfg, "actor_rollout_ref.ref.fsdp_config.model_dtype", "bf16"))
        return cls(
            ppo_epochs=int(_get(actor, "ppo_epochs", 1)),
            critic_ppo_epochs=int(_get(cfg, "critic.ppo_epochs", 1)),
            # verl builds the reference policy for a KL loss or a KL penalty in the reward
            reference=bool(_get(actor, "use_kl_loss", False))
            or bool(_get(cfg, "algorithm.use_kl_in_reward", False)),
            reference_param_bytes=_DTYPE_BYTES.get(ref_dtype, 2),
            dataloader_workers=int(_get(cfg, "data.dataloader_num_workers", 0)),
            agent_workers=int(_get(cfg, "actor_rollout_ref.rollout.agent.num_workers", 1)),
            reward_workers=int(_get(cfg, "reward.num_workers", 0)),
            save_freq=int(_get(cfg, "trainer.save_freq", -1)),
            test_freq=int(_get(cfg, "trainer.test_freq", -1)),
            val_before_train=bool(_get(cfg, "trainer.val_before_train", True)),
            val_rollouts=int(_get(cfg, "actor_rollout_ref.rollout.val_kwargs.n", 1)),
            actor_keep=_get(cfg, "trainer.max_actor_ckpt_to_keep"),
            critic_keep=_get(cfg, "trainer.max_critic_ckpt_to_keep"),
            saves_optimizer="optimizer" in (_get(actor, "checkpoint.save_contents", ["optimizer"]) or []),
            critic_saves_optimizer="optimizer"
            in (_get(cfg, "critic.checkpoint.save_contents", ["optimizer"]) or []),
        )


@dataclass(frozen=True)
class Workload:
    """A job's run: its steps and prompts, and the node it runs on."""

    steps: int
    prompts: int  # per step
    rollouts: int  # per prompt
    val_prompts: int
    max_turns: int
    nodes: int = 1  # nodes verl trains on

    @property
    def trajectories(self) -> int:
        return self.prompts * self.rollouts


def _every(steps: int, freq: int) -> int:
    """Steps of a run of ``steps`` at which verl acts every ``freq`` steps (and at the last one)."""
    if freq is None or freq <= 0 or steps <= 0:
        return 0
    return steps // freq + (1 if steps % freq else 0)


# ---------------------------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------------------------
def _forward_flops(
    matmul_params: int, shape, tokens: float, attention_square: float, *, causal: bool
) -> float:
    """FLOPs of one forward pass over ``tokens`` tokens whose sequences' squared lengths sum to
    ``attention_square``: 2 per matmul parameter and token, 4 x length^2 x query width per layer
    for the scores and their product with the values (half of it for a causal kernel)."""
    attention = 4.0 * attention_square * shape.q_dim * shape.layers * (0.5 if causal else 1.0)
    return 2.0 * matmul_params * tokens + attention


def _pass_tokens(lengths: Lengths, trajectories: int, micro: int, *, padded: bool) -> tuple[float, float]:
    """(tokens, sum of squared lengths) one pass over the step's trajectories computes."""
    if padded:
        return trajectories * lengths.max_mean(micro), trajectories * lengths.max_mean_square(micro)
    return trajectories * lengths.mean, trajectories * lengths.mean_square


@dataclass(frozen=True)
class TimeInputs:
    """The assumptions of one end of the time model's range (``low``: the faster end, at
    ``hardware.mfu`` and ``hardware.length_share``; ``high``: at ``hardware.mfu_low`` and
    ``hardware.length_share_high`` (each no better than the low end's), with the search load's high
    end and the KV pool's retracted sequences prefilled again)."""

    end: str
    mfu: float
    length_share: float
    searching_turns: float
    queries_per_call: float
    distinct_share: float
    retraction: bool

    @classmethod
    def of(cls, hardware, end: str = "low") -> TimeInputs:
        i = 0 if end == "low" else 1
        return cls(
            end=end,
            mfu=float(hardware.mfu if end == "low" else min(hardware.mfu, hardware.mfu_low)),
            length_share=float(
                hardware.length_share
                if end == "low"
                else max(hardware.length_share, hardware.length_share_high)
            ),
            searching_turns=SEARCH_RANGE["searching_turns"][i],
            queries_per_call=SEARCH_RANGE["queries_per_call"][i],
            distinct_share=SEARCH_RANGE["distinct_share"][i],
            retraction=end == "high",
        )


@dataclass(frozen=True)
class Search:
    """The retrieval service a job's rollouts search: reranker replicas on the job's GPUs (0: none
    there, the reranking is not modelled) and the BM25 candidates each query's reranking scores."""

    replicas: int
    pairs_per_query: int


def search_seconds(search: Search | None, inputs: TimeInputs, *, trajectories: float, spec: GpuSpec) -> float:
    """Seconds of reranking one turn round of ``trajectories`` costs (every trajectory searching
    once, ``queries_per_call`` queries, ``distinct_share`` of them not answered by the cache)."""
    if search is None or search.replicas <= 0:
        return 0.0
    pairs = trajectories * inputs.queries_per_call * inputs.distinct_share * search.pairs_per_query
    return pairs / (spec.rerank_pairs_per_s * search.replicas)


def kv_demand(trajectories: int, replicas: int, lengths: Lengths) -> float:
    """Tokens a replica's KV pool must hold to run all its sequences at once to their mean length."""
    return trajectories / max(1, replicas) * lengths.mean


def rollout_seconds(
    shape, *, trajectories: int, replicas: int, tp: int, kv_tokens: int, lengths: Lengths, spec: GpuSpec,
    hardware, max_turns: int, inputs: TimeInputs | None = None, search: Search | None = None,
) -> dict[str, float]:  # fmt: skip
    """Seconds of one rollout phase: decoding (memory-bound), prefill (compute-bound, sequences
    the KV pool retracted prefilled again at the high end), the turns' search waits."""
    inputs = inputs or TimeInputs.of(hardware)
    generated = float(hardware.generated_share)
    per_replica = trajectories / max(1, replicas)
    mean_generated = generated * lengths.mean
    # sequences a replica runs at once: all of them, or as many as its KV pool holds at full length
    concurrency = max(1.0, min(per_replica, kv_tokens / max(1.0, lengths.mean)))
    steps = max(generated * lengths.high, per_replica * mean_generated / concurrency)
    matmul = shape.layers * shape.layer_params + shape.vocab * shape.hidden
    weights_per_gpu = 2.0 * matmul / tp
    kv_per_gpu = shape.kv_bytes_per_token() / min(tp, shape.kv_heads)
    # every generated token reads the KV of its context, on average half the trajectory's length
    kv_read = per_replica * generated * lengths.mean_square / 2 * kv_per_gpu
    bandwidth = spec.memory_gbps * 1e9 * float(hardware.bandwidth_efficiency)
    decode = (steps * weights_per_gpu + kv_read) / bandwidth
    prefilled = (1 - generated) * per_replica
    per_sequence = 2.0 * matmul * lengths.mean + 2.0 * lengths.mean_square * shape.q_dim * shape.layers
    compute = tp * spec.tflops * 1e12 * inputs.mfu
    out = {"decode": decode, "prefill": prefilled * per_sequence / compute}
    demand = kv_demand(trajectories, replicas, lengths)
    if inputs.retraction and demand > kv_tokens > 0:
        # sglang retracts running sequences when its pool is full and prefills them again later: the
        # share of the demand beyond the pool, at half its length on average when retracted
        out["retracted prefill"] = (1 - kv_tokens / demand) * per_replica * per_sequence / 2 / compute
    rerank = search_seconds(search, inputs, trajectories=trajectories, spec=spec)
    out["search waits"] = inputs.searching_turns * rerank + max_turns * TIME_CONSTANTS["turn_wait_s"]
    return out


def judge_seconds(
    judge_shape,
    judge: Mapping[str, Any],
    *,
    requests: float,
    spec: GpuSpec,
    hardware,
    mfu: float | None = None,
) -> float:
    """Seconds the served judge takes to score ``requests`` turns, ``judge.concurrency`` at a time."""
    tp = int(judge["tensor_parallel"])
    replicas = max(1, int(judge["gpus"]) // tp)
    per_replica = requests / replicas
    running = max(1.0, min(per_replica, int(judge["concurrency"]) / replicas))
    reply, prompt = TIME_CONSTANTS["judge_reply_tokens"], TIME_CONSTANTS["judge_prompt_tokens"]
    steps = per_replica * reply / running
    matmul = judge_shape.layers * judge_shape.layer_params + judge_shape.vocab * judge_shape.hidden
    kv_per_gpu = judge_shape.kv_bytes_per_token() / min(tp, judge_shape.kv_heads)
    read = steps * 2.0 * matmul / tp + per_replica * reply * (prompt + reply / 2) * kv_per_gpu
    decode = read / (spec.memory_gbps * 1e9 * float(hardware.bandwidth_efficiency))
    mfu = float(hardware.mfu) if mfu is None else mfu
    prefill = per_replica * prompt * 2.0 * matmul / (tp * spec.tflops * 1e12 * mfu)
    return decode + prefill


def _pass_seconds(shape, memory, run: RunSettings, lengths: Lengths, n: int, compute: float, *,
                  padded: bool) -> dict[str, float]:  # fmt: skip
    """Seconds of a step's forward and backward passes over its ``n`` trajectories: the log-probs,
    the actor update and the critic's, at ``compute`` FLOP/s."""
    matmul = shape.layers * shape.layer_params + shape.vocab * shape.hidden
    value_matmul = shape.layers * shape.layer_params + shape.hidden
    causal = not padded

    def forward(params: int, micro: int) -> float:
        tokens, square = _pass_tokens(lengths, n, micro, padded=padded)
        return _forward_flops(params, shape, tokens, square, causal=causal)

    recompute = 1 if memory.grad_checkpointing else 0
    out: dict[str, float] = {}
    out["old log-probs"] = forward(matmul, memory.log_prob_micro_batch) / compute
    if run.reference:
        out["reference log-probs"] = forward(matmul, memory.ref_micro_batch) / compute
    update = (3 + recompute) * forward(matmul, memory.micro_batch)
    if memory.fused:  # the fused kernel recomputes each chunk's logits in the backward pass
        update += (
            2.0 * shape.vocab * shape.hidden * _pass_tokens(lengths, n, memory.micro_batch, padded=padded)[0]
        )
    out["actor update"] = run.ppo_epochs * update / compute
    if memory.critic:
        critic_recompute = 1 if memory.critic_grad_checkpointing else 0
        out["critic values"] = forward(value_matmul, memory.critic_micro_batch) / compute
        out["critic update"] = (
            run.critic_ppo_epochs
            * (3 + critic_recompute)
            * forward(value_matmul, memory.critic_micro_batch)
            / compute
        )
    return out


def _host_bytes(shape, memory, run: RunSettings, *, gpus: int, n: int) -> float:
    """Bytes a GPU moves over its host link in a step: offloaded states in and out, the reference's
    pinned shards streamed per micro-batch."""
    per_gpu = shape.params / gpus
    moved = 0.0
    if memory.actor_param_offload:  # loaded for the log-probs, the update and the weight sync
        moved += 3 * 2 * memory.param_bytes * per_gpu
    if memory.actor_optimizer_offload:
        moved += 2 * 8 * per_gpu
    if memory.critic:
        cper = shape.value_params / gpus
        if memory.critic_param_offload:
            moved += 2 * 2 * memory.param_bytes * cper
        if memory.critic_optimizer_offload:
            moved += 2 * 8 * cper
    if run.reference:
        micro_batches = math.ceil(n / gpus / max(1, memory.ref_micro_batch))
        moved += micro_batches * run.reference_param_bytes * per_gpu
    return moved


def step_time(
    shape,
    memory,
    run: RunSettings,
    work: Workload,
    hardware,
    *,
    gpus: int,
    kv_tokens: int,
    padded: bool,
    judge_shape=None,
    judge: Mapping[str, Any] | None = None,
    inputs: TimeInputs | None = None,
    search: Search | None = None,
) -> dict[str, float]:
    """Seconds of one training step by phase (see the module docstring).

    Args:
        shape: the backbone's :class:`spader.planning.plan.Shape`.
        memory: the job's :class:`spader.planning.plan.VerlMemory` (micro-batches, offloads, tensor
            parallelism, the critic, fused log-probs).
        run: :class:`RunSettings` of the job.
        work: the job's :class:`Workload`.
        hardware: the config's ``hardware`` section.
        gpus: GPUs verl trains and rolls out on.
        kv_tokens: tokens one sglang replica's KV pool holds (the memory plan's).
        padded: the padded path (else the packed one).
        judge_shape, judge: R3-RAG's served judge (shape and ``judge`` section), or None.
        inputs: the end of the range (default: the low end, :meth:`TimeInputs.of`).
        search: the retrieval service's reranker on the job's GPUs (None: BM25 and bookkeeping only).
    """
    inputs = inputs or TimeInputs.of(hardware)
    spec = GPUS[hardware.gpu]
    lengths = Lengths.from_share(memory.seq_len, inputs.length_share)
    n = work.trajectories
    compute = gpus * spec.tflops * 1e12 * inputs.mfu
    out: dict[str, float] = {}
    rollout = rollout_seconds(
        shape, trajectories=n, replicas=gpus // max(1, memory.rollout_tp), tp=memory.rollout_tp,
        kv_tokens=kv_tokens, lengths=lengths, spec=spec, hardware=hardware, max_turns=work.max_turns,
        inputs=inputs, search=search,
    )  # fmt: skip
    out["rollout"] = sum(rollout.values())
    if judge_shape is not None and judge is not None:
        turns = max(1.0, inputs.length_share * work.max_turns)
        out["judge"] = judge_seconds(
            judge_shape, judge, requests=n * turns, spec=spec, hardware=hardware, mfu=inputs.mfu
        )
    out.update(_pass_seconds(shape, memory, run, lengths, n, compute, padded=padded))
    # host link: offloaded states in and out, the reference's pinned shards streamed per micro-batch
    moved = _host_bytes(shape, memory, run, gpus=gpus, n=n)
    out["host transfers"] = moved / (spec.host_link_gbps * 1e9 * float(hardware.bandwidth_efficiency))
    out["overhead"] = TIME_CONSTANTS["step_overhead_s"]
    return out


def run_hours(step_seconds: float, validation_seconds: float, work: Workload, run: RunSettings,
              checkpoint_bytes: float, *, save_every: int | None = None) -> dict[str, float]:  # fmt: skip
    """Hours of a whole run by part: the steps, the validations, the checkpoint saves (every
    ``save_every`` steps, default ``run.save_freq``), one start."""
    validations = _every(work.steps, run.test_freq) + (1 if run.val_before_train else 0)
    saves = _every(work.steps, save_every or run.save_freq)
    return {
        "steps": work.steps * step_seconds / 3600,
        "validation": validations * validation_seconds / 3600,
        "checkpoints": saves * checkpoint_bytes / (TIME_CONSTANTS["checkpoint_write_gbps"] * 1e9) / 3600,
        "start": TIME_CONSTANTS["startup_minutes"] / 60,
    }


@dataclass(frozen=True)
class Cadence:
    """How often a training saves and what an end of its allocation can cost (:func:`save_cadence`)."""

    save_every_steps: int
    max_work_lost_minutes: float
    #: the time left at which the job stops itself at its next step boundary (minutes): the
    #: warning window, or longer when a step and its save do not fit in it
    stop_before_minutes: float
    step_minutes: float
    save_minutes: float
    covered: bool
    refused: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "save_every_steps": self.save_every_steps,
            "max_work_lost_minutes": round(self.max_work_lost_minutes, 1),
            "stop_before_minutes": round(self.stop_before_minutes, 1),
            "step_minutes_high": round(self.step_minutes, 2),
            "save_minutes": round(self.save_minutes, 2),
            "warning_covers_step_and_save": self.covered,
        }


def save_cadence(*, step_minutes: float, save_minutes: float, warning_s: float, allocation_minutes: float,
                 bound_minutes: float, save_freq: int) -> Cadence:  # fmt: skip
    """The save cadence of a GPU training from its step time (the high end of its range) and its
    allocation (docs/cluster.md, "Time limits").

    The job stops at its first step boundary once its allocation has ``warning_s`` or less left and
    saves that step. When the step in flight and its save fit in that window, a time limit loses no
    trained step; the cadence then bounds what an end without that save loses (a lost node, a
    warning that never came): every N steps with N x step + save within ``bound_minutes``, at most
    ``save_freq``. When they do not fit, the job saves every step and stops earlier (with a step
    and its save, and 10% more, left), so a time limit costs at most one step. Refused: a run whose
    one step and its save exceed ``bound_minutes``, and an allocation that holds no step.
    """
    window = warning_s / 60
    covered = step_minutes + save_minutes <= window
    if covered:
        every = max(1, min(int(save_freq), math.floor((bound_minutes - save_minutes) / step_minutes)))
        stop_before = window
    else:
        every, stop_before = 1, 1.1 * (step_minutes + save_minutes)
    lost = every * step_minutes + save_minutes
    reasons = []
    if lost > bound_minutes:
        reasons.append(
            f"a step takes up to {step_minutes:.1f} min and its save {save_minutes:.1f} min: a lost allocation "
            f"costs up to {lost:.1f} min, over training.max_work_lost_minutes ({bound_minutes:g})"
        )
    start = TIME_CONSTANTS["startup_minutes"]
    if start + stop_before >= allocation_minutes:
        reasons.append(
            f"an allocation of {allocation_minutes:.0f} min (training.time_limit.hours) holds no step: the start "
            f"takes {start:.0f} min and the job stops {stop_before:.1f} min before its limit (a step of "
            f"{step_minutes:.1f} min and its save, or training.time_limit.warning_s)"
        )
    refused = "; ".join(reasons) or None
    return Cadence(every, lost, stop_before, step_minutes, save_minutes, covered, refused)


def save_minutes(checkpoint_bytes: float) -> float:
    """Minutes one checkpoint takes to write (``checkpoint_write_gbps``)."""
    return checkpoint_bytes / (TIME_CONSTANTS["checkpoint_write_gbps"] * 1e9) / 60


# ---------------------------------------------------------------------------------------------
# Host memory
# ---------------------------------------------------------------------------------------------
def host_terms(
    shape, memory, run: RunSettings, work: Workload, *, gpus: int, reranker_on_gpus: bool,
    cache_bytes: int, judge_gpus_on_node: int = 0,
) -> tuple[dict[str, float], dict[str, float]]:  # fmt: skip
    """(steady terms, model-loading terms) of the most loaded node, in GiB.

    Args:
        gpus: GPUs verl uses in all (every node holds ``gpus / work.nodes`` of them).
        reranker_on_gpus: the retrieval service has a reranker replica per GPU of the node.
        cache_bytes: the retrieval service's result cache cap.
        judge_gpus_on_node: GPUs of a served judge on this node (its sglang processes).
    """
    h = HOST_CONSTANTS
    nodes = max(1, work.nodes)
    on_node = gpus / nodes  # verl's GPUs of one node
    share = 1.0 / nodes  # FSDP shards over every GPU of the job: a node holds its share
    steady: dict[str, float] = {}
    if run.reference:
        steady["reference model (pinned)"] = shape.params * run.reference_param_bytes * share / GIB
    if memory.free_cache_engine:
        # each tensor-parallel rank backs up its 1/tp of the bf16 weights: 2 bytes per parameter
        # for every replica of the node
        steady["sglang weight copies (pinned)"] = on_node / memory.rollout_tp * shape.params * 2 / GIB
    if memory.actor_param_offload:
        steady["actor parameters (offloaded)"] = shape.params * memory.param_bytes * share / GIB
    if memory.actor_optimizer_offload:
        steady["actor optimizer (offloaded)"] = shape.params * 8 * share / GIB
    if memory.critic and memory.critic_param_offload:
        steady["critic parameters (offloaded)"] = shape.value_params * memory.param_bytes * share / GIB
    if memory.critic and memory.critic_optimizer_offload:
        steady["critic optimizer (offloaded)"] = shape.value_params * 8 * share / GIB
    # verl's worker and sglang's scheduler per GPU, the retrieval service (one process, its
    # reranker replicas on the node's GPUs), the judge's sglang schedulers
    gpu_processes = 2 * on_node + (1 if reranker_on_gpus else 0) + judge_gpus_on_node
    steady["GPU processes"] = gpu_processes * h["gpu_process"]
    # all on the first node (the trainer's): data loader, agent loop and reward workers, sglang's
    # tokenizer and detokenizer per replica, Ray's GCS, raylet and dashboard, the trainer, the
    # retrieval service's main process
    replicas = on_node / memory.rollout_tp
    cpu_processes = run.dataloader_workers + run.agent_workers + run.reward_workers + 2 * replicas + 3 + 1 + 1
    steady["CPU processes"] = cpu_processes * h["cpu_process"]
    steady["retrieval service (JVM heap, cache)"] = h["jvm_heap"] + cache_bytes / GIB
    steady["step batch"] = 2 * work.trajectories * memory.seq_len * h["batch_bytes_per_token"] / GIB
    # loading: one rank of the mesh reads the model on the CPU in its dtype (every rank for a tied
    # model, verl's get_init_weight_context_manager), before sglang's copies or offloaded states exist
    loaders = on_node if shape.tied else 1
    loading = {
        "model loading (one copy per loading rank)": loaders * shape.params * memory.param_bytes / GIB,
        **{k: v for k, v in steady.items() if k in ("reference model (pinned)", "GPU processes", "CPU processes",
                                                     "retrieval service (JVM heap, cache)")},
    }  # fmt: skip
    return steady, loading


# ---------------------------------------------------------------------------------------------
# Disk
# ---------------------------------------------------------------------------------------------
def _coexisting(keep: int | None, saves: int, *, earlier: int | None) -> int:
    """Checkpoints on disk at the peak of an attempt: those an earlier attempt left (``earlier``
    kept, or every save when None) plus this attempt's own peak (``keep``, or 2 with one kept: the
    new one is written before the old one goes), never more than the run saves."""
    if saves <= 0:
        return 0
    if keep is None:
        return saves
    left = saves if earlier is None else min(earlier, keep)
    return min(saves, left + max(int(keep), 2))


def disk_terms(shape, memory, run: RunSettings, work: Workload) -> dict[str, float]:
    """GiB of a training job at its peak: checkpoints coexisting during an attempt, and the export."""
    saves = _every(work.steps, run.save_freq)
    actor_bytes = shape.params * (memory.param_bytes + (8 if run.saves_optimizer else 0))
    out = {}
    copies = _coexisting(run.actor_keep, saves, earlier=run.actor_keep)
    out[f"actor checkpoints ({copies} x {actor_bytes / GIB:.1f})"] = copies * actor_bytes / GIB
    if memory.critic:
        critic_bytes = shape.value_params * (memory.param_bytes + (8 if run.critic_saves_optimizer else 0))
        copies = _coexisting(run.critic_keep, saves, earlier=run.actor_keep)
        out[f"critic checkpoints ({copies} x {critic_bytes / GIB:.1f})"] = copies * critic_bytes / GIB
    out["export (bf16)"] = shape.params * 2 / GIB
    return out


def kept_after(shape, memory, run: RunSettings, work: Workload) -> float:
    """GiB a finished job leaves in results/: the checkpoints kept and the export."""
    saves = _every(work.steps, run.save_freq)
    actor = (
        min(saves, run.actor_keep or saves) * shape.params * (memory.param_bytes + 8 * run.saves_optimizer)
    )
    critic = 0.0
    if memory.critic:
        critic = (
            min(saves, run.critic_keep or saves, run.actor_keep or saves)
            * shape.value_params
            * (memory.param_bytes + 8 * run.critic_saves_optimizer)
        )
    return (actor + critic + shape.params * 2) / GIB
