"""The method registry: what it refuses, which method a variant belongs to, and what it drives
(the table rows, the verl YAML, the overrides, the search tool's turn records). Methods registered
here are removed again after each test."""

from __future__ import annotations

import pytest

import spader.methods as methods
from spader.methods import Advantage, Method, MethodError, Reward, TableRole, method_of, register


@pytest.fixture
def registry():
    """The registry as it was before the test, restored after it."""
    saved = [dict(r) for r in (methods.METHODS, methods.REWARDS, methods.ADVANTAGES, methods._OWNER)]
    yield methods
    for current, before in zip(
        (methods.METHODS, methods.REWARDS, methods.ADVANTAGES, methods._OWNER), saved, strict=True
    ):
        current.clear()
        current.update(before)


def _method(name="extra", reward="extra_r", advantage="extra_a", **kw) -> Method:
    return Method(
        name=name,
        description="a test method",
        rewards=(Reward(name=reward, description="r", step_reward=reward, step_rewards="m:f", **kw),),
        advantages=(
            Advantage(name=advantage, estimator=f"{advantage}_est", rewards=(reward,), description="a"),
        ),
    )


def test_a_name_brought_by_another_method_is_refused(registry):
    register(_method())
    with pytest.raises(MethodError, match="reward 'extra_r' is already brought by method 'extra'"):
        register(_method(name="other", advantage="other_a"))
    with pytest.raises(MethodError, match="advantage 'spa' is already brought by method 'spader'"):
        register(_method(name="third", reward="third_r", advantage="spa"))
    with pytest.raises(MethodError, match="registered twice"):
        register(_method(reward="x_r", advantage="x_a"))  # the name 'extra' with another definition


def test_a_table_the_tables_do_not_know_is_refused(registry):
    with pytest.raises(MethodError, match="table 'leaderboard'"):
        register(Method(name="t", description="t", tables=(TableRole(table="leaderboard", key="label"),)))


def test_a_variant_belongs_to_its_rewards_method_or_for_the_terminal_reward_its_advantages():
    assert method_of("spa", "step").name == "spader"
    assert method_of("grpo_return", "step").name == "spader"
    assert method_of("grpo", "step").name == "spader"  # GRPO's advantage on SPADER's reward
    assert method_of("grpo", "terminal").name == "grpo"
    assert method_of("gae", "terminal").name == "ppo"
    assert method_of("gae", "stepsearch").name == "stepsearch"
    assert method_of("turn_gae", "r3rag").name == "r3rag"


def test_the_verl_yaml_and_the_table_rows_come_from_the_method():
    assert methods.verl_yaml({"verl_config": None, "advantage": "gae", "reward": "terminal"}) == "ppo"
    assert methods.verl_yaml({"verl_config": "grpo", "advantage": "gae", "reward": "terminal"}) == "grpo"
    rows = methods.table_rows(
        {
            "a": {"advantage": "spa", "reward": "step", "table": "ablation", "label": "A", "beta": 4.0},
            "b": {"advantage": "spa", "reward": "step", "table": "beta_sweep", "label": None, "beta": 2.0},
            "c": {"advantage": "gae", "reward": "terminal", "table": None},
        }
    )
    assert rows == [
        ["a", {"ordered": False, "table": "ablation", "value": "A"}],
        ["b", {"ordered": True, "table": "beta_sweep", "value": 2.0}],
        ["c", {}],
    ]


def test_a_table_the_method_does_not_offer_is_refused():
    from spader.config import VariantConfig

    with pytest.raises(ValueError, match="table: method 'ppo' offers no table"):
        VariantConfig.model_validate({"advantage": "gae", "reward": "terminal", "table": "ablation"})
    with pytest.raises(ValueError, match="label: an ablation row needs its label"):
        VariantConfig.model_validate({"table": "ablation"})


def test_a_reward_that_reads_the_turns_gets_them_recorded(registry):
    from spader.training.scorer_launch import scorer_launch

    register(_method(record_turns=True))
    register(_method(name="plain", reward="plain_r", advantage="plain_a"))
    assert scorer_launch({"advantage": "extra_a", "reward": "extra_r"}).record_turns
    assert not scorer_launch({"advantage": "plain_a", "reward": "plain_r"}).record_turns
    assert not scorer_launch({"advantage": "spa", "reward": "step"}).record_turns


def test_a_method_path_that_cannot_be_imported_is_named():
    with pytest.raises(MethodError, match="'spader.nowhere:thing' cannot be imported"):
        methods.resolve("spader.nowhere:thing")
    with pytest.raises(MethodError, match="not of the form"):
        methods.resolve("spader.methods")


def test_what_a_training_needs_is_asked_for_by_name_not_by_method(registry):
    from spader.training.scorer_launch import scorer_launch

    assert methods.needs("stepsearch", "evidence") and not methods.needs("step", "evidence")
    assert methods.needs("r3rag", "judge") and not methods.needs("terminal", "judge")
    with pytest.raises(MethodError, match="inputs \\['oracle'\\] are not among"):
        Reward(name="x", description="x", inputs=("oracle",))
    # a plug-in reward that reads StepSearch's evidence gets it as StepSearch does
    register(_method(record_turns=True, inputs=("evidence",)))
    with pytest.raises(ValueError, match="evidence of rule build_evidence"):
        scorer_launch({"advantage": "extra_a", "reward": "extra_r"})
