"""Variant configs: every config/verl YAML composes against the pinned verl's ppo_trainer and passes
verl's own validation, and their defaults equal config/config.yaml (so the two never drift apart)."""

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

pytest.importorskip("verl")

from spader.infra.config import verl_config_chain
from spader.integrations.verl.compose import compose, validate
from spader.integrations.verl.overrides import ESTIMATORS, TRAINING_KEYS, method_overrides

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
VARIANTS = CONFIG["variants"]
TRAINING = CONFIG["training"]


def launch_overrides(model: Path) -> list[str]:
    """What the training launcher adds on a one-GPU machine (paths, GPUs, logger)."""
    return [
        f"actor_rollout_ref.model.path={model}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=/unused/tools.yaml",
        "trainer.logger=[console]",
    ]


@pytest.fixture(scope="module")
def composed():
    """Per variant: its YAML composed alone, and with config.yaml's method overrides (Hydra compose
    takes about a second on this machine, so each is composed once)."""
    return {
        name: (compose(spec["verl_config"]), compose(spec["verl_config"], method_overrides(spec, TRAINING)))
        for name, spec in VARIANTS.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_composes_and_passes_verl_validation(name, tiny_model, composed):
    spec = VARIANTS[name]
    cfg = OmegaConf.merge(composed[name][1], OmegaConf.from_dotlist(launch_overrides(tiny_model)))
    validate(cfg)
    assert cfg.algorithm.adv_estimator == ESTIMATORS[spec["advantage"]]
    assert cfg.trainer.v1.trainer_mode == ("spader_sync" if spec["reward"] == "step" else "sync")
    assert cfg.trainer.use_v1 is True
    if spec["advantage"] == "gae":
        assert OmegaConf.select(cfg, "critic.model.path", throw_on_resolution_failure=False) == str(
            tiny_model
        )


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_yaml_defaults_equal_config_yaml(name, composed):
    # composing the variant's YAML alone gives exactly the config that config.yaml's numbers give
    spec = VARIANTS[name]
    alone, launched = (OmegaConf.to_container(c) for c in composed[name])
    assert alone == launched
    if spec["reward"] == "step":
        block = alone["algorithm"]["spader"]
        assert (block["alpha"], block["beta"], block["cost"]) == (spec["alpha"], spec["beta"], spec["cost"])
        assert alone["algorithm"]["gamma"] == TRAINING["gamma"]


def test_base_yaml_carries_config_yaml_training_values(composed):
    cfg = composed["grpo"][0]
    for key, verl_key in TRAINING_KEYS.items():
        assert OmegaConf.select(cfg, verl_key) == TRAINING[key], (key, verl_key)
    assert (
        cfg.reward.custom_reward_function.reward_kwargs.invalid_format_reward
        == (TRAINING["divergences"]["invalid_format_reward"])
    )


def test_every_training_key_reaches_verl():
    """Each config.yaml training key is either mapped to a verl key or set by method_overrides."""
    by_method = {"gamma", "divergences"}
    assert set(TRAINING) - by_method == set(TRAINING_KEYS)


def test_method_overrides_set_the_divergence_options():
    spec = dict(VARIANTS["spader"], beta=2.5)
    training = dict(
        TRAINING,
        gamma=0.8,
        divergences={
            "novelty": "exp_decay",
            "invalid_format_reward": 0.0,
            "cost_warmup": {"free_steps": 100, "ramp_steps": 100},
        },
    )
    cfg = compose("spader", method_overrides(spec, training))
    assert cfg.algorithm.gamma == 0.8
    assert OmegaConf.to_container(cfg.algorithm.spader) == {
        "alpha": 1.0,
        "beta": 2.5,
        "cost": 0.01,
        "novelty": "exp_decay",
        "cost_warmup": {"free_steps": 100, "ramp_steps": 100},
    }
    assert cfg.reward.custom_reward_function.reward_kwargs.invalid_format_reward == 0.0
    # a step-reward variant over a YAML without the spader block still composes (++ adds the keys)
    cfg = compose("grpo", method_overrides(VARIANTS["no_spa"], TRAINING))
    assert cfg.algorithm.adv_estimator == "spader_traj" and cfg.algorithm.spader.beta == 4.0


@pytest.mark.parametrize(
    "variant, message",
    [
        ({"advantage": "gae", "reward": "step"}, "terminal reward"),
        ({"advantage": "spa", "reward": "terminal"}, "defined on the step rewards"),
        ({"advantage": "dpo", "reward": "step"}, "advantage must be one of"),
        (
            {"advantage": "spa", "reward": "step", "alpha": "1", "beta": 1, "cost": 0},
            "variant alpha must be a number",
        ),
    ],
)
def test_method_overrides_reject_bad_variants(variant, message):
    with pytest.raises(ValueError, match=message):
        method_overrides(variant, TRAINING)


def test_config_chain_lists_the_project_parents():
    chain = [Path(p).name for p in verl_config_chain("no_np", REPO / "config" / "verl")]
    assert chain == ["no_np.yaml", "spader_base.yaml", "base.yaml"]
    assert [Path(p).name for p in verl_config_chain("ppo", REPO / "config" / "verl")] == [
        "ppo.yaml",
        "base.yaml",
    ]


def test_compose_names_a_missing_variant():
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        compose("nope")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.adv_estimator=not_registered"], "Unknown advantage estimator"),
        (["trainer.v1.trainer_mode=warp"], "Unknown trainer 'warp'"),
        (["actor_rollout_ref.rollout.multi_turn.format=qwen"], "unknown tool parser 'qwen'"),
        (["algorithm.spader.novelty=log"], "algorithm.spader.novelty must be one of"),
        (["algorithm.spader.cost_warmup={free_steps:1}"], "malformed"),
        (["data.train_batch_size=8"], "train_batch_size"),
    ],
)
def test_validate_rejects_bad_settings(overrides, message, tiny_model):
    cfg = compose("spader", launch_overrides(tiny_model) + overrides)
    with pytest.raises(Exception, match=message):
        validate(cfg)
