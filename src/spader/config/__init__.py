"""The workflow configuration: one typed model (:mod:`.model`), the schema and key reference
generated from it (:mod:`.schema`, :mod:`.docs`) and the start-up check (:mod:`.checks`).

``spader config docs`` (or ``python -m spader.config write``) regenerates
``workflow/schemas/config.schema.yaml`` and ``config/README.md``; ``spader config check`` exits 1
when either is out of date; ``spader config show`` prints a resolved configuration
(:mod:`.files` reads config files as a workflow run does).
"""

from spader.config.checks import (
    ConfigError,
    check_config,
    hub_slug,
    verl_config_chain,
    verl_config_dir,
)
from spader.config.files import (
    config_paths,
    in_file_order,
    load_config,
    load_yaml,
    merge_files,
    merge_into,
    resolved_config,
)
from spader.config.model import (
    DATASETS,
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
    "config_paths",
    "hub_slug",
    "in_file_order",
    "load_config",
    "load_yaml",
    "merge_files",
    "merge_into",
    "model_kind",
    "named_run_root",
    "rebase_run_paths",
    "resolved_config",
    "verl_config_chain",
    "verl_config_dir",
]
