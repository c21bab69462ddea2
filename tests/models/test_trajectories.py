"""Scripted warm-start episodes (spader.demo.trajectories) and their tokenization for supervised
fine-tuning (spader.demo.warmstart.encode_conversation). The search engine is the fake of
conftest.py; the tokenizer and chat template are the real tiny Qwen3's."""

from __future__ import annotations

import json

import pytest

from spader.agent.loop import Question, render_prompt
from spader.core.parsing import parse_turn
from spader.core.prompt import fit_observation, observation_message
from spader.core.text import normalize
from spader.demo.trajectories import (
    answer_text,
    entity_phrases,
    load_questions,
    script_trajectories,
    world_questions,
)
from spader.demo.warmstart import encode_conversation

VARGA = Question(
    "q1",
    "Which films were directed by Ilse Varga?",
    [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"], ["Glass Harbour"]],
)
MORROW = Question("q2", "Which rivers flow into Lake Morrow?", [["Ourel"], ["Vikmor"], ["Tamsen"]])
NOTHING = Question("q3", "Which novels were written by Ansel Brek?", [["The Tin Lighthouse"]])


@pytest.mark.parametrize(
    ("question", "names"),
    [
        ("Which films were directed by Ilse Varga?", ["Ilse Varga"]),
        ("Films directed by Marta Velling", ["Marta Velling"]),
        ("what rivers flow into Lake Mormorel?", ["Lake Mormorel"]),
        ("Who wrote the novel The Broken Window?", ["The Broken Window"]),
        ("Which albums were released by Halcyon & Rust?", ["Halcyon & Rust"]),
        (
            "films directed by Teodor Hask or Films directed by Marta Velling",
            ["Marta Velling", "Teodor Hask"],
        ),
        ("In which district is the village of Łowicz Górny?", ["Łowicz Górny"]),
        ("what is the tallest mountain", []),
    ],
)
def test_entity_phrases(question, names):
    assert entity_phrases(question) == names


def _observations(traj) -> list[str]:
    return traj.observations


def test_answers_are_gold_entities_the_observations_show(fake_search):
    search = fake_search(topk=2)
    varga, morrow = script_trajectories([VARGA, MORROW], search, max_tool_response_chars=2000)
    assert search.calls == [[VARGA.question, MORROW.question]]  # one call per step, one query each
    for traj, q in ((varga, VARGA), (morrow, MORROW)):
        seen = "\n".join(_observations(traj))
        assert traj.kept and traj.answers
        for name in traj.answers:
            assert name in seen  # written as the passages write it, never from nowhere
            assert any(normalize(name) in map(normalize, aliases) for aliases in q.gold)
    # Glass Harbour and Vikmor are gold but no passage shows them; answers in order of appearance
    assert varga.answers == ["The Salt Orchard", "Winter Quay"]
    assert morrow.answers == ["Tamsen", "Ourel"] and morrow.found == [2, 0]


def test_turns_are_the_loop_protocol_and_observations_are_the_loops(fake_search):
    search = fake_search(topk=2)
    (traj,) = script_trajectories([VARGA], search, max_tool_response_chars=200)
    roles = [m["role"] for m in traj.messages]
    # the prompt (instructions, question), then the observation as a user turn
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    call = parse_turn(traj.messages[2]["content"])
    assert call.kind == "search" and call.tool_call.queries == [VARGA.question]
    final = parse_turn(traj.messages[4]["content"])
    assert final.kind == "answer" and final.answer.valid and final.answer.answers == traj.answers
    # the observation is fit_observation's text for the same results and budget (a passage dropped)
    results = fake_search(topk=2)([VARGA.question])
    text = fit_observation([VARGA.question], results, 200)[0]
    assert traj.messages[3] == observation_message(text) and traj.observations == [text]
    assert text.count("Doc ") == 1 and traj.answers == ["The Salt Orchard"]
    assert traj.messages[4]["content"] == answer_text(traj.answers)


def test_a_second_search_with_the_name_only_when_the_first_showed_nothing(fake_search):
    search = fake_search(topk=2, blind=(VARGA.question,))
    varga, morrow = script_trajectories([VARGA, MORROW], search)
    assert varga.searches == [[VARGA.question], ["Ilse Varga"]]
    assert morrow.searches == [[MORROW.question]]
    assert search.calls == [[VARGA.question, MORROW.question], ["Ilse Varga"]]
    assert varga.kept and "Winter Quay" in varga.answers
    (single,) = script_trajectories([VARGA], fake_search(topk=2, blind=(VARGA.question,)), max_searches=1)
    assert single.searches == [[VARGA.question]] and not single.kept and single.answers == []


def test_retry_when_incomplete_searches_again_until_every_gold_entity_was_shown(fake_search):
    """``retry_when="incomplete"``: an episode whose first search showed some gold entities but not
    all (VARGA: "Glass Harbour" is in no passage) searches the name too; one whose first search
    showed every gold entity does not. The default retries only an episode that found none."""
    complete = Question("q5", MORROW.question, [["Tamsen"], ["Ourel"]])
    search = fake_search(topk=1)
    varga, morrow = script_trajectories([VARGA, complete], search, retry_when="incomplete")
    assert varga.searches == [[VARGA.question], ["Ilse Varga"]] and varga.kept
    assert morrow.searches == [[MORROW.question]] and morrow.answers == ["Tamsen", "Ourel"]
    assert search.calls == [[VARGA.question, MORROW.question], ["Ilse Varga"]]
    default = script_trajectories([VARGA, complete], fake_search(topk=1))
    assert [t.searches for t in default] == [[[VARGA.question]], [[MORROW.question]]]
    with pytest.raises(ValueError, match="retry_when"):
        script_trajectories([VARGA], fake_search(), retry_when="always")


def test_an_episode_that_finds_nothing_is_not_kept(fake_search):
    (traj,) = script_trajectories([NOTHING], fake_search(topk=1, blind=(NOTHING.question, "Ansel Brek")))
    assert not traj.kept and traj.answers == []
    assert json.loads(json.dumps(traj.to_json()))["kept"] is False


def test_every_turn_fits_the_turn_budget(fake_search, tokenizer):
    from spader.demo.warmstart import turn_fits

    long_question = Question(
        "q4", "Which films made in the cold northern harbour towns were directed by Ilse Varga?", VARGA.gold
    )
    budget = len(tokenizer(answer_text(["The Salt Orchard"]), add_special_tokens=False)["input_ids"]) + 4
    fits = turn_fits(tokenizer, budget)
    search = fake_search(topk=2)
    unlimited = script_trajectories([long_question], search)[0]
    assert unlimited.searches == [[long_question.question]] and len(unlimited.answers) == 2
    (traj,) = script_trajectories([long_question], search, fits=fits)
    assert traj.searches == [["Ilse Varga"]]  # the question is too long for a turn: its name
    assert traj.kept and traj.answers == ["The Salt Orchard"]  # the names that fit, first seen first
    assert all(fits(m["content"]) for m in traj.messages if m["role"] == "assistant")
    (cut,) = script_trajectories([VARGA], search, fits=turn_fits(tokenizer, 5))
    assert not cut.kept  # not even the search fits


def test_bad_script_arguments(fake_search):
    with pytest.raises(ValueError, match="max_searches"):
        script_trajectories([VARGA], fake_search(), max_searches=3)
    with pytest.raises(ValueError, match="no gold"):
        script_trajectories([Question("x", "Which films?", [])], fake_search())


def test_loss_mask_covers_assistant_turns_only(fake_search, tokenizer):
    (traj,) = script_trajectories([VARGA], fake_search(topk=2))
    ids, mask = encode_conversation(tokenizer, traj.messages)
    assert len(ids) == len(mask)
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    assistant = [m for m in traj.messages if m["role"] == "assistant"]
    assert len(spans) == len(assistant)
    eos = tokenizer.eos_token
    for (a, b), message in zip(spans, assistant, strict=True):
        assert tokenizer.decode(ids[a:b], skip_special_tokens=False) == message["content"] + eos
        # the learned tokens follow exactly the prompt the agent loop renders for that turn
        k = traj.messages.index(message)
        assert ids[:a] == render_prompt(tokenizer, traj.messages[:k])
    unmasked = tokenizer.decode(
        [t for t, m in zip(ids, mask, strict=True) if not m], skip_special_tokens=False
    )
    assert VARGA.question in unmasked and "Doc 1 (Title:" in unmasked and "<|im_start|>assistant" in unmasked


def test_encode_rejects_a_conversation_without_assistant_turn(tokenizer):
    with pytest.raises(ValueError, match="no assistant turn"):
        encode_conversation(tokenizer, [{"role": "user", "content": "hi"}])


def test_world_questions_leave_out_every_topic_an_excluded_question_touches():
    from spader.demo.world import build_world

    world = build_world()
    everything = world_questions(world, [])
    first = world.topics[0]  # Ilse Varga's films
    excluded = [Question("e1", f"Who directed {first.objects[1].plain}?", [[first.subject.plain]])]
    kept = world_questions(world, excluded)
    assert 0 < len(kept) < len(everything)
    names = {first.subject.plain, *(o.plain for o in first.objects)}
    for q in kept:
        assert not any(n in q.question for n in names)
        assert not any(a in names for aliases in q.gold for a in aliases)
    # list questions in three wordings and one-answer questions per object
    assert {q.question for q in everything} >= {
        "Which films were directed by Ilse Varga?",
        "what films did Ilse Varga direct",
        "Films directed by Ilse Varga",
        "Who directed Winter Quay?",
    }


def test_load_questions_reads_a_mix_file_and_names_a_bad_line(tmp_path):
    good = tmp_path / "train.jsonl"
    rec = {
        "id": "qampari:1",
        "dataset": "qampari",
        "split": "train",
        "question": "Which films were directed by Ilse Varga?",
        "answers": [["Winter Quay"]],
        "answers_norm": [["winter quay"]],
        "meta": {},
    }
    good.write_text(json.dumps(rec) + "\n")
    (q,) = load_questions(good)
    assert (q.id, q.question, q.gold) == ("qampari:1", rec["question"], [["Winter Quay"]])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec) + "\nnot json\n")
    with pytest.raises(Exception, match=r"bad\.jsonl.*2"):
        load_questions(bad)


def test_generated_worlds_share_no_name_with_the_demo_world_or_the_excluded_questions():
    from spader.demo.trajectories import generated_questions
    from spader.demo.world import SEED, build_world

    demo = build_world(SEED)
    demo_names = {normalize(e.plain) for t in demo.topics for e in (t.subject, *t.objects)}
    excluded = Question("e1", "Which films were directed by Ilse Varga?", [["Winter Quay"]])
    (questions, _), (others, _) = generated_questions([SEED + 1, SEED + 2], [excluded])
    assert questions and all(q.id.startswith(f"gen{SEED + 1}:") for q in questions)
    assert {q.question for q in questions} != {q.question for q in others}  # another world per seed
    for q in questions:
        names = {normalize(a) for aliases in q.gold for a in aliases}
        assert not names & demo_names, q
        assert "Ilse Varga" not in q.question and normalize(q.question) != normalize(excluded.question)
    with pytest.raises(ValueError, match="demo world's own"):
        generated_questions([SEED], [])


def test_a_generated_world_is_searched_over_its_own_passages(tokenizer):
    from spader.demo.trajectories import generated_questions
    from spader.demo.warmstart import turn_fits
    from spader.demo.world import SEED

    ((questions, search),) = generated_questions([SEED + 1], [])
    listing = next(q for q in questions if len(q.gold) > 2)
    (results,) = search([listing.question])
    assert results == search([listing.question])[0]  # the same order for the same query
    titles = [p["title"] for p in results]
    gold = {aliases[0] for aliases in listing.gold}
    assert gold <= set(titles)  # every object's passage, the subject's, and one unrelated passage
    assert len([t for t in titles if t not in gold]) == 3
    (unrelated,) = search(["what is the tallest mountain"])  # names no topic: unrelated passages only
    assert len(unrelated) == 1 and unrelated[0]["title"] not in gold
    trajs = script_trajectories(
        questions[:40], search, max_tool_response_chars=1500, fits=turn_fits(tokenizer, 48)
    )
    kept = [t for t in trajs if t.kept]
    assert len(kept) >= 30  # nearly every episode shows a gold entity
    for t in kept:
        seen = "\n".join(t.observations)
        assert all(name in seen for name in t.answers)
