"""Token-level decoding with Hugging Face transformers, with sglang's request semantics.

One function, :func:`decode_batch`, generates for a batch of token-id prompts and decides where
each generation ends the way sglang's scheduler does, so that the CPU rollout replica (verl's
``server_manager.generate``) and the evaluation engine (:class:`spader.agent.generation.TransformersEngine`)
behave like the sglang engines they stand in for:

* a generation ends at the first of: its token budget (``finish = "length"``), an end-of-sequence
  or ``stop_token_ids`` token (unless ``ignore_eos``; the token is kept), the first token whose
  text completes a ``stop`` string or matches a ``stop_regex`` (that token is kept);
* the returned token ids are never trimmed (sglang hands ``output_ids`` back untrimmed); the
  returned *text* drops the matched stop string and what follows it, or the matched stop token,
  unless ``no_stop_trim``;
* ``temperature`` 0 is greedy; ``top_k`` -1 and ``top_p`` 1 are off; every request samples from its
  own generator, so a request ``seed`` makes its tokens reproducible in any batch;
* log-probabilities, when asked for, are those of the processed distribution (after temperature,
  top-k/top-p), as sglang's default ``processed_logprobs``.

:func:`parse_sampling_params` turns an sglang sampling-params dict into :class:`DecodeParams`,
refusing keys it would silently ignore.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["DecodeParams", "DecodeResult", "decode_batch", "finish_point", "parse_sampling_params"]

# sglang SamplingParams keys that need no support here because their default is the only value
# the project uses; any other value is refused rather than ignored.
_NEUTRAL = {"n": 1, "frequency_penalty": 0.0, "presence_penalty": 0.0, "logit_bias": None,
            "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
            "custom_params": None, "stream_interval": None}  # fmt: skip


@dataclass(frozen=True)
class DecodeParams:
    """How one request is decoded (sglang's ``SamplingParams`` fields that apply here)."""

    max_new_tokens: int
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_regex: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    seed: int | None = None
    logprobs: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 0 or self.min_new_tokens < 0:
            raise ValueError("max_new_tokens and min_new_tokens must be >= 0")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.min_p < 0:
            raise ValueError(
                f"temperature >= 0, 0 < top_p <= 1 and min_p >= 0 required, got temperature="
                f"{self.temperature}, top_p={self.top_p}, min_p={self.min_p}"
            )

    def batch_key(self) -> tuple:
        """Requests with equal keys can share one ``generate`` call (budgets and seeds differ per
        row)."""
        return (self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty,
                self.min_new_tokens, self.stop, self.stop_regex, self.stop_token_ids,
                self.ignore_eos)  # fmt: skip


@dataclass
class DecodeResult:
    """One generation: ``token_ids`` (untrimmed), ``text`` (trimmed per ``no_stop_trim``),
    ``finish`` (``stop`` or ``length``), ``matched`` (the stop string, regex or token id that
    ended it, else None) and per-token ``log_probs`` when they were asked for."""

    token_ids: list[int]
    text: str
    finish: str
    matched: str | int | None = None
    log_probs: list[float] | None = field(default=None)


def _as_tuple(value, kind) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        value = [value]
    return tuple(kind(v) for v in value)


def parse_sampling_params(params: Mapping[str, Any], *, default_max_new_tokens: int) -> DecodeParams:
    """An sglang (or vllm-style) sampling-params dict as :class:`DecodeParams`.

    Args:
        params: e.g. ``{"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64,
            "stop": ["</answer>"], "no_stop_trim": True, "logprobs": True}``. ``max_tokens`` and
            ``seed`` are read as ``max_new_tokens`` and ``sampling_seed``.
        default_max_new_tokens: budget when the dict sets none.
    Returns:
        The parameters.
    Raises:
        ValueError: a key this decoder does not implement, with a value that would change the
            result (the message names it).
    """
    p = dict(params)
    budget = p.pop("max_new_tokens", None)
    alt = p.pop("max_tokens", None)
    budget = (
        default_max_new_tokens if budget is None and alt is None else (budget if budget is not None else alt)
    )
    seed, alt_seed = p.pop("sampling_seed", None), p.pop("seed", None)
    seed = alt_seed if seed is None else seed
    unsupported = []
    for key, neutral in _NEUTRAL.items():
        if key in p and p.pop(key) not in (neutral, None):
            unsupported.append(key)
    out = DecodeParams(
        max_new_tokens=int(budget),
        min_new_tokens=int(p.pop("min_new_tokens", 0) or 0),
        temperature=float(p.pop("temperature", 1.0)),
        top_p=float(p.pop("top_p", 1.0)),
        top_k=int(p.pop("top_k", -1)),
        min_p=float(p.pop("min_p", 0.0) or 0.0),
        repetition_penalty=float(p.pop("repetition_penalty", 1.0)),
        stop=_as_tuple(p.pop("stop", None), str),
        stop_regex=_as_tuple(p.pop("stop_regex", None), str),
        stop_token_ids=_as_tuple(p.pop("stop_token_ids", None), int),
        ignore_eos=bool(p.pop("ignore_eos", False)),
        no_stop_trim=bool(p.pop("no_stop_trim", False)),
        skip_special_tokens=bool(p.pop("skip_special_tokens", True)),
        spaces_between_special_tokens=bool(p.pop("spaces_between_special_tokens", True)),
        seed=None if seed is None else int(seed),
        logprobs=bool(p.pop("logprobs", False)),
    )
    unsupported = sorted([*unsupported, *p])
    if unsupported:
        raise ValueError(f"sampling parameter(s) not supported by the transformers decoder: {unsupported}")
    return out


def finish_point(token_ids: Sequence[int], params: DecodeParams, tokenizer, eos_ids) -> tuple[int, str, Any]:
    """Where sglang ends a generation that produced ``token_ids``.

    sglang checks every new token in this order: the budget, then an end-of-sequence or stop
    token, then whether the text so far contains a stop string (or matches a stop regex). The
    first token at which one of them fires ends the generation and is kept.

    Args:
        token_ids: the generated ids (possibly longer than the generation sglang would keep).
        params: the request.
        tokenizer: decodes the generation for stop strings (special tokens kept).
        eos_ids: the model's end-of-sequence ids.
    Returns:
        ``(length, finish, matched)``: keep ``token_ids[:length]``.
    """
    limit = min(len(token_ids), params.max_new_tokens)
    found: list[tuple[int, int, str, Any]] = []  # (length, priority, finish, matched)
    if len(token_ids) >= params.max_new_tokens:
        found.append((params.max_new_tokens, 0, "length", None))
    if not params.ignore_eos:
        stops = set(params.stop_token_ids) | set(eos_ids)
        for i, tok in enumerate(token_ids[:limit]):
            if tok in stops:
                found.append((i + 1, 1, "stop", int(tok)))
                break
    regexes = [re.compile(r) for r in params.stop_regex]
    if (params.stop or regexes) and limit:

        def hit(n: int):
            text = tokenizer.decode(list(token_ids[:n]), skip_special_tokens=False)
            for s in params.stop:
                if s in text:
                    return s
            return next((r.pattern for r in regexes if r.search(text)), None)

        if hit(limit) is not None:
            # once the text contains a stop it keeps containing it: the first such prefix
            lo, hi = 1, limit
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if hit(mid) is not None else (mid + 1, hi)
            found.append((lo, 2, "stop", hit(lo)))
    if not found:
        return limit, "length", None
    length, _, finish, matched = min(found, key=lambda f: (f[0], f[1]))
    return length, finish, matched


def _text(token_ids, finish, matched, params: DecodeParams, tokenizer) -> str:
    ids = list(token_ids)
    if not params.no_stop_trim and isinstance(matched, int) and ids:
        ids = ids[:-1]
    text = tokenizer.decode(
        ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )
    if not params.no_stop_trim and isinstance(matched, str) and finish == "stop":
        pos = text.find(matched) if matched in params.stop else -1
        if matched in params.stop_regex:
            m = re.search(matched, text)
            pos = m.start() if m else -1
        if pos >= 0:
            text = text[:pos]
    return text


class _RowSampler:
    """Last logits processor: per-row seeded sampling (Gumbel-max) and the chosen tokens' log-probs.

    transformers samples a whole batch from one global generator, so a row's tokens would depend
    on its batch-mates. Here each row draws from its own generator: adding Gumbel noise to the
    processed log-probabilities and letting greedy decoding take the arg-max samples exactly from
    the processed distribution, and a row decodes the same tokens alone or in any batch.
    """

    def __init__(self, generators, sample: bool, record: bool):
        self.generators = generators
        self.sample = sample
        self.record = record
        self.log_probs: list[list[float]] = [[] for _ in generators]

    def __call__(self, input_ids, scores):
        import torch

        logp = torch.log_softmax(scores.float(), dim=-1)
        out = logp
        if self.sample:
            uniform = torch.stack([torch.rand(scores.shape[-1], generator=g) for g in self.generators])
            out = logp - torch.log(-torch.log(uniform.clamp_(1e-20, 1.0 - 1e-7))).to(logp.device)
        if self.record:
            chosen = out.argmax(dim=-1)
            for row, tok in enumerate(chosen.tolist()):
                self.log_probs[row].append(float(logp[row, tok]))
        return out


class _StopOnText:
    """Stopping criterion: a row is done once its generated text contains a stop string or
    matches a stop regex (sglang's rule; transformers' own ``stop_strings`` criterion can fire
    before the string is complete). A cheap check of the last tokens is confirmed on the whole
    generated text before a row is stopped; :func:`finish_point` then finds the exact token."""

    def __init__(self, tokenizer, params: DecodeParams, width: int):
        self.tokenizer = tokenizer
        self.stops = params.stop
        self.regexes = [re.compile(r) for r in params.stop_regex]
        self.width = width
        self.window = max((len(s) for s in self.stops), default=0) + 1

    def _text(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        done = []
        for row in input_ids[:, self.width :].tolist():
            hit = False
            if self.regexes:  # a match may span any length
                text = self._text(row)
                hit = any(s in text for s in self.stops) or any(r.search(text) for r in self.regexes)
            elif any(s in self._text(row[-self.window :]) for s in self.stops):
                text = self._text(row)
                hit = any(s in text for s in self.stops)
            done.append(hit)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _processors(params: DecodeParams) -> list:
    """transformers' own processors for the request's repetition penalty, temperature and
    top-k/top-p/min-p (the distribution sglang samples from and reports log-probs of)."""
    from transformers.generation import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out = []
    if params.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.temperature > 0:
        out.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            out.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            out.append(TopPLogitsWarper(params.top_p))
        if params.min_p > 0:
            out.append(MinPLogitsWarper(params.min_p))
    return out


def _generate(model, tokenizer, prompts, params: DecodeParams, seeds, budget: int, pad_id: int, eos_ids):
    """One greedy ``model.generate`` over left-padded prompts, sampling through :class:`_RowSampler`.

    Returns:
        ``(new token ids per row, log-probs per row or None)``.
    """
    import torch
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):  # left padding: every prompt ends at the same column
        ids[row, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[row, width - len(p) :] = 1
    sampler = _RowSampler(
        [torch.Generator().manual_seed(int(s)) for s in seeds],
        sample=params.temperature > 0,
        record=params.logprobs,
    )
    config = GenerationConfig(
        max_new_tokens=budget,
        min_new_tokens=params.min_new_tokens or None,
        do_sample=False,
        eos_token_id=None if params.ignore_eos else sorted(set(eos_ids) | set(params.stop_token_ids)),
        pad_token_id=pad_id,
    )
    stopping = [_StopOnText(tokenizer, params, width)] if params.stop or params.stop_regex else []
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([*_processors(params), sampler]),
            stopping_criteria=StoppingCriteriaList(stopping),
        )
    new = out[:, width:].tolist()
    return new, (sampler.log_probs if params.logprobs else None)


def decode_batch(
    model, tokenizer, prompts: Sequence[Sequence[int]], params: Sequence[DecodeParams], eos_ids
) -> list[DecodeResult]:
    """Generate for ``prompts`` (token ids), request ``i`` decoded with ``params[i]``.

    Requests with the same :meth:`DecodeParams.batch_key` share one generate call (left-padded,
    the longest budget). Each samples from its own generator, seeded with its ``seed`` (or, when
    it has none, a seed drawn from torch's global generator), so a seeded request decodes the
    same tokens whatever it is batched with.

    Args:
        model: a causal LM (eval mode).
        tokenizer: its tokenizer (pad token set).
        prompts: token ids per request.
        params: decoding parameters per request.
        eos_ids: the model's end-of-sequence ids (generation config and tokenizer).
    Returns:
        One :class:`DecodeResult` per request, in order.
    """
    import torch

    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} parameter sets")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = [int(e) for e in eos_ids if e is not None]
    seeds = [p.seed if p.seed is not None else int(torch.randint(0, 2**62, (1,)).item()) for p in params]
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(p.batch_key(), []).append(i)
    results: list[DecodeResult | None] = [None] * len(prompts)
    for idx in groups.values():
        budget = max(params[i].max_new_tokens for i in idx)
        run = replace(params[idx[0]], logprobs=any(params[i].logprobs for i in idx))
        new, logps = [[] for _ in idx], None
        if budget > 0:
            batch = [prompts[i] for i in idx]
            new, logps = _generate(
                model, tokenizer, batch, run, [seeds[i] for i in idx], budget, pad_id, eos_ids
            )
        for row, i in enumerate(idx):
            length, finish, matched = finish_point(new[row], params[i], tokenizer, eos_ids)
            ids = [int(t) for t in new[row][:length]]
            results[i] = DecodeResult(
                token_ids=ids,
                text=_text(ids, finish, matched, params[i], tokenizer),
                finish=finish,
                matched=matched,
                log_probs=logps[row][:length] if params[i].logprobs and logps is not None else None,
            )
    return results  # type: ignore[return-value]
