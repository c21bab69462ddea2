"""Rule warmstart_policy on the CPU demo, and the warm-started policy acting in the real
evaluation loop.

The tests read the session's run of the README's demo command (the ``demo_run`` fixture of
tests/conftest.py: the real snakemake CLI in a fresh copy of the repository), whose
warmstart_policy job scripted episodes against its own retrieval service, and whose
evaluate_policy jobs then ran the warm-started policy greedily on CPU, as ReAct and as RAG,
through the agent loop of evaluation (spader.agent.loop with the transformers engine and the
retrieval service) on the demo's four evaluation sets: their per-question records are read here.
Nothing is faked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from warmstart_rates import METHODS, floor_failures, rates  # tests/support

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DATASETS = ["qampari", "mintaka", "webqsp", "quest"]
WARM = "results/demo/warmstart"


@pytest.fixture(scope="module")
def demo(demo_run) -> Path:
    """The work directory of the session's demo run (tests/conftest.py, ``demo_run``)."""
    return demo_run["work"]


@pytest.fixture(scope="module")
def episodes(demo) -> dict[str, list[dict]]:
    """The demo run's own react and rag episodes (rule evaluate_policy's per-question records)."""
    out = {}
    for m in METHODS:
        out[m] = [
            json.loads(line)
            for d in DATASETS
            for line in (demo / f"results/demo/eval/{m}/{d}.jsonl").read_text().splitlines()
        ]
    return out


def test_rule_writes_a_tiny_warm_started_model(demo):
    from transformers import AutoModelForCausalLM

    from spader.demo.tiny import TINY_MARKER, is_tiny

    model = demo / WARM / "model"
    assert is_tiny(model)
    marker = json.loads((model / TINY_MARKER).read_text())
    assert "tiny" in marker["note"] and marker["warmstart"]["conversations"] > 0
    AutoModelForCausalLM.from_pretrained(model)  # loads
    summary = json.loads((demo / WARM / "summary.json").read_text())
    assert summary["loss_last"] < summary["loss_first"] / 4  # it learned something
    # the copying task trained beside the episodes: random spans repeated after noise (measured:
    # 16.2 -> 0.07, the model writes the repeated spans back)
    assert summary["copy_loss_last"] < 0.5 < summary["copy_loss_first"]
    trajectories = [
        json.loads(line) for line in (demo / WARM / "trajectories.jsonl").read_text().splitlines()
    ]
    kept = [t for t in trajectories if t["kept"]]
    # every kept episode is trained on, and its first turn alone too when it has several turns
    first_turns = sum(sum(m["role"] == "assistant" for m in t["messages"]) > 1 for t in kept)
    expected = len(kept) + (first_turns if summary["settings"]["first_turn_examples"] else 0)
    assert summary["conversations"] == expected
    assert summary["questions"] + summary["generated_questions"] == len(trajectories)
    assert summary["generated_questions"] > 0  # config/demo.yaml scripts generated worlds
    evaluation = {
        json.loads(line)["question_text"]
        for d in DATASETS
        for line in (demo / f"results/demo/data/eval/{d}.jsonl").read_text().splitlines()
    }
    assert not evaluation & {t["question"] for t in trajectories}  # never an evaluation question
    for t in kept:  # every answer is written in an observation the episode saw
        seen = "\n".join(t["observations"])
        assert t["answers"] and all(a in seen for a in t["answers"])


def _questions_named(text: str, gold: list[list[list[str]]]) -> tuple[int, int]:
    """How many questions (of their gold lists ``gold``) have a gold entity named in ``text`` as a
    whole-word, normalized match (as the rewards count a find), and how many have all of them."""
    from spader.core.matching import find_hits

    entities = [entity for answers in gold for entity in answers]
    owner = [q for q, answers in enumerate(gold) for _ in answers]
    hits = find_hits([text], entities)  # one normalization of the text for every entity
    found = [sum(owner[i] == q for i in hits) for q in range(len(gold))]
    return sum(n > 0 for n in found), sum(n == len(g) for n, g in zip(found, gold, strict=True))


def test_what_the_warm_start_names_of_the_evaluation(demo):
    """The README's claim, on the demo run's own warm start: no question it scripts and nothing
    it trains the model to write (the assistant's turns carry the loss) names a gold entity of an
    evaluation question; the passages its searches retrieved do, since the demo has one corpus for
    both sides of its world: in its kept episodes, gold entities of 100 of the 200 evaluation
    questions, every one of them for 61 (README, docs/cpu-training.md)."""
    trajectories = [
        json.loads(line) for line in (demo / WARM / "trajectories.jsonl").read_text().splitlines()
    ]
    kept = [t for t in trajectories if t["kept"]]
    gold = [
        json.loads(line)["ground_truth"]
        for d in DATASETS
        for line in (demo / f"results/demo/data/eval/{d}.jsonl").read_text().splitlines()
    ]
    written = [t["question"] for t in trajectories]
    written += [m["content"] for t in kept for m in t["messages"] if m["role"] == "assistant"]
    assert _questions_named("\n".join(written), gold) == (0, 0)
    seen = "\n".join(o for t in kept for o in t["observations"])
    assert len(gold) == 200 and _questions_named(seen, gold) == (100, 61)


def test_warm_started_policy_searches_and_answers_in_the_evaluation_loop(episodes):
    """The floors of tests/support/warmstart_rates.py (measured over warm-start seeds by
    bench/warmstart.py), on every evaluation question, greedy: ReAct's first step searches, its
    episodes end in a well-formed answer and copy gold names; RAG (one forced retrieval, then one
    turn to answer) answers well-formed and copies."""
    found = {m: rates(records) for m, records in episodes.items()}
    print(found)
    assert not floor_failures(found), found


def _jobs(smk, demo: Path, *args: str) -> list[tuple[str, str]]:
    """(rule, input) of the jobs a dry run of the demo command would run."""
    proc = smk.run(*smk.demo_args(), "-n", *args, cwd=demo)
    return [(job.rule, job.fields.get("input", "")) for job in smk.parse_jobs(proc.stdout + proc.stderr)]


def test_rerun_scope_and_consumers_of_the_warm_start(smk, demo, tmp_path):
    """Only a warm-start setting reruns the warm start (not the data, index or tiny model), and the
    prompting baselines evaluate the warm-started model."""
    assert _jobs(smk, demo, f"{WARM}/model") == []
    overlay = tmp_path / "ws.yaml"
    overlay.write_text(json.dumps({"backbones": {"demo": {"warmstart": {"steps": 7}}}}))
    changed = _jobs(smk, demo, "--configfile", "config/demo.yaml", str(overlay), "--", f"{WARM}/model")
    assert [rule for rule, _ in changed] == ["warmstart_policy"]
    evaluation = _jobs(smk, demo, "--force", "results/demo/eval/react/qampari.jsonl")
    assert [f"{WARM}/model" in inputs for rule, inputs in evaluation if rule == "evaluate_policy"] == [True]
