"""Agent inference: the one search/answer loop (``loop``), the generation engine protocol and the
transformers engine (``generation``; sglang's is in :mod:`spader.integrations.sglang`) and the
search function over the retrieval service (``search``)."""

from spader.agent.generation import Generation, Sampling
from spader.agent.loop import AgentSettings, Episode, Question, Step, run_episodes
from spader.agent.search import RetrievalSearch

__all__ = [
    "AgentSettings",
    "Episode",
    "Generation",
    "Question",
    "RetrievalSearch",
    "Sampling",
    "Step",
    "run_episodes",
]
