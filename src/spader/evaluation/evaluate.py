"""Evaluate one method (a prompting baseline or a trained variant) on one dataset.

:func:`evaluate_method` is the core (an engine and a search function in, records and a summary
out); :func:`evaluate_policy` is what rule ``evaluate_policy`` runs: it starts the retrieval
service for the job's duration, builds the engine named by ``evaluation.engine`` and writes the
per-instance JSONL and the summary JSON.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spader.agent.loop import AgentSettings, Question, SearchFn, run_episodes
from spader.agent.search import RetrievalSearch
from spader.core.prompt import PromptTemplate, checked_template
from spader.evaluation.backends import build_engine
from spader.evaluation.episodes import episode_record, load_eval_set, summarize, write_jsonl
from spader.models.local import is_tiny

log = logging.getLogger(__name__)

__all__ = ["TINY_NOTE", "evaluate_method", "evaluate_policy"]

TINY_NOTE = (
    "TINY RANDOM MODEL: the policy is a tiny randomly initialised model (the demo's is warm-started for a "
    "minute on scripted episodes); these scores are meaningless"
)


def evaluate_method(
    items: Sequence[tuple[Question, str]],
    engine,
    search: SearchFn,
    settings: AgentSettings,
    *,
    method: str,
    progress: bool = True,
    template: PromptTemplate | None = None,
) -> list[dict[str, Any]]:
    """Run and score every instance; failures are kept as zeros (see ``records``).

    All episodes advance together, turn by turn: each turn is one engine call (the transformers
    engine batches it by ``batch_size``, sglang schedules it itself) and one search request.

    Args:
        items: ``(question, data_source)`` pairs (from :func:`load_eval_set`).
        engine: generation engine; search: batched search function.
        settings: loop budgets and decoding; method: ``rag``, ``react`` or a trained variant.
        template: the user-prompt template (default: the project's).
    Returns:
        One record per instance, in input order.
    """
    questions = [q for q, _ in items]
    episodes = run_episodes(
        questions, engine, search, settings, method=method, progress=progress, template=template
    )
    records = [episode_record(ep, source) for ep, (_, source) in zip(episodes, items, strict=True)]
    return records


def _service_and_client():
    """The retrieval service API. Imported here so the agent and the scoring code do
    not depend on pyserini/FlagEmbedding."""
    try:
        from spader.retrieval.client import RetrievalClient
        from spader.retrieval.service import running_service
    except ImportError as exc:
        raise RuntimeError(
            "rule evaluate_policy needs the retrieval service (spader.retrieval.service.running_service and "
            f"spader.retrieval.client.RetrievalClient), which cannot be imported: {exc}"
        ) from exc
    return running_service, RetrievalClient


def evaluate_policy(
    records_path: str | os.PathLike,
    index_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    out_records: str | os.PathLike,
    out_summary: str | os.PathLike,
    *,
    method: str,
    evaluation: Mapping[str, Any],
    retrieval: Mapping[str, Any],
    agent: Mapping[str, Any] | None = None,
    prompt: Mapping[str, Any] | None = None,
    threads: int | None = None,
    service_log: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Evaluate ``method`` with the policy in ``model_dir`` on one evaluation set.

    Args:
        records_path: the evaluation set JSONL.
        index_dir: the BM25 index served by the retrieval service.
        model_dir: the policy (the backbone for ``rag``/``react``, the exported checkpoint for a
            trained variant).
        out_records, out_summary: per-instance JSONL and summary JSON to write.
        evaluation: ``config["evaluation"]``; retrieval: ``config["retrieval"]`` (reranker resolved
            to a local ``path``).
        agent: ``config["agent"]``, the turn settings shared with training.
        prompt: ``{"path": template file or None, "version": its hash}`` (the rule's param); the
            file's hash must still be ``version`` (an edit after the DAG was built fails here).
        threads: CPU threads of the job (shared by the service).
        service_log: where the retrieval service writes its log.
    Returns:
        The summary.
    """
    service = dict(retrieval.get("service", {}))
    # queries are cut to what the service accepts, as training's search tool does
    settings = dataclasses.replace(
        AgentSettings.from_config(evaluation, agent),
        max_query_chars=int(service.get("max_query_chars", 1000)),
    )
    template = checked_template(prompt)
    items = load_eval_set(records_path)
    tiny = is_tiny(model_dir)
    if tiny:
        log.warning("%s (%s)", TINY_NOTE, model_dir)
    running_service, RetrievalClient = _service_and_client()
    started = time.monotonic()
    name = evaluation.get("engine", "transformers")
    load = functools.partial(
        build_engine,
        name,
        model_dir,
        gpus=int(evaluation.get("gpus", 0)),
        batch_size=int(evaluation.get("batch_size", 8)),
        mem_fraction=float(evaluation.get("gpu_memory_utilization", 0.7)),
        context_length=settings.max_context_tokens,
        seed=settings.seed,
        # the search service's process shares the job's cores; torch's thread pool degrades
        # badly when its threads outnumber the cores it gets (measured in bench/eval.py)
        threads=max(1, int(threads) - 1) if threads else None,
    )
    # The transformers model loads in a thread while the search service starts (both take
    # seconds of imports); sglang is built first, in the main thread (it installs signal handlers
    # and takes its fixed share of GPU memory before the reranker takes what it needs).
    loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-load")
    pending = loader.submit(load) if name == "transformers" else None
    engine = None if pending is not None else load()
    try:
        with (
            running_service(index_dir, dict(retrieval), log_path=service_log, threads=threads) as base_url,
            RetrievalClient(
                base_url, timeout=service.get("request_timeout_s", 120), retries=service.get("retries", 3)
            ) as client,
        ):
            if engine is None:
                engine = pending.result()
            search = RetrievalSearch(
                client,
                topk=int(retrieval.get("topk", 5)),
                max_query_chars=int(service.get("max_query_chars", 1000)),
                max_queries_per_request=int(service.get("max_queries_per_request", 512)),
            )
            records = evaluate_method(items, engine, search, settings, method=method, template=template)
    finally:
        loader.shutdown(wait=True)  # a load still in flight (the service failed first) ends here
        if engine is None and pending is not None and pending.exception() is None:
            engine = pending.result()
        if engine is not None:
            engine.close()
    summary = summarize(
        records,
        method=method,
        dataset=Path(records_path).stem,
        engine=engine.name,
        model_dir=str(model_dir),
        tiny_model=tiny,
        note=TINY_NOTE if tiny else "",
        prompt_version=template.version,
        prompt_template=template.source,
        settings={**dict(evaluation), "agent": dict(agent or {})},
        search_requests=search.requests,
        elapsed_s=round(time.monotonic() - started, 3),
    )
    write_jsonl(out_records, records)
    Path(out_summary).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info(
        "%s on %s: n=%d P=%.4f R=%.4f F1=%.4f (format valid %.1f%%, %d failed)",
        method,
        summary["dataset"],
        summary["n"],
        summary["precision"],
        summary["recall"],
        summary["f1"],
        100 * summary["format_valid_rate"],
        summary["failed"],
    )
    return summary
