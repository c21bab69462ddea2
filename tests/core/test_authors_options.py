"""The pure pieces of the options that reproduce the authors' code (config/authors.yaml): their
parsing, their observation format and caps, their counting, their alias-blind reward, their prompt."""

from __future__ import annotations

import json

import pytest

from spader.core.matching import authors_text_hits, find_hits
from spader.core.metrics import alias_blind, authors_correct_count, authors_prf, authors_query_count, prf
from spader.core.parsing import authors_answer, authors_tool_call, parse_turn
from spader.core.prompt import (
    AUTHORS_SERVER_CHARS,
    error_observation,
    fit_authors_observation,
    load_template,
    observation_message,
)


@pytest.mark.parametrize(
    ("text", "answers"),
    [
        ('<answer>["A", "B"]</answer>', ["A", "B"]),  # JSON
        ("<answer>['A', \"B's\"]</answer>", ["A", "B's"]),  # not JSON: a Python literal
        ("<answer>[A, B]</answer>", ["[A, B]"]),  # neither: the raw string
        ('<answer>{"a": 1}</answer>', ['{"a": 1}']),  # JSON but not a list: the raw string
        ('<answer>[1961, " ", "B"]</answer>', ["1961", "B"]),  # items as strings, blanks dropped
        ('<answer>["A"]</answer> later <answer>["C"]</answer>', ["C"]),  # the last block
        ('<answer>["\\ud800x"]</answer>', ["?x"]),  # a lone surrogate cannot be written out
    ],
)
def test_their_answer_reading(text, answers):
    parsed = authors_answer(text)
    assert parsed.valid and parsed.answers == answers


def test_their_answer_validity_differs_between_their_evaluation_and_their_reward():
    assert authors_answer("no tags").reason == "no_answer"
    assert authors_answer("<answer>  </answer>").reason == "no_answer"  # evaluation: empty is invalid
    empty = authors_answer("<answer> </answer>", "training")
    assert empty.valid and empty.answers == []  # their reward: valid, F1 0
    assert authors_answer('<think>x <answer>["A"]</answer>', "training").reason == "unbalanced_think"
    assert authors_answer('<answer>["A"]', "training").reason == "unclosed_answer"
    # only what follows the first "Question:" is checked for tags
    assert authors_answer('<think> Question: <answer>["A"]</answer>', "training").valid
    assert authors_answer('<think>x <answer>["A"]</answer>').valid  # their evaluation ignores <think>


def test_their_tool_call_reading():
    assert authors_tool_call("no call") is None
    assert authors_tool_call('<tool_call>["a"]</tool_call><tool_call>["b", ["c"]]</tool_call>').queries == [
        "b",
        "c",
    ]
    legacy = '<tool_call>{"name": "search", "arguments": {"query_list": ["q1", " q2 "]}}</tool_call>'
    assert authors_tool_call(legacy).queries == ["q1", "q2"]
    assert authors_tool_call('<tool_call>"q"</tool_call>').error.startswith(
        "Your tool call could not be parsed."
    )
    assert json.loads(authors_tool_call('<tool_call>["", " "]</tool_call>').error) == {
        "result": "Error: 'query_list' is missing, empty, or not a list in parameters."
    }
    deep = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"  # hostile nesting never raises
    assert authors_tool_call(deep).error is not None
    from spader.core.parsing import authors_training_call

    assert authors_training_call(deep).observation.startswith("<tool_response>\nYour tool call could not")
    # a turn with a call is a search step whatever follows; one without is the episode's last
    turn = parse_turn('<tool_call>["a"]</tool_call> <answer>["A"]</answer>', (), "authors")
    assert turn.kind == "search" and turn.tool_call.queries == ["a"]
    assert parse_turn('<answer>["A"]</answer>', (), "authors").kind == "answer"
    assert parse_turn("thinking", (), "authors").kind == "none"


def test_their_query_count_over_the_conversation():
    prompt = load_template("authors").user_prompt("Which films?")
    assert authors_query_count(prompt) == 2  # the example call; the bare tag opens a span no tag closes
    assert authors_query_count(prompt + '\n<tool_call>["a", "b", "c"]</tool_call>') == 2 + 1  # swallowed
    assert authors_query_count('<tool_call>["a", "b"]</tool_call>\n<tool_call>bad</tool_call>') == 3
    legacy = '<tool_call>{"name": "s", "arguments": {"query_list": ["a", "b", "c"]}}</tool_call>'
    assert authors_query_count(legacy) == 3
    assert authors_query_count('<tool_call>{"name": "s"}</tool_call>') == 1


def test_alias_blind_gold_never_matches_an_entity_with_two_aliases():
    gold = [["Paris", "Paname"], ["Lyon"]]
    assert prf(["Paris", "Lyon"], gold)[2] == 1.0
    assert prf(["Paris", "Lyon"], alias_blind(gold))[2] == 0.5
    # their evaluation matches aliases (entity recall), with their normalization
    assert authors_correct_count(["paname", "LYON"], gold) == 2


@pytest.mark.parametrize(
    ("predicted", "ours", "theirs"),
    [
        # two aliases of one entity: one hit and a false positive here, two correct predictions there
        (["Paris", "Paname"], (0.5, 0.5), (1.0, 0.5)),
        (["Paris", "Lyon"], (1.0, 1.0), (1.0, 1.0)),
        (["Paris", "Paname", "Rome"], (1 / 3, 0.5), (2 / 3, 0.5)),
        (["Rome"], (0.0, 0.0), (0.0, 0.0)),
        ([], (0.0, 0.0), (0.0, 0.0)),
    ],
)
def test_their_precision_counts_every_prediction_equal_to_a_gold_alias(predicted, ours, theirs):
    gold = [["Paris", "Paname"], ["Lyon"], ["Paris", "PANAME"]]  # the third is the first again
    for (p, r, f), (want_p, want_r) in ((prf(predicted, gold), ours), (authors_prf(predicted, gold), theirs)):
        assert (p, r) == pytest.approx((want_p, want_r))
        assert f == pytest.approx(2 * p * r / (p + r) if p + r else 0.0)
    assert authors_prf(predicted, [])[2] == 0.0


def test_their_discovery_is_a_substring_of_the_whole_observation():
    """Their reward finds an entity anywhere in the observation text: inside a longer word, and in
    the queries the observation echoes; the default matching finds neither."""
    gold = [["Lyon"], ["Ari"], ["Nice"], ["Saint-Malo"]]
    text = 'Results for "Lyon films":\nDoc 1 (Title: Aristotle) Born in Saint Malo.'
    assert authors_text_hits(text, gold) == {0, 1}  # the query's Lyon, Ari of Aristotle
    assert find_hits(["Aristotle", "Born in Saint Malo."], gold) == set()
    assert authors_text_hits(text.replace("Saint Malo", "Saint-Malo"), gold) == {0, 1, 3}
    assert authors_text_hits("", gold) == set()


def _passages(n: int, words: int = 120) -> list[dict]:
    return [
        {"id": f"d{i}", "title": f"Title {i}", "text": " ".join(["word"] * words) + f" end{i}"}
        for i in range(n)
    ]


def test_their_observation_format_and_caps():
    small, _ = fit_authors_observation(["q1"], [_passages(1)], 11000)
    body = json.loads(small.removeprefix("<tool_response>").removesuffix("</tool_response>"))
    assert list(body) == ["result"]  # their training tool dumps the server's whole response
    assert body["result"][0]["query"] == "q1"  # the query echoed
    assert body["result"][0]["documents"][0]["contents"].startswith("Title 0 word")  # the title repeated
    assert small.startswith('<tool_response>{\n  "result": [\n    {\n      "query": "q1",')  # indent 2
    # twenty queries of five long passages: their server keeps rank 1 of every query first, and
    # stops at 10,000 characters with a System Note; their fork keeps the first max_chars
    queries = [f"q{i}" for i in range(20)]
    passages = [_passages(5, i) for i in range(len(queries))]
    full, shown = fit_authors_observation(queries, passages, 1_000_000)
    result = json.loads(full.removeprefix("<tool_response>").removesuffix("</tool_response>"))
    assert result["truncation_warning"] == "System Note: Retrieval results truncated at 10000 characters."
    kept = [len(q["documents"]) for q in result["result"]]
    assert max(kept) - min(kept) <= 1 and sum(kept) < 100 and [len(s) for s in shown] == kept
    cut, shown_cut = fit_authors_observation(queries, passages, 3000)
    assert cut == full[:3000] + "...(truncated)"  # the first characters, not the last
    assert 0 < sum(map(len, shown_cut)) < sum(kept)  # only passages whole before the cut count
    evaluation, _ = fit_authors_observation(queries, passages, 1_000_000, context="evaluation")
    assert evaluation.startswith("<tool_response>[\n  {") and evaluation.endswith(
        "]\nSystem Note: Retrieval results truncated at 10000 characters.</tool_response>"
    )
    assert AUTHORS_SERVER_CHARS == 10000
    # the message's content is the whole text: no newlines added around it
    assert observation_message(small, "authors")["content"] == small
    assert error_observation("boom", "authors") == "<tool_response>boom</tool_response>"
    assert error_observation("boom") == "Error: boom"


def test_their_prompt_is_a_packaged_template():
    template = load_template("authors")
    assert template.source == "spader/core/prompts/authors.txt"
    assert template.text.startswith("Answer the question. You must strictly follow this loop for every step:")
    assert template.text.endswith("Question: {question}") and template.version != load_template().version


# ---------------------------------------------------------------------------------------------
# The options against the authors' functions on random inputs (tests/support/authors_reference.py)
# ---------------------------------------------------------------------------------------------
# names whose spellings their normaliser keeps apart and norm_v1 merges (accents, case), or that
# both read alike (curly quotes, dashes, articles)
NAMES = ["Café Lune", "Cafe Lune", "CAFÉ LUNE", "São Paulo", "Sao Paulo", "The Salt Orchard", "Salt Orchard",
         "O'Brien", "O\u2019Brien", "Jean-Luc", "Jean\u2013Luc", "Winter Quay", "winter quay", "Lyon", "Ari"]  # fmt: skip


def _gold(rng) -> list[list[str]]:
    """Alias lists, some entries repeated (the same list, or the same entity spelled otherwise)."""
    gold = [rng.sample(NAMES, rng.choice([1, 1, 1, 2])) for _ in range(rng.randint(1, 5))]
    for _ in range(rng.randint(0, 2)):
        gold.append(list(rng.choice(gold)))
    return gold


def test_their_reward_f1_with_alias_blind_gold_on_random_inputs():
    """``aliases: blind`` scores the answer as their reward does (their normaliser, one string per
    alias list): equal to their ``compute_score_qampari`` on every random case; the earlier F1
    through norm_v1 differs on the accented spellings."""
    import random

    import authors_reference as theirs

    from spader.integrations.verl.reward import compute_score

    rng = random.Random(0)
    differed = 0
    for _ in range(2000):
        gold = _gold(rng)
        predicted = rng.sample(NAMES, rng.randint(0, 4)) + [f"['{rng.choice(NAMES)}']"] * rng.randint(0, 1)
        solution = f"<think>x</think>\n<answer>{json.dumps(predicted, ensure_ascii=False)}</answer>"
        want = theirs.training_f1(solution, gold)
        got = compute_score("q", solution, {"entities": gold}, {"spader_final_turn": ""}, parser="authors",
                            aliases="blind", invalid_format_reward=0.0)  # fmt: skip
        assert got["f1"] == pytest.approx(want) and got["score"] == pytest.approx(want), (gold, predicted)
        differed += prf(predicted, alias_blind(gold))[2] != pytest.approx(want)
    assert differed > 0  # what norm_v1 made of it


def _observation(rng) -> str:
    words = [*rng.sample(NAMES, rng.randint(0, 3)), "passage", "text", "Aristotle", "Lyonnais"]
    rng.shuffle(words)
    return " ".join(words)


def test_their_step_rewards_with_substring_discovery_and_listed_entries_on_random_groups():
    """``discovery: substring`` with ``denominator: entries`` and their novelty premium, on
    alias-blind gold as in their run: each distinct gold entry an entity by its exact text, matched
    through their normaliser anywhere in the observation, ``|GT|`` every entry of the list. Equal
    to their reward manager's step rewards on every random group; merging the entries with norm_v1
    first (the former behaviour) differs."""
    import random

    import authors_reference as theirs

    from spader.core.matching import discovery_gold
    from spader.core.rewards import StepRewardWeights, _search_rewards

    rng = random.Random(1)
    weights = StepRewardWeights(alpha=1.0, beta=4.0, cost=0.0, novelty="exp_decay")
    merged = 0
    for _ in range(600):
        gold = _gold(rng)
        entries = alias_blind(gold)  # what the agent loop hands the search tool with aliases: blind
        texts = [[_observation(rng) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 4))]
        queries = [[0] * len(steps) for steps in texts]
        found, n_gold = discovery_gold(entries, "substring", "entries")
        hits = [[authors_text_hits(t, found) for t in steps] for steps in texts]
        ours, _ = _search_rewards(hits, queries, n_gold, weights)
        want = theirs.group_step_rewards(texts, [e for (e,) in entries], alpha=1.0, beta=4.0)
        assert [[pytest.approx(r) for r in row] for row in want] == ours, (entries, texts)
        old, old_n = discovery_gold(entries, "passages", "distinct")
        old_hits = [[authors_text_hits(t, old) for t in steps] for steps in texts]
        merged += _search_rewards(old_hits, queries, old_n, weights)[0] != ours
    assert merged > 0


def _call_text(rng) -> str:
    """A random turn around a random <tool_call> block (their parsers' cases and more)."""
    queries = rng.choice([["a", " b "], [], [" "], ["a", ["b", ["c"]]], ["a", 5, None], "solo"])
    payload = rng.choice([
        json.dumps(queries), json.dumps({"name": "search", "arguments": {"query_list": queries}}),
        json.dumps({"arguments": {"query_list": queries}}), json.dumps({"name": "lookup", "arguments": {}}),
        json.dumps({"name": None, "arguments": {"query_list": ["a"]}}), json.dumps({"name": 5}),
        json.dumps({"arguments": "text"}), json.dumps({"arguments": ["a"]}), json.dumps({"query_list": ["q"]}),
        json.dumps({"name": "search"}), '"films"', "42", "true", "null", "[oops", "{", "", "  [\"x\"]  ",
        "['single quotes']",
    ])  # fmt: skip
    block = f"<tool_call>{payload}</tool_call>"
    return rng.choice([
        block, f"<think>plan</think>{block}", f'<tool_call>["first"]</tool_call> then {block}',
        f"{block}<|im_end|>", "no call at all", f"<tool_call>{payload}", f"{payload}</tool_call>",
    ])  # fmt: skip


def test_their_training_and_evaluation_readings_of_a_call_on_random_turns():
    """Their training (``spader_authors`` parser and tool) and their evaluation (``parser:
    authors`` in the evaluation loop) each read a call their own way: a JSON scalar ends the
    training episode and draws an error in evaluation, a malformed call's observation is their
    training's in training and their evaluation's in evaluation."""
    import random

    import authors_reference as theirs

    from spader.core.parsing import authors_training_call

    rng = random.Random(2)
    kinds = set()
    for _ in range(3000):
        text = _call_text(rng)
        # training
        kind, value = theirs.training_turn(text)
        call = authors_training_call(text)
        if kind == "end":
            assert call is None, text
        elif kind == "search":
            assert call.error is None and call.queries == value, text
        else:
            assert error_observation(call.error, "authors", 11000, call.observation) == value, text
        kinds.add(("training", kind))
        # evaluation
        kind, value = theirs.evaluation_turn(text)
        call = authors_tool_call(text)
        if kind == "end":
            assert call is None, text
        elif kind == "search":
            assert call.error is None and call.queries == value, text
        else:
            assert error_observation(call.error, "authors", 11000) == value, text
        kinds.add(("evaluation", kind))
    assert len(kinds) == 6
