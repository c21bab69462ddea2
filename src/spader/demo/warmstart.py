"""Supervised warm start of the demo's tiny policy on scripted trajectories.

A randomly initialised policy never writes a valid action, so in the demo every rollout would be
invalid and every reward and advantage equal. The warm start teaches the tiny model the action
format by supervised fine-tuning on scripted episodes of the demo world
(:mod:`spader.demo.trajectories`): plain torch on CPU, seeded, loss on the assistant's tokens only.
Real backbones are never warm-started (the config check allows it for ``tiny:`` models only).

The fine-tuning itself (tokenization through the chat template, assistant-only loss) is
:mod:`spader.demo.sft`; this module scripts the episodes, trains and writes the marked model.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spader.demo.sft import WarmstartSettings, encode_conversation, train_warmstart

if TYPE_CHECKING:
    from spader.config import AgentConfig
    from spader.core.prompt import PromptTemplate
    from spader.retrieval.backend import SearchSettings

log = logging.getLogger(__name__)

__all__ = ["WarmstartSettings", "encode_conversation", "train_warmstart", "turn_fits", "warmstart_policy"]


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Write ``value`` as indented UTF-8 JSON."""
    Path(path).write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _questions(mix_path, eval_paths, settings: WarmstartSettings) -> list:
    """The questions to script: the training mix, plus the demo world's when configured; never an
    evaluation question (nor, for world questions, anything an evaluation question names)."""
    from spader.core.text import normalize
    from spader.demo.trajectories import load_questions, world_questions
    from spader.evaluation.episodes import load_eval_set

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


def _generated(eval_paths, settings: WarmstartSettings, scripting: Mapping[str, Any]) -> list:
    """Episodes of ``settings.generated_worlds`` worlds generated with the seeds after the demo's,
    each searched over its own passages (:class:`spader.demo.trajectories.WorldSearch`)."""
    if not settings.generated_worlds:
        return []
    from spader.demo.trajectories import generated_questions, script_trajectories
    from spader.demo.world import SEED
    from spader.evaluation.episodes import load_eval_set

    excluded = [q for path in eval_paths for q, _ in load_eval_set(path)]
    seeds = [SEED + k for k in range(1, settings.generated_worlds + 1)]
    out = []
    for questions, search in generated_questions(seeds, excluded):
        out += script_trajectories(questions, search, **scripting)
    return out


def turn_fits(tokenizer, max_turn_tokens: int | None):
    """``fits(text)``: True when an assistant turn's text fits in the agent's turn budget.

    The loop stops a turn after ``max_turn_tokens`` new tokens; a scripted turn longer than that
    would teach the policy a turn that evaluation cuts short and parses as invalid. One token is
    kept spare: a turn's tokens in context can differ from the text's tokens alone at the edges.

    Args:
        tokenizer: the policy's tokenizer.
        max_turn_tokens: ``agent.max_turn_tokens`` (None: no per-turn cap, every turn fits).
    Returns:
        The predicate.
    """

    def fits(text: str) -> bool:
        if max_turn_tokens is None:
            return True
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 <= max_turn_tokens

    return fits


def _mark_warm(base_dir: Path, out_dir: Path, summary: Mapping[str, Any]) -> None:
    """Keep the tiny-model marker (evaluation reports say the model is tiny) and say what the warm
    start did to it."""
    from spader.models.local import TINY_MARKER

    marker = json.loads((base_dir / TINY_MARKER).read_text()) if (base_dir / TINY_MARKER).exists() else {}
    marker.update(
        {
            "note": "tiny model, warm-started by supervised fine-tuning on scripted demo episodes; "
            "its scores only show that the pipeline runs",
            "warmstart": {k: summary[k] for k in ("settings", "conversations", "loss_last", "train_seconds")},
        }
    )
    write_json(out_dir / TINY_MARKER, marker)


def _scripting(model_dir, warmstart: WarmstartSettings, agent, retrieval, prompt) -> dict[str, Any]:
    """The keyword arguments of :func:`spader.demo.trajectories.script_trajectories`: the agent's
    observation and turn budgets (the model's tokenizer), the service's query limit, the template."""
    from transformers import AutoTokenizer

    from spader.core.prompt import load_template

    template = prompt or load_template(role=agent.prompt_role)
    return {
        "max_tool_response_chars": agent.max_tool_response_chars,
        "max_query_chars": retrieval.max_query_chars,
        "max_searches": warmstart.max_searches,
        "retry_when": warmstart.retry,
        "template": template,
        "fits": turn_fits(AutoTokenizer.from_pretrained(str(model_dir)), agent.max_turn_tokens),
    }


def _script(questions, eval_paths, index_dir, warmstart, retrieval, scripting, threads, service_log):
    """``(trajectories, generated, seconds)``: the episodes of ``questions`` scripted against the
    retrieval service, then those of the generated worlds (``generated``, also in ``trajectories``)."""
    from spader.demo.trajectories import script_trajectories
    from spader.evaluation.evaluate import service_search

    started = time.monotonic()
    with service_search(index_dir, retrieval, log_path=service_log, threads=threads) as search:
        trajectories = script_trajectories(questions, search, **scripting)
    generated = _generated(eval_paths, warmstart, scripting)
    trajectories += generated
    return trajectories, generated, time.monotonic() - started


def _kept(trajectories) -> list:
    """The episodes that are training data; raises ValueError when there is none."""
    kept = [t for t in trajectories if t.kept]
    if not kept:
        raise ValueError(
            f"none of the {len(trajectories)} scripted episodes shows a gold entity: nothing to learn"
        )
    return kept


def _write_jsonl(path, trajectories) -> None:
    """Write the scripted episodes as JSON Lines."""
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_json(), ensure_ascii=False) + "\n")


def _summary(metrics, questions, generated, kept_fraction: float, script_seconds: float, model_dir):
    """The warm start's summary: the training metrics, the scripting's counts and time."""
    return {
        **metrics,
        "questions": len(questions),
        "generated_questions": len(generated),  # scripted in the generated worlds
        "kept_fraction": kept_fraction,
        "script_seconds": round(script_seconds, 2),
        "base_model": str(model_dir),
        "tiny_model": True,
    }


def warmstart_policy(
    mix_path: str | os.PathLike,
    eval_paths: Sequence[str | os.PathLike],
    index_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    out_model: str | os.PathLike,
    out_trajectories: str | os.PathLike,
    out_summary: str | os.PathLike,
    *,
    warmstart: WarmstartSettings,
    agent: AgentConfig,
    retrieval: SearchSettings,
    prompt: PromptTemplate | None = None,
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
        warmstart: the settings of ``backbones.<name>.warmstart``; agent: the ``agent`` section
            (observation and turn budgets); retrieval: the search and service settings; prompt:
            the user-prompt template (default: the project's).
        threads: the job's CPU threads (shared with the service while scripting).
        service_log: the retrieval service's log file.
    Returns:
        The summary.
    Raises:
        ValueError: the model is not a tiny one, or no scripted episode shows a gold entity.
    """
    from spader.models.local import is_tiny

    if not is_tiny(model_dir):
        raise ValueError(
            f"{model_dir}: only tiny models are warm-started (real backbones are used as released)"
        )
    scripting = _scripting(model_dir, warmstart, agent, retrieval, prompt)
    questions = _questions(mix_path, eval_paths, warmstart)
    trajectories, generated, script_seconds = _script(
        questions, eval_paths, index_dir, warmstart, retrieval, scripting, threads, service_log
    )
    kept = _kept(trajectories)
    _write_jsonl(out_trajectories, trajectories)
    metrics = train_warmstart(model_dir, [t.messages for t in kept], out_model, warmstart, threads=threads)
    summary = _summary(
        metrics, questions, generated, len(kept) / len(trajectories), script_seconds, model_dir
    )
    _mark_warm(Path(model_dir), Path(out_model), summary)
    write_json(out_summary, summary)
    return summary
