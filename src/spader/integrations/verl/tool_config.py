"""The ``multi_turn.tool_config_path`` YAML naming the SPADER search tool."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["TOOL_CLASS", "TOOL_NAME", "TOOL_SCHEMA", "write_tool_config"]

TOOL_CLASS = "spader.integrations.verl.search_tool.SearchTool"
TOOL_NAME = "search"

#: OpenAI function schema of the tool. The chat template never sees it (the ``spader_tool_agent``
#: loop hides tool schemas: the user prompt describes the protocol); verl uses the name.
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Search Wikipedia; returns the top passages of every query.",
        "parameters": {
            "type": "object",
            "properties": {"queries": {"type": "array", "description": "search queries (strings)"}},
            "required": ["queries"],
        },
    },
}


def _service_urls(service_url: str | Mapping[str, str]) -> dict[str, str]:
    """The service URLs by host name (``""`` for a single URL); raises unless all are http(s)."""
    urls = {"": service_url} if isinstance(service_url, str) else dict(service_url)
    if not urls or not all(
        isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls.values()
    ):
        raise ValueError(
            f"service_url must be an http(s) URL or a mapping of host names to them, got {service_url!r}"
        )
    return urls


def _retrieval_settings(retrieval: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's search settings read from ``config["retrieval"]`` (KeyError for a missing key)."""
    return {
        "topk": int(retrieval["topk"]),
        "initial_k": int(retrieval["initial_k"]),
        "timeout": float(retrieval["service"]["request_timeout_s"]),
        "retries": int(retrieval["service"]["retries"]),
        "max_query_chars": int(retrieval["service"]["max_query_chars"]),
        "max_queries_per_request": int(retrieval["service"]["max_queries_per_request"]),
    }


def write_tool_config(
    path: str | os.PathLike,
    *,
    service_url: str | Mapping[str, str],
    retrieval: Mapping[str, Any],
    max_queries_per_call: int | None,
    max_chars: int,
    record_turns: bool = False,
    observation_format: str = "spader",
    discovery: str = "passages",
    denominator: str = "distinct",
) -> Path:
    """Write verl's tool YAML for :class:`spader.integrations.verl.search_tool.SearchTool`.

    Args:
        path: where to write the YAML (parent directories are created).
        service_url: base URL of the retrieval service (``http://127.0.0.1:<port>``), or one per
            node of a multi-node job (host name -> URL; every tool instance uses its host's).
        retrieval: the workflow's ``config["retrieval"]`` (``topk``, ``initial_k``,
            ``service.request_timeout_s``, ``service.retries``, ``service.max_query_chars``).
        max_queries_per_call: queries of one tool call beyond this are not run (``agent.max_queries_per_call``;
            None: all run).
        max_chars: observation budget in characters (``training.max_tool_response_chars``; give
            verl's ``multi_turn.max_tool_response_length`` at least this value so it never cuts).
        record_turns: also record each turn's passages and text (the StepSearch and R3-RAG rewards).
        observation_format, discovery, denominator: ``agent.observation_format``,
            ``training.divergences.discovery`` and ``.denominator``.
    Returns:
        The written path.
    """
    urls = _service_urls(service_url)
    if int(max_chars) < 1 or (max_queries_per_call is not None and int(max_queries_per_call) < 1):
        raise ValueError(
            f"max_chars and max_queries_per_call must be >= 1, got {max_chars}, {max_queries_per_call}"
        )
    try:
        config = {
            "type": "native",
            **(
                {"retrieval_service_url": service_url}
                if isinstance(service_url, str)
                else {"retrieval_service_urls": dict(sorted(urls.items()))}
            ),
            **_retrieval_settings(retrieval),
            "max_queries_per_call": None if max_queries_per_call is None else int(max_queries_per_call),
            "max_chars": int(max_chars),
            "record_turns": bool(record_turns),
            "observation_format": str(observation_format),
            "discovery": str(discovery),
            "denominator": str(denominator),
        }
    except KeyError as exc:
        raise ValueError(
            f"retrieval settings lack the key {exc.args[0]!r} (config key 'retrieval.{exc.args[0]}')"
        ) from exc
    doc = {"tools": [{"class_name": TOOL_CLASS, "config": config, "tool_schema": TOOL_SCHEMA}]}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path
