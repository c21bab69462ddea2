"""The two baselines' configs: their constants after composition over verl's ppo_trainer, the
checks that refuse a malformed one, and what their training launch adds."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from paper_verl import paper_overrides

pytest.importorskip("verl")

from spader.config import ConfigError, check_config, resolved_config
from spader.integrations.verl.compose import compose, validate
from spader.integrations.verl.overrides import method_overrides
from spader.integrations.verl.step_rewards import check_step_rewards
from spader.methods import verl_yaml
from spader.training.scorer_launch import judge_endpoint, judge_params, judge_settings, scorer_launch

REPO = Path(__file__).resolve().parents[2]
CONFIG = resolved_config(REPO / "config" / "config.yaml")


@pytest.fixture(scope="module")
def composed():
    """Each baseline composed with config.yaml's method overrides and the launcher's judge settings
    (resolved), and ppo for reference."""
    out = {}
    for name in ("stepsearch", "r3rag", "ppo"):
        spec = CONFIG["variants"][name]
        judge = scorer_launch(spec, judge=CONFIG["judge"]).overrides if name == "r3rag" else []
        cfg = compose(
            verl_yaml(spec),
            ["actor_rollout_ref.model.path=/m", *method_overrides(spec, CONFIG["training"]), *judge],
        )
        out[name] = OmegaConf.to_container(cfg, resolve=True)
    return out


def test_stepsearch_constants(composed):
    c = composed["stepsearch"]
    alg, actor = c["algorithm"], c["actor_rollout_ref"]["actor"]
    assert (alg["adv_estimator"], alg["gamma"], alg["lam"]) == ("gae", 1.0, 1.0)
    assert (alg["use_kl_in_reward"], alg["kl_penalty"]) == (True, "kl")  # KL in the reward, k1
    assert (alg["kl_ctrl"]["type"], alg["kl_ctrl"]["kl_coef"]) == ("fixed", 0.001)
    assert actor["use_kl_loss"] is False
    assert (actor["entropy_coeff"], actor["clip_ratio"]) == (0.001, 0.2)
    assert alg["step_reward"] == "stepsearch" and alg["stepsearch"]["lambda_s"] == 0.6
    assert c["trainer"]["v1"]["trainer_mode"] == "spader_sync"


def test_r3rag_constants(composed):
    c = composed["r3rag"]
    alg, actor = c["algorithm"], c["actor_rollout_ref"]["actor"]
    assert (alg["adv_estimator"], alg["gamma"], alg["lam"]) == ("r3rag_turn_gae", 1.0, 1.0)
    assert (alg["use_kl_in_reward"], alg["kl_penalty"], alg["kl_ctrl"]["kl_coef"]) == (True, "kl", 0.01)
    assert actor["use_kl_loss"] is False and actor["clip_ratio"] == 0.2
    assert c["critic"]["cliprange_value"] == 0.2
    assert (
        alg["r3rag"]["judge"]["kind"] == "llm" and alg["r3rag"]["judge"]["model"] == CONFIG["judge"]["model"]
    )
    assert c["actor_rollout_ref"]["rollout"]["temperature"] == 1.0


def test_critic_like_the_ppo_baseline(composed):
    ppo = composed["ppo"]["critic"]
    assert composed["stepsearch"]["critic"] == ppo
    assert composed["r3rag"]["critic"] == {**ppo, "cliprange_value": 0.2}
    for name in ("stepsearch", "r3rag"):  # same optimizer, batch and rollout budget as PPO
        for key in ("data", "trainer"):
            a = {k: v for k, v in composed[name][key].items() if k != "v1"}
            assert a == {k: v for k, v in composed["ppo"][key].items() if k != "v1"}, (name, key)
        assert (
            composed[name]["actor_rollout_ref"]["rollout"] == composed["ppo"]["actor_rollout_ref"]["rollout"]
        )


def test_config_yaml_options_reach_verl():
    step16 = dict(CONFIG["variants"]["stepsearch"], lambda_s=1.6)
    cfg = compose("stepsearch", method_overrides(step16, CONFIG["training"]))
    assert cfg.algorithm.stepsearch.lambda_s == 1.6
    rerank = dict(CONFIG["variants"]["r3rag"], judge="reranker")
    assert (
        compose("r3rag", method_overrides(rerank, CONFIG["training"])).algorithm.r3rag.judge.kind
        == "reranker"
    )


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ({"advantage": "spa", "reward": "stepsearch"}, "advantage 'spa' does not train reward 'stepsearch'"),
        ({"advantage": "gae", "reward": "r3rag"}, "advantage 'gae' does not train reward 'r3rag'"),
        ({"advantage": "turn_gae", "reward": "terminal"}, "advantage 'turn_gae' does not train reward"),
        ({"advantage": "gae", "reward": "stepsearch", "lambda_s": "big"}, "lambda_s"),
    ],
)
def test_method_overrides_refuse_mismatches(variant, message):
    with pytest.raises(ValueError, match=message):
        method_overrides({"verl_config": "x", **variant}, CONFIG["training"])


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("stepsearch", ["algorithm.adv_estimator=grpo"], "stepsearch is trained with gae"),
        ("stepsearch", ["critic.enable=false"], "critic.enable"),
        ("stepsearch", ["algorithm.gamma=0.9"], "algorithm.gamma: stepsearch uses 1.0"),
        ("stepsearch", ["algorithm.stepsearch.lambda_s=-1"], "lambda_s and workers must be >= 0"),
        ("r3rag", ["algorithm.r3rag.judge.kind=oracle"], "judge.kind must be one of"),
        ("r3rag", ["algorithm.lam=0.95"], "algorithm.lam: r3rag uses 1.0"),
        ("r3rag", ["algorithm.step_reward=magic"], "algorithm.step_reward must be one of"),
    ],
)
def test_validation_refuses_malformed_baselines(name, overrides, message, composed):
    cfg = OmegaConf.merge(OmegaConf.create(composed[name]), OmegaConf.from_dotlist(overrides))
    check_step_rewards(composed[name])  # the shipped config passes
    with pytest.raises(ValueError, match=message):
        check_step_rewards(cfg)


def test_verl_validation_runs_the_baseline_checks(tiny_model):
    base = [
        f"actor_rollout_ref.model.path={tiny_model}",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=/unused.yaml",
    ]
    cfg = compose("stepsearch", [*paper_overrides("stepsearch"), *base, "algorithm.adv_estimator=grpo"])
    with pytest.raises(ValueError, match="stepsearch is trained with gae"):
        validate(cfg)


def paper(mutate):
    config = copy.deepcopy(CONFIG)
    mutate(config)
    return config


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["variants"]["r3rag"].update(advantage="gae"), "'variants.r3rag.advantage'"),
        (
            lambda c: c["variants"]["stepsearch"].update(advantage="turn_gae"),
            "'variants.stepsearch.advantage'",
        ),
        (lambda c: c["judge"].update(gpus=1), r"'judge.gpus'.*the 7 left must be >= 1 and divide the 512"),
        (lambda c: c["judge"].update(gpus=8), r"'judge.gpus'.*the 0 left"),
        (
            lambda c: (
                c["variants"]["r3rag"].update(judge="reranker"),
                c["retrieval"]["reranker"].update(model=None),
            ),
            "'variants.r3rag.judge': the reranker judge needs retrieval.reranker.model",
        ),
        (lambda c: c["variants"]["r3rag"].update(judge="human"), "'variants.r3rag.judge'"),
    ],
)
def test_workflow_config_errors_name_the_key(mutate, message):
    with pytest.raises(ConfigError, match=message):
        check_config(paper(mutate), REPO / "config" / "verl")


def test_a_judge_url_frees_the_gpus():
    check_config(
        paper(lambda c: c["judge"].update(gpus=1, url="http://judge:30000/v1")),
        REPO / "config" / "verl",
    )


def test_launch_additions(tmp_path):
    variants, judge = CONFIG["variants"], CONFIG["judge"]
    step = scorer_launch(variants["stepsearch"], evidence=tmp_path / "ev.jsonl", stepsearch={"workers": 3})
    assert step.record_turns and step.judge_gpus == 0
    assert step.overrides == [
        f"++algorithm.stepsearch.evidence_path={tmp_path / 'ev.jsonl'}",
        "++algorithm.stepsearch.workers=3",
    ]
    with pytest.raises(ValueError, match="input 'evidence'"):
        scorer_launch(variants["stepsearch"])
    served = scorer_launch(variants["r3rag"], judge=judge)
    assert served.record_turns and served.judge_gpus == judge["gpus"]
    assert "++algorithm.r3rag.judge.model=Qwen/Qwen2.5-14B-Instruct" in served.overrides
    assert "++algorithm.r3rag.judge.concurrency=64" in served.overrides
    rerank = scorer_launch(dict(variants["r3rag"], judge="reranker"), judge=judge)
    assert rerank.record_turns and rerank.overrides == [] and rerank.judge_gpus == 0
    assert scorer_launch(variants["spader"]).record_turns is False
    # the judge's operational settings are not params (editing them retrains nothing)
    params = judge_params(variants["r3rag"], judge)
    assert "timeout_s" not in params and "url" not in params and params["model"] == judge["model"]
    assert judge_params(dict(variants["r3rag"], judge="reranker"), judge) is None
    assert judge_settings(params, {"judge": dict(judge, url="http://x/v1")})["url"] == "http://x/v1"


def test_a_configured_judge_url_is_used_as_it_is():
    judge = dict(CONFIG["judge"], url="http://judge-host:30000/v1")
    launch = scorer_launch(CONFIG["variants"]["r3rag"], judge=judge)
    assert launch.judge_gpus == 0
    with judge_endpoint(launch, judge, model_dir=None, training_gpus=8, environ={}) as (overrides, env):
        assert overrides == ["++algorithm.r3rag.judge.url=http://judge-host:30000/v1"] and env == {}
