"""The options that reproduce the authors' evaluation (config/authors.yaml), each against the
default on the same scripted turns (ScriptedEngine and FakeSearch are fakes, see conftest.py): no
stop string and the last call of a turn, the last <answer> anywhere, uncapped calls, their
observation format, their evaluation loop (the last turn's call runs, a generation error scored
on what it wrote, failed instances dropped, the history re-rendered), their budgets and the
sampling fields of generation_config.json."""

from __future__ import annotations

import dataclasses
import json

import pytest
from sections import agent_settings

from spader.agent.conversation import render_ids
from spader.agent.loop import AgentSettings, Question, run_episodes
from spader.core.prompt import load_template
from spader.evaluation.episodes import episode_record, summarize

FILMS = "Which films were directed by Ilse Varga?"
FILMS_GOLD = [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"], ["Glass Harbour"]]
LAKE = "Which rivers flow into Lake Morrow?"
LAKE_GOLD = [["Tam", "River Tam"], ["Oure"]]

DEFAULT = agent_settings(max_turns=3, max_context_tokens=100_000)
AUTHORS = dataclasses.replace(DEFAULT, stop=(), parser="authors", observation_format="authors")


def run(scripted, search, scripts, settings, template=None):
    gold = {FILMS: FILMS_GOLD, LAKE: LAKE_GOLD}
    questions = [Question(f"q{i}", q, gold[q]) for i, q in enumerate(scripts)]
    engine = scripted(scripts)
    episodes = run_episodes(questions, engine, search, settings, progress=False, template=template)
    return engine, episodes, [episode_record(ep, "test") for ep in episodes]


TWO_CALLS = (
    '<think>a</think><tool_call>["Ilse Varga"]</tool_call> more <tool_call>["Lake Morrow"]</tool_call>'
)


def test_without_stop_strings_the_last_call_of_a_turn_runs(scripted, fake_search):
    scripts = {FILMS: [TWO_CALLS, '<answer>["Winter Quay"]</answer>']}
    run(scripted, fake_search, scripts, AUTHORS)
    assert fake_search.calls == [["Lake Morrow"]]
    fake_search.calls.clear()
    run(scripted, fake_search, scripts, DEFAULT)  # the first tag ends the turn: its call runs
    assert fake_search.calls == [["Ilse Varga"]]


def test_the_answer_is_the_last_answer_anywhere_json_then_literal_then_raw(scripted, fake_search):
    # the answer is written in a search turn, the last turn holds none
    scripts = {
        FILMS: ["<answer>['Winter Quay', 'Glass Harbour']</answer><tool_call>[\"x\"]</tool_call>", "done"]
    }
    _, (ep,), (rec,) = run(scripted, fake_search, scripts, AUTHORS)
    assert rec["format_valid"] and ep.predictions == ["Winter Quay", "Glass Harbour"]  # a Python literal
    assert rec["f1"] == pytest.approx(0.8)  # P 1, R 2/3
    _, _, (rec,) = run(scripted, fake_search, scripts, DEFAULT)
    assert not rec["format_valid"] and rec["f1"] == 0.0
    raw = {FILMS: ["<answer>Winter Quay</answer>"]}
    _, (ep,), _ = run(scripted, fake_search, raw, AUTHORS)
    assert ep.predictions == ["Winter Quay"]  # the raw string, one answer
    _, _, (rec,) = run(scripted, fake_search, raw, DEFAULT)
    assert rec["invalid_reason"] == "answer_not_json_list"


def test_every_query_of_a_call_runs_without_a_cap(scripted, fake_search):
    queries = [f"Ilse Varga {i}" for i in range(15)]
    scripts = {FILMS: [f"<tool_call>{json.dumps(queries)}</tool_call>", '<answer>["x"]</answer>']}
    _, _, (rec,) = run(
        scripted, fake_search, scripts, dataclasses.replace(DEFAULT, max_queries_per_call=None)
    )
    assert fake_search.calls == [queries] and rec["queries_issued"] == 15
    fake_search.calls.clear()
    _, _, (rec,) = run(scripted, fake_search, scripts, DEFAULT)
    assert fake_search.calls == [queries[:10]] and rec["queries_written"] == 15


def test_their_observation_is_the_servers_json_and_their_error_message(scripted, fake_search, passages):
    scripts = {
        FILMS: [
            '<tool_call>["Ilse Varga"]</tool_call>',
            "<tool_call>[oops</tool_call>",
            "<answer>[]</answer>",
        ]
    }
    _, (ep,), _ = run(scripted, fake_search, scripts, AUTHORS)
    first, second = ep.steps[0].observation, ep.steps[1].observation
    # their evaluation tool: the result list with indent 2, the queries echoed, the titles repeated
    assert first.startswith('<tool_response>[\n  {\n    "query": "Ilse Varga",\n    "documents": [')
    body = json.loads(first.removeprefix("<tool_response>").removesuffix("</tool_response>"))
    doc = body[0]["documents"][0]
    assert doc["contents"] == f"{doc['title']} " + next(
        p["text"] for p in passages if p["title"] == doc["title"]
    )
    assert second.startswith("<tool_response>Your tool call could not be parsed. Error: ")
    assert second.endswith(
        "Please output valid JSON inside <tool_call>...</tool_call> tags and try again.</tool_response>"
    )
    # the observation turn's content is the whole text, tags included, as their loop sends it
    shown = ep.conversation.tokenizer.decode(ep.conversation.ids, skip_special_tokens=False)
    assert "<|im_start|>user\n<tool_response>[\n" in shown


def test_their_loop_runs_the_last_turns_call_and_scores_an_earlier_answer(scripted, fake_search):
    scripts = {FILMS: ["<answer>['Winter Quay']</answer>", '<tool_call>["Lake Morrow"]</tool_call>']}
    settings = dataclasses.replace(AUTHORS, max_turns=2)
    # the first turn has no call: their loop ends there
    _, (ep,), _ = run(scripted, fake_search, scripts, settings)
    assert ep.status == "answered" and ep.predictions == ["Winter Quay"]
    scripts = {
        FILMS: [
            '<tool_call>["Ilse Varga"]</tool_call>',
            '<answer>["Winter Quay"]</answer><tool_call>["Lake Morrow"]</tool_call>',
        ]
    }
    _, (ep,), (rec,) = run(scripted, fake_search, scripts, dataclasses.replace(settings, loop="authors"))
    assert fake_search.calls == [["Ilse Varga"], ["Lake Morrow"]]  # the second (last) turn's call ran
    assert ep.status == "turn_budget" and rec["format_valid"] and rec["f1"] == pytest.approx(0.5)
    fake_search.calls.clear()
    _, (ep,), _ = run(scripted, fake_search, scripts, settings)  # the project's loop: not run
    assert fake_search.calls == [["Ilse Varga"]] and ep.steps[-1].skipped_queries == 1


def test_their_loop_scores_a_generation_error_and_drops_a_failed_instance(scripted, fake_search):
    scripts = {
        FILMS: [
            '<answer>["Winter Quay"]</answer><tool_call>["Ilse Varga"]</tool_call>',
            RuntimeError("engine died"),
        ],
        LAKE: ['<answer>["Tam"]</answer>'],
    }
    theirs = dataclasses.replace(AUTHORS, loop="authors")
    _, (films, _), recs = run(scripted, fake_search, scripts, theirs)
    assert films.status == "generation_error" and films.predictions == ["Winter Quay"]
    assert recs[0]["f1"] == pytest.approx(0.5) and not recs[0]["dropped"]
    _, _, recs = run(scripted, fake_search, scripts, AUTHORS)  # the project's loop: a failure scores 0
    assert recs[0]["f1"] == 0.0
    # an episode that failed otherwise is left out of their means, never out of the project's
    failed = [dict(recs[0], status="episode_error", dropped=True, f1=0.0), dict(recs[1], f1=1.0)]
    summary = summarize(failed)
    assert (summary["f1"], summary["n"], summary["dropped"]) == (1.0, 2, 1)  # n counts the records
    assert summarize([dict(r, dropped=False) for r in failed])["f1"] == 0.5


def test_their_loop_renders_the_history_again_each_turn(scripted, fake_search, tokenizer):
    scripts = {
        FILMS: [
            '<think>\n\nplan\n</think>\n\n<tool_call>["Ilse Varga"]</tool_call>',
            '<answer>["Winter Quay"]</answer>',
        ]
    }
    theirs = dataclasses.replace(AUTHORS, loop="authors")
    one_message = load_template(role="user")  # agent.prompt_role: user, as their script sends it
    engine, (ep,), _ = run(scripted, fake_search, scripts, theirs, template=one_message)
    messages = [
        {"role": "user", "content": ep.prompt_text},
        {
            "role": "assistant",
            "content": tokenizer.decode(tokenizer.encode(scripts[FILMS][0]), skip_special_tokens=True),
        },
        {"role": "user", "content": ep.steps[0].observation},
    ]
    second_prompt = engine.requests[1][0]
    assert second_prompt == render_ids(tokenizer, messages, add_generation_prompt=True)
    engine, _, _ = run(scripted, fake_search, scripts, AUTHORS, one_message)  # the project's loop: ids kept
    assert engine.requests[1][0] != second_prompt


def test_evaluation_budgets_per_turn_and_for_the_response(scripted, fake_search):
    scripts = {FILMS: ['<tool_call>["Ilse Varga"]</tool_call>', '<answer>["Winter Quay"]</answer>']}
    engine, _, _ = run(scripted, fake_search, scripts, dataclasses.replace(DEFAULT, max_turn_tokens=40))
    assert [budget for _, budget, _ in engine.requests] == [40, 40]
    engine, (ep,), _ = run(
        scripted, fake_search, scripts, dataclasses.replace(DEFAULT, max_response_tokens=500)
    )
    prompt = len(engine.requests[0][0])
    assert engine.requests[0][1] == 500  # the response budget, not the context's 100,000
    assert engine.requests[1][1] == 500 - (len(engine.requests[1][0]) - prompt)
    assert ep.conversation.response_tokens <= 500


def test_their_counting_of_search_efficiency(scripted, fake_search):
    """Over the whole conversation: their prompt's example call and its bare <tool_call> (which
    swallows the first real call), a malformed call and its error message; the project's figure
    counts the queries the agent wrote."""
    scripts = {
        FILMS: [
            '<tool_call>["Ilse Varga", "Salt Orchard", "Glass Harbour"]</tool_call>',
            "<tool_call>[oops</tool_call>",
            '<tool_call>["Winter Quay"]</tool_call>',
            '<answer>["Winter Quay", "Glass Harbour"]</answer>',
        ]
    }
    settings = dataclasses.replace(AUTHORS, max_turns=4)
    _, _, (rec,) = run(scripted, fake_search, scripts, settings, template=load_template("authors"))
    assert (rec["queries_written"], rec["correct_entities"], rec["search_efficiency"]) == (4, 2, 2.0)
    # example call 2 + swallowed first call 1 + malformed 1 + its error message 1 + last call 1
    assert rec["conversation_queries"] == 6 and rec["authors_correct_entities"] == 2
    assert rec["conversation_queries_per_correct_entity"] == 3.0
    _, _, (rec,) = run(scripted, fake_search, scripts, settings)  # the project's prompt: no bare tag
    assert rec["conversation_queries"] == 2 + 3 + 1 + 1 + 1


def test_generation_config_sampling_reaches_the_engine(tmp_path, tokenizer, monkeypatch):
    from spader.agent import generation
    from spader.config.model import AgentConfig, EvaluationConfig, ServiceConfig
    from spader.evaluation.evaluate import generation_config_sampling, loop_settings

    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_k": 20, "top_p": 0.95})
    )
    assert generation_config_sampling(tmp_path) == {"top_k": 20, "top_p": 0.95}  # not the temperature
    theirs = EvaluationConfig(generation_config=True, max_context_tokens=4096)
    settings = loop_settings(theirs, AgentConfig(), ServiceConfig(), tmp_path)
    plain = theirs.model_copy(update={"generation_config": False})
    assert (loop_settings(plain, AgentConfig(), ServiceConfig(), tmp_path).top_k, settings.top_k) == (
        -1,
        20,
    )
    seen = []

    def decode_batch(model, tok, prompts, params, eos_ids):
        seen.extend(params)
        return [generation.DecodeResult([], "", "stop") for _ in prompts]

    monkeypatch.setattr(generation, "decode_batch", decode_batch)
    import torch

    engine = generation.TransformersEngine.__new__(generation.TransformersEngine)  # no model is loaded
    engine.torch, engine.tokenizer, engine.threads, engine.batch_size, engine._markers = (
        torch,
        tokenizer,
        None,
        4,
        [],
    )
    engine.model = type("M", (), {"generation_config": type("G", (), {"eos_token_id": None})()})()
    engine.generate([[1, 2]], [8], settings.sampling, [0])
    assert (seen[0].top_k, seen[0].top_p, seen[0].temperature) == (20, 0.95, 1.0)
    assert (tmp_path / "missing").mkdir() is None and generation_config_sampling(tmp_path / "missing") == {}


def test_the_config_sections_reach_the_loops_settings():
    from spader.config.model import AgentConfig, EvaluationConfig, ServiceConfig

    evaluation = EvaluationConfig(
        max_context_tokens=32768, max_turn_tokens=5096, max_response_tokens=8192, loop="authors"
    )
    agent = AgentConfig(
        max_turn_tokens=48, stop=[], parser="authors", observation_format="authors", max_queries_per_call=None
    )
    got = AgentSettings.from_config(evaluation, agent, ServiceConfig())
    assert (got.max_turn_tokens, got.max_response_tokens, got.max_context_tokens) == (5096, 8192, 32768)
    assert (got.stop, got.parser, got.observation_format, got.loop, got.max_queries_per_call) == (
        (),
        "authors",
        "authors",
        "authors",
        None,
    )
    assert (
        AgentSettings.from_config(
            EvaluationConfig(max_context_tokens=100), agent, ServiceConfig()
        ).max_turn_tokens
        == 48
    )


def test_their_context_limit_ends_the_episode_on_random_episodes(scripted, fake_search, tokenizer):
    """``evaluation.overflow: end_episode``: a turn whose cap does not fit in the context left is
    a request their vLLM server refuses, and their loop stops there, scored on what the episode
    wrote. Against their loop (authors_reference.evaluation_episode) on random episodes: the same
    turns, the same observations, the same predictions; ``shrink`` instead gives the last turn the
    room left."""
    import random

    import authors_reference as theirs

    from spader.core.metrics import authors_prf
    from spader.core.prompt import fit_authors_observation

    rng = random.Random(3)
    template = load_template("authors", role="user")  # their evaluation's one user message
    prompt = [{"role": "user", "content": template.user_prompt(FILMS)}]
    start = len(render_ids(tokenizer, prompt, add_generation_prompt=True))
    ended = shrank = 0
    for _ in range(12):
        names = ["Winter Quay", "Glass Harbour", "Salt Orchard", "Ilse Varga", "Lake Morrow"]
        turns = [
            f"<think>{'plan ' * rng.randint(1, 30)}</think><answer>{json.dumps(rng.sample(names, 2))}</answer>"
            f"<tool_call>{json.dumps(rng.sample(names, rng.randint(1, 3)))}</tool_call>"
            for _ in range(rng.randint(1, 4))
        ] + ['<answer>["Winter Quay"]</answer>']
        cap = rng.choice([40, 120, 300])
        limit = start + cap + rng.randint(0, 900)
        settings = dataclasses.replace(
            AUTHORS,
            loop="authors",
            max_turns=6,
            max_turn_tokens=cap,
            max_context_tokens=limit,
            overflow="end_episode",
        )
        engine, (ep,), (rec,) = run(scripted, fake_search, {FILMS: turns}, settings, template=template)
        said = iter(tokenizer.decode(tokenizer.encode(t)[:cap]) for t in turns)  # max_tokens cuts a turn

        def observe(queries):
            text, _ = fit_authors_observation(queries, fake_search(queries), 11000, context="evaluation")
            return text

        def served(messages):
            # the history as a chat-completions server holds it: each turn's text decoded without
            # special tokens (the tiny tokenizer's action tags are special ones, Qwen3's are not)
            return [
                dict(m, content=tokenizer.decode(tokenizer.encode(m["content"]), skip_special_tokens=True))
                if m["role"] == "assistant"
                else m
                for m in messages
            ]

        messages = theirs.evaluation_episode(
            [dict(m) for m in prompt],
            lambda _, said=said: next(said),
            observe,
            lambda m: len(render_ids(tokenizer, served(m), add_generation_prompt=True)),
            max_model_len=limit,
            max_tokens=cap,
            max_turns=6,
        )
        written = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [s.text for s in ep.steps] == written
        assert all(budget == cap and len(p) + cap <= limit for p, budget, _ in engine.requests)
        their_answer = theirs.get_answers("\n".join(written))
        assert ep.predictions == (their_answer or [])
        assert rec["f1"] == pytest.approx(authors_prf(their_answer, FILMS_GOLD)[2])
        size = len(render_ids(tokenizer, served(messages), add_generation_prompt=True))
        refused = len(written) < 6 and messages[-1]["role"] == "user" and size + cap > limit
        assert (ep.status == "context_budget") == refused
        if refused:
            ended += 1
            assert rec["budget_cut"]
            # the project's budget: a turn that does not fit runs with the room left (unless the
            # observation before it already overflowed the budget)
            shrunk, _, _ = run(
                scripted,
                fake_search,
                {FILMS: turns},
                dataclasses.replace(settings, overflow="shrink"),
                template,
            )
            later = [budget for _, budget, _ in shrunk.requests[len(engine.requests) :]]
            assert all(b < cap for b in later)
            shrank += bool(later)
    assert ended >= 3 and shrank >= 1


def test_their_turn_boundary_in_the_evaluation_loop(scripted, fake_search, tokenizer):
    """``agent.turn_boundary: authors`` holds in the loop that keeps training's ids: the observation
    turn follows the turn's last generated token, as their training appends it."""
    scripts = {FILMS: ['<tool_call>["Ilse Varga"]</tool_call><|im_end|>', '<answer>["Winter Quay"]</answer>']}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    follows = {}
    for boundary in ("template", "authors"):
        settings = dataclasses.replace(AUTHORS, turn_boundary=boundary)
        engine, _, _ = run(scripted, fake_search, scripts, settings)
        second = engine.requests[1][0]
        at = len(engine.requests[0][0]) + second[len(engine.requests[0][0]) :].index(im_end)
        follows[boundary] = tokenizer.decode(second[at + 1 : at + 3], skip_special_tokens=False)
    assert follows == {"template": "\n<|im_start|>", "authors": "<|im_start|>user"}
