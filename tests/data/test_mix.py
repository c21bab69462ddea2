"""The training mix (docs/data.md, "Training mix"): the seeded recipe, de-duplication, eval-overlap
removal, answer count filters, the validation split, and the errors that name the dataset. The mix
takes the configuration's typed section ``mix``."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from spader.config import DATASETS
from spader.config.model import MixConfig
from spader.core.text import normalize
from spader.data import (
    MIX_SCHEMA,
    MixError,
    build_entities,
    build_mix,
    mix_metrics,
    mix_training_set,
    read_records,
)
from spader.data.records import META_FIELDS, record_schema, records_frame, write_frame


def rec(dataset: str, n: int, question: str, n_answers: int = 2, split: str = "train") -> dict:
    answers, answers_norm = build_entities([[f"Entity {n}-{i}"] for i in range(n_answers)])
    meta = {k: None for k in META_FIELDS[dataset]}
    meta.update(source_file="x", source_id=str(n))
    return {
        "id": f"{dataset}:{n:05d}",
        "dataset": dataset,
        "split": split,
        "question": question,
        "answers": answers,
        "answers_norm": answers_norm,
        "meta": meta,
    }


def frame(records, dataset):
    return records_frame(records, record_schema(dataset))


def pool_of(dataset: str, n: int, start: int = 0, **kw):
    return frame(
        [rec(dataset, start + i, f"Question {start + i} of {dataset}?", **kw) for i in range(n)], dataset
    )


def mix_config(counts: dict[str, int], **settings) -> MixConfig:
    """The section ``mix`` drawing ``counts`` (the other datasets none), without validation
    questions unless ``settings`` asks for them."""
    return MixConfig.model_validate(
        {"counts": {**dict.fromkeys(DATASETS, 0), **counts}, "val_per_dataset": 0, **settings}
    )


def reference_sample(
    records: list[dict], eval_questions: list[str], k: int, seed: int, min_answers: int = 1
) -> list[str]:
    """docs/data.md's recipe written out in plain Python, independently of the polars implementation."""
    evals = {normalize(q) for q in eval_questions}
    pool, seen_ids, seen_q = [], set(), set()
    for r in sorted(records, key=lambda r: r["id"]):
        if r["id"] in seen_ids:
            continue
        seen_ids.add(r["id"])
        q = normalize(r["question"])
        if len(r["answers"]) < min_answers or q in evals or q in seen_q:
            continue
        seen_q.add(q)
        pool.append(r)
    return [r["id"] for r in random.Random(seed).sample(pool, k)]


def test_matches_the_recipe_written_out():
    rng = random.Random(7)
    records = [
        rec("qampari", n, f"Which things number {n % 40}?", n_answers=1 + n % 4)
        for n in rng.sample(range(500), 120)
    ]
    records += records[:5]  # duplicate ids
    evals = [f"which things number {i}" for i in range(3)]  # same questions up to case and punctuation
    cfg = mix_config({"qampari": 20}, seed=11, min_answers=2)
    train, _, stats = build_mix(
        {"qampari": frame(records, "qampari")},
        {
            "qampari": frame(
                [rec("qampari", 9000 + i, q, split="test") for i, q in enumerate(evals)], "qampari"
            )
        },
        cfg,
    )
    expected = reference_sample(records, evals, 20, seed=11, min_answers=2)
    assert sorted(train["id"].to_list()) == sorted(expected)
    assert stats["datasets"]["qampari"]["removed"]["duplicate_id"] == 5


def test_counts_shuffle_val_and_disjointness():
    pools = {
        d: pool_of(d, 30, start=100 * i) for i, d in enumerate(["qampari", "mintaka", "webqsp", "quest"])
    }
    evals = {"quest": frame([rec("quest", 1, "QUESTION 301 OF QUEST", split="test")], "quest")}
    cfg = mix_config({"qampari": 12, "mintaka": 6, "webqsp": 6, "quest": 6}, seed=3, val_per_dataset=2)
    train, val, stats = build_mix(pools, evals, cfg)
    assert train.schema == MIX_SCHEMA and val.schema == MIX_SCHEMA
    assert train["dataset"].value_counts().sort("dataset").rows() == [
        ("mintaka", 6),
        ("qampari", 12),
        ("quest", 6),
        ("webqsp", 6),
    ]
    assert val["dataset"].value_counts().sort("dataset").rows() == [
        (d, 2) for d in ["mintaka", "qampari", "quest", "webqsp"]
    ]
    assert not set(train["id"]) & set(val["id"])
    assert "quest:00301" not in set(train["id"]) | set(val["id"])  # its question is in quest's eval split
    assert stats["datasets"]["quest"]["removed"]["eval_overlap"] == 1
    assert stats["train_total"] == 30 and stats["val_total"] == 8
    metrics = mix_metrics(stats)
    assert metrics["quest/removed/eval_overlap"] == 1.0 and metrics["qampari/train"] == 12.0
    assert metrics["train_total"] == 30.0 and all(isinstance(v, float) for v in metrics.values())
    # the datasets are interleaved by the final shuffle, not in blocks
    first_block = train["dataset"].head(12).to_list()
    assert len(set(first_block)) > 1


def test_same_inputs_same_mix_other_seed_other_mix():
    pools = {"webqsp": pool_of("webqsp", 50)}
    a = build_mix(pools, {}, mix_config({"webqsp": 10}, seed=1))[0]
    b = build_mix(pools, {}, mix_config({"webqsp": 10}, seed=1))[0]
    c = build_mix(pools, {}, mix_config({"webqsp": 10}, seed=2))[0]
    assert a["id"].to_list() == b["id"].to_list()
    assert set(a["id"]) != set(c["id"])
    # a dataset's sample does not depend on the other datasets' counts
    both = {"webqsp": pools["webqsp"], "quest": pool_of("quest", 20)}
    d = build_mix(both, {}, mix_config({"webqsp": 10, "quest": 5}, seed=1))[0]
    assert set(d.filter(d["dataset"] == "webqsp")["id"]) == set(a["id"])


def test_question_duplicates_keep_the_smallest_id():
    records = [
        rec("mintaka", 3, "Who directed The Salt Orchard?"),
        rec("mintaka", 1, "who directed the salt orchard"),
        rec("mintaka", 2, "Who  directed the Salt-Orchard?"),
        rec("mintaka", 4, "Who wrote it?"),
    ]
    train, _, stats = build_mix(
        {"mintaka": frame(records, "mintaka")}, {}, mix_config({"mintaka": 3}, seed=0)
    )
    # "Salt-Orchard" normalizes to "saltorchard": a different question, kept
    assert sorted(train["id"]) == ["mintaka:00001", "mintaka:00002", "mintaka:00004"]
    assert stats["datasets"]["mintaka"]["removed"]["duplicate_question"] == 1


def test_answer_count_filters():
    records = [rec("quest", i, f"Q{i}", n_answers=i) for i in range(1, 7)]
    cfg = mix_config({"quest": 3}, seed=0, min_answers=2, max_answers=4)
    train, _, stats = build_mix({"quest": frame(records, "quest")}, {}, cfg)
    assert sorted(len(a) for a in train["answers"].to_list()) == [2, 3, 4]
    assert stats["datasets"]["quest"]["removed"]["answer_count"] == 3


def test_too_small_pool_names_the_dataset_and_never_upsamples():
    pools = {"qampari": pool_of("qampari", 10), "webqsp": pool_of("webqsp", 4)}
    with pytest.raises(
        MixError, match=r"dataset 'webqsp': the pool has 4 usable .* mix.counts.webqsp asks for 5"
    ):
        build_mix(pools, {}, mix_config({"qampari": 5, "webqsp": 5}))
    with pytest.raises(
        MixError, match=r"dataset 'qampari': 2 training questions are left .*val_per_dataset asks for 3"
    ):
        build_mix(pools, {}, mix_config({"qampari": 8}, val_per_dataset=3))
    with pytest.raises(MixError, match=r"dataset 'quest': mix.counts.quest = 1 but no train records"):
        build_mix(pools, {}, mix_config({"quest": 1}))
    # a count of zero leaves the dataset out entirely (no pool needed)
    train, val, stats = build_mix(pools, {}, mix_config({"qampari": 10, "quest": 0}))
    assert len(train) == 10 and len(val) == 0 and set(stats["datasets"]) == {"qampari"}


def test_wrong_dataset_in_pool():
    with pytest.raises(MixError, match="dataset 'quest': train records of other datasets \\['mintaka'\\]"):
        build_mix({"quest": pool_of("mintaka", 3)}, {}, mix_config({"quest": 1}))


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"counts": {"nq": 3}}, r"counts\.nq\n.*Extra inputs"),
        ({"counts": {"quest": -1}}, r"counts\.quest\n.*greater than or equal to 0"),
        ({"min_answers": 0}, r"min_answers\n.*greater than or equal to 1"),
        ({"val_per_dataset": -1}, r"val_per_dataset\n.*greater than or equal to 0"),
    ],
)
def test_the_section_refuses_bad_settings_naming_the_key(settings, key):
    with pytest.raises(ValidationError, match=key):
        MixConfig.model_validate(settings)


def test_fewer_most_answers_than_least_is_refused():
    with pytest.raises(MixError, match=r"mix.max_answers \(2\) is below mix.min_answers \(3\)"):
        build_mix({}, {}, mix_config({}, min_answers=3, max_answers=2))


def test_files_round_trip(tmp_path):
    train, test = {}, {}
    for d in ["mintaka", "quest"]:
        train[d] = write_frame(pool_of(d, 12), tmp_path / f"{d}_train.jsonl", record_schema(d))
        test[d] = write_frame(
            pool_of(d, 3, start=50, split="test"), tmp_path / f"{d}_test.jsonl", record_schema(d)
        )
    cfg = mix_config({"mintaka": 4, "quest": 4}, seed=5, min_answers=1, max_answers=None, val_per_dataset=1)
    out = [tmp_path / "a" / n for n in ("train.jsonl", "val.jsonl", "stats.json")]
    stats = mix_training_set(train, test, *out, cfg)
    again = [tmp_path / "b" / n for n in ("train.jsonl", "val.jsonl", "stats.json")]
    mix_training_set(train, test, *again, cfg)
    assert [p.read_bytes() for p in out] == [p.read_bytes() for p in again]  # byte-identical reruns
    assert json.loads(out[2].read_text()) == stats
    rows = read_records(out[0], MIX_SCHEMA)
    assert len(rows) == 8 and rows.schema == MIX_SCHEMA
    first = json.loads(out[0].read_text().splitlines()[0])
    assert list(first) == ["id", "dataset", "split", "question", "answers", "answers_norm", "meta"]
    assert set(first["meta"]) == set(MIX_SCHEMA["meta"].to_schema())


def test_records_frame_refuses_unknown_fields():
    good = rec("quest", 1, "Q?")
    unknown = r"record 'quest:00001' does not fit the schema \(fields \['colour'\]\)"
    with pytest.raises(ValueError, match=unknown):
        frame([{**good, "meta": {**good["meta"], "colour": "red"}}], "quest")
    with pytest.raises(ValueError, match=r"fields \['answers_norm'\]"):
        frame([{k: v for k, v in good.items() if k != "answers_norm"}], "quest")
    with pytest.raises(ValueError, match="has an empty question"):
        frame([{**good, "question": ""}], "quest")


@pytest.mark.parametrize(
    ("train_question", "test_question"),
    [
        (
            "Which films did Ilse\u200b Varga direct?",
            "Which films did Ilse Varga direct?",
        ),  # zero-width space
        ("Which films did Ilse Varga di\u00adrect?", "which films did ilse varga direct"),  # soft hyphen
        # held out: a word joiner, a bidi isolate and a variation selector, in the test question
        ("Which films did Ilse Varga direct?", "Which\u2060 films did \u2066Ilse\u2069 Varga\ufe0f direct?"),
    ],
)
def test_a_test_question_with_invisible_characters_stays_out_of_the_mix(train_question, test_question):
    pool = [rec("qampari", i, f"Question {i}?") for i in range(6)] + [rec("qampari", 6, train_question)]
    evals = {"qampari": frame([rec("qampari", 900, test_question, split="test")], "qampari")}
    train, val, stats = build_mix(
        {"qampari": frame(pool, "qampari")}, evals, mix_config({"qampari": 6}, seed=0)
    )
    assert "qampari:00006" not in set(train["id"]) | set(val["id"])
    assert stats["datasets"]["qampari"]["removed"]["eval_overlap"] == 1


@pytest.mark.parametrize(
    ("train_dataset", "test_dataset", "test_question"),
    [
        ("qampari", "mintaka", "Who directed The Salt Orchard?"),
        # held out: another pair of datasets, and an invisible character on top
        ("webqsp", "quest", "who directed the salt\u00ad orchard"),
    ],
)
def test_a_test_question_of_another_dataset_stays_out_of_the_mix(train_dataset, test_dataset, test_question):
    pool = [rec(train_dataset, i, f"Question {i}?") for i in range(6)]
    pool.append(rec(train_dataset, 6, "Who directed the Salt Orchard?"))
    evals = {test_dataset: frame([rec(test_dataset, 900, test_question, split="test")], test_dataset)}
    train, _, stats = build_mix(
        {train_dataset: frame(pool, train_dataset)}, evals, mix_config({train_dataset: 6}, seed=0)
    )
    assert f"{train_dataset}:00006" not in set(train["id"])
    assert stats["datasets"][train_dataset]["removed"]["eval_overlap"] == 1


def test_the_files_of_every_evaluated_dataset_filter_the_mix(tmp_path):
    """mix_training_set reads the test split of a dataset the mix does not draw from (QUEST here)."""
    train = {
        "mintaka": write_frame(pool_of("mintaka", 6), tmp_path / "m_train.jsonl", record_schema("mintaka"))
    }
    quest_test = [rec("quest", 1, "QUESTION 3 OF MINTAKA", split="test")]
    test = {
        "mintaka": write_frame(
            pool_of("mintaka", 1, start=50, split="test"), tmp_path / "m_test.jsonl", record_schema("mintaka")
        ),
        "quest": write_frame(frame(quest_test, "quest"), tmp_path / "q_test.jsonl", record_schema("quest")),
    }
    out = [tmp_path / n for n in ("train.jsonl", "val.jsonl", "stats.json")]
    stats = mix_training_set(train, test, *out, mix_config({"mintaka": 5, "quest": 0}, seed=0))
    assert stats["datasets"]["mintaka"]["removed"]["eval_overlap"] == 1
    assert "mintaka:00003" not in set(read_records(out[0], MIX_SCHEMA)["id"])


def test_the_mix_job_reads_the_test_split_of_every_evaluated_dataset():
    """Through the workflow: with QUEST out of the mix (count 0), its test split is still an input."""
    from pathlib import Path

    import yaml
    from dag_jobs import dag_jobs

    repo = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    config.setdefault("mix", {})["counts"] = {"qampari": 6000, "mintaka": 2000, "webqsp": 2000, "quest": 0}
    jobs = dag_jobs(config, "results/paper/data/mix/train.jsonl", repo)
    (inputs,) = [inputs for (rule, _), (_, inputs, _) in jobs.items() if rule == "mix_training_set"]
    tests = {p.split("/")[-2] for p in inputs if p.endswith("/test.jsonl")}
    trains = {p.split("/")[-2] for p in inputs if p.endswith("/train.jsonl")}
    assert tests == {"qampari", "mintaka", "webqsp", "quest"} and trains == {"qampari", "mintaka", "webqsp"}
