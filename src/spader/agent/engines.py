"""Generation engines behind the agent loop: Hugging Face transformers (CPU or GPU) and sglang's
offline engine (GPU, the default for real runs).

Both take already tokenized prompts (the loop renders the chat template once, with the model's
own tokenizer, and counts the context from the same ids) and return one :class:`Generation` per
prompt. A failure is confined to the prompts it concerns: a batch that raises is retried one
prompt at a time, and a prompt that still fails comes back with ``error`` set instead of raising,
so the loop can score that episode as a failure (P = R = F1 = 0) and keep the others.

sglang is imported only inside :class:`SglangEngine` (it is not installed on CPU machines, and
installing it replaces torch).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from spader.agent.decoding import DecodeParams, DecodeResult, decode_batch

log = logging.getLogger(__name__)

__all__ = [
    "ENGINES",
    "Engine",
    "Generation",
    "Sampling",
    "SglangEngine",
    "TransformersEngine",
    "build_engine",
]

ENGINES = ("transformers", "sglang")


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by every request of an evaluation run."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0


@dataclass(frozen=True)
class Generation:
    """One assistant turn as generated.

    ``finish`` is ``stop`` (end of turn or a stop string), ``length`` (token budget) or ``error``
    (then ``error`` holds the message and ``text`` is empty).
    """

    text: str
    completion_tokens: int = 0
    finish: str = "stop"
    error: str | None = None


class Engine(Protocol):
    """What the agent loop needs from an engine."""

    name: str
    tokenizer: object

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], sampling: Sampling
    ) -> list[Generation]:
        """One generation per prompt (token ids), each limited to its own ``max_new_tokens``."""

    def close(self) -> None:
        """Release the model (and any worker processes)."""


def _special_strings(tokenizer) -> list[str]:
    """End-of-turn / padding markers cut from generated text (the turn ends there)."""
    out = []
    for tok in (getattr(tokenizer, "eos_token", None), getattr(tokenizer, "pad_token", None)):
        if isinstance(tok, str) and tok and tok not in out:
            out.append(tok)
    return out


def _cut_at_markers(text: str, markers: Sequence[str]) -> str:
    cut = len(text)
    for m in markers:
        i = text.find(m)
        if 0 <= i < cut:
            cut = i
    return text[:cut]


def _ensure_stop_kept(text: str, stop: Sequence[str]) -> str:
    """Cut the text just after the first stop string, if any (engines differ in what follows)."""
    best = None
    for s in stop:
        i = text.find(s)
        if i >= 0 and (best is None or i + len(s) < best):
            best = i + len(s)
    return text if best is None else text[:best]


def load_tokenizer(model_dir: str | os.PathLike):
    """The model's own tokenizer (its chat template renders every prompt)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


class TransformersEngine:
    """Batched ``model.generate`` with left padding.

    Args:
        model_dir: a Hugging Face model directory (weights, tokenizer with chat template).
        device: ``cpu``, ``cuda`` or ``None`` (cuda when available).
        batch_size: prompts per forward batch; prompts are sorted by length so that a batch pads
            little.
        threads: CPU threads for torch (the job's threads; more threads than cores slows torch
            down badly on a shared machine). ``None`` leaves torch's default.
    """

    name = "transformers"

    def __init__(
        self,
        model_dir: str | os.PathLike,
        device: str | None = None,
        batch_size: int = 8,
        threads: int | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.threads = int(threads) if threads and self.device == "cpu" else None
        self.batch_size = max(1, int(batch_size))
        self.tokenizer = load_tokenizer(model_dir)
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(self.device)
        self.model.eval()
        self._markers = _special_strings(self.tokenizer)
        self._pad_id = self.tokenizer.pad_token_id
        log.info(
            "transformers engine: %s on %s (%s), batch %d", model_dir, self.device, dtype, self.batch_size
        )

    @property
    def eos_ids(self) -> list[int]:
        """End-of-sequence ids: the model's generation config and the tokenizer's."""
        eos = set(_as_list(self.model.generation_config.eos_token_id)) | {self.tokenizer.eos_token_id}
        return sorted(int(e) for e in eos if e is not None)

    def decode(self, prompts: Sequence[Sequence[int]], params: Sequence[DecodeParams]) -> list[DecodeResult]:
        """Token-level generation with sglang's request semantics (:mod:`spader.agent.decoding`);
        the CPU rollout replica of training serves verl's generate calls with it."""
        if self.threads and self.torch.get_num_threads() != self.threads:
            self.torch.set_num_threads(self.threads)  # here: OpenMP settings are per calling thread
        return decode_batch(self.model, self.tokenizer, prompts, params, self.eos_ids)

    def _generate_batch(self, prompts: Sequence[Sequence[int]], budgets: Sequence[int], sampling: Sampling):
        # the stop string is kept (the parser needs the closing tag), like SglangEngine's no_stop_trim
        params = [
            DecodeParams(
                max_new_tokens=int(b),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                stop=tuple(sampling.stop),
                no_stop_trim=True,
                skip_special_tokens=False,
                spaces_between_special_tokens=False,
            )
            for b in budgets
        ]
        results = []
        for out in decode_batch(self.model, self.tokenizer, prompts, params, self.eos_ids):
            text = _ensure_stop_kept(_cut_at_markers(out.text, self._markers), sampling.stop)
            results.append(Generation(text, completion_tokens=len(out.token_ids), finish=out.finish))
        return results

    def generate(self, prompts, max_new_tokens, sampling: Sampling) -> list[Generation]:
        """See :class:`Engine`. Prompts are processed in length-sorted batches of ``batch_size``."""
        if self.threads and self.torch.get_num_threads() != self.threads:
            self.torch.set_num_threads(self.threads)  # here: OpenMP settings are per calling thread
        if sampling.temperature > 0:
            self.torch.manual_seed(sampling.seed)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            batch = [prompts[i] for i in idx]
            budgets = [max_new_tokens[i] for i in idx]
            try:
                outs = self._generate_batch(batch, budgets, sampling)
            except Exception as exc:  # noqa: BLE001  isolate the failing prompt(s): retry one at a time
                log.warning("batch of %d prompts failed (%s); retrying one by one", len(idx), exc)
                outs = []
                for p, b in zip(batch, budgets, strict=True):
                    try:
                        outs.extend(self._generate_batch([p], [b], sampling))
                    except Exception as single:  # noqa: BLE001 (recorded on the episode, scored as 0)
                        log.error("generation failed for a prompt of %d tokens: %s", len(p), single)
                        outs.append(
                            Generation("", finish="error", error=f"{type(single).__name__}: {single}")
                        )
            for i, g in zip(idx, outs, strict=True):
                results[i] = g
        return results  # type: ignore[return-value]

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


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
                "the GPU extra on a CUDA machine (pip install -e '.[gpu]'), or set evaluation.engine: "
                "transformers."
            ) from exc
        self.tokenizer = load_tokenizer(model_dir)
        self._markers = _special_strings(self.tokenizer)
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

    def _params(self, budget: int, sampling: Sampling) -> dict:
        return {
            "max_new_tokens": int(budget),
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "stop": list(sampling.stop) or None,
            # Keep the stop string (the parser needs the closing tag) and the agent's own tags,
            # which some tokenizers mark as special.
            "no_stop_trim": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }

    def _one(self, out: dict, sampling: Sampling) -> Generation:
        meta = out.get("meta_info", {}) or {}
        reason = meta.get("finish_reason") or {}
        kind = reason.get("type") if isinstance(reason, dict) else str(reason)
        text = _ensure_stop_kept(_cut_at_markers(out.get("text", ""), self._markers), sampling.stop)
        return Generation(
            text,
            completion_tokens=int(meta.get("completion_tokens", 0)),
            finish="length" if kind == "length" else "stop",
        )

    def generate(self, prompts, max_new_tokens, sampling: Sampling) -> list[Generation]:
        """See :class:`Engine`."""
        params = [self._params(b, sampling) for b in max_new_tokens]
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


def build_engine(
    engine: str,
    model_dir: str | os.PathLike,
    *,
    gpus: int = 0,
    batch_size: int = 8,
    mem_fraction: float = 0.7,
    context_length: int | None = None,
    seed: int = 0,
    threads: int | None = None,
) -> Engine:
    """Construct the engine named by ``evaluation.engine``.

    Args:
        engine: ``transformers`` or ``sglang``.
        model_dir: the policy's Hugging Face directory.
        gpus: GPUs of the job (0 = CPU; sglang needs at least one).
        threads: CPU threads of the job (transformers on CPU).
    """
    if not Path(model_dir, "config.json").exists():
        raise FileNotFoundError(f"model directory {model_dir} has no config.json (not a Hugging Face model)")
    if engine == "transformers":
        device = "cuda" if gpus > 0 else "cpu"
        return TransformersEngine(model_dir, device=device, batch_size=batch_size, threads=threads)
    if engine == "sglang":
        if gpus < 1:
            raise ValueError(
                "evaluation.engine 'sglang' needs a GPU (evaluation.gpus >= 1); use 'transformers' on CPU"
            )
        return SglangEngine(
            model_dir, tp_size=gpus, mem_fraction=mem_fraction, context_length=context_length, seed=seed
        )
    raise ValueError(f"evaluation.engine must be one of {ENGINES}, got {engine!r}")
