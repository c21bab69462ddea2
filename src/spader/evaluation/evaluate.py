"""Evaluate one method (a prompting baseline or a trained variant) on one dataset.

:func:`evaluate_method` is the core (an engine and a search function in, records and a summary
out); :func:`evaluate_policy` is what rule ``evaluate_policy`` runs: it starts the retrieval
service for the job's duration, builds the engine named by ``evaluation.engine`` and writes the
per-instance JSONL and the summary JSON.

An evaluation fails instead of writing anything when its engine died or failed on more than
``evaluation.max_error_share`` of the episodes (:class:`EvaluationFailed`, naming the engine, the
share and the job's log): scores computed over the episodes left would look like a result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spader.agent.loop import AgentSettings, GenerationFailure, Question, SearchFn, run_episodes
from spader.agent.search import RetrievalSearch
from spader.config.model import AgentConfig, EvaluationConfig
from spader.core.prompt import PromptTemplate, load_template
from spader.evaluation.engines import build_engine
from spader.evaluation.episodes import episode_record, load_eval_set, summarize, write_jsonl
from spader.infra.node import Needs, Node, check_here
from spader.models.local import is_tiny
from spader.retrieval.backend import SearchSettings
from spader.retrieval.service import connected_client

log = logging.getLogger(__name__)

__all__ = [
    "GENERATION_CONFIG_KEYS",
    "TINY_NOTE",
    "EvaluationFailed",
    "check_generation_errors",
    "evaluate_method",
    "evaluate_policy",
    "evaluate_seeds",
    "generation_config_sampling",
    "loop_settings",
    "service_search",
]

TINY_NOTE = (
    "TINY RANDOM MODEL: the policy is a tiny randomly initialised model (the demo's is warm-started for "
    "two minutes on scripted episodes); these scores are meaningless"
)


#: Sampling fields a checkpoint's generation_config.json sets for requests that leave them unset
#: (vLLM's ``--generation-config auto``, its default since 0.8: ``get_diff_sampling_param``).
#: Temperature is not among them here: the authors' evaluation sets it on every request.
GENERATION_CONFIG_KEYS = {"top_k": int, "top_p": float, "min_p": float, "repetition_penalty": float}


def generation_config_sampling(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The sampling fields of ``<model_dir>/generation_config.json`` (:data:`GENERATION_CONFIG_KEYS`);
    empty without the file.

    Raises:
        ValueError: the file is not a JSON object or a field has the wrong type (names the file).
    """
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        log.warning(
            "evaluation.generation_config: %s has no generation_config.json; sampling as configured",
            model_dir,
        )
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    out = {}
    for key, kind in GENERATION_CONFIG_KEYS.items():
        if data.get(key) is None:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path}: field '{key}' must be a number, got {value!r}")
        out[key] = kind(value)
    return out


def loop_settings(
    evaluation: EvaluationConfig, agent: AgentConfig, service, model_dir: str | os.PathLike
) -> AgentSettings:
    """The agent loop's settings of one evaluation job: the ``agent`` and ``evaluation`` sections,
    queries cut to what the search ``service`` accepts (as training's search tool cuts them), and
    with ``evaluation.generation_config`` the sampling fields of the policy's
    generation_config.json (:func:`generation_config_sampling`, as vLLM fills what the authors'
    requests left unset)."""
    settings = AgentSettings.from_config(evaluation, agent, service)
    if evaluation.generation_config:
        defaults = generation_config_sampling(model_dir)
        log.info("sampling from %s/generation_config.json: %s", model_dir, defaults)
        settings = dataclasses.replace(settings, **defaults)
    return settings


class EvaluationFailed(RuntimeError):
    """The evaluation's engine died or failed on too many episodes; nothing was written."""


def check_generation_errors(
    records: Sequence[dict[str, Any]], *, engine: str, max_error_share: float, log_path: str | None = None
) -> None:
    """Fail when more than ``max_error_share`` of the records were lost to generation errors.

    Raises:
        EvaluationFailed: naming the engine, the share and the job's log.
    """
    n = len(records)
    failed = sum(rec["status"] == "generation_error" for rec in records)
    if n and failed > max_error_share * n:
        where = f"; see {log_path}" if log_path else ""
        raise EvaluationFailed(
            f"engine {engine!r}: {failed} of {n} episodes ({failed / n:.1%}) ended in a generation error, "
            f"more than evaluation.max_error_share={max_error_share}; no records were written{where}"
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
    metrics: str = "spader",
) -> list[dict[str, Any]]:
    """Run and score every instance; failures are kept as zeros (see ``records``).

    All episodes advance together, turn by turn: each turn is one engine call (the transformers
    engine batches it by ``batch_size``, sglang schedules it itself) and one search request.

    Args:
        items: ``(question, data_source)`` pairs (from :func:`load_eval_set`).
        engine: generation engine; search: batched search function.
        settings: loop budgets and decoding; method: ``rag``, ``react`` or a trained variant.
        template: the user-prompt template (default: the project's).
        metrics: how an instance is scored (``evaluation.metrics``: ``spader`` or ``authors``).
    Returns:
        One record per instance, in input order.
    """
    questions = [q for q, _ in items]
    episodes = run_episodes(
        questions, engine, search, settings, method=method, progress=progress, template=template
    )
    return [episode_record(ep, source, metrics) for ep, (_, source) in zip(episodes, items, strict=True)]


def evaluate_seeds(
    items: Sequence[tuple[Question, str]],
    engine,
    search: SearchFn,
    settings: AgentSettings,
    *,
    method: str,
    seeds: Sequence[int] | None = None,
    template: PromptTemplate | None = None,
    metrics: str = "spader",
) -> list[dict[str, Any]]:
    """:func:`evaluate_method` once per sampling seed (``evaluation.seeds``; None: the settings'
    seed alone). With seeds, every record carries its ``seed``: the tables average each question
    over its seeds and report the spread of the scores over seeds."""
    scored = {"method": method, "template": template, "metrics": metrics}
    if not seeds:
        return evaluate_method(items, engine, search, settings, **scored)
    records: list[dict[str, Any]] = []
    for seed in seeds:
        seeded = dataclasses.replace(settings, seed=int(seed))
        run = evaluate_method(items, engine, search, seeded, **scored)
        records += [{**r, "seed": int(seed)} for r in run]
        log.info("%s, seed %d: F1 %.4f", method, seed, sum(r["f1"] for r in run) / max(1, len(run)))
    return records


@contextlib.contextmanager
def service_search(
    index_dir: str | os.PathLike,
    search: SearchSettings,
    *,
    log_path: str | os.PathLike | None = None,
    threads: int | None = None,
) -> Iterator[RetrievalSearch]:
    """The agent's search tool (:class:`RetrievalSearch`) against a retrieval service started for
    the block, queries cut and batched as the service accepts them (training's search tool does
    the same)."""
    with connected_client(index_dir, search, log_path=log_path, threads=threads) as client:
        yield RetrievalSearch(
            client,
            topk=search.topk,
            max_query_chars=search.max_query_chars,
            max_queries_per_request=search.max_queries_per_request,
        )


def evaluate_policy(
    records_path: str | os.PathLike,
    index_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    out_records: str | os.PathLike,
    out_summary: str | os.PathLike,
    *,
    method: str,
    evaluation: EvaluationConfig,
    retrieval: SearchSettings,
    agent: AgentConfig | None = None,
    prompt: PromptTemplate | None = None,
    threads: int | None = None,
    service_log: str | os.PathLike | None = None,
    job_log: str | os.PathLike | None = None,
    needs: Needs | None = None,
    measure: Callable[..., Node] | None = None,
) -> dict[str, Any]:
    """Evaluate ``method`` with the policy in ``model_dir`` on one evaluation set, once the node
    holds what the job needs (before any model loads; else a one-line PreflightError).

    Args:
        records_path: the evaluation set JSONL.
        index_dir: the BM25 index served by the retrieval service.
        model_dir: the policy (the backbone for ``rag``/``react``, the exported checkpoint for a
            trained variant).
        out_records, out_summary: per-instance JSONL and summary JSON to write.
        evaluation: the ``evaluation`` section, its context budget resolved
            (:meth:`spader.config.Config.evaluation_params`); retrieval: the search and service
            settings (reranker resolved to a local directory).
        agent: the ``agent`` section, the turn settings shared with training.
        prompt: the user-prompt template the job was planned with (the rule's prompt param through
            :func:`spader.core.prompt.checked_template`; default: the project's).
        threads: CPU threads of the job (shared by the service).
        service_log: where the retrieval service writes its log.
        job_log: the job's log (named in the error of a failed evaluation).
        needs, measure: its node's needs (default: ``evaluation.gpus`` GPUs), how it is measured.
    Returns:
        The summary.
    Raises:
        EvaluationFailed: the engine died or failed on more than ``evaluation.max_error_share`` of
            the episodes (nothing is written).
    """
    check_here(needs or Needs(f"evaluate {method}", gpus=evaluation.gpus), Path(out_records).parent, measure=measure)  # fmt: skip
    agent = agent or AgentConfig()
    settings = loop_settings(evaluation, agent, retrieval, model_dir)  # queries cut as training's are
    template = prompt or load_template(role=agent.prompt_role)
    items, tiny = load_eval_set(records_path), _tiny(model_dir)
    started = time.monotonic()
    records, requests, engine = _checked_episodes(
        items, evaluation, model_dir, settings, index_dir, retrieval, method, template,
        threads=threads, service_log=service_log, log_path=str(job_log) if job_log else None,
    )  # fmt: skip
    summary = _summary(
        records, method, Path(records_path).stem, engine.name, model_dir, tiny, template,
        evaluation, agent, settings, requests, started,
    )  # fmt: skip
    _write_outputs(records, summary, out_records, out_summary)
    return summary


def _tiny(model_dir: str | os.PathLike) -> bool:
    """Whether the policy is a tiny random model (said in the log and the summary)."""
    tiny = is_tiny(model_dir)
    if tiny:
        log.warning("%s (%s)", TINY_NOTE, model_dir)
    return tiny


def _checked_episodes(
    items: list[tuple[Question, str]],
    evaluation: EvaluationConfig,
    model_dir: str | os.PathLike,
    settings: AgentSettings,
    index_dir: str | os.PathLike,
    retrieval: SearchSettings,
    method: str,
    template: PromptTemplate,
    *,
    threads: int | None,
    service_log: str | os.PathLike | None,
    log_path: str | None,
):
    """``(records, search requests, engine)``: the episodes run beside the search service, the
    engine closed after; raises when more generations failed than ``max_error_share`` allows."""
    engine_load = _EngineLoad(evaluation, model_dir, settings, threads)
    try:
        records, requests = _episodes_beside_the_service(
            items, engine_load, index_dir, retrieval, settings,
            method=method, template=template, seeds=evaluation.seeds, metrics=evaluation.metrics,
            threads=threads, service_log=service_log, log_path=log_path,
        )  # fmt: skip
    finally:
        engine = engine_load.close()
    check_generation_errors(
        records, engine=engine.name, max_error_share=evaluation.max_error_share, log_path=log_path
    )
    return records, requests, engine


def _summary(
    records: list[dict[str, Any]],
    method: str,
    dataset: str,
    engine: str,
    model_dir: str | os.PathLike,
    tiny: bool,
    template: PromptTemplate,
    evaluation: EvaluationConfig,
    agent: AgentConfig,
    settings: AgentSettings,
    requests,
    started: float,
) -> dict[str, Any]:
    """The evaluation's summary: its scores (:func:`summarize`), settings and provenance."""
    return summarize(
        records,
        method=method,
        dataset=dataset,
        engine=engine,
        model_dir=str(model_dir),
        tiny_model=tiny,
        note=TINY_NOTE if tiny else "",
        prompt_version=template.version,
        prompt_template=template.source,
        settings={**evaluation.model_dump(), "agent": agent.model_dump()},
        sampling={
            k: v for k, v in dataclasses.asdict(settings.sampling).items() if k not in ("stop", "seed")
        },
        search_requests=requests,
        elapsed_s=round(time.monotonic() - started, 3),
    )


class _EngineLoad:
    """The policy's inference engine, loaded while the search service starts.

    The transformers model loads in a thread while the service starts (both take seconds of
    imports); sglang is built at once, in the main thread (it installs signal handlers and takes
    its fixed share of GPU memory before the reranker takes what it needs).
    """

    def __init__(self, evaluation: EvaluationConfig, model_dir, settings: AgentSettings, threads: int | None):
        load = functools.partial(
            build_engine,
            evaluation.engine,
            model_dir,
            gpus=evaluation.gpus,
            batch_size=evaluation.batch_size,
            mem_fraction=evaluation.gpu_memory_utilization,
            context_length=settings.max_context_tokens,
            seed=settings.seed,
            # the search service's process shares the job's cores; torch's thread pool degrades
            # badly when its threads outnumber the cores it gets (measured in bench/eval.py)
            threads=max(1, int(threads) - 1) if threads else None,
        )
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-load")
        self._pending = self._loader.submit(load) if evaluation.engine == "transformers" else None
        self._engine = None if self._pending is not None else load()

    def get(self):
        """The engine (waits for a load still in flight)."""
        if self._engine is None:
            self._engine = self._pending.result()
        return self._engine

    def close(self):
        """Wait for a load still in flight (the service may have failed first), close the engine,
        and return it (its name goes into the summary)."""
        self._loader.shutdown(wait=True)
        if self._engine is None and self._pending is not None and self._pending.exception() is None:
            self._engine = self._pending.result()
        if self._engine is not None:
            self._engine.close()
        return self._engine


def _episodes_beside_the_service(
    items, engine_load: _EngineLoad, index_dir, retrieval: SearchSettings, settings: AgentSettings,
    *, method: str, template: PromptTemplate, seeds, metrics: str, threads, service_log, log_path,
) -> tuple[list[dict], int]:  # fmt: skip
    """Start the job's retrieval service, run every episode against it, stop it.

    Returns:
        The episode records and the number of search requests sent.
    Raises:
        EvaluationFailed: the engine failed in a way that leaves no usable record.
    """
    with service_search(index_dir, retrieval, log_path=service_log, threads=threads) as search:
        engine = engine_load.get()
        try:
            records = evaluate_seeds(
                items,
                engine,
                search,
                settings,
                method=method,
                template=template,
                seeds=seeds,
                metrics=metrics,
            )
        except GenerationFailure as exc:
            where = f"; see {log_path}" if log_path else ""
            raise EvaluationFailed(f"{exc}; no records were written{where}") from exc
    return records, search.requests


def _write_outputs(records: list[dict], summary: dict, out_records, out_summary) -> None:
    write_jsonl(out_records, records)
    Path(out_summary).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info(
        "%s on %s: n=%d P=%.4f R=%.4f F1=%.4f (format valid %.1f%%, %d failed, %d cut by a token budget)",
        summary["method"],
        summary["dataset"],
        summary["n"],
        summary["precision"],
        summary["recall"],
        summary["f1"],
        100 * summary["format_valid_rate"],
        summary["failed"],
        summary["budget_cut"],
    )
