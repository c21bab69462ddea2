"""Rollout backend ``transformers``: verl's rollout replica served by transformers generation.

verl 0.9.1 runs rollouts against *replicas* (``RolloutReplicaRegistry``): the agent loop's
``server_manager.generate`` reaches a replica's server actor through verl's load balancer, and
after every actor update the trainer pushes the new weights into the rollout through the
``BaseRollout`` adapter living in each training worker (``get_rollout_class``). On GPUs both are
sglang's; this module supplies CPU ones with the same contract:

* :class:`TransformersServer` (a Ray actor per replica) owns the policy copy used for rollouts and
  answers ``generate(prompt_ids, sampling_params, request_id, ...) -> TokenOutput``. Concurrent
  requests are gathered for a few milliseconds and decoded together by the evaluation engine's
  decoder (:meth:`spader.agent.generation.TransformersEngine.decode`), which applies sglang's
  sampling semantics (stop strings and tokens, budgets, seeds, log-probs). The token budget is
  derived exactly as verl's sglang server derives it; a request without a seed gets one derived
  from ``rollout.seed`` (:meth:`TransformersServer._derived_seed`), so rollouts are reproducible.
* :class:`TransformersServerAdapter` (inside each training worker) receives the actor's full
  weights from verl's naive checkpoint engine after each update; the replica's leader rank ships
  them to its server in buckets, the server loads them before the next rollout.
* :class:`TransformersReplica` starts the server next to the replica's training workers.

Registered under the rollout name ``transformers`` (``actor_rollout_ref.rollout.name``).
Sizing knobs come from ``actor_rollout_ref.rollout.engine_kwargs.transformers``: ``threads``
(torch threads of the server), ``batch_size`` (requests per forward batch), ``batch_wait_ms``;
``test_hang_after`` (tests only) makes the server stop answering after that many requests, as a
hung engine would. Each replica samples with ``rollout.seed`` + its rank (as verl's vLLM server
seeds its replicas) and reports that seed with every generation.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator, get_max_position_embeddings

from spader.integrations.verl.episode_metrics import SEED_FIELD

__all__ = [
    "NAME",
    "TransformersReplica",
    "TransformersServer",
    "TransformersServerAdapter",
    "server_name",
]

log = logging.getLogger(__name__)

#: ``actor_rollout_ref.rollout.name`` of this backend.
NAME = "transformers"
_BUCKET_BYTES = 64 << 20


def server_name(replica_rank: int, suffix: str = "") -> str:
    """Ray actor name of a replica's server (the adapters in the training workers look it up)."""
    return f"transformers_server_{replica_rank}{suffix}"


def _engine_kwargs(config: RolloutConfig) -> dict:
    kwargs = dict((config.engine_kwargs or {}).get(NAME) or {})
    unknown = set(kwargs) - {"threads", "batch_size", "batch_wait_ms", "test_hang_after"}
    if unknown:
        raise ValueError(
            f"actor_rollout_ref.rollout.engine_kwargs.{NAME}: unknown key(s) {sorted(unknown)} "
            "(threads, batch_size, batch_wait_ms, test_hang_after)"
        )
    return kwargs


class TransformersServer:
    """The rollout model of one replica (a Ray actor; see the module docstring).

    Args:
        config: verl's rollout config.
        model_config: verl's model config (``local_path`` is loaded).
        replica_rank: this replica's rank.
    """

    def __init__(self, config, model_config, replica_rank: int):
        from spader.agent.generation import TransformersEngine

        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        kwargs = _engine_kwargs(self.config)
        self.replica_rank = replica_rank
        self.engine = TransformersEngine(
            self.model_config.local_path,
            device="cpu",
            batch_size=int(kwargs.get("batch_size", 64)),
            threads=kwargs.get("threads"),
        )
        self.max_model_len = self.config.max_model_len or get_max_position_embeddings(
            self.model_config.hf_config
        )
        self.batch_wait_s = float(kwargs.get("batch_wait_ms", 5)) / 1000.0
        # one thread owns the model: decoding and weight loading never overlap
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transformers-rollout")
        self._pending: list[tuple[list[int], Any, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self.global_steps = None
        # one seed per replica, as verl's vLLM server (rollout.seed + replica rank)
        self.seed = int(self.config.seed) + int(replica_rank)
        hang = kwargs.get("test_hang_after")
        self._hang_after = None if hang is None else int(hang)
        self._seen: dict[bytes, int] = {}
        self.stats = {"requests": 0, "batches": 0, "decode_s": 0.0, "weight_updates": 0, "weight_load_s": 0.0}

    # -- generation -------------------------------------------------------------------------
    def _budget(self, prompt_len: int, params: dict) -> int:
        # as verl's sglang server: an explicit max_new_tokens/max_tokens, else what is left of
        # the response budget; then clamped to the model's context
        if "max_new_tokens" in params:
            budget = params.pop("max_new_tokens")
        elif "max_tokens" in params:
            budget = params.pop("max_tokens")
        else:
            budget = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - prompt_len,
            )
        possible = self.max_model_len - prompt_len - 1
        if possible < 0:
            raise ValueError(
                f"prompt length ({prompt_len}) exceeds the model's context ({self.max_model_len})"
            )
        return max(0, min(int(budget), possible))

    async def generate(
        self,
        prompt_ids,
        sampling_params: dict[str, Any],
        request_id: str,
        image_data=None,
        video_data=None,
        **kwargs,
    ) -> TokenOutput:
        """Generate one assistant turn for ``prompt_ids`` (verl's server ``generate`` contract)."""
        from spader.agent.decoding import parse_sampling_params

        if image_data or video_data or kwargs.get("audio_data"):
            raise ValueError("the transformers rollout replica serves text-only models")
        if self._hang_after is not None and self.stats["requests"] + len(self._pending) >= self._hang_after:
            log.warning("test_hang_after=%d: this rollout server stops answering", self._hang_after)
            await asyncio.Event().wait()  # never set: a hung engine
        prompt = [int(t) for t in prompt_ids]
        params = dict(sampling_params)
        budget = self._budget(len(prompt), params)
        if params.get("sampling_seed") is None and params.get("seed") is None:
            params["sampling_seed"] = self._derived_seed(prompt)
        decode = parse_sampling_params({**params, "max_new_tokens": budget}, default_max_new_tokens=budget)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, decode, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        result = await future
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs,
            stop_reason=result.finish,
            extra_fields={"global_steps": self.global_steps, SEED_FIELD: self.seed},
        )

    def _derived_seed(self, prompt: list[int]) -> int:
        """The sampling seed of a request that brings none: from the rollout seed, the weights'
        step, the prompt and how often this prompt was asked for since the weights changed.

        The ``n`` rollouts of a group send the same first prompt; the counter tells them apart,
        and since they are interchangeable, which of them arrives first does not matter. Rollouts
        are thus reproducible for a fixed ``rollout.seed`` whatever the batching and arrival order.
        """
        key = hashlib.sha256(struct.pack(f"<{len(prompt)}q", *prompt)).digest()
        k = self._seen.get(key, 0)
        self._seen[key] = k + 1
        tag = f"{self.seed}:{self.global_steps}:{k}:".encode()
        return int.from_bytes(hashlib.sha256(tag + key).digest()[:8], "little") & ((1 << 62) - 1)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(self.batch_wait_s)  # let the other turns of this wave arrive
            batch = self._pending[: self.engine.batch_size]
            del self._pending[: len(batch)]
            start = time.perf_counter()
            try:
                results = await loop.run_in_executor(
                    self._executor, self.engine.decode, [b[0] for b in batch], [b[1] for b in batch]
                )
            except Exception as exc:  # noqa: BLE001  the requests of this batch fail, the server lives on
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self.stats["requests"] += len(batch)
            self.stats["batches"] += 1
            self.stats["decode_s"] += time.perf_counter() - start
            for (_, _, fut), res in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(res)

    # -- weights ----------------------------------------------------------------------------
    def _load(self, named) -> int:
        import torch

        state = {name: tensor for name, tensor in named}
        with torch.no_grad():
            result = self.engine.model.load_state_dict(state, strict=False, assign=False)
        if result.unexpected_keys:
            raise ValueError(f"weights the rollout model does not have: {sorted(result.unexpected_keys)[:8]}")
        return len(state)

    async def load_weights(self, named: list) -> int:
        """Copy a bucket of ``(name, tensor)`` pairs into the rollout model; returns its size."""
        start = time.perf_counter()
        n = await asyncio.get_running_loop().run_in_executor(self._executor, self._load, named)
        self.stats["weight_load_s"] += time.perf_counter() - start
        return n

    async def set_global_steps(self, global_steps: int | None) -> None:
        """Record the trainer step of the loaded weights (returned with every generation)."""
        self.global_steps = global_steps
        self._seen.clear()
        self.stats["weight_updates"] += 1

    def get_stats(self) -> dict:
        """Counters and seconds spent decoding and loading weights (for the training bench)."""
        return dict(self.stats)

    # -- lifecycle hooks verl calls on every server (nothing is released on a CPU) -----------
    async def wake_up(self):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, **kwargs):
        return None

    async def resume_generation(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class TransformersReplica(RolloutReplica):
    """A rollout replica whose server is a :class:`TransformersServer` (CPU)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(TransformersServer)

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        """Start the server actor on the node of the replica's training workers."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {
            "name": server_name(self.replica_rank, self.name_suffix),
            "max_concurrency": self.max_concurrency,
            "num_cpus": 1,
        }
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(
                lambda worker: ray.get_runtime_context().get_node_id()
            )
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        server = self.server_class.options(**options).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
        )
        await server.get_stats.remote()  # raises here if the model failed to load
        self.servers = [server]
        self._server_handle = server
        # the load balancer keys servers by address; this backend has no HTTP endpoint
        self._server_address = f"{NAME}://{options['name']}"


class TransformersServerAdapter(BaseRollout):
    """The rollout side of weight sync inside a training worker (verl's ``BaseRollout``).

    Every rank iterates the weight generator (it drives FSDP's all-gathers); the replica's
    leader rank sends the full tensors to its server in buckets of about 64 MiB.
    """

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank < 0 else replica_rank
        self.is_leader_rank = rank % world == 0
        self.sleep_level = 2
        self._server = None

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        """Send the actor's weights to the replica's server (leader rank only)."""
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the transformers rollout takes full tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the transformers rollout does not serve LoRA adapters; merge them")
        if self.is_leader_rank and self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        bucket, size, sent = [], 0, []
        async for name, tensor in ensure_async_iterator(weights):
            if not self.is_leader_rank:
                continue
            t = tensor.detach().to("cpu")
            bucket.append((name, t))
            size += t.numel() * t.element_size()
            if size >= _BUCKET_BYTES:
                sent.append(await self._server.load_weights.remote(bucket))
                bucket, size = [], 0
        if self.is_leader_rank:
            if bucket:
                sent.append(await self._server.load_weights.remote(bucket))
            await self._server.set_global_steps.remote(kwargs.get("global_steps"))
            log.info("sent %d tensors to %s", sum(sent), server_name(self.replica_rank))
