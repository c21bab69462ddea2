"""sglang's offline engine behind the agent loop's :class:`~spader.agent.generation.Engine` protocol.

Token ids in, token ids out: ``Engine.generate(input_ids=..., sampling_params=...)`` answers each
request with a dict holding ``output_ids`` (the generated ids, untrimmed: with ``no_stop_trim``
the token that completes a stop string is among them), ``text`` and ``meta_info`` (sglang 0.5's
tokenizer manager); the agent loop keeps the ids. Each request carries its own
``sampling_seed``.

sglang is imported only when the engine is built: it is installed by the ``gpu`` extra on CUDA
machines only (installing it replaces torch).
"""

from __future__ import annotations

import logging
import os

from spader.agent.generation import (
    Generation,
    Sampling,
    cut_at_markers,
    keep_through_stop,
    load_tokenizer,
    special_strings,
)

log = logging.getLogger(__name__)

__all__ = ["SglangEngine"]


class SglangEngine:
    """sglang's offline ``Engine`` (GPU). Requests of one turn are submitted as one batch and
    scheduled by sglang (continuous batching).

    Args:
        model_dir: a Hugging Face model directory.
        tp_size: tensor-parallel degree (GPUs of the job).
        mem_fraction: ``mem_fraction_static``; leave room for the reranker of the search service
            when it shares the GPU.
        context_length: longest sequence the engine must hold.
        seed: sglang's random seed (sampling).
    """

    name = "sglang"

    def __init__(
        self,
        model_dir: str | os.PathLike,
        tp_size: int = 1,
        mem_fraction: float = 0.7,
        context_length: int | None = None,
        seed: int = 0,
    ):
        try:
            import sglang
        except ImportError as exc:
            raise RuntimeError(
                "evaluation.engine is 'sglang' but sglang is not installed in this environment. Install "
                "the GPU extra on a CUDA machine (pip install -c requirements/gpu-lock.txt -e '.[gpu]'), or set evaluation.engine: "
                "transformers."
            ) from exc
        self.tokenizer = load_tokenizer(model_dir)
        self._markers = special_strings(self.tokenizer)
        kwargs = dict(
            model_path=str(model_dir),
            tp_size=int(tp_size),
            mem_fraction_static=float(mem_fraction),
            random_seed=int(seed),
        )
        if context_length:
            kwargs["context_length"] = int(context_length)
        self.engine = sglang.Engine(**kwargs)
        log.info("sglang engine: %s, tp %d, mem fraction %.2f", model_dir, tp_size, mem_fraction)

    def _params(self, budget: int, sampling: Sampling, seed: int | None) -> dict:
        params = {
            "max_new_tokens": int(budget),
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "top_k": int(sampling.top_k),
            "min_p": float(sampling.min_p),
            "repetition_penalty": float(sampling.repetition_penalty),
            "stop": list(sampling.stop) or None,
            # Keep the stop string (the parser needs the closing tag) and the agent's own tags,
            # which some tokenizers mark as special.
            "no_stop_trim": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if seed is not None:
            params["sampling_seed"] = int(seed)
        return params

    def _one(self, out: dict, sampling: Sampling) -> Generation:
        meta = out.get("meta_info", {}) or {}
        reason = meta.get("finish_reason") or {}
        kind = reason.get("type") if isinstance(reason, dict) else str(reason)
        if out.get("output_ids") is None:
            raise RuntimeError("sglang answered without output_ids (sglang >= 0.5 returns them)")
        ids = tuple(int(i) for i in out["output_ids"])
        text = keep_through_stop(cut_at_markers(out.get("text") or "", self._markers), sampling.stop)
        return Generation(
            text,
            completion_tokens=int(meta.get("completion_tokens", len(ids))),
            finish="length" if kind == "length" else "stop",
            token_ids=ids,
        )

    def generate(self, prompts, max_new_tokens, sampling: Sampling, seeds=None) -> list[Generation]:
        """See :class:`Engine`."""
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        params = [self._params(b, sampling, seed) for b, seed in zip(max_new_tokens, seeds, strict=True)]
        try:
            outs = self.engine.generate(input_ids=[list(p) for p in prompts], sampling_params=params)
            return [self._one(o, sampling) for o in outs]
        except Exception as exc:  # noqa: BLE001  isolate the failing prompt(s)
            log.warning("sglang batch of %d prompts failed (%s); retrying one by one", len(prompts), exc)
        results = []
        for p, prm in zip(prompts, params, strict=True):
            try:
                results.append(
                    self._one(self.engine.generate(input_ids=list(p), sampling_params=prm), sampling)
                )
            except Exception as exc:  # noqa: BLE001 (recorded on the episode, scored as 0)
                results.append(Generation("", finish="error", error=f"{type(exc).__name__}: {exc}"))
        return results

    def close(self) -> None:
        self.engine.shutdown()
