"""verl plugin of the SPADER project, imported in every process that imports verl.

verl loads it through the ``verl.plugins`` entry point (pyproject.toml), where an exception is
swallowed with a debug log, and through ``VERL_USE_EXTERNAL_MODULES``, where it is raised; the
training entry point (:mod:`.main`) sets the latter so that a broken plug-in fails the run at
start instead of later as "Unknown advantage estimator". Nothing here catches exceptions.

Registers:

* the advantage estimators of the method registry that name a function (``spader_spa``,
  ``spader_traj`` and those of methods from entry points, :func:`.estimators.register_methods`),
  ``spader_grpo`` (:mod:`.estimators`) and R3-RAG's ``r3rag_turn_gae`` (:mod:`.turn_gae`);
* v1 trainer mode ``spader_sync`` (:mod:`.trainer`);
* the policy loss ``spader_step_ratio``, the paper's importance ratio per decision step
  (``training.policy_ratio: step``, :mod:`.policy_loss`);
* tool parser ``spader`` and agent loop ``spader_tool_agent`` (:mod:`.agent_loop`);
* the critic's value-model loader honours the configured attention implementation
  (:mod:`.attention`: verl 0.9.1 hard-codes flash-attention 2 there);
* the attention implementation ``spader_varlen`` for verl's remove-padding path (packed sequences
  through PyTorch's variable-length attention; :mod:`.packed_attention`);
* verl's fused log-prob kernel runs through the ``lm_head`` module, so it works under FSDP2 for
  untied backbones (:mod:`.fused_logprobs`);
* verl's ``sglang`` rollout replica with a seed per replica (the configured seed + the replica's
  rank, as verl's vLLM server), reported with every generation (:mod:`.sglang_replica`);
* the CPU platform ``cpu``, verl's FSDP engines for the ``cpu`` device and the rollout backend
  ``transformers`` (:mod:`.cpu`), inactive unless a run selects them. They are registered first:
  importing verl's trainer modules already asks for the platform.

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

from spader.integrations.verl import cpu  # noqa: E402  (registration, before the trainer imports)

_CPU = cpu.register()

from spader.integrations.verl import sglang_replica  # noqa: E402

# sglang replicas seeded seed + replica rank (.sglang_replica)
sglang_replica.register()

from spader.integrations.verl import agent_loop, attention, estimators, policy_loss, trainer, turn_gae  # noqa: E402  (registration)
from spader.methods import load_plugins  # noqa: E402

# the critic's value model loads with critic.model.override_config.attn_implementation (.attention)
attention.install()

from spader.integrations.verl import fused_logprobs, packed_attention  # noqa: E402

# packed sequences (training.remove_padding) attend through attn_implementation=spader_varlen
packed_attention.register()

# verl's fused log-probs (use_fused_kernels) through the lm_head's FSDP2 unit (.fused_logprobs)
fused_logprobs.install()

# methods from outside the repository (entry points of group spader.methods), then every registry
# advantage that names its estimator function
load_plugins()

REGISTERED = {
    "adv_estimators": (*estimators.register_methods(), estimators.GRPO, turn_gae.TURN_GAE),
    "trainer_modes": (trainer.MODE,),
    "policy_losses": (policy_loss.LOSS_MODE,),
    "attention": (packed_attention.NAME,),
    "tool_parsers": (agent_loop.PARSER,),
    "agent_loops": (agent_loop.AGENT_LOOP,),
    **_CPU,
}
