"""The search tool of training: a verl ``BaseTool`` over the retrieval service.

One call = one search step of a trajectory. The tool runs the step's queries in one batched
request (``spader.retrieval.client.RetrievalClient``), renders the observation with
``spader.core.prompt.format_observation`` (the text evaluation shows too), keeps it within the
character budget by dropping the lowest-ranked passages first, and records what the *shown*
passages contain: a :class:`spader.methods.steps.StepRecord` (turn, number of queries, ground-truth
entities hit by :func:`spader.core.matching.find_hits`) appended to the trajectory's
``agent_data.extra_fields`` under :data:`spader.methods.steps.STEPS_KEY`. Matching runs on passage titles
and texts only, never on the queries the agent wrote; with ``discovery: substring``
(``training.divergences.discovery``, the authors' code) an alias anywhere in the whole observation
text counts instead (:func:`spader.core.matching.authors_text_hits`), the queries it echoes included.

The ground-truth entities come in ``create_kwargs["entities"]`` (the ``spader_tool_agent`` loop
fills it from the row's ``reward_model.ground_truth``). verl's ``ToolAgentLoop`` calls
``create -> execute -> release`` for every call.

In the authors' observation format (``observation_format: authors``) the observation is their
search server's JSON (:func:`spader.core.prompt.fit_authors_observation`, as their training tool
shows it) and an error their tool's or parser's message (:func:`spader.core.prompt.error_observation`),
as their training shows it when the ``spader_authors`` parser hands it over (``observation``:
:func:`spader.core.parsing.authors_training_call`).

Tool YAML ``config`` keys (see :mod:`.tool_config`): ``retrieval_service_url`` (one service) or
``retrieval_service_urls`` (host name -> URL: one replica per node of a multi-node job, each on its
node's loopback; the tool uses the one of the host it runs on), ``topk``, ``initial_k``,
``timeout``, ``retries``, ``max_queries_per_call`` (null: no cap), ``max_queries_per_request``,
``max_query_chars``, ``max_chars``, ``record_turns``, ``observation_format``, ``discovery``,
``denominator`` (``training.divergences.denominator``: ``|E_GT|`` of the step rewards, each gold
entity once or every entry of the gold list, :func:`spader.core.matching.discovery_gold`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from spader.core.matching import DENOMINATORS, DISCOVERY, authors_text_hits, discovery_gold, passage_hits
from spader.core.prompt import (
    OBSERVATION_FORMATS,
    error_observation,
    fit_authors_observation,
    fit_observation,
)
from spader.integrations.verl.tool_config import TOOL_SCHEMA
from spader.methods.r3rag.scoring import turn_reasoning
from spader.methods.steps import FINAL_TURN_KEY, N_GOLD_KEY, STEPS_KEY, StepRecord, TurnDetails

__all__ = ["SearchTool", "as_alias_lists", "service_url"]

#: How a step record's ``error`` begins when the search service failed or could not be reached
#: (not the policy's malformed call): what ``episode/search_errors`` counts.
SERVICE_ERROR = "search service unavailable"

log = logging.getLogger(__name__)


def as_alias_lists(entities: Any) -> list[list[str]]:
    """Ground-truth entities as ``list[list[str]]`` (parquet read-back gives numpy arrays)."""
    if entities is None:
        raise ValueError(
            "the search tool needs the question's ground-truth entities (create_kwargs['entities'])"
        )
    out = []
    for aliases in entities:
        if isinstance(aliases, str):
            out.append([aliases])
        else:
            out.append([str(a) for a in aliases])
    return out


def service_url(config: Mapping[str, Any], host: str | None = None) -> str:
    """The retrieval service this tool instance talks to: ``retrieval_service_url``, or the entry
    of ``host`` (default: this machine's host name) in ``retrieval_service_urls``.

    Raises:
        ValueError: neither key, or no replica for ``host`` (a worker on a node where the job
            started none would otherwise fail every search).
    """
    urls = config.get("retrieval_service_urls")
    if urls:
        if not isinstance(urls, Mapping):
            raise ValueError(
                f"search tool config: 'retrieval_service_urls' must map host names to URLs, got {urls!r}"
            )
        host = host or socket.gethostname()
        if host not in urls:
            raise ValueError(
                f"search tool config: no retrieval service for host {host!r} in 'retrieval_service_urls' "
                f"(replicas run on {sorted(urls)}); every node with agent-loop workers needs its own"
            )
        return str(urls[host])
    url = config.get("retrieval_service_url")
    if not url:
        raise ValueError("search tool config: missing key 'retrieval_service_url'")
    return str(url)


def _turn_fields(shown, queries, observation: str, extra_fields: Mapping[str, Any] | None) -> dict:
    """What the search tool adds to its step record for a reward that reads the turns
    (:attr:`spader.methods.Reward.record_turns`; :meth:`spader.methods.steps.TurnDetails.fields`).
    The turn's text is the one the agent loop recorded for the turn being executed
    (:data:`spader.methods.steps.FINAL_TURN_KEY`)."""
    text = str((extra_fields or {}).get(FINAL_TURN_KEY) or "")
    return TurnDetails.fields(shown, queries, turn_reasoning(text), observation)


def _issued_queries(parameters: Any) -> tuple[list[str], str | None]:
    """The non-blank queries a call issued (stripped, in order, repeats kept) and the error that
    makes the step an error observation instead (None when the queries can run).

    ``parameters`` comes from the ``spader`` tool parser, which already rejects what cannot be a
    list of query strings; anything else reaching the tool (a hand-written tool config, another
    parser) is checked again here, so no value can make the HTTP request itself fail.
    """
    if not isinstance(parameters, dict):
        return [], "the tool call arguments must be an object with a 'queries' list"
    if parameters.get("error"):
        return [], str(parameters["error"])
    raw = parameters.get("queries") or []
    if not isinstance(raw, list) or not all(isinstance(q, str) for q in raw):
        return [], "the tool call must be a JSON list of query strings"
    issued = [q.strip() for q in raw if q.strip()]
    try:
        for q in issued:
            q.encode("utf-8")
    except UnicodeEncodeError:
        return [], "the tool call must be a JSON list of query strings"
    if not issued:
        return [], "the tool call contains no non-empty query"
    return issued, None


class SearchTool(BaseTool):
    """verl ``BaseTool``: runs one search step and records its ground-truth hits."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        from spader.retrieval.client import RetrievalClient

        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA)
        super().__init__(config, tool_schema)

        def setting(key, kind, default=...):
            value = config.get(key, default)
            if value is ...:
                raise ValueError(f"search tool config: missing key '{key}'")
            try:
                return None if value is None and default is None else kind(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"search tool config: '{key}' must be {kind.__name__}, got {value!r}"
                ) from exc

        url = service_url(config)
        log.info("search tool on %s: retrieval service %s", socket.gethostname(), url)
        self.topk = setting("topk", int, 5)
        self.initial_k = setting("initial_k", int, None)
        self.max_queries = setting("max_queries_per_call", int, None)
        self.max_queries_per_request = setting("max_queries_per_request", int, 512)
        self.max_query_chars = setting("max_query_chars", int, 1000)
        self.max_chars = setting("max_chars", int)
        self.observation_format = setting("observation_format", str, "spader")
        if self.observation_format not in OBSERVATION_FORMATS:
            raise ValueError(
                f"search tool config: 'observation_format' must be one of {OBSERVATION_FORMATS}, "
                f"got {self.observation_format!r}"
            )
        self.discovery = setting("discovery", str, "passages")
        if self.discovery not in DISCOVERY:
            raise ValueError(
                f"search tool config: 'discovery' must be one of {DISCOVERY}, got {self.discovery!r}"
            )
        self.denominator = setting("denominator", str, "distinct")
        if self.denominator not in DENOMINATORS:
            raise ValueError(
                f"search tool config: 'denominator' must be one of {DENOMINATORS}, got {self.denominator!r}"
            )
        # the step-level baselines (StepSearch, R3-RAG) also need each turn's passages and text
        self.record_turns = setting("record_turns", bool, False)
        self.client = RetrievalClient(
            url, timeout=setting("timeout", float, 120.0), retries=setting("retries", int, 3)
        )
        # Blocking requests wait in the tool's own threads, as many as the client sends at once:
        # verl runs every episode's tokenizer work in the loop's default executor, which a few
        # dozen searches waiting on the service would otherwise hold.
        self._requests = ThreadPoolExecutor(self.client.connections, thread_name_prefix="search")
        self._instances: dict[str, tuple[list[list[str]], int]] = {}

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start a call; the entities come from ``kwargs['create_kwargs']['entities']``."""
        instance_id = instance_id or str(uuid4())
        create_kwargs = kwargs.get("create_kwargs") or {}
        # the entities discovery indexes (each gold entity once, as the F1 metric counts them; each
        # distinct entry with discovery: substring) and |E_GT| of the step rewards
        self._instances[instance_id] = discovery_gold(
            as_alias_lists(create_kwargs.get("entities")), self.discovery, self.denominator
        )
        return instance_id, ToolResponse()

    async def release(self, instance_id: str, **kwargs) -> None:
        """End a call (verl releases after every call)."""
        self._instances.pop(instance_id, None)

    def _search(self, queries: list[str]) -> list[list[dict]]:
        unique = list(dict.fromkeys(queries))
        results: list[list[dict]] = []
        step = self.max_queries_per_request  # an uncapped call may hold more than one request takes
        for start in range(0, len(unique), step):
            chunk = unique[start : start + step]
            results += self.client.retrieve(chunk, topk=self.topk, initial_k=self.initial_k)
        if len(results) != len(unique):
            raise RuntimeError(
                f"retrieval service returned {len(results)} result lists for {len(unique)} queries"
            )
        by_query = dict(zip(unique, results, strict=False))
        return [by_query[q] for q in queries]

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs
    ) -> tuple[ToolResponse, float, dict]:
        """Run the step's queries; returns the observation, reward 0 (rewards are densified later)
        and metrics. ``parameters`` is ``{"queries": [...]}`` or ``{"queries": [], "error": why}``
        from the ``spader`` tool parser; ``kwargs['agent_data']`` is the trajectory's state."""
        agent_data = kwargs.get("agent_data")
        instance = self._instances.get(instance_id)
        if instance is None:
            raise KeyError(f"search tool instance {instance_id!r} was not created")
        entities, n_gold = instance
        turn = int(getattr(agent_data, "assistant_turns", 0) or 0) if agent_data is not None else 0
        issued, error = _issued_queries(parameters)
        # q_t counts every query the call issued; the ones beyond the per-call cap are not run
        capped = issued if self.max_queries is None else issued[: self.max_queries]
        queries = [q[: self.max_query_chars] for q in capped]
        hits: set[int] = set()
        if error is None:
            try:
                passages = await asyncio.get_running_loop().run_in_executor(
                    self._requests, self._search, queries
                )
                if self.observation_format == "authors":
                    text, shown = fit_authors_observation(queries, passages, self.max_chars)
                else:
                    text, shown = fit_observation(queries, passages, self.max_chars)
                if self.discovery == "passages":
                    hits = passage_hits(shown, entities)
            except Exception as exc:  # noqa: BLE001 (the step becomes an error observation, counted)
                log.warning("search failed for %d queries: %s: %s", len(queries), type(exc).__name__, exc)
                error = f"{SERVICE_ERROR} ({type(exc).__name__})"
        if error is not None:  # the authors' training shows some malformed calls its own way
            shown_as = parameters.get("observation") if isinstance(parameters, dict) else None
            text = error_observation(error, self.observation_format, self.max_chars, shown_as)
        if self.discovery == "substring":  # the authors' reward: the whole observation, queries echoed
            hits = authors_text_hits(text, entities)
        record = StepRecord(turn=max(turn, 1), queries=len(issued), hits=tuple(sorted(hits)), error=error)
        if agent_data is not None:
            entry = record.as_dict()
            if self.record_turns:
                entry.update(
                    _turn_fields(shown if error is None else [], queries, text, agent_data.extra_fields)
                )
            agent_data.extra_fields.setdefault(STEPS_KEY, []).append(entry)
            agent_data.extra_fields[N_GOLD_KEY] = n_gold
        return (
            ToolResponse(text=text),
            0.0,
            {"queries": record.queries, "hits": len(hits), "error": error is not None},
        )
