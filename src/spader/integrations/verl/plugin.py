"""verl plugin of the SPADER project, imported in every process that imports verl.

verl loads it through the ``verl.plugins`` entry point (pyproject.toml), where an exception is
swallowed with a debug log, and through ``VERL_USE_EXTERNAL_MODULES``, where it is raised; the
training entry point (:mod:`.main`) sets the latter so that a broken plug-in fails the run at
start instead of later as "Unknown advantage estimator". Nothing here catches exceptions.

Registers:

* advantage estimators ``spader_spa`` and ``spader_traj`` (:mod:`.estimators`);
* v1 trainer mode ``spader_sync`` (:mod:`.trainer`);
* tool parser ``spader`` and agent loop ``spader_tool_agent`` (:mod:`.agent_loop`).

The search tool (:mod:`.search_tool`) and the reward function (:mod:`.reward`) need no
registration: verl imports them by name from the tool YAML and ``pkg://`` path.
"""

from importlib.metadata import version

#: The one verl version the plug-ins are written against (pyproject.toml pins the same): they rely
#: on its trainer internals (``_compute_advantage``, TransferQueue field names, the agent loop's
#: hooks), so another version must fail here rather than train subtly wrong.
REQUIRED_VERL = "0.9.1"

if version("verl") != REQUIRED_VERL:
    raise ImportError(f"spader's verl plug-ins need verl=={REQUIRED_VERL}, found verl=={version('verl')}")

from spader.integrations.verl import agent_loop, estimators, trainer  # noqa: E402  (registration)

REGISTERED = {
    "adv_estimators": (estimators.SPA, estimators.TRAJ),
    "trainer_modes": (trainer.MODE,),
    "tool_parsers": (agent_loop.PARSER,),
    "agent_loops": (agent_loop.AGENT_LOOP,),
}
