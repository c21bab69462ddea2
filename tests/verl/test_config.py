"""Variant configs: every config/verl YAML composes against the pinned verl's ppo_trainer with
config/config.yaml's overrides and passes verl's own validation; the YAMLs carry no number of
config.yaml (the overrides are the only source), and shared training runs are found by Hydra."""

import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

pytest.importorskip("verl")

from spader.config import resolved_config, verl_config_chain
from spader.integrations.verl.compose import compose, validate
from spader.integrations.verl.overrides import (
    AGENT_KEYS,
    TRAINING_KEYS,
    config_overrides,
    method_overrides,
    method_settings,
)
from spader.methods import advantage_spec, verl_yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = resolved_config(REPO / "config" / "config.yaml")
VARIANTS = CONFIG["variants"]
TRAINING = CONFIG["training"]
AGENT = CONFIG["agent"]


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
    """Per variant: its YAML composed with config.yaml's overrides and the launcher's judge settings
    (Hydra compose takes about a second on this machine, so each is composed once)."""
    from spader.training.scorer_launch import scorer_launch

    def judge(spec):  # what the launcher adds for an LLM-judged variant (its endpoint comes at run time)
        return scorer_launch(spec, judge=CONFIG["judge"]).overrides if spec["reward"] == "r3rag" else []

    return {
        name: compose(verl_yaml(spec), [*config_overrides(spec, TRAINING, AGENT), *judge(spec)])
        for name, spec in VARIANTS.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_composes_and_passes_verl_validation(name, tiny_model, composed):
    spec = VARIANTS[name]
    cfg = OmegaConf.merge(composed[name], OmegaConf.from_dotlist(launch_overrides(tiny_model)))
    validate(cfg)
    assert cfg.algorithm.adv_estimator == advantage_spec(spec["advantage"]).estimator
    assert cfg.trainer.v1.trainer_mode == ("sync" if spec["reward"] == "terminal" else "spader_sync")
    assert cfg.trainer.use_v1 is True
    if spec["advantage"] == "gae":
        assert OmegaConf.select(cfg, "critic.model.path", throw_on_resolution_failure=False) == str(
            tiny_model
        )


def _flat_keys(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _flat_keys(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


def test_the_yamls_carry_no_number_of_config_yaml():
    """Every value config.yaml gives a variant reaches verl as an override only: no YAML of the
    variant's chain sets a key its overrides set (a YAML value would silently stand in for a
    config.yaml key a launch forgot to pass). The structure (estimator, trainer mode) may repeat."""
    from spader.training.launch import override_key

    structure = {"algorithm.adv_estimator", "trainer.v1.trainer_mode", "algorithm.step_reward"}
    found = {}
    for name, spec in VARIANTS.items():
        from_config = {override_key(o) for o in config_overrides(spec, TRAINING, AGENT)} - structure
        for path in verl_config_chain(verl_yaml(spec), REPO / "config" / "verl"):
            doc = yaml.safe_load(Path(path).read_text()) or {}
            for key in _flat_keys({k: v for k, v in doc.items() if k not in ("defaults", "hydra")}):
                if key in from_config or any(key.startswith(k + ".") for k in from_config):
                    found.setdefault(name, set()).add(f"{Path(path).name}: {key}")
    assert found == {}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_yaml_values_reach_the_composed_config(name, composed):
    cfg = composed[name]
    for key, verl_key in TRAINING_KEYS.items():
        assert OmegaConf.select(cfg, verl_key) == TRAINING[key], (key, verl_key)
    for key, verl_key in AGENT_KEYS.items():
        value = OmegaConf.select(cfg, verl_key)
        assert (OmegaConf.to_container(value) if OmegaConf.is_config(value) else value) == AGENT[key], key
    for key, value in method_settings(VARIANTS[name], TRAINING).items():
        got = OmegaConf.select(cfg, key)
        assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == value, key
    kwargs = cfg.reward.custom_reward_function.reward_kwargs
    assert kwargs.invalid_format_reward == VARIANTS[name]["invalid_format_reward"]
    assert (kwargs.parser, kwargs.aliases) == (AGENT["parser"], TRAINING["divergences"]["aliases"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.format == "spader"


def test_a_yaml_composed_without_the_overrides_has_verls_defaults():
    # the paper's numbers live in config.yaml only
    cfg = compose("grpo")
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) != (
        TRAINING["train_batch_size"],
        TRAINING["rollout_n"],
    )
    assert OmegaConf.select(cfg, "algorithm.spader") is None and OmegaConf.select(cfg, "spader_agent") is None


def test_every_training_key_reaches_verl():
    """Each config.yaml training key is either mapped to a verl key or set by method_overrides."""
    by_method = {"gamma", "divergences"}
    # where verl trains and the CPU run's size, read by the launcher (spader.training.launch)
    by_launcher = {"device", "rollout_backend", "cpu_workers", "max_steps", "nodes"}
    # how the job lives with time limits and a failing search service (not the trained model)
    by_launcher |= {"time_limit", "max_search_error_rate", "rollout_timeout_s"}
    # the packed path and token-capped micro-batches (spader.integrations.verl.overrides, tested below)
    by_launcher |= {"remove_padding", "max_token_len_per_gpu"}
    # the save cadence's bound (the planned cadence reaches verl as trainer.save_freq) and the
    # export's retention of checkpoints (spader.training.run, spader.training.hf_export)
    by_launcher |= {"max_work_lost_minutes", "keep_checkpoints"}
    # the policy loss of the importance ratio (tests/verl/test_policy_ratio.py)
    by_launcher |= {"policy_ratio"}
    # the job's measurements against its plan (spader.training.measure)
    by_launcher |= {"over_plan_factor", "stop_when_over_plan"}
    assert set(TRAINING) - by_method - by_launcher == set(TRAINING_KEYS)


def test_method_overrides_set_the_divergence_options():
    spec = dict(VARIANTS["spader"], beta=2.5, invalid_format_reward=0.0)
    training = dict(
        TRAINING,
        gamma=0.8,
        divergences={
            "novelty": "exp_decay",
            "cost_warmup": {"free_steps": 100, "ramp_steps": 100},
            "epsilon": "inside_sqrt",
            "aliases": "blind",
        },
    )
    cfg = compose("spader", method_overrides(spec, training))
    assert cfg.algorithm.gamma == 0.8
    assert OmegaConf.to_container(cfg.algorithm.spader) == {
        "alpha": 1.0,
        "beta": 2.5,
        "cost": 0.01,
        "cost_per": "call",
        "novelty": "exp_decay",
        "cost_warmup": {"free_steps": 100, "ramp_steps": 100},
        "epsilon": "inside_sqrt",
    }
    assert cfg.reward.custom_reward_function.reward_kwargs.invalid_format_reward == 0.0
    assert cfg.reward.custom_reward_function.reward_kwargs.aliases == cfg.spader_agent.aliases == "blind"
    # the invalid-format reward is the variant's: the authors' GRPO keeps -1 beside SPADER's 0
    grpo = compose("grpo", method_overrides(dict(VARIANTS["grpo"], invalid_format_reward=-1.0), training))
    assert grpo.reward.custom_reward_function.reward_kwargs.invalid_format_reward == -1.0
    # a step-reward variant over a YAML without the spader structure still composes
    cfg = compose("grpo", method_overrides(VARIANTS["no_spa"], TRAINING))
    assert cfg.algorithm.adv_estimator == "spader_traj" and cfg.algorithm.spader.beta == 4.0


@pytest.mark.parametrize(
    "variant, message",
    [
        ({"advantage": "gae", "reward": "step"}, "advantage 'gae' does not train reward 'step'"),
        ({"advantage": "spa", "reward": "terminal"}, "advantage 'spa' does not train reward 'terminal'"),
        (
            {"advantage": "dpo", "reward": "step"},
            "(?s)advantage.*'spa', 'grpo_return', 'grpo', 'gae' or 'turn_gae'",
        ),
        (
            {"advantage": "spa", "reward": "step", "alpha": "1", "beta": 1, "cost": 0},
            "(?s)alpha.*valid number",
        ),
    ],
)
def test_method_overrides_reject_bad_variants(variant, message):
    with pytest.raises(ValueError, match=message):
        method_overrides({"verl_config": "spader", **variant}, TRAINING)


def test_config_chain_lists_the_project_parents():
    chain = [Path(p).name for p in verl_config_chain("stepsearch", REPO / "config" / "verl")]
    assert chain == ["stepsearch.yaml", "step_baselines.yaml", "base.yaml"]
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
    cfg = compose(
        "spader",
        config_overrides(VARIANTS["spader"], TRAINING, AGENT) + launch_overrides(tiny_model) + overrides,
    )
    with pytest.raises(Exception, match=message):
        validate(cfg)


# ---------------------------------------------------------------------------------------------
# The GPU path: what every model verl builds loads with, and the settings shared with evaluation
# ---------------------------------------------------------------------------------------------

# Attention implementations torch itself provides (no extra package): what the `gpu` extra
# installs without a flash-attn distribution.
TORCH_ATTENTION = {"sdpa", "eager"}


def _gpu_extra() -> list[str]:
    import tomllib

    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]["gpu"]


@pytest.mark.parametrize("name", ["spader", "ppo"])
def test_the_packed_path_composes_with_token_capped_micro_batches(name, tiny_model):
    """training.remove_padding + max_token_len_per_gpu: verl's remove-padding path for the actor,
    reference and critic, with the plug-in's varlen attention, and dynamic micro-batches capped at
    the configured tokens for every pass; verl's validation passes."""
    from spader.config.model import TrainingConfig
    from spader.integrations.verl.compose import gpu_path_settings
    from spader.integrations.verl.packed_attention import NAME

    training = TrainingConfig(
        **{**TRAINING, "remove_padding": True, "max_token_len_per_gpu": 12000}
    ).model_dump()
    spec = VARIANTS[name]
    cfg = compose(verl_yaml(spec), [*config_overrides(spec, training, AGENT), *launch_overrides(tiny_model)])
    validate(cfg)
    s = gpu_path_settings(cfg)
    assert s["actor_rollout_ref.model.use_remove_padding"] is True
    assert s["actor_rollout_ref.model.override_config.attn_implementation"] == NAME
    resolved = OmegaConf.to_container(cfg, resolve=True)
    actor, rollout = resolved["actor_rollout_ref"]["actor"], resolved["actor_rollout_ref"]["rollout"]
    ref = resolved["actor_rollout_ref"]["ref"]
    assert actor["use_dynamic_bsz"] and actor["ppo_max_token_len_per_gpu"] == 12000
    assert rollout["log_prob_use_dynamic_bsz"] and rollout["log_prob_max_token_len_per_gpu"] == 12000
    assert ref["log_prob_use_dynamic_bsz"] and ref["log_prob_max_token_len_per_gpu"] == 12000
    critic = resolved["critic"]
    assert critic["use_dynamic_bsz"] and critic["ppo_max_token_len_per_gpu"] == 12000
    if s["critic.enable"]:
        assert s["critic.model.use_remove_padding"] is True
        assert s["critic.model.override_config.attn_implementation"] == NAME


def test_token_capped_micro_batches_need_the_packed_path():
    from pydantic import ValidationError

    from spader.config.model import TrainingConfig

    with pytest.raises(
        ValidationError, match="max_token_len_per_gpu: token-capped micro-batches need remove_padding"
    ):
        TrainingConfig(max_token_len_per_gpu=12000)
    with pytest.raises(ValidationError, match="below the longest sequence"):
        TrainingConfig(remove_padding=True, max_token_len_per_gpu=4096)


def test_composed_configs_load_every_model_with_what_the_gpu_extra_installs(composed):
    from spader.integrations.verl.compose import gpu_path_settings

    flash_installed = any(
        r.replace("_", "-").startswith("flash-attn") and "flash-attn-4" not in r for r in _gpu_extra()
    )
    provided = TORCH_ATTENTION | ({"flash_attention_2"} if flash_installed else set())
    for name, cfg in composed.items():
        s = gpu_path_settings(cfg)
        assert s["actor_rollout_ref.model.override_config.attn_implementation"] in provided, name
        # the paper config keeps the padded path (sdpa with a mask); training.remove_padding packs
        assert s["actor_rollout_ref.model.use_remove_padding"] is False, name
        # actor, reference (built from the actor's model config) and critic are FSDP2
        assert s["actor_rollout_ref.actor.strategy"] == s["actor_rollout_ref.ref.strategy"] == "fsdp2", name
        assert s["critic.strategy"] == "fsdp2", name
        if s["critic.enable"]:
            assert s["critic.model.override_config.attn_implementation"] in provided, name
            assert s["critic.model.use_remove_padding"] is False, name
        # sglang ends a turn at a stop string only with its tokenizer loaded
        assert s["actor_rollout_ref.rollout.skip_tokenizer_init"] is False, name
        assert s["trainer.max_actor_ckpt_to_keep"] == TRAINING["max_actor_ckpt_to_keep"] == 2
        assert s["trainer.max_critic_ckpt_to_keep"] == TRAINING["max_critic_ckpt_to_keep"] == 2
        # training.seed seeds the prompt order too (and the critic's mini-batches, the rollout)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        seeds = {
            s["data.seed"],
            resolved["critic"]["data_loader_seed"],
            resolved["actor_rollout_ref"]["rollout"]["seed"],
            s["actor_rollout_ref.rollout.engine_kwargs.sglang.random_seed"],
        }
        assert seeds == {TRAINING["seed"]}, name


def test_the_seed_reaches_sglang_where_verl_reads_it(composed):
    """verl's sglang server builds sglang's ServerArgs from its RolloutConfig's
    ``engine_kwargs["sglang"]`` (verl/workers/rollout/sglang_rollout/async_sglang_server.py,
    ``launch_server``); sglang's ``random_seed`` seeds its sampler."""
    from verl.utils.config import omega_conf_to_dataclass

    for name in ("spader", "ppo"):
        resolved = OmegaConf.create(OmegaConf.to_container(composed[name], resolve=True))
        rollout = omega_conf_to_dataclass(resolved.actor_rollout_ref.rollout)
        assert type(rollout).__name__ == "RolloutConfig"
        assert rollout.get("engine_kwargs", {}).get("sglang", {}) == {"random_seed": TRAINING["seed"]}
    seeded = compose("spader", [*config_overrides(VARIANTS["spader"], dict(TRAINING, seed=7), AGENT)])
    assert OmegaConf.to_container(seeded, resolve=True)["actor_rollout_ref"]["rollout"]["engine_kwargs"] == {
        "vllm": {},
        "sglang": {"random_seed": 7},
        "trtllm": {},
    }


def test_the_seed_override_moves_the_prompt_order_seed(tiny_model):
    cfg = compose("spader", ["actor_rollout_ref.actor.data_loader_seed=7"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["data"]["seed"] == 7
    assert resolved["actor_rollout_ref"]["rollout"]["engine_kwargs"]["sglang"]["random_seed"] == 7


def test_agent_settings_reach_verl():
    from spader.integrations.verl.overrides import agent_overrides

    assert set(AGENT) - {"max_queries_per_call", "prompt_template", "prompt_role"} == set(AGENT_KEYS)
    changed = dict(AGENT, max_turn_tokens=77, stop=["</answer>"], max_turns=3)
    cfg = compose("spader", agent_overrides(changed))
    assert cfg.spader_agent.max_turn_tokens == 77 and list(cfg.spader_agent.stop) == ["</answer>"]
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3


def test_identical_trainings_are_one_run():
    from spader.integrations.verl.overrides import shared_training_runs

    qwen = CONFIG["backbones"]["qwen3_8b"]["variants"]
    runs = shared_training_runs(qwen, VARIANTS, TRAINING, REPO / "config" / "verl")
    assert {v: r for v, r in runs.items() if v != r} == {"beta_0": "no_np", "beta_4": "spader"}
    # a variant whose numbers differ trains on its own; the order of the backbone's list decides
    variants = dict(VARIANTS, beta_4=dict(VARIANTS["beta_4"], beta=4.5))
    assert shared_training_runs(qwen, variants, TRAINING, REPO / "config" / "verl")["beta_4"] == "beta_4"
    assert shared_training_runs(["beta_4", "spader"], VARIANTS, TRAINING, REPO / "config" / "verl") == {
        "beta_4": "beta_4",
        "spader": "beta_4",
    }


def test_shared_runs_follow_what_hydra_composes(tmp_path):
    """The identity is the composed config, not the YAML text: a YAML that restates a default of
    verl's ppo_trainer still shares its run, one that changes a value trains on its own."""
    from spader.integrations.verl import overrides

    config_dir = tmp_path / "verl"
    shutil.copytree(REPO / "config" / "verl", config_dir)
    pair = ["spader", "beta_4"]
    # beta_4 with a YAML of its own, SPADER's to begin with
    specs = {**VARIANTS, "beta_4": {**VARIANTS["beta_4"], "verl_config": "beta_4"}}

    def runs():
        return overrides.shared_training_runs(pair, specs, TRAINING, config_dir)

    beta_4 = config_dir / "beta_4.yaml"
    text = (config_dir / "spader.yaml").read_text()
    beta_4.write_text(text + "\nactor_rollout_ref:\n  actor:\n    clip_ratio: 0.2  # verl's default\n")
    assert runs() == {"spader": "spader", "beta_4": "spader"}
    beta_4.write_text(text + "\nactor_rollout_ref:\n  actor:\n    clip_ratio: 0.3\n")
    assert runs() == {"spader": "spader", "beta_4": "beta_4"}
    # each composition is kept for the process: the same files and overrides compose once
    kept = len(overrides._IDENTITIES)
    assert runs() == {"spader": "spader", "beta_4": "beta_4"} and len(overrides._IDENTITIES) == kept


def test_epsilon_option_reaches_the_estimator():
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import spader.integrations.verl.plugin  # noqa: F401  (registration)

    cfg = compose(
        "spader", method_overrides(VARIANTS["spader"], dict(TRAINING, divergences={"epsilon": "inside_sqrt"}))
    )
    assert cfg.algorithm.spader.epsilon == "inside_sqrt"
    # two trajectories whose returns differ by 1e-4: the floor sqrt(1e-6) of inside_sqrt shows
    rewards = torch.tensor([[0.0, 1e-4], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1]])
    fn = get_adv_estimator_fn("spader_spa")
    inside, _ = fn(token_level_rewards=rewards, response_mask=mask, index=["u", "u"], config=cfg.algorithm)
    paper = compose("spader", method_overrides(VARIANTS["spader"], TRAINING))
    outside, _ = fn(token_level_rewards=rewards, response_mask=mask, index=["u", "u"], config=paper.algorithm)
    half = 0.5e-4
    assert inside[0, 1].item() == pytest.approx(half / (half**2 + 1e-6) ** 0.5, rel=1e-4)
    assert outside[0, 1].item() == pytest.approx(half / (half + 1e-6), rel=1e-4)


def test_the_critic_value_model_loads_with_the_configured_attention(tiny_model):
    """verl 0.9.1's value-model loader hard-codes flash_attention_2; the plug-in makes it honour
    critic.model.override_config (transformers has no flash-attn here, as on a `gpu` extra node)."""
    import importlib.util

    import verl.utils.model as verl_model
    from transformers import AutoConfig

    import spader.integrations.verl.plugin  # noqa: F401  (installs the adapter)
    from spader.integrations.verl import attention

    config = AutoConfig.from_pretrained(tiny_model, attn_implementation="sdpa")
    config.num_labels = 1
    model = verl_model.load_valuehead_model(
        tiny_model, torch_dtype=None, model_config=config, trust_remote_code=False
    )
    assert (
        type(model).__name__ == "Qwen3ForTokenClassification" and model.config._attn_implementation == "sdpa"
    )
    assert attention.install() is False  # installed once
    if importlib.util.find_spec("flash_attn") is None:
        original = verl_model.load_valuehead_model.keywords["_verl_loader"]
        with pytest.raises(Exception) as failed:  # verl's own loader, as it runs without the adapter
            original(tiny_model, None, config, False)
        chain = f"{failed.value} {failed.value.__cause__!r}"
        assert "flash" in chain.lower() or "FlashAttention" in chain, chain
