"""R3-RAG's outcome-scaled process rewards (docs/baselines.md): one hand-computed table per
outcome state, the outcome of a last turn, the judge's prompt and verdict, the reranker judge."""

from __future__ import annotations

import math

import pytest
import torch

from spader.methods.r3rag.densify import r3rag_dense_rewards
from spader.methods.r3rag.scoring import (
    classify_final_turn,
    judge_messages,
    parse_relevance,
    r3rag_rewards,
    reranker_relevance,
    turn_reasoning,
)
from spader.methods.steps import TurnDetails

RHO = [0.5, 0.25, 0.75]  # process scores of three turns (the last one only counts without an answer)


@pytest.mark.parametrize(
    ("outcome", "f1", "expected"),
    [
        # valid answer, F1 = 1: search turns x1.6, answer 2
        ("answered", 1.0, [0.8, 0.4, 2.0]),
        # valid answer, F1 = 0: search turns x0.8, answer 0
        ("answered", 0.0, [0.4, 0.2, 0.0]),
        # valid answer, F1 = 0.5: x(0.8 + 0.4) = x1.2, answer 1.0
        ("answered", 0.5, [0.6, 0.3, 1.0]),
        # budget ran out on a search call: every turn x0.9, the last one's own score included
        ("no_answer", None, [0.45, 0.225, 0.675]),
        # invalid last turn: -0.9 there, earlier turns keep their scores unscaled
        ("invalid", None, [0.5, 0.25, -0.9]),
    ],
)
def test_outcome_states(outcome, f1, expected):
    assert r3rag_rewards(RHO, outcome, f1) == pytest.approx(expected)


def test_single_turn_trajectories():
    assert r3rag_rewards([0.0], "answered", 0.25) == [0.5]  # answered at once: 2 F1
    assert r3rag_rewards([0.0], "invalid") == [-0.9]


@pytest.mark.parametrize(
    ("rho", "outcome", "f1", "message"),
    [
        ([], "answered", 1.0, "at least one assistant turn"),
        ([1.2], "invalid", None, r"\[0, 1\]"),
        ([0.1, 0.2], "answered", None, "needs its F1"),
        ([0.1], "timeout", None, "outcome must be one of"),
    ],
)
def test_bad_inputs_are_refused(rho, outcome, f1, message):
    with pytest.raises(ValueError, match=message):
        r3rag_rewards(rho, outcome, f1)


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        ('<think>done</think><answer>["A", "B"]</answer>', "answered"),
        ("<answer>[]</answer>", "answered"),  # an empty list is a valid answer (F1 0)
        ('<think>more</think><tool_call>["q1", "q2"]</tool_call>', "no_answer"),
        ("<tool_call>not json</tool_call>", "invalid"),  # a malformed call is an invalid format
        ('<answer>["A"]', "invalid"),  # unclosed
        ('<think><think>x</think></think><answer>["A"]</answer>', "invalid"),  # nested think
        ("<think>ran out of tokens in the middle of a tho", "invalid"),  # cut by the token cap
    ],
)
def test_outcome_of_the_last_turn(text, outcome):
    assert classify_final_turn(text) == outcome


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("The documents list two of the films.\nRelevance: 0.85", 0.85),
        ("relevance: 1", 1.0),
        ("Relevance: 1.70", 1.0),  # clamped
        ("Relevance: -0.3", 0.0),
        ("**Relevance:** 0.4", 0.4),
        # verdict first (the prompt's and R3-RAG's reply format); its explanation carries no number
        ("Relevance: 0.70\nEvaluation:\n- Relevance: the documents name two films", 0.7),
        ("Relevance: 0.2\nEvaluation: a second Relevance: 0.9 in the text", 0.2),  # the first verdict
        ("Relevance: x.xx", None),
        ("These documents are useless.", None),
        ("", None),
        (None, None),
    ],
)
def test_verdict_parsing(reply, score):
    assert parse_relevance(reply) == (pytest.approx(score) if score is not None else None)


def test_reranker_judge_is_the_sigmoid_of_the_best_score():
    assert reranker_relevance([-2.0, 0.0, 1.5]) == pytest.approx(1 / (1 + math.exp(-1.5)))
    assert reranker_relevance([]) == 0.0
    assert reranker_relevance([-1e9]) == 0.0


def test_judge_prompt_has_the_elements_and_no_gold():
    text = '<think>The films of Varga; search both.</think><tool_call>["Varga films"]</tool_call>'
    reasoning = turn_reasoning(text)
    assert reasoning == "The films of Varga; search both."
    observation = "Doc 1 (Title: Winter Quay) " + "x" * 2000
    (message,) = judge_messages(
        "Which films did Ilse Varga direct?", reasoning, ["Varga films", "Varga"], observation
    )
    content = message["content"]
    assert message["role"] == "user"
    assert "Which films did Ilse Varga direct?" in content
    assert "The films of Varga; search both." in content
    assert '"Varga films"; "Varga"' in content
    assert "Doc 1 (Title: Winter Quay) " + "x" * (512 - 27) in content and "x" * 600 not in content
    assert "contradictory or illogical" in content and content.rstrip().endswith("Relevance: x.xx")
    # the verdict is asked for first, as R3-RAG asks its judge
    assert "Start your reply with a first line of exactly this form" in content
    # without <think>, the reasoning is the text before the call
    assert turn_reasoning('Let me look. <tool_call>["q"]</tool_call>') == "Let me look."


def details(turn, pid="p", scores=(0.0,), error=None):
    return TurnDetails(turn=turn, passage_ids=(pid,), passage_texts=("t",), scores=scores, error=error)


def test_dense_rewards_of_a_batch_with_each_outcome():
    # row 0: search, search, answer (F1 0.5); row 1: search, search (budget ran out);
    # row 2: search with an error observation, invalid last turn; row 3: verl padding row
    mask = torch.tensor(
        [
            [1, 1, 0, 1, 0, 1, 1],
            [1, 0, 1, 1, 0, 0, 0],
            [1, 0, 1, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 0, 0],
        ]
    )
    records = [
        [details(1, "a"), details(2, "b")],
        [details(1, "c"), details(2, "d")],
        [details(1, "e", error="search service unavailable")],
        [],
    ]
    scores = {"a": 0.5, "b": 1.0, "c": 0.2, "d": 0.4}
    asked = []

    def scorer(items):
        asked.extend(d.passage_ids[0] for _, d in items)
        return [scores[d.passage_ids[0]] for _, d in items]

    dense, stats = r3rag_dense_rewards(
        mask,
        torch.tensor([0.5, -1.0, -1.0, 0.0]),
        ["answered", "no_answer", "invalid", "answered"],
        records,
        ["q0", "q1", "q2", "q3"],
        scorer,
        skip=[False, False, False, True],
    )
    assert sorted(asked) == ["a", "b", "c", "d"]  # the error turn is not sent to the judge
    factor = 0.8 + 0.8 * 0.5
    assert dense[0].tolist() == pytest.approx([0, factor * 0.5, 0, factor * 1.0, 0, 0, 2 * 0.5])
    assert dense[1].tolist() == pytest.approx([0.9 * 0.2, 0, 0, 0.9 * 0.4, 0, 0, 0])
    assert dense[2].tolist() == pytest.approx([0.0, 0, 0, 0, -0.9, 0, 0])
    assert dense[3].tolist() == [0.0] * 7
    metrics = stats.metrics("r3rag/")
    assert metrics["r3rag/outcome_answered"] == 1 and metrics["r3rag/outcome_no_answer"] == 1
    assert metrics["r3rag/judged_turns"] == 4


def test_the_scorer_must_answer_every_turn():
    mask = torch.tensor([[1, 0, 1]])
    with pytest.raises(ValueError, match="returned 0 scores for 1 turns"):
        r3rag_dense_rewards(mask, torch.tensor([1.0]), ["answered"], [[details(1)]], ["q"], lambda items: [])


def test_doc_examples():
    import doctest
    import importlib

    for name in (
        "spader.core.parsing",  # malformed_turn: the turns R3-RAG's original samples again
        "spader.methods.r3rag.scoring",
        "spader.methods.stepsearch.gain",
        "spader.scorers.evidence",
        "spader.scorers.judge_server",
    ):
        result = doctest.testmod(importlib.import_module(name))
        assert result.attempted > 0 and result.failed == 0, name


def test_the_judge_has_the_original_s_reply_budget():
    """R3-RAG gives its judge 4,096 tokens: a judge that explains at length is not cut before its
    verdict (the config's default, which the launcher hands the trainer's client)."""
    from spader.config import JudgeConfig
    from spader.training.scorer_launch import scorer_launch

    assert JudgeConfig().max_tokens == 4096
    launch = scorer_launch({"verl_config": "r3rag", "advantage": "turn_gae", "reward": "r3rag"}, judge={})
    assert "++algorithm.r3rag.judge.max_tokens=4096" in launch.overrides


def test_the_judge_options_reach_the_trainers_client():
    """judge.temperature null (the server's default) and judge.unparsable raise travel from the
    config through the launch overrides to the trainer's judge client settings."""
    from omegaconf import OmegaConf

    from spader.integrations.verl.scorer_rewards import JudgeSettings
    from spader.training.scorer_launch import scorer_launch

    r3rag = {"verl_config": "r3rag", "advantage": "turn_gae", "reward": "r3rag"}
    for judge, expected in (
        ({"temperature": None, "unparsable": "raise"}, (None, "raise")),
        ({}, (0.0, "zero")),
    ):
        launch = scorer_launch(r3rag, judge=judge)
        dotlist = [o.removeprefix("++") for o in launch.overrides]
        dotlist += ["algorithm.r3rag.judge.kind=llm", "algorithm.r3rag.judge.url=http://127.0.0.1:1/v1"]
        client = JudgeSettings.from_config(OmegaConf.from_dotlist(dotlist)).client
        assert (client.temperature, client.unparsable) == expected
