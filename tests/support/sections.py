"""Settings objects of the package built as the workflow builds them, from the configuration's typed
sections (whose defaults are the only ones), with some fields changed for a test."""

from __future__ import annotations

import dataclasses

from spader.agent.loop import AgentSettings
from spader.config import AgentConfig, EvaluationConfig, RetrievalConfig
from spader.config.model import ServiceConfig
from spader.retrieval.backend import SearchSettings


def search_settings(**changes) -> SearchSettings:
    """The ``retrieval`` section's defaults as :class:`SearchSettings`, with ``changes``."""
    return dataclasses.replace(SearchSettings.from_config(RetrievalConfig()), **changes)


def agent_settings(**changes) -> AgentSettings:
    """The ``agent`` and ``evaluation`` sections' defaults as :class:`AgentSettings` (the context
    budget training's, as the workflow resolves it), with ``changes``; ``max_error_share`` None
    unless given (a run that never stops for generation errors)."""
    base = AgentSettings.from_config(
        EvaluationConfig(max_context_tokens=8704), AgentConfig(), ServiceConfig()
    )
    return dataclasses.replace(base, **{"max_error_share": None, **changes})
