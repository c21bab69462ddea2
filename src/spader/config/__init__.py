"""The workflow configuration: one typed model (:mod:`.model`), the schema and key reference
generated from it (:mod:`.schema`, :mod:`.docs`) and the start-up check (:mod:`.checks`).

``python -m spader.config write`` regenerates ``workflow/schemas/config.schema.yaml`` and
``config/README.md``; ``python -m spader.config check`` exits 1 when either is out of date.
"""

from spader.config.checks import (
    ConfigError,
    check_config,
    hub_slug,
    load_config,
    verl_config_chain,
    verl_config_dir,
)
from spader.config.model import (
    DATASETS,
    OPERATIONAL_SERVICE_KEYS,
    PROMPTING,
    USER_SUPPLIED,
    AgentConfig,
    BackboneConfig,
    Config,
    EvaluationConfig,
    JudgeConfig,
    RetrievalConfig,
    StepSearchConfig,
    TrainingConfig,
    VariantConfig,
    model_kind,
    named_run_root,
    rebase_run_paths,
)

__all__ = [
    "DATASETS",
    "OPERATIONAL_SERVICE_KEYS",
    "PROMPTING",
    "USER_SUPPLIED",
    "AgentConfig",
    "BackboneConfig",
    "Config",
    "ConfigError",
    "EvaluationConfig",
    "JudgeConfig",
    "RetrievalConfig",
    "StepSearchConfig",
    "TrainingConfig",
    "VariantConfig",
    "check_config",
    "hub_slug",
    "load_config",
    "model_kind",
    "named_run_root",
    "rebase_run_paths",
    "verl_config_chain",
    "verl_config_dir",
]
