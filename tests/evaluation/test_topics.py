"""The evaluation questions' topics (spader.evaluation.topics): the file format and its errors,
the clusters they make, and the demo's bundled file against the questions its evaluation asks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from spader.config import resolved_config
from spader.data import DATASETS, eval_rows, normalize_release, record_schema
from spader.data.records import records_frame
from spader.evaluation.topics import TopicsError, read_topics, topic_clusters

REPO = Path(__file__).resolve().parents[2]


def test_a_question_may_name_several_topics(tmp_path):
    path = tmp_path / "topics.tsv"
    path.write_text("id\ttopic\nq:1\tA\nq:2\tB\nq:2\tC\nq:2\tB\n\nm:1\tC\n", encoding="utf-8")
    assert read_topics(path) == {"q:1": ("A",), "q:2": ("B", "C"), "m:1": ("C",)}


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("question\ttopic\nq\tA\n", ":1:", "expected the header"),
        ("id\ttopic\nq\tA\nq\tA\tB\n", ":3:", "two non-empty fields"),
        ("id\ttopic\nq\t \n", ":2:", "two non-empty fields"),
        ("id\ttopic\nq A\n", ":2:", "two non-empty fields"),
        ("id\ttopic\n", "", "names no question"),
    ],
)
def test_a_malformed_topics_file_is_named_with_its_line(tmp_path, text, where, what):
    path = tmp_path / "topics.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TopicsError, match=what) as err:
        read_topics(path)
    assert f"{path}{where}" in str(err.value) and "\n" not in str(err.value)


def test_questions_linked_through_a_shared_topic_are_one_cluster():
    """q3 asks about B and C, so B's and C's questions are one cluster, in whichever dataset."""
    topics = {"q1": ("A",), "q2": ("B",), "q3": ("B", "C"), "m1": ("C",), "m2": ("D",), "m3": ("A",)}
    assert topic_clusters([["q1", "q2", "q3"], ["m1", "m2", "m3"]], topics) == [[0, 1, 1], [1, 2, 0]]
    # the order of the links does not matter
    assert topic_clusters([["m1", "q3", "q2"]], topics) == [[0, 0, 0]]
    with pytest.raises(TopicsError, match="no topic for evaluation question 'm4'"):
        topic_clusters([["q1"], ["m4"]], topics, source="topics.tsv")


def _demo_test_questions() -> dict[str, list[str]]:
    """The ids of every normalized test question of the bundled demo releases, and of the ones the
    demo evaluates (mix.eval_limit of them per dataset, picked as rule export_eval_set picks)."""
    base = resolved_config(REPO / "config" / "config.yaml")
    demo = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    limit, seed = demo["mix"]["eval_limit"], base["mix"]["seed"]
    out = {}
    for d in DATASETS:
        spec = base["datasets"][d]["splits"]["test"]
        url = demo["datasets"][d]["files"][spec["file"]]["url"]
        records, _ = normalize_release(d, "test", REPO / url.removeprefix("file:"), spec.get("member"))
        frame = records_frame(records, record_schema(d))
        out[d] = (frame["id"].to_list(), eval_rows(frame, limit=limit, seed=seed)["id"].to_list())
    return out


def test_the_demo_names_the_topic_of_every_question_it_can_evaluate():
    """resources/demo/topics.tsv (config/demo.yaml, evaluation.topics) names a topic for every
    normalized test question of the bundled releases. Over the 200 questions the demo evaluates,
    54 of their 65 topics are asked in more than one dataset, and the questions fall into 41
    clusters, the largest of 42 questions (QUEST's "A or B" questions link two topics): the
    numbers docs/method.md states."""
    demo = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    topics = read_topics(REPO / demo["evaluation"]["topics"])
    questions = _demo_test_questions()
    for d, (every, _) in questions.items():
        assert every and not [q for q in every if q not in topics], d
    evaluated = [asked for _, asked in questions.values()]
    assert [len(ids) for ids in evaluated] == [demo["mix"]["eval_limit"]] * 4
    datasets_of: dict[str, set[int]] = {}
    for i, ids in enumerate(evaluated):
        for q in ids:
            for t in topics[q]:
                datasets_of.setdefault(t, set()).add(i)
    assert len(datasets_of) == 65 and sum(len(v) > 1 for v in datasets_of.values()) == 54
    sizes = Counter(c for group in topic_clusters(evaluated, topics) for c in group)
    assert len(sizes) == 41 and max(sizes.values()) == 42
