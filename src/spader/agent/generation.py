"""Generation engines behind the agent loop: the :class:`Engine` protocol and the Hugging Face
transformers engine (CPU or GPU). sglang's offline engine (GPU, the default for real runs) lives
in :mod:`spader.integrations.sglang`; :func:`spader.evaluation.engines.build_engine` picks one.

Engines take token ids and return token ids, as verl's rollout servers do in training: the loop
keeps each conversation as ids (:mod:`spader.agent.conversation`) and never re-renders it. Each
request may carry its own sampling seed, so a seeded request samples the same tokens whatever it
is batched with. A failure is confined to the prompts it concerns: a batch that raises is retried
one prompt at a time, and a prompt that still fails comes back with ``error`` set instead of
raising, so the loop can score that episode as a failure (P = R = F1 = 0) and keep the others
(an evaluation with more failures than ``evaluation.max_error_share`` then fails as a whole).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from spader.agent.decoding import DecodeParams, DecodeResult, decode_batch

log = logging.getLogger(__name__)

__all__ = [
    "Engine",
    "Generation",
    "Sampling",
    "TransformersEngine",
    "cut_at_markers",
    "keep_through_stop",
    "load_tokenizer",
    "special_strings",
]


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by every request of an evaluation run (per-request seeds are
    passed to :meth:`Engine.generate`)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class Generation:
    """One assistant turn as generated.

    ``token_ids`` are the ids the model generated (through the token that completed a stop string
    or the end-of-turn token; the loop cuts them after the first stop tag), ``text`` their
    decoding. ``finish`` is ``stop`` (end of turn or a stop string), ``length`` (token budget) or
    ``error`` (then ``error`` holds the message and ``token_ids`` is empty).
    """

    text: str
    completion_tokens: int = 0
    finish: str = "stop"
    error: str | None = None
    token_ids: tuple[int, ...] = ()


class Engine(Protocol):
    """What the agent loop needs from an engine."""

    name: str
    tokenizer: object

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: Sequence[int],
        sampling: Sampling,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """One generation per prompt (token ids), each limited to its own ``max_new_tokens`` and
        sampled with its own seed (``seeds[i]``; None: the engine's)."""

    def close(self) -> None:
        """Release the model (and any worker processes)."""


def special_strings(tokenizer) -> list[str]:
    """End-of-turn / padding markers cut from generated text (the turn ends there)."""
    out = []
    for tok in (getattr(tokenizer, "eos_token", None), getattr(tokenizer, "pad_token", None)):
        if isinstance(tok, str) and tok and tok not in out:
            out.append(tok)
    return out


def cut_at_markers(text: str, markers: Sequence[str]) -> str:
    cut = len(text)
    for m in markers:
        i = text.find(m)
        if 0 <= i < cut:
            cut = i
    return text[:cut]


def keep_through_stop(text: str, stop: Sequence[str]) -> str:
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
        self._markers = special_strings(self.tokenizer)
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

    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        sampling: Sampling,
        seeds: Sequence[int | None],
    ):
        # the stop string is kept (the parser needs the closing tag), like SglangEngine's no_stop_trim
        params = [
            DecodeParams(
                max_new_tokens=int(b),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                stop=tuple(sampling.stop),
                no_stop_trim=True,
                skip_special_tokens=False,
                spaces_between_special_tokens=False,
                seed=seed,
            )
            for b, seed in zip(budgets, seeds, strict=True)
        ]
        results = []
        for out in decode_batch(self.model, self.tokenizer, prompts, params, self.eos_ids):
            text = keep_through_stop(cut_at_markers(out.text, self._markers), sampling.stop)
            results.append(
                Generation(
                    text,
                    completion_tokens=len(out.token_ids),
                    finish=out.finish,
                    token_ids=tuple(out.token_ids),
                )
            )
        return results

    def generate(self, prompts, max_new_tokens, sampling: Sampling, seeds=None) -> list[Generation]:
        """See :class:`Engine`. Prompts are processed in length-sorted batches of ``batch_size``;
        a request without a seed draws one from torch's generator, seeded with ``sampling.seed``."""
        if self.threads and self.torch.get_num_threads() != self.threads:
            self.torch.set_num_threads(self.threads)  # here: OpenMP settings are per calling thread
        if sampling.temperature > 0:
            self.torch.manual_seed(sampling.seed)
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            batch = [prompts[i] for i in idx]
            budgets = [max_new_tokens[i] for i in idx]
            batch_seeds = [seeds[i] for i in idx]
            try:
                outs = self._generate_batch(batch, budgets, sampling, batch_seeds)
            except Exception as exc:  # noqa: BLE001  isolate the failing prompt(s): retry one at a time
                log.warning("batch of %d prompts failed (%s); retrying one by one", len(idx), exc)
                outs = []
                for p, b, seed in zip(batch, budgets, batch_seeds, strict=True):
                    try:
                        outs.extend(self._generate_batch([p], [b], sampling, [seed]))
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
