"""Several sampling seeds (``evaluation.seeds``): every question evaluated once per seed with the
real transformers engine and the tiny Qwen3, records tagged with their seed, and the tables'
per-question mean and spread over the seeds."""

from __future__ import annotations

import pytest

from spader.agent.generation import TransformersEngine
from spader.agent.loop import AgentSettings, Question
from spader.config import AgentConfig, EvaluationConfig
from spader.config.model import ServiceConfig
from spader.evaluation.evaluate import evaluate_seeds
from spader.evaluation.tables import prf_table

QUESTIONS = [
    (Question("q1", "Which films were directed by Ilse Varga?", [["Winter Quay"], ["Heat"]]), "qampari"),
    (Question("q2", "Which novels were written by Edvard Lunn?", [["The Tin Lighthouse"]]), "qampari"),
]


def fake_search(queries):
    """Stands in for the retrieval service (a fake: no index is needed to tag seeds)."""
    return [
        [{"id": "1__0", "title": "Winter Quay", "text": "Winter Quay is a film directed by Ilse Varga."}]
    ] * len(queries)


@pytest.fixture(scope="module")
def engine(tiny_qwen3_dir):
    engine = TransformersEngine(tiny_qwen3_dir, device="cpu", batch_size=4, threads=1)
    yield engine
    engine.close()


def _settings(seed: int = 0) -> AgentSettings:
    evaluation = EvaluationConfig(temperature=1.0, max_context_tokens=512, seed=seed)
    return AgentSettings.from_config(
        evaluation, AgentConfig(max_turns=2, max_turn_tokens=12), ServiceConfig()
    )


def test_every_question_is_evaluated_once_per_seed_and_tagged(engine):
    records = evaluate_seeds(QUESTIONS, engine, fake_search, _settings(), method="react", seeds=[3, 4])
    assert [(r["id"], r["seed"]) for r in records] == [("q1", 3), ("q2", 3), ("q1", 4), ("q2", 4)]
    # each seed is its own sampling: the texts differ between seeds, and repeat for the same seed
    first = [s["text"] for r in records[:2] for s in r["steps"]]
    second = [s["text"] for r in records[2:] for s in r["steps"]]
    assert first != second
    again = evaluate_seeds(QUESTIONS, engine, fake_search, _settings(), method="react", seeds=[3])
    assert [s["text"] for r in again for s in r["steps"]] == first
    # without seeds: the settings' seed alone, no seed field
    plain = evaluate_seeds(QUESTIONS, engine, fake_search, _settings(3), method="react")
    assert [s["text"] for r in plain for s in r["steps"]] == first and "seed" not in plain[0]
    # the tables: two questions, two seeds, the mean over seeds and its spread
    table = prf_table({("react", "qampari"): records}, ["react"], ["qampari"]).row(0, named=True)
    assert table["n"] == 2 and table["seeds"] == 2 and table["f1_seed_sd"] is not None


def test_several_seeds_need_sampling():
    with pytest.raises(ValueError, match="greedy decoding"):
        EvaluationConfig(temperature=0.0, seeds=[0, 1])
    with pytest.raises(ValueError, match="distinct seeds"):
        EvaluationConfig(temperature=1.0, seeds=[1, 1])
    assert EvaluationConfig(temperature=0.0, seeds=[5]).seeds == [5]
