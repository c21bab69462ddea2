"""Training entry point: verl's ``run_ppo`` with the SPADER plug-in loaded everywhere.

    python -m spader.integrations.verl.main --config-path <abs dir> --config-name <variant> [overrides...]

Like ``python -m verl.trainer.main_ppo`` but:

* the config is composed with :func:`.compose.compose` (Hydra's compose API: no ``outputs/`` run
  directory is created in the working directory, no logging is reconfigured);
* ``VERL_USE_EXTERNAL_MODULES`` names the plugin, in this process and in the Ray runtime env, so
  every Ray worker imports it and a broken plug-in raises at start (the entry point alone would
  swallow the error);
* :func:`.compose.validate` checks the config before Ray starts (verl's ``validate_config`` plus
  our registries); ``--validate-only`` stops there and prints the resolved config.

Training needs GPUs (sglang rollout); on a CPU machine use ``--validate-only``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

__all__ = ["ENV_VAR", "PLUGIN", "ensure_plugin_env", "main", "parse_args", "prepare"]

log = logging.getLogger(__name__)

PLUGIN = "spader.integrations.verl.plugin"
ENV_VAR = "VERL_USE_EXTERNAL_MODULES"


def ensure_plugin_env(environ: MutableMapping[str, str] = os.environ) -> str:
    """Add the plugin to ``VERL_USE_EXTERNAL_MODULES`` (kept: modules already listed); returns it."""
    modules = [m for m in environ.get(ENV_VAR, "").split(",") if m.strip()]
    if PLUGIN not in modules:
        modules.append(PLUGIN)
    environ[ENV_VAR] = ",".join(modules)
    return environ[ENV_VAR]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``--config-path DIR --config-name NAME [--validate-only] [overrides...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m spader.integrations.verl.main", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config-path", required=True, help="absolute directory of the project's verl YAMLs")
    parser.add_argument("--config-name", required=True, help="variant YAML name, e.g. spader")
    parser.add_argument(
        "--validate-only", action="store_true", help="compose, validate, print the config, exit"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (key=value, +key=value, ++key=value)")
    args = parser.parse_args(list(argv))
    if not Path(args.config_path).is_absolute():
        parser.error(
            f"--config-path must be absolute (Hydra resolves relative paths oddly), got {args.config_path}"
        )
    return args


def prepare(config_path: str, config_name: str, overrides: Sequence[str]) -> DictConfig:
    """Compose and validate the config; forward the plugin variable to the Ray workers."""
    modules = ensure_plugin_env()
    import verl  # noqa: F401  (imports the plugin through VERL_USE_EXTERNAL_MODULES, loudly)

    from spader.integrations.verl import plugin  # noqa: F401  (and explicitly, should verl be imported already)
    from spader.integrations.verl.compose import compose, validate

    cfg = compose(config_name, overrides, config_dir=config_path)
    from verl.utils.device import auto_set_device

    auto_set_device(cfg)
    validate(cfg)
    with open_dict(cfg):
        runtime_env = cfg.ray_kwargs.ray_init.runtime_env
        if runtime_env.get("env_vars") is None:
            runtime_env.env_vars = {}
        runtime_env.env_vars[ENV_VAR] = modules
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    """Run training (or ``--validate-only``); returns the process exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = prepare(args.config_path, args.config_name, args.overrides)
    if args.validate_only:
        sys.stdout.write(OmegaConf.to_yaml(cfg, resolve=True))
        return 0
    if not cfg.trainer.use_v1:
        raise ValueError(
            "trainer.use_v1=false: the SPADER trainer mode is a v1 trainer; use verl's v1 trainer"
        )
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    log.info("starting verl run_ppo with %s", cfg.trainer.v1.trainer_mode)
    run_ppo(cfg, task_runner_class=TaskRunnerV1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
