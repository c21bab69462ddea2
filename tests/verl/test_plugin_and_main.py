"""The plugin reaches every process that imports verl, fails loudly where verl lets it, and the
training entry point composes, validates and hands a ready config to verl's run_ppo."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paper_verl import paper_overrides

pytest.importorskip("verl")

from spader.integrations.verl import main as entry

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config" / "verl"
PLUGIN = "spader.integrations.verl.plugin"

CHECK_REGISTRIES = """
import verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.experimental.agent_loop.tool_parser import ToolParser
missing = [n for n in ("spader_spa", "spader_traj") if n not in ADV_ESTIMATOR_REGISTRY]
missing += [n for n in ("spader_tool_agent",) if n not in _agent_loop_registry]
missing += [n for n in ("spader",) if n not in ToolParser._registry]
get_trainer_cls("spader_sync")
assert not missing, missing
print("registered")
"""


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_env_var_registers_everything_without_the_entry_point():
    proc = _python(CHECK_REGISTRIES, VERL_USE_EXTERNAL_PLUGINS="none", VERL_USE_EXTERNAL_MODULES=PLUGIN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "registered" in proc.stdout


def test_entry_point_is_what_verl_loads():
    # verl/__init__.py loads every entry point of the group "verl.plugins"
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="verl.plugins") if e.name == "spader"]
    assert ep.value == PLUGIN
    assert ep.load().REGISTERED["trainer_modes"] == ("spader_sync",)


def test_a_broken_plugin_fails_loudly_through_the_env_var(monkeypatch):
    # what verl/__init__.py does with VERL_USE_EXTERNAL_MODULES, with one plugin module unimportable
    from verl.utils.import_utils import import_external_libs

    import spader.integrations.verl as package

    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    monkeypatch.delattr(package, "estimators", raising=False)
    monkeypatch.setitem(sys.modules, "spader.integrations.verl.estimators", None)
    with pytest.raises(ImportError, match="spader.integrations.verl.estimators"):
        import_external_libs([PLUGIN])


def test_plugin_pins_the_verl_version_of_pyproject():
    import tomllib

    from spader.integrations.verl import plugin

    pyproject = tomllib.loads((CONFIG_DIR.parents[1] / "pyproject.toml").read_text())
    assert f"verl=={plugin.REQUIRED_VERL}" in pyproject["project"]["dependencies"]


def test_ensure_plugin_env_keeps_other_modules():
    env = {"VERL_USE_EXTERNAL_MODULES": "other.mod"}
    assert entry.ensure_plugin_env(env) == f"other.mod,{PLUGIN}"
    assert entry.ensure_plugin_env(env) == f"other.mod,{PLUGIN}"  # idempotent
    assert entry.ensure_plugin_env({}) == PLUGIN


def test_config_path_must_be_absolute():
    with pytest.raises(SystemExit):
        entry.parse_args(["--config-path", "config/verl", "--config-name", "spader"])


def _launch(model, variant="spader"):
    """config.yaml's overrides of the variant and what the launcher adds on one GPU."""
    return [
        *paper_overrides(variant),
        f"actor_rollout_ref.model.path={model}",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.logger=[console]",
    ]


def test_validate_only_prints_the_resolved_config(tiny_model, capsys, monkeypatch):
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    code = entry.main(
        [
            "--config-path",
            str(CONFIG_DIR),
            "--config-name",
            "spader",  # no_np's YAML: its method's
            "--validate-only",
            *_launch(tiny_model, "no_np"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "adv_estimator: spader_spa" in out and "trainer_mode: spader_sync" in out
    assert f"VERL_USE_EXTERNAL_MODULES: {PLUGIN}" in out
    assert os.environ["VERL_USE_EXTERNAL_MODULES"] == PLUGIN


def test_main_hands_the_validated_config_to_run_ppo(tiny_model, monkeypatch):
    # verl's run_ppo needs GPUs (Ray resource pools, sglang); it is replaced by a recorder here
    import verl.trainer.main_ppo as main_ppo

    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    calls = []
    monkeypatch.setattr(
        main_ppo, "run_ppo", lambda cfg, task_runner_class: calls.append((cfg, task_runner_class))
    )
    assert (
        entry.main(["--config-path", str(CONFIG_DIR), "--config-name", "spader", *_launch(tiny_model)]) == 0
    )
    ((cfg, runner),) = calls
    assert runner is main_ppo.TaskRunnerV1
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == PLUGIN
    assert cfg.actor_rollout_ref.model.path == str(tiny_model)


def test_main_rejects_an_invalid_config(tiny_model, monkeypatch):
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    with pytest.raises(ValueError, match="Unknown advantage estimator"):
        entry.main(
            [
                "--config-path",
                str(CONFIG_DIR),
                "--config-name",
                "spader",
                "--validate-only",
                *_launch(tiny_model),
                "algorithm.adv_estimator=nope",
            ]
        )
