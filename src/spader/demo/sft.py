"""Supervised fine-tuning of a causal LM on chat conversations, loss on the assistant's tokens only.

The training routine of the demo's warm start (:mod:`spader.demo.warmstart`): plain torch on CPU,
seeded. Conversations are tokenized through the model's chat template exactly as the agent loop
renders its prompts (:func:`spader.agent.loop.render_prompt`, no ``tools`` argument): an assistant
turn's tokens are what the loop's generation would have to produce after that prompt, up to and
including the end-of-turn token.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from spader.config.model import WarmstartConfig

log = logging.getLogger(__name__)

__all__ = ["WarmstartSettings", "copy_batch", "copy_vocabulary", "encode_conversation", "train_warmstart"]


#: The supervised warm start's settings: the ``backbones.<name>.warmstart`` section itself (the
#: configuration model holds its defaults, bounds and descriptions; ``model_validate`` builds it
#: from a rule's param).
WarmstartSettings = WarmstartConfig


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
    # Rows are right-padded: under causal attention no real token sees a pad, so no padding
    # mask is needed, and without one attention takes its fast causal path.
    del attn
    return _labelled_loss(model, model.get_decoder()(input_ids=ids).last_hidden_state, labels)


def _labelled_loss(model, hidden, labels):
    """Next-token cross-entropy of the decoder's ``hidden`` states at the positions that predict a
    labelled token (the output projection runs on those alone)."""
    import torch.nn.functional as F

    target = labels[:, 1:]
    keep = target != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), target[keep])


def copy_vocabulary(tokenizer) -> list[int]:
    """Token ids of the demo world's name pieces (:func:`spader.demo.world.name_parts`) in every
    form they take in text (as they are, capitalised, followed by a space): what names are made of."""
    from spader.demo.world import name_parts

    special = set(tokenizer.all_special_ids)
    ids: set[int] = set()
    for piece in name_parts():
        for form in (piece, piece + " ", piece.capitalize(), piece.capitalize() + " "):
            ids.update(tokenizer(form, add_special_tokens=False)["input_ids"])
    return sorted(ids - special)


def copy_batch(vocabulary: Sequence[int], batch_size: int, length: int, rng: random.Random):
    """A batch of the copying task: per row, up to ``length // 2`` tokens of noise, then a span of
    ``length // 4`` to ``length // 2`` tokens, then the span again (tokens drawn from ``vocabulary``).

    Returns:
        ``(ids, labels, sources)``, right-padded ``(batch, width)`` tensors: ``labels`` holds the
        repeated span's tokens after its first (the ones an earlier occurrence predicts), -100
        elsewhere; ``sources`` at a position of the repeat holds the position of its token's earlier
        occurrence, -1 elsewhere (and at the last token, which predicts nothing).
    """
    import torch

    rows = []
    for _ in range(batch_size):
        noise = [rng.choice(vocabulary) for _ in range(rng.randint(0, length // 2))]
        span = [rng.choice(vocabulary) for _ in range(rng.randint(max(2, length // 4), length // 2))]
        start = len(noise) + len(span)  # where the repeat begins
        ids = noise + span + span
        labels = [-100] * (start + 1) + span[1:]
        sources = [-1] * start + [p - len(span) for p in range(start, len(ids) - 1)] + [-1]
        rows.append((ids, labels, sources))
    width = max(len(r[0]) for r in rows)
    ids = torch.zeros((batch_size, width), dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    sources = torch.full((batch_size, width), -1, dtype=torch.long)
    for i, (a, b, c) in enumerate(rows):
        ids[i, : len(a)], labels[i, : len(b)], sources[i, : len(c)] = map(torch.tensor, (a, b, c))
    return ids, labels, sources


def _copy_loss(model, ids, labels, sources, attention_weight: float):
    """Next-token loss on the repeated spans, plus (weighted) two attention targets: the first
    layer's first head on the previous token (what lets a later layer find where the current token
    was followed before), the last layer's first head on the current token's earlier occurrence.
    Measured on the demo's tiny model: with these targets it copies spans within a few hundred
    steps; a target on the token after the earlier occurrence was never learned."""
    import torch

    out = model.get_decoder()(input_ids=ids, output_attentions=attention_weight > 0)
    loss = _labelled_loss(model, out.last_hidden_state, labels)
    if attention_weight > 0:
        first, last = out.attentions[0][:, 0], out.attentions[-1][:, 0]  # (batch, query, key)
        previous = first[:, 1:, :].diagonal(dim1=1, dim2=2)  # position t on t - 1
        found = sources >= 0
        earlier = last.gather(2, sources.clamp(min=0).unsqueeze(-1)).squeeze(-1)[found]
        loss = loss - attention_weight * (
            torch.log(previous + 1e-6).mean() + torch.log(earlier + 1e-6).mean()
        )
    return loss


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


def _load_model(model_dir, settings: WarmstartSettings):
    """The tokenizer and the model (in training mode) of ``model_dir``, with eager attention when the
    copying task's attention targets need the attention weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    copying = settings.copy_weight > 0
    # the copying task's attention targets need the attention weights, which only eager returns
    attention = {"attn_implementation": "eager"} if copying and settings.copy_attention_weight > 0 else {}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **attention)
    model.train()
    return tokenizer, model


def _encode_all(tokenizer, conversations, settings: WarmstartSettings) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, loss_mask)`` per conversation, plus per multi-turn one its first turn alone
    when ``settings.first_turn_examples``."""
    encoded = [encode_conversation(tokenizer, c) for c in conversations]
    if settings.first_turn_examples:
        encoded += [encode_conversation(tokenizer, _first_turn(c)) for c in conversations if _turns(c) > 1]
    return encoded


def _padded_batch(encoded, idx: Sequence[int], pad: int):
    """``(ids, attn, labels)`` of the conversations ``idx``, right-padded to the longest."""
    import torch

    width = max(len(encoded[i][0]) for i in idx)
    ids = torch.full((len(idx), width), pad, dtype=torch.long)
    attn = torch.zeros((len(idx), width), dtype=torch.long)
    labels = torch.full((len(idx), width), -100, dtype=torch.long)
    for row, i in enumerate(idx):  # right padding: positions start at 0 for every row
        seq, mask = encoded[i]
        ids[row, : len(seq)] = torch.tensor(seq)
        attn[row, : len(seq)] = 1
        labels[row, : len(seq)] = torch.tensor([t if m else -100 for t, m in zip(seq, mask, strict=True)])
    return ids, attn, labels


def _metrics(settings: WarmstartSettings, encoded, losses: list[float], copy_losses: list[float], elapsed):
    """The training metrics :func:`train_warmstart` returns."""
    return {
        "steps": settings.steps,
        "conversations": len(encoded),
        "tokens": sum(len(ids) for ids, _ in encoded),
        "assistant_tokens": sum(sum(m) for _, m in encoded),
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "losses": losses,
        "copy_loss_first": copy_losses[0] if copy_losses else None,
        "copy_loss_last": sum(copy_losses[-10:]) / len(copy_losses[-10:]) if copy_losses else None,
        "train_seconds": round(elapsed, 2),
        "settings": settings.model_dump(mode="json"),
    }


def _save(model, tokenizer, out_dir) -> None:
    """Write the model (in eval mode) and its tokenizer to ``out_dir``, replacing it if present."""
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


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

    if not conversations:
        raise ValueError("no conversation to train on")
    if threads:
        torch.set_num_threads(int(threads))
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    tokenizer, model = _load_model(model_dir, settings)
    encoded = _encode_all(tokenizer, conversations, settings)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    plan = _batches([len(ids) for ids, _ in encoded], settings.batch_size, settings.steps, rng)
    started = time.monotonic()
    losses, copy_losses = _train(model, tokenizer, encoded, plan, pad, settings, progress)
    elapsed = time.monotonic() - started
    _save(model, tokenizer, out_dir)
    metrics = _metrics(settings, encoded, losses, copy_losses, elapsed)
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


def _train(model, tokenizer, encoded, plan, pad: int, settings: WarmstartSettings, progress: bool):
    """Run the optimisation steps of ``plan`` (batch indices per step); returns the per-step
    assistant losses and copying-task losses (empty without the copying task)."""
    import torch

    copying = settings.copy_weight > 0
    vocabulary = copy_vocabulary(tokenizer) if copying else []
    copy_rng = random.Random(settings.seed + 1)
    optim = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.98)
    )
    warmup = max(1, round(settings.warmup_ratio * settings.steps))
    losses: list[float] = []
    copy_losses: list[float] = []
    bar = tqdm(plan, desc="warm start", unit="step", disable=not progress)
    for step, idx in enumerate(bar):
        for group in optim.param_groups:
            group["lr"] = settings.lr * _schedule(step, settings.steps, warmup)
        loss = _assistant_loss(model, *_padded_batch(encoded, idx, pad))
        losses.append(float(loss.detach()))
        if copying:
            batch = copy_batch(vocabulary, settings.copy_batch_size, settings.copy_length, copy_rng)
            copy = _copy_loss(model, *batch, settings.copy_attention_weight)
            copy_losses.append(float(copy.detach()))
            loss = loss + settings.copy_weight * copy
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
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
    return losses, copy_losses
