"""SPADER plugged into verl 0.9.1 through its registries, without a fork (docs/ARCHITECTURE.md).

* :mod:`.plugin` - imported by verl in every process (entry point ``verl.plugins``); registers
  everything below.
* :mod:`.estimators` - advantage estimators ``spader_spa`` and ``spader_traj``.
* :mod:`.trainer` - v1 trainer mode ``spader_sync``: verl's sync trainer plus step-reward
  densification before the advantage.
* :mod:`.agent_loop` - agent loop ``spader_tool_agent`` and tool parser ``spader``.
* :mod:`.search_tool` - the ``BaseTool`` that calls the retrieval service and records step hits.
* :mod:`.reward` - ``compute_score``: the terminal reward (F1 or the invalid-format reward).
* :mod:`.compose`, :mod:`.overrides`, :mod:`.tool_config`, :mod:`.main` - configuration and launch.

This ``__init__`` imports nothing, so that ``import spader.integrations.verl.compose`` stays cheap.
"""
