"""StepSearch's rewards (docs/baselines.md): hand-computed table, TF-IDF against the vectoriser
StepSearch's code uses, and the dense token rewards of a batch."""

from __future__ import annotations

import math
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from spader.core.text import normalize
from spader.methods.steps import TurnDetails
from spader.methods.stepsearch.densify import stepsearch_dense_rewards
from spader.methods.stepsearch.gain import (
    EvidenceIndex,
    SearchTurn,
    batch_match_degrees,
    information_gains,
    match_degrees,
    redundancy,
    stepsearch_rewards,
    tfidf_tokens,
)

# Two gold entities with evidence g1, g2; three search turns, then the answer (F1 0.5).
EVIDENCE = ["Alpha Beta", "Gamma Delta"]
PASSAGES = {"p1": "alpha beta", "p2": "gamma zeta", "p3": "gamma delta", "p4": "omega"}
TURNS = [
    ["p1"],  # identical to g1
    ["p1", "p2"],  # p1 again (repeat); p2 shares "gamma" with g2 (partial overlap)
    ["p3", "p3", "p4"],  # identical to g2, returned by two queries; p4 unrelated
]
# cos(p2, g2) with the TF-IDF fitted on {p2, g1, g2} (N = 3, smoothed idf = ln((1+N)/(1+df)) + 1):
# gamma (df 2) a = ln(4/3) + 1, zeta and delta (df 1) b = ln 2 + 1; cos = a^2 / (a^2 + b^2).
A, B = math.log(4 / 3) + 1, math.log(2) + 1
PARTIAL = A * A / (A * A + B * B)  # 0.366447
DEGREES = [[1.0, 0.0], [1.0, PARTIAL], [0.0, 1.0]]
GAINS = [
    (1.0 + 0.0) / 2,  # m^0 = 0
    (0.0 + PARTIAL) / 2,  # m^1 = (1, 0): only g2 improves
    (0.0 + (1.0 - PARTIAL)) / 2,  # m^2 = (1, PARTIAL)
]
PENALTIES = [0.0, 1 / 2, 1 / 3]  # p1 seen before; the second p3 repeats the first within the turn
TABLE = [0.6 * (g - p) for g, p in zip(GAINS, PENALTIES, strict=True)]  # 0.3, -0.190066, -0.009934


def turns():
    return [SearchTurn(tuple(ids), tuple(PASSAGES[i] for i in ids)) for ids in TURNS]


def test_hand_computed_table():
    (degrees,) = batch_match_degrees([("q", turns())], {"q": EVIDENCE})
    assert [d.tolist() for d in degrees] == [pytest.approx(row, abs=1e-12) for row in DEGREES]
    assert information_gains(degrees) == pytest.approx(GAINS, abs=1e-12)
    assert sum(information_gains(degrees)) == pytest.approx(1.0)  # all evidence fully matched in the end
    assert redundancy(TURNS) == pytest.approx(PENALTIES)
    rewards = stepsearch_rewards(degrees, TURNS, 0.5)
    assert rewards == pytest.approx([0.3, -0.1900660, -0.0099340, 0.5], abs=1e-6)
    assert rewards[:3] == pytest.approx(TABLE)
    # the scale its code applies (option 1.6)
    assert stepsearch_rewards(degrees, TURNS, 0.5, lambda_s=1.6) == pytest.approx(
        [1.6 * (g - p) for g, p in zip(GAINS, PENALTIES, strict=True)] + [0.5]
    )
    # as StepSearch's code: an invalid format earns no step rewards, only the -1
    assert stepsearch_rewards(degrees, TURNS, None, lambda_s=1.6) == [0.0, 0.0, 0.0, -1.0]


def test_dense_token_rewards_sit_on_turn_ends():
    # runs: a a | o o | a a | o | a | o o | a a a  -> three search turns then the answer turn
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    details = [
        [
            TurnDetails(turn=t + 1, passage_ids=tuple(ids), passage_texts=tuple(PASSAGES[i] for i in ids))
            for t, ids in enumerate(TURNS)
        ],
        [],  # answered at once: only the terminal reward, -1 (invalid format)
    ]
    dense, stats = stepsearch_dense_rewards(
        mask, torch.tensor([0.5, -1.0]), details, ["q", "q"], {"q": EVIDENCE}, lambda_s=0.6
    )
    expected = [0.0] * 13
    expected[1], expected[5], expected[7], expected[12] = *TABLE, 0.5
    assert dense[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert dense[1].tolist() == pytest.approx([0, 0, -1.0] + [0] * 10)
    assert stats.search_turns == 3 and stats.trajectories == 2
    assert stats.metrics("stepsearch/")["stepsearch/turn_gain/mean"] == pytest.approx(1 / 3)


def test_an_invalid_format_and_a_question_without_evidence_earn_no_step_reward():
    """As StepSearch's code: the trajectory's only reward is the terminal one."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1]] * 3)
    details = [
        [
            TurnDetails(turn=t + 1, passage_ids=tuple(ids), passage_texts=tuple(PASSAGES[i] for i in ids))
            for t, ids in enumerate(TURNS)
        ]
    ] * 3
    dense, stats = stepsearch_dense_rewards(
        mask,
        torch.tensor([0.5, -1.0, 0.5]),
        details,
        ["q", "q", "none"],
        {"q": EVIDENCE, "none": []},
        lambda_s=0.6,
        valid=[True, False, True],
    )
    expected = [0.0] * 13
    expected[1], expected[5], expected[7], expected[12] = *TABLE, 0.5
    assert dense[0].tolist() == pytest.approx(expected, abs=1e-6)
    # invalid format: no gain, and none of the redundancy penalties its repeats would cost
    assert dense[1].tolist() == pytest.approx([0.0] * 12 + [-1.0])
    # n = 0: no redundancy penalty either
    assert dense[2].tolist() == pytest.approx([0.0] * 12 + [0.5])
    counts = stats.metrics("stepsearch/")
    assert counts["stepsearch/rows_invalid_no_step_reward"] == 1.0
    assert counts["stepsearch/rows_without_evidence"] == 1.0


def test_records_beyond_the_turns_are_dropped_and_missing_ones_find_nothing():
    mask = torch.tensor([[1, 0, 1, 0, 1]])  # two search turns, the answer
    late = TurnDetails(turn=2, passage_ids=("p1",), passage_texts=(PASSAGES["p1"],))
    extra = TurnDetails(turn=3, passage_ids=("p3",), passage_texts=(PASSAGES["p3"],))  # the answer turn
    dense, stats = stepsearch_dense_rewards(
        mask, torch.tensor([1.0]), [[late, extra]], ["q"], {"q": EVIDENCE}, lambda_s=1.0
    )
    # turn 1 has no record (gain 0, no passages), turn 2 finds g1 fully: G = 0.5
    assert dense[0].tolist() == pytest.approx([0.0, 0, 0.5, 0, 1.0])
    assert stats.dropped_records == 1


def test_no_evidence_means_no_step_reward_at_all():
    (degrees,) = batch_match_degrees([("q", turns())], {"q": []})
    assert information_gains(degrees) == [0.0, 0.0, 0.0]
    # as StepSearch's code: n = 0 gives no step reward, the repeats cost nothing either
    assert stepsearch_rewards(degrees, TURNS, 0.0, lambda_s=1.0) == [0.0, 0.0, 0.0, 0.0]


def test_match_degrees_equal_the_vectoriser_fitted_per_passage():
    """The closed form equals fitting scikit-learn's TfidfVectorizer (StepSearch's choice, default
    settings) on {d, g_1..g_n} for each passage d, on random texts with repeats and short words."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_similarity

    rng = random.Random(7)
    words = [f"w{i}" for i in range(40)] + ["a", "the", "x", "Ørnes", "co-op"]

    def text(k):
        return " ".join(rng.choice(words) for _ in range(k))

    for _ in range(60):
        evidence = [text(rng.randint(0, 25)) for _ in range(rng.randint(1, 5))]
        passages = [text(rng.randint(0, 30)) for _ in range(rng.randint(1, 4))]
        got = match_degrees([tfidf_tokens(p) for p in passages], EvidenceIndex.from_texts(evidence))
        for k, p in enumerate(passages):
            docs = [normalize(p)] + [normalize(g) for g in evidence]
            try:
                fitted = TfidfVectorizer().fit_transform(docs)
                ref = np.maximum(cosine_similarity(fitted[0], fitted[1:]).ravel(), 0.0)
            except ValueError:  # no document has a token: the vectoriser refuses, the match is 0
                ref = np.zeros(len(evidence))
            assert got[k] == pytest.approx(ref, abs=1e-12)


def test_batch_scores_each_passage_once_per_question_and_in_parallel():
    trajectories = [("q", turns()), ("r", turns()[:1]), ("q", turns()[1:])]
    evidence = {"q": EVIDENCE, "r": ["omega"]}
    serial = batch_match_degrees(trajectories, evidence)
    with ThreadPoolExecutor(2) as pool:
        parallel = batch_match_degrees(trajectories, evidence, pool=pool)
    for a, b in zip(serial, parallel, strict=True):
        assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert serial[1][0].tolist() == [0.0]  # p1 shares nothing with "omega"
    assert serial[2][1].tolist() == pytest.approx([0.0, 1.0])


def test_a_search_turn_must_pair_ids_and_texts():
    with pytest.raises(ValueError, match="2 passage ids but 1 texts"):
        SearchTurn(("a", "b"), ("x",))
