"""Supervised warm start of the demo's tiny policy on scripted trajectories.

A randomly initialised policy never writes a valid action, so in the demo every rollout would be
invalid and every reward and advantage equal. The warm start teaches the tiny model the action
format by supervised fine-tuning on scripted episodes of the demo world
(:mod:`spader.demo.trajectories`): plain torch on CPU, seeded, loss on the assistant's tokens only.
Real backbones are never warm-started (the config check allows it for ``tiny:`` models only).

Conversations are tokenized through the model's chat template exactly as the agent loop renders
its prompts (:func:`spader.agent.loop.render_prompt`, no ``tools`` argument): an assistant turn's
tokens are what the loop's generation would have to produce after that prompt, up to and
including the end-of-turn token.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

__all__ = ["WarmstartSettings", "encode_conversation", "train_warmstart", "turn_fits", "warmstart_policy"]


@dataclass(frozen=True)
class WarmstartSettings:
    """Supervised fine-tuning settings (``backbones.<name>.warmstart``; documented in the schema).

    Attributes:
        steps: optimizer steps.
        lr: peak AdamW learning rate (linear warm-up, then cosine decay to 10%).
        batch_size: conversations per step.
        warmup_ratio: fraction of the steps spent warming up.
        weight_decay: AdamW weight decay.
        max_searches: search steps a scripted episode may take (1 or 2).
        world_questions: also script the demo world's questions about topics that no evaluation
            question asks about or answers (more distinct names than the small demo mix holds,
            so that the model learns to copy names rather than recite them).
        first_turn_examples: besides each whole episode, train on its first turn alone (the
            prompt and the first search): a short sequence, so copying the question into a query
            is seen twice as often for a fraction of the cost of a whole episode.
        seed: seed of the batches and of torch.
    """

    steps: int = 300
    lr: float = 3.0e-3
    batch_size: int = 4
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    max_searches: int = 2
    world_questions: bool = True
    first_turn_examples: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"warmstart.steps and warmstart.batch_size must be >= 1, got {self.steps}, {self.batch_size}"
            )
        if not self.lr > 0 or not 0 <= self.warmup_ratio < 1 or self.weight_decay < 0:
            raise ValueError(
                "warmstart.lr must be > 0, warmup_ratio in [0, 1) and weight_decay >= 0, got "
                f"{self.lr}, {self.warmup_ratio}, {self.weight_decay}"
            )
        if self.max_searches not in (1, 2):
            raise ValueError(f"warmstart.max_searches must be 1 or 2, got {self.max_searches}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> WarmstartSettings:
        """Build from ``backbones.<name>.warmstart`` (unknown keys are an error)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - names)
        if unknown:
            raise ValueError(f"unknown warmstart setting(s) {unknown}; known: {sorted(names)}")
        return cls(**dict(cfg))


def encode_conversation(tokenizer, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and its loss mask (1 on assistant tokens only).

    Each assistant turn is the suffix of the conversation rendered through that turn beyond the
    agent loop's prompt for it (the conversation before it plus the assistant header): the turn's
    text and its end-of-turn token. The template's newline after the end-of-turn token is never
    generated, so it is not learned either.

    Args:
        tokenizer: the model's tokenizer (with its chat template).
        messages: user / assistant / tool messages, ending with an assistant turn.
    Returns:
        ``(input_ids, loss_mask)`` of equal length.
    Raises:
        ValueError: when a rendered prefix is not a token prefix of the longer rendering (a chat
            template that rewrites earlier turns cannot be trained turn by turn this way), or
            when the conversation has no assistant turn.
    """
    from spader.agent.loop import render_prompt

    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no assistant turn to learn from")
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    mask: list[int] = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render_prompt(tokenizer, list(messages[:k]))
        text = tokenizer.apply_chat_template(list(messages[: k + 1]), tokenize=False)
        full = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if full[: len(prompt)] != prompt or prompt[: len(ids)] != ids:
            raise ValueError(f"assistant turn {k}: the chat template does not render turns as prefixes")
        turn = full[len(prompt) :]
        end = turn.index(eos) + 1 if eos in turn else len(turn)
        mask += [0] * (len(prompt) - len(ids)) + [1] * end
        ids = prompt + turn[:end]
    return ids, mask


def _turns(messages: Sequence[dict]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def _first_turn(messages: Sequence[dict]) -> list[dict]:
    """The conversation cut after its first assistant turn."""
    k = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return list(messages[: k + 1])


def _schedule(step: int, total: int, warmup: int) -> float:
    """Learning-rate factor: linear warm-up, then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _assistant_loss(model, ids, attn, labels):
    """Mean next-token cross-entropy over the labelled (assistant) positions.

    The output projection runs only on the positions that predict a labelled token: assistant
    turns are a few percent of a conversation's tokens, and projecting every position onto the
    vocabulary would cost more than the rest of the small model.
    """
    import torch.nn.functional as F

    # Rows are right-padded: under causal attention no real token sees a pad, so no padding
    # mask is needed, and without one attention takes its fast causal path.
    del attn
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), target[keep])


def _batches(lengths: Sequence[int], batch_size: int, steps: int, rng: random.Random):
    """Batch indices per step: shuffled epochs, each cut into length-sorted groups (little
    padding), the groups visited in random order."""
    out: list[list[int]] = []
    while len(out) < steps:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        chunk = batch_size * 8
        groups = []
        for start in range(0, len(order), chunk):
            part = sorted(order[start : start + chunk], key=lambda i: lengths[i])
            groups += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
        rng.shuffle(groups)
        out += groups
    return out[:steps]


def train_warmstart(
    model_dir: str | os.PathLike,
    conversations: Sequence[Sequence[dict]],
    out_dir: str | os.PathLike,
    settings: WarmstartSettings,
    *,
    threads: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Fine-tune the model in ``model_dir`` on ``conversations`` and save it to ``out_dir``.

    Args:
        model_dir: a Hugging Face causal LM directory with its tokenizer (the tiny Qwen3).
        conversations: chat messages per scripted episode.
        out_dir: where the fine-tuned model and tokenizer are written (replaced if present).
        settings: steps, learning rate, batch size, seed.
        threads: torch CPU threads (the job's threads).
        progress: show a progress bar (on stderr, the job's log).
    Returns:
        Training metrics: first and last losses, per-step losses, tokens, time.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not conversations:
        raise ValueError("no conversation to train on")
    if threads:
        torch.set_num_threads(int(threads))
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train()
    encoded = [encode_conversation(tokenizer, c) for c in conversations]
    if settings.first_turn_examples:
        encoded += [encode_conversation(tokenizer, _first_turn(c)) for c in conversations if _turns(c) > 1]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optim = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.98)
    )
    warmup = max(1, round(settings.warmup_ratio * settings.steps))
    plan = _batches([len(ids) for ids, _ in encoded], settings.batch_size, settings.steps, rng)
    losses: list[float] = []
    started = time.monotonic()
    bar = tqdm(plan, desc="warm start", unit="step", disable=not progress)
    for step, idx in enumerate(bar):
        width = max(len(encoded[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        attn = torch.zeros((len(idx), width), dtype=torch.long)
        labels = torch.full((len(idx), width), -100, dtype=torch.long)
        for row, i in enumerate(idx):  # right padding: positions start at 0 for every row
            seq, mask = encoded[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            attn[row, : len(seq)] = 1
            labels[row, : len(seq)] = torch.tensor([t if m else -100 for t, m in zip(seq, mask, strict=True)])
        for group in optim.param_groups:
            group["lr"] = settings.lr * _schedule(step, settings.steps, warmup)
        loss = _assistant_loss(model, ids, attn, labels)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if step % 25 == 0 or step == settings.steps - 1:
            log.info(
                "step %d/%d: loss %.4f, lr %.2e",
                step + 1,
                settings.steps,
                losses[-1],
                optim.param_groups[0]["lr"],
            )
    bar.close()
    elapsed = time.monotonic() - started
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    metrics = {
        "steps": settings.steps,
        "conversations": len(encoded),
        "tokens": sum(len(ids) for ids, _ in encoded),
        "assistant_tokens": sum(sum(m) for _, m in encoded),
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "losses": losses,
        "train_seconds": round(elapsed, 2),
        "settings": asdict(settings),
    }
    log.info(
        "warm start: %d steps in %.1f s, loss %.3f -> %.3f (%d conversations, %d tokens)",
        settings.steps,
        elapsed,
        metrics["loss_first"],
        metrics["loss_last"],
        len(encoded),
        metrics["tokens"],
    )
    return metrics


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Write ``value`` as indented UTF-8 JSON."""
    Path(path).write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _questions(mix_path, eval_paths, settings: WarmstartSettings) -> list:
    """The questions to script: the training mix, plus the demo world's when configured; never an
    evaluation question (nor, for world questions, anything an evaluation question names)."""
    from spader.core.text import normalize
    from spader.demo.trajectories import load_questions, world_questions
    from spader.evaluation.records import load_eval_set

    excluded = [q for path in eval_paths for q, _ in load_eval_set(path)]
    banned = {normalize(q.question) for q in excluded}
    questions = [q for q in load_questions(mix_path) if normalize(q.question) not in banned]
    if settings.world_questions:
        from spader.demo.world import build_world

        seen = {normalize(q.question) for q in questions}
        for q in world_questions(build_world(), excluded):
            if normalize(q.question) not in seen:
                seen.add(normalize(q.question))
                questions.append(q)
    return questions


def turn_fits(tokenizer, max_turn_tokens: int):
    """``fits(text)``: True when an assistant turn's text fits in the agent's turn budget.

    The loop stops a turn after ``max_turn_tokens`` new tokens; a scripted turn longer than that
    would teach the policy a turn that evaluation cuts short and parses as invalid. One token is
    kept spare: a turn's tokens in context can differ from the text's tokens alone at the edges.

    Args:
        tokenizer: the policy's tokenizer.
        max_turn_tokens: ``agent.max_turn_tokens``.
    Returns:
        The predicate.
    """

    def fits(text: str) -> bool:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 <= max_turn_tokens

    return fits


def _mark_warm(base_dir: Path, out_dir: Path, summary: Mapping[str, Any]) -> None:
    """Keep the tiny-model marker (evaluation reports say the model is tiny) and say what the warm
    start did to it."""
    from spader.models.tiny import TINY_MARKER

    marker = json.loads((base_dir / TINY_MARKER).read_text()) if (base_dir / TINY_MARKER).exists() else {}
    marker.update(
        {
            "note": "tiny model, warm-started by supervised fine-tuning on scripted demo episodes; "
            "its scores only show that the pipeline runs",
            "warmstart": {k: summary[k] for k in ("settings", "conversations", "loss_last", "train_seconds")},
        }
    )
    write_json(out_dir / TINY_MARKER, marker)


def warmstart_policy(
    mix_path: str | os.PathLike,
    eval_paths: Sequence[str | os.PathLike],
    index_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    out_model: str | os.PathLike,
    out_trajectories: str | os.PathLike,
    out_summary: str | os.PathLike,
    *,
    warmstart: Mapping[str, Any],
    agent: Mapping[str, Any],
    retrieval: Mapping[str, Any],
    prompt: Mapping[str, Any] | None = None,
    threads: int | None = None,
    service_log: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """What rule ``warmstart_policy`` runs: script episodes against the retrieval service, then
    fine-tune the tiny model on them.

    Args:
        mix_path: the training mix (``results/{suite}/data/mix/train.jsonl``).
        eval_paths: the evaluation sets (their questions and answers are never scripted).
        index_dir: the BM25 index the retrieval service serves.
        model_dir: the tiny model to warm-start (it must carry the tiny-model marker).
        out_model: the warm-started model directory.
        out_trajectories: the scripted episodes (JSON Lines, kept or not).
        out_summary: settings, counts, losses and times (JSON).
        warmstart: ``backbones.<name>.warmstart``; agent: ``config["agent"]`` (observation
            budget); retrieval: retrieval settings with the service block; prompt: the rule's
            prompt-template param.
        threads: the job's CPU threads (shared with the service while scripting).
        service_log: the retrieval service's log file.
    Returns:
        The summary.
    Raises:
        ValueError: the model is not a tiny one, or no scripted episode shows a gold entity.
    """
    from spader.agent.search import RetrievalSearch
    from spader.core.prompt import checked_template
    from spader.demo.trajectories import script_trajectories
    from spader.models.tiny import is_tiny
    from spader.retrieval.client import RetrievalClient
    from spader.retrieval.service import running_service

    if not is_tiny(model_dir):
        raise ValueError(
            f"{model_dir}: only tiny models are warm-started (real backbones are used as released)"
        )
    from transformers import AutoTokenizer

    settings = WarmstartSettings.from_config(warmstart)
    template = checked_template(prompt)
    fits = turn_fits(AutoTokenizer.from_pretrained(str(model_dir)), int(agent.get("max_turn_tokens", 1024)))
    questions = _questions(mix_path, eval_paths, settings)
    service = dict(retrieval.get("service") or {})
    started = time.monotonic()
    with (
        running_service(index_dir, dict(retrieval), log_path=service_log, threads=threads) as url,
        RetrievalClient(
            url, timeout=service.get("request_timeout_s", 120), retries=service.get("retries", 3)
        ) as client,
    ):
        search = RetrievalSearch(
            client,
            topk=int(retrieval.get("topk", 5)),
            max_query_chars=int(service.get("max_query_chars", 1000)),
            max_queries_per_request=int(service.get("max_queries_per_request", 512)),
        )
        trajectories = script_trajectories(
            questions,
            search,
            max_tool_response_chars=int(agent.get("max_tool_response_chars", 11000)),
            max_query_chars=int(service.get("max_query_chars", 1000)),
            max_searches=settings.max_searches,
            template=template,
            fits=fits,
        )
    script_seconds = time.monotonic() - started
    kept = [t for t in trajectories if t.kept]
    if not kept:
        raise ValueError(
            f"none of the {len(trajectories)} scripted episodes shows a gold entity: nothing to learn"
        )
    with open(out_trajectories, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_json(), ensure_ascii=False) + "\n")
    metrics = train_warmstart(model_dir, [t.messages for t in kept], out_model, settings, threads=threads)
    summary = {
        **metrics,
        "questions": len(questions),
        "kept_fraction": len(kept) / len(trajectories),
        "script_seconds": round(script_seconds, 2),
        "base_model": str(model_dir),
        "tiny_model": True,
    }
    _mark_warm(Path(model_dir), Path(out_model), summary)
    write_json(out_summary, summary)
    return summary
