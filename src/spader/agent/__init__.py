"""Agent inference: the one search/answer loop (``loop``), its generation engines (``engines``:
transformers on CPU/GPU, sglang on GPU, imported lazily) and the search function over the
retrieval service (``search``)."""

from spader.agent.engines import Generation, Sampling, build_engine
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
    "build_engine",
    "run_episodes",
]
