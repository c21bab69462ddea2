"""The agent loop on scripted turns (ScriptedEngine and FakeSearch are fakes, see conftest.py):
protocol, budgets, discovery per turn and every hostile output a model can produce."""

from __future__ import annotations

import json

import pytest
from sections import agent_settings

from spader.agent.loop import AgentSettings, Question, run_episodes
from spader.evaluation.episodes import episode_record

FILMS = "Which films were directed by Ilse Varga?"
FILMS_GOLD = [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"], ["Glass Harbour"]]
LAKE = "Which rivers flow into Lake Morrow?"
LAKE_GOLD = [["Tam", "River Tam"], ["Oure"]]

SETTINGS = agent_settings(
    max_turns=4, max_turn_tokens=64, max_context_tokens=100_000, max_queries_per_call=10
)


def run(scripted, search, scripts, gold=None, settings=SETTINGS, method="react"):
    gold = gold or {FILMS: FILMS_GOLD, LAKE: LAKE_GOLD}
    questions = [Question(f"q{i}", q, gold[q]) for i, q in enumerate(scripts)]
    episodes = run_episodes(questions, scripted(scripts), search, settings, method=method, progress=False)
    return episodes, [episode_record(ep, "test") for ep in episodes]


def test_search_then_answer_records_turns_discovery_and_scores(scripted, fake_search):
    scripts = {
        FILMS: [
            '<think>search</think><tool_call>["Ilse Varga films"]</tool_call>',
            '<tool_call>["Glass Harbour", "Salt Orchard"]</tool_call>',
            '<think>done</think><answer>["Salt Orchard", "the salt orchard", "Winter Quay", "Lake Morrow"]</answer>',
        ]
    }
    (ep,), (rec,) = run(scripted, fake_search, scripts)
    assert ep.status == "answered" and rec["format_valid"]
    # one search call per turn; turn 2 sends both queries together
    assert fake_search.calls == [["Ilse Varga films"], ["Glass Harbour", "Salt Orchard"]]
    # p1+p2 name Salt Orchard and Winter Quay; turn 2 adds Glass Harbour (p3, p5)
    assert [s.new_entities for s in ep.steps] == [[0, 1], [2], []]
    assert rec["new_entities_per_turn"] == [2, 1, 0] and rec["entities_found"] == 3
    assert (rec["search_calls"], rec["queries_issued"], rec["turns"]) == (2, 3, 3)
    # predictions: 3 unique after normalization, 2 correct of 3 gold -> P = R = F1 = 2/3
    assert rec["precision"] == pytest.approx(2 / 3) and rec["recall"] == pytest.approx(2 / 3)
    assert rec["f1"] == pytest.approx(2 / 3)
    tool_msgs = [s.observation for s in ep.steps if s.observation is not None]
    assert len(tool_msgs) == 2 and tool_msgs[0].startswith(
        'Results for "Ilse Varga films":\nDoc 1 (Title: The Salt Orchard)'
    )
    assert rec["steps"][0]["passage_ids"] == [["p1", "p2"]]
    json.dumps(rec)  # the record is JSON-serialisable


def test_episodes_advance_in_lock_step_with_one_engine_call_per_turn(scripted, fake_search):
    scripts = {
        FILMS: ['<tool_call>["Ilse Varga"]</tool_call>', '<answer>["Winter Quay"]</answer>'],
        LAKE: ['<answer>["Tam"]</answer>'],
    }
    engine = scripted(scripts)
    questions = [Question("a", FILMS, FILMS_GOLD), Question("b", LAKE, LAKE_GOLD)]
    eps = run_episodes(questions, engine, fake_search, SETTINGS, progress=False)
    assert engine.calls == [2, 1]  # turn 1: both episodes; turn 2: the one still running
    assert [e.question.id for e in eps] == ["a", "b"] and [e.predictions for e in eps] == [
        ["Winter Quay"],
        ["Tam"],
    ]


def test_rag_retrieves_with_the_question_then_must_answer_in_one_turn(scripted, fake_search):
    scripts = {FILMS: ['<answer>["Glass Harbour"]</answer>'], LAKE: ['<tool_call>["more"]</tool_call>']}
    eps, recs = run(scripted, fake_search, scripts, method="rag")
    assert fake_search.calls == [[FILMS, LAKE]]  # the retrieval only; the second call is never run
    films, lake = recs
    assert films["steps"][0]["kind"] == "retrieval" and films["steps"][0]["queries"] == [FILMS]
    assert films["format_valid"] and films["f1"] == pytest.approx(0.5)  # P 1, R 1/3
    assert films["search_calls"] == 1 and films["turns"] == 2
    assert lake["status"] == "turn_budget" and lake["f1"] == 0.0 and not lake["format_valid"]
    # the retrieval is shown as a search turn of the model's own, then its observation
    retrieval = json.dumps([FILMS]).join(["<tool_call>", "</tool_call>"])
    assert eps[0].steps[0].text == retrieval
    shown = eps[0].conversation.tokenizer.decode(eps[0].conversation.ids, skip_special_tokens=False)
    assert f"<|im_start|>assistant\n{retrieval}<|im_end|>\n<|im_start|>user\n<tool_response>\n" in shown


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<think>unclosed <answer>["Winter Quay"]</answer>', "unbalanced_think"),  # unbalanced tags
        (
            '<think>a</think><think><think>b</think></think><answer>["x"]</answer>',
            "unbalanced_think",
        ),  # nested
        ('<answer>["Winter Quay"]', "unclosed_answer"),  # unclosed answer
        ("<answer>Winter Quay, Glass Harbour</answer>", "answer_not_json_list"),  # not JSON
        ('<answer>{"a": 1}</answer>', "answer_not_json_list"),  # JSON, not a list
        ("<answer>[1, 2]</answer>", "answer_not_json_list"),  # list of non-strings
        ("", "no_action"),  # empty output
        ("I think the answer is Winter Quay.", "no_action"),  # neither tool call nor answer
        ('<tool_call>["unclosed"]', "no_action"),  # unclosed tool call is not a call
    ],
)
def test_hostile_final_turns_score_zero_and_never_raise(scripted, fake_search, text, reason):
    (_ep,), (rec,) = run(scripted, fake_search, {FILMS: [text]})
    assert not rec["format_valid"] and rec["invalid_reason"] == reason
    assert (rec["precision"], rec["recall"], rec["f1"]) == (0.0, 0.0, 0.0) and rec["predictions"] == []
    assert fake_search.calls == []


def test_malformed_tool_call_returns_an_error_observation_and_the_episode_goes_on(scripted, fake_search):
    scripts = {
        FILMS: [
            "<tool_call>Ilse Varga films</tool_call>",
            '<tool_call>["", "  "]</tool_call>',
            '<answer>["Winter Quay"]</answer>',
        ]
    }
    (ep,), (rec,) = run(scripted, fake_search, scripts)
    assert fake_search.calls == []
    tool = [s.observation for s in ep.steps if s.observation is not None]
    assert tool == [
        "Error: the tool call must be a JSON list of query strings",
        "Error: the tool call contains no non-empty query",
    ]
    assert [s.tool_error is not None for s in ep.steps] == [True, True, False]
    assert rec["format_valid"] and rec["search_calls"] == 0 and rec["recall"] == pytest.approx(1 / 3)


def test_ten_thousand_item_answer_is_scored(scripted, fake_search):
    answer = ["Winter Quay", "Glass Harbour"] + [f"Film number {i}" for i in range(9998)]
    settings = agent_settings(max_turns=4, max_context_tokens=1_000_000)  # no per-turn cap
    (_ep,), (rec,) = run(
        scripted, fake_search, {FILMS: ["<answer>" + json.dumps(answer) + "</answer>"]}, settings=settings
    )
    assert rec["format_valid"] and len(rec["predictions"]) == 10_000
    assert rec["precision"] == pytest.approx(2 / 10_000) and rec["recall"] == pytest.approx(2 / 3)


def test_endless_search_loop_is_stopped_by_the_turn_budget(scripted, fake_search):
    settings = agent_settings(max_turns=3, max_turn_tokens=64, max_context_tokens=100_000)
    (ep,), (rec,) = run(
        scripted, fake_search, {FILMS: ['<tool_call>["Ilse Varga"]</tool_call>'] * 50}, settings=settings
    )
    assert ep.status == "turn_budget" and rec["invalid_reason"] == "turn_budget" and rec["f1"] == 0.0
    assert rec["turns"] == 3 and len(fake_search.calls) == 2  # the call of the last turn is never run
    assert ep.steps[-1].queries == [] and ep.steps[-1].skipped_queries == 1


def test_queries_beyond_the_per_call_limit_are_not_run(scripted, fake_search):
    settings = agent_settings(max_turns=2, max_queries_per_call=3, max_context_tokens=100_000)
    queries = [f"query {i}" for i in range(7)]
    scripts = {FILMS: [f"<tool_call>{json.dumps(queries)}</tool_call>", "<answer>[]</answer>"]}
    (ep,), (rec,) = run(scripted, fake_search, scripts, settings=settings)
    assert fake_search.calls == [queries[:3]] and ep.steps[0].skipped_queries == 4
    assert rec["format_valid"] and rec["f1"] == 0.0  # [] is a valid, empty answer


def test_context_budget_ends_the_episode(scripted, fake_search, tokenizer):
    from spader.agent.loop import render_prompt
    from spader.core.prompt import build_messages

    first = len(render_prompt(tokenizer, build_messages(FILMS)))
    settings = agent_settings(max_turns=4, max_turn_tokens=64, max_context_tokens=first + 40)
    scripts = {FILMS: ['<tool_call>["Ilse Varga"]</tool_call>', '<answer>["Winter Quay"]</answer>']}
    (ep,), (rec,) = run(scripted, fake_search, scripts, settings=settings)
    assert ep.steps[0].prompt_tokens == first
    assert ep.status == "context_budget" and rec["turns"] == 1 and rec["f1"] == 0.0


def test_long_observations_drop_low_ranked_passages_and_discovery_counts_only_shown_ones(
    scripted, fake_search, passages
):
    # FakeSearch returns p1 (Salt Orchard) then p2 (Winter Quay); the budget fits only p1
    header = 'Results for "Ilse Varga":\n'
    one = header + "Doc 1 (Title: The Salt Orchard) " + passages[0]["text"]
    settings = agent_settings(max_turns=2, max_tool_response_chars=len(one) + 5, max_context_tokens=100_000)
    scripts = {FILMS: ['<tool_call>["Ilse Varga"]</tool_call>', '<answer>["Winter Quay"]</answer>']}
    (ep,), (rec,) = run(scripted, fake_search, scripts, settings=settings)
    tool = next(s.observation for s in ep.steps if s.observation is not None)
    assert tool == one and rec["steps"][0]["passage_ids"] == [["p1"]]
    assert rec["new_entities_per_turn"] == [1, 0]  # Winter Quay was returned but not shown


def test_observation_fitting_and_hits_are_the_training_tool_s():
    """One implementation serves both: evaluation shows and scores what training would."""
    import spader.agent.loop as loop
    import spader.integrations.verl.search_tool as tool
    from spader.core import prompt, rewards

    assert loop.fit_observation is tool.fit_observation is prompt.fit_observation
    assert loop.passage_hits is tool.passage_hits is rewards.passage_hits


def test_hostile_long_queries_are_cut_as_in_training(scripted, fake_search):
    settings = agent_settings(max_turns=2, max_query_chars=12, max_context_tokens=100_000)
    long = "Ilse Varga " + "x" * 10_000
    scripts = {FILMS: [f"<tool_call>{json.dumps([long])}</tool_call>", "<answer>[]</answer>"]}
    (_ep,), (rec,) = run(scripted, fake_search, scripts, settings=settings)
    assert fake_search.calls == [["Ilse Varga x"]] and rec["steps"][0]["queries"] == ["Ilse Varga x"]


def test_a_generation_failure_is_kept_as_zero_and_the_others_continue(scripted, fake_search):
    scripts = {FILMS: [RuntimeError("CUDA out of memory")], LAKE: ['<answer>["Tam", "Oure"]</answer>']}
    _eps, (films, lake) = run(scripted, fake_search, scripts)
    assert films["status"] == "generation_error" and "out of memory" in films["error"] and films["f1"] == 0.0
    assert lake["f1"] == 1.0


def test_settings_come_from_the_agent_and_evaluation_config_and_are_checked():
    from spader.config import AgentConfig, EvaluationConfig
    from spader.config.model import ServiceConfig

    s = AgentSettings.from_config(
        EvaluationConfig(engine="transformers", max_context_tokens=900, temperature=0.5, gpus=0),
        AgentConfig(max_turns=3, max_turn_tokens=40, stop=["</answer>"], regenerations=2),
        ServiceConfig(max_query_chars=77),
    )
    assert s.max_query_chars == 77
    assert (s.max_turns, s.max_turn_tokens, s.max_context_tokens, s.temperature) == (3, 40, 900, 0.5)
    assert s.stop == ("</answer>",) and s.sampling.stop == ("</answer>",) and s.regenerations == 2
    # the defaults: no per-turn cap, the authors' evaluation decoding, a small error tolerance
    d = AgentSettings.from_config(EvaluationConfig(max_context_tokens=8704), AgentConfig(), ServiceConfig())
    assert (d.max_turn_tokens, d.temperature, d.top_p, d.max_error_share) == (None, 1.0, 1.0, 0.02)
    # the context budget is resolved by the workflow (training's); unresolved, it is an error
    with pytest.raises(ValueError, match="max_context_tokens is null"):
        AgentSettings.from_config(EvaluationConfig(), AgentConfig(), ServiceConfig())
    with pytest.raises(ValueError, match="agent.max_turns"):
        agent_settings(max_turns=0)
    with pytest.raises(ValueError, match="evaluation.max_context_tokens"):
        agent_settings(max_context_tokens=0)


class RejectingSearch:
    """Fake retrieval (see conftest.py) that answers like the real client does when the service
    rejects a request (HTTP 4xx): any request holding ``bad`` fails, the others are served."""

    class Rejected(RuntimeError):
        status = 422

    def __init__(self, bad: str, inner):
        self.bad, self.inner, self.calls = bad, inner, []

    def __call__(self, queries):
        self.calls.append(list(queries))
        if self.bad in queries:
            raise self.Rejected(f"query {self.bad!r} rejected")
        return self.inner(queries)


def test_text_after_the_first_closing_tag_is_not_part_of_the_turn(scripted, fake_search):
    """A server that keeps generating after </tool_call>: the turn still ends there, as in training."""
    scripts = {
        FILMS: ['<tool_call>["Ilse Varga"]</tool_call><answer>["Invented"]</answer>', "<answer>[]</answer>"]
    }
    (ep,), (rec,) = run(scripted, fake_search, scripts)
    assert ep.steps[0].kind == "search" and ep.steps[0].text == '<tool_call>["Ilse Varga"]</tool_call>'
    assert fake_search.calls == [["Ilse Varga"]] and ep.status == "answered" and rec["predictions"] == []
    shown = ep.conversation.tokenizer.decode(ep.conversation.ids, skip_special_tokens=False)
    assert "</tool_call><|im_end|>" in shown and "Invented" not in shown


def test_unusable_queries_are_that_episodes_error_observation(scripted, fake_search):
    scripts = {
        FILMS: ['<tool_call>["\\ud800 films"]</tool_call>', '<answer>["Winter Quay"]</answer>'],
        LAKE: ["<tool_call>[" + "[" * 3000 + "]" * 3000 + "]</tool_call>", '<answer>["Tam"]</answer>'],
    }
    settings = agent_settings(max_turns=4, max_context_tokens=100_000)  # the deep list is a long turn
    (films, lake), records = run(scripted, fake_search, scripts, settings=settings)
    assert fake_search.calls == []  # nothing unusable reached the service
    for ep in (films, lake):
        assert "JSON list of query strings" in ep.steps[0].tool_error
        assert ep.steps[0].observation.startswith("Error:") and ep.status == "answered"
    assert [r["f1"] for r in records] == [pytest.approx(0.5), pytest.approx(2 / 3)]
    json.dumps(records)


def test_a_rejected_search_costs_only_its_episode(scripted, fake_search):
    search = RejectingSearch("poison", fake_search)
    scripts = {
        FILMS: ['<tool_call>["poison"]</tool_call>', '<answer>["Winter Quay"]</answer>'],
        LAKE: ['<tool_call>["Lake Morrow"]</tool_call>', '<answer>["Tam", "Oure"]</answer>'],
    }
    (films, lake), (_rf, rl) = run(scripted, search, scripts)
    assert search.calls == [["poison", "Lake Morrow"], ["poison"], ["Lake Morrow"]]
    assert "rejected the queries" in films.steps[0].tool_error and films.status == "answered"
    assert lake.steps[0].hits == [0, 1] and rl["f1"] == 1.0


def test_a_search_service_that_stays_down_stops_the_run(scripted):
    def dead(queries):
        raise ConnectionError("retrieval service unreachable after retries")

    with pytest.raises(ConnectionError):
        run(scripted, dead, {FILMS: ['<tool_call>["x"]</tool_call>', "<answer>[]</answer>"]})


def test_any_failure_of_one_episode_is_recorded_and_scored_zero(scripted, fake_search, monkeypatch):
    import spader.agent.loop as loop

    real = loop._record_passages

    def flaky(ep, step, queries, passages, settings):
        if ep.question.question == FILMS:
            raise KeyError("corrupt passage")
        return real(ep, step, queries, passages, settings)

    monkeypatch.setattr(loop, "_record_passages", flaky)
    scripts = {
        FILMS: ['<tool_call>["Ilse Varga"]</tool_call>', '<answer>["Winter Quay"]</answer>'],
        LAKE: ['<tool_call>["Lake Morrow"]</tool_call>', '<answer>["Tam", "Oure"]</answer>'],
    }
    (films, _lake), (rf, rl) = run(scripted, fake_search, scripts)
    assert films.status == "episode_error" and "recording search results: KeyError" in films.error
    assert (rf["f1"], rf["status"]) == (0.0, "episode_error") and rl["f1"] == 1.0
    from spader.evaluation.episodes import summarize

    assert summarize([rf, rl])["failed"] == 1


def test_an_engine_that_raises_fails_its_episodes_not_the_run(tokenizer, fake_search):
    class Broken:
        name, tokenizer_ = "broken", None

        def __init__(self, tok):
            self.tokenizer = tok

        def generate(self, prompts, max_new_tokens, sampling, seeds=None):
            raise RuntimeError("engine crashed")

    questions = [Question("q0", FILMS, FILMS_GOLD), Question("q1", LAKE, LAKE_GOLD)]
    episodes = run_episodes(questions, Broken(tokenizer), fake_search, SETTINGS, progress=False)
    assert [(e.status, e.error) for e in episodes] == [
        ("generation_error", "RuntimeError: engine crashed")
    ] * 2


# --------------------------------------------------------------------------------------------
# One representation of a conversation, training's budgets and decoding
# --------------------------------------------------------------------------------------------
def test_the_conversation_keeps_the_generated_ids_and_is_never_re_rendered(scripted, fake_search, tokenizer):
    """The next prompt holds the ids the model generated, not the template's rendering of its text."""
    text = '<tool_call>["Ilse Varga"]</tool_call>'
    odd = [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]  # one id per character
    assert odd != tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(odd, skip_special_tokens=False) == text
    engine = scripted({FILMS: [odd, '<answer>["Winter Quay"]</answer>']})
    settings = agent_settings(max_turns=3, max_context_tokens=100_000)
    (ep,) = run_episodes([Question("q", FILMS, FILMS_GOLD)], engine, fake_search, settings, progress=False)
    assert ep.status == "answered" and fake_search.calls == [["Ilse Varga"]]
    first, second = engine.requests[0][0], engine.requests[1][0]
    assert second[: len(first)] == first and second[len(first) : len(first) + len(odd)] == odd
    # after the turn: the template's closing tokens, the observation as a user turn, the next header
    tail = tokenizer.decode(second[len(first) + len(odd) :], skip_special_tokens=False)
    assert tail.startswith('<|im_end|>\n<|im_start|>user\n<tool_response>\nResults for "Ilse Varga":')
    assert tail.endswith("\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert ep.conversation.ids == second + tokenizer.encode(
        '<answer>["Winter Quay"]</answer>', add_special_tokens=False
    )


def test_a_turn_may_use_the_remaining_budget_unless_a_cap_is_set(scripted, fake_search, tokenizer):
    from spader.agent.loop import render_prompt
    from spader.core.prompt import build_messages

    first = len(render_prompt(tokenizer, build_messages(FILMS)))
    for cap, expected in ((None, 500), (64, 64)):
        engine = scripted({FILMS: ['<answer>["Winter Quay"]</answer>']})
        settings = agent_settings(max_turns=2, max_turn_tokens=cap, max_context_tokens=first + 500)
        run_episodes([Question("q", FILMS, FILMS_GOLD)], engine, fake_search, settings, progress=False)
        assert engine.requests[0][1] == expected


def test_turns_cut_by_a_token_budget_are_counted(scripted, fake_search, tokenizer):
    from spader.agent.loop import render_prompt
    from spader.core.prompt import build_messages
    from spader.evaluation.episodes import summarize

    long = "<think>" + "more thinking " * 100 + '</think><answer>["Winter Quay"]</answer>'
    capped = agent_settings(max_turns=2, max_turn_tokens=30, max_context_tokens=100_000)
    (ep,), (rec,) = run(scripted, fake_search, {FILMS: [long]}, settings=capped)
    assert ep.steps[0].budget_cut and ep.status == "no_action" and rec["f1"] == 0.0
    assert (rec["budget_cut"], rec["budget_cut_turns"]) == (True, 1)
    # the context budget: the turn uses what is left and is cut there
    first = len(render_prompt(tokenizer, build_messages(FILMS)))
    tight = agent_settings(max_turns=2, max_context_tokens=first + 30)
    (ep2,), (rec2,) = run(scripted, fake_search, {FILMS: [long]}, settings=tight)
    assert ep2.status == "context_budget" and rec2["budget_cut"] and rec2["budget_cut_turns"] == 1
    # an answer within the budget is not cut
    (_e,), (ok,) = run(scripted, fake_search, {FILMS: ['<answer>["Winter Quay"]</answer>']}, settings=capped)
    assert (ok["budget_cut"], ok["budget_cut_turns"]) == (False, 0)
    assert summarize([rec, rec2, ok])["budget_cut"] == 2


def test_each_request_samples_with_its_own_seed_whatever_its_batch(scripted, fake_search):
    from spader.agent.loop import request_seed

    scripts = {
        FILMS: ['<tool_call>["Ilse Varga"]</tool_call>', "<answer>[]</answer>"],
        LAKE: ["<answer>[]</answer>"],
    }
    settings = agent_settings(max_turns=3, max_context_tokens=100_000, seed=7)
    together = scripted(scripts)
    run_episodes(
        [Question("a", FILMS, FILMS_GOLD), Question("b", LAKE, LAKE_GOLD)], together, fake_search, settings,
        progress=False,
    )  # fmt: skip
    alone = scripted(scripts)
    run_episodes([Question("a", FILMS, FILMS_GOLD)], alone, fake_search, settings, progress=False)
    seeds_together = [seed for _, _, seed in together.requests]
    assert seeds_together == [request_seed(7, "a", 0), request_seed(7, "b", 0), request_seed(7, "a", 1)]
    assert [seed for _, _, seed in alone.requests] == [seeds_together[0], seeds_together[2]]
    assert len(set(seeds_together)) == 3 and request_seed(8, "a", 0) != seeds_together[0]


def test_a_malformed_turn_is_sampled_again_when_regenerations_are_on(scripted, fake_search):
    scripts = {FILMS: ["I am not sure.", '<answer>["Winter Quay"]</answer>']}
    off = agent_settings(max_turns=2, max_context_tokens=100_000)
    (ep,), _ = run(scripted, fake_search, scripts, settings=off)
    assert ep.status == "no_action" and len(ep.steps) == 1
    on = agent_settings(max_turns=2, max_context_tokens=100_000, regenerations=3)
    (ep,), (rec,) = run(scripted, fake_search, scripts, settings=on)
    assert ep.status == "answered" and len(ep.steps) == 1 and ep.steps[0].regenerated == 1
    assert rec["f1"] == pytest.approx(0.5)
    # the malformed sample left no trace in the conversation
    assert "not sure" not in ep.conversation.tokenizer.decode(ep.conversation.ids)


def test_too_many_generation_errors_stop_the_run(scripted, fake_search):
    from spader.agent.loop import GenerationFailure

    scripts = {FILMS: [RuntimeError("CUDA error: device lost")], LAKE: ['<answer>["Tam", "Oure"]</answer>']}
    strict = agent_settings(max_turns=2, max_context_tokens=100_000, max_error_share=0.02)
    with pytest.raises(GenerationFailure, match=r"engine 'scripted': 1 of 2 episodes \(50.0%\).*device lost"):
        run(scripted, fake_search, scripts, settings=strict)
    tolerant = agent_settings(max_turns=2, max_context_tokens=100_000, max_error_share=0.5)
    _eps, (films, lake) = run(scripted, fake_search, scripts, settings=tolerant)
    assert films["status"] == "generation_error" and lake["f1"] == 1.0
