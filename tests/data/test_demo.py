"""The bundled demo data (resources/demo): identical to a fresh `python -m spader.demo` run, in the
real formats, usable by the demo configuration (drops, mix, exports), and searchable: a BM25
search for a demo question finds its answers."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml

from spader.config import resolved_config
from spader.config.model import MixConfig
from spader.core.rewards import find_hits
from spader.data import (
    DATASETS,
    build_mix,
    eval_rows,
    normalize_release,
    record_schema,
    verl_rows,
)
from spader.data.records import DROP_REASONS, records_frame
from spader.demo import DEMO_FILES

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "resources" / "demo"


def _config() -> dict:
    base = resolved_config(REPO / "config" / "config.yaml")
    demo = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    splits = {d: base["datasets"][d]["splits"] for d in DATASETS}
    files = {d: {name: src["url"] for name, src in demo["datasets"][d]["files"].items()} for d in DATASETS}
    return {"splits": splits, "files": files, "mix": {**base["mix"], **demo["mix"]}}


def _release(dataset: str, split: str):
    """The demo file of one split, found the way config/demo.yaml names it."""
    cfg = _config()
    spec = cfg["splits"][dataset][split]
    url = cfg["files"][dataset][spec["file"]]
    return REPO / url.removeprefix("file:"), spec.get("member")


@pytest.fixture(scope="module")
def normalized():
    out = {}
    for d in DATASETS:
        for split in ("train", "test"):
            path, member = _release(d, split)
            out[d, split] = normalize_release(d, split, path, member)
    return out


def test_committed_files_equal_a_fresh_regeneration(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "spader.demo", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    # what git would keep (a demo run in this checkout adds ignored downloads under resources/demo)
    kept = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "."],
        cwd=DEMO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    committed = sorted(p for p in kept if (DEMO / p).is_file())
    assert committed == sorted(DEMO_FILES), "resources/demo holds files the generator does not write"
    for name in DEMO_FILES:
        fresh, kept = (tmp_path / name).read_bytes(), (DEMO / name).read_bytes()
        if fresh != kept:
            same_payload = name.endswith(".gz") and gzip.decompress(fresh) == gzip.decompress(kept)
            pytest.fail(
                f"resources/demo/{name} differs from `python -m spader.demo` output"
                + (
                    " (same content, different gzip bytes: another zlib?)"
                    if same_payload
                    else "; regenerate it with `python -m spader.demo resources/demo`"
                )
            )
    total = sum((DEMO / n).stat().st_size for n in DEMO_FILES)
    assert total < 1_000_000


def _chunks() -> list[dict]:
    lines = []
    with tarfile.open(DEMO / "chunked_wikipedia.tar.gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        assert members and all(
            re.fullmatch(r"wikipedia_chunks/chunks_v5/wikipedia_chunks_\d+\.jsonl", m.name) for m in members
        )
        for m in members:
            for line in tar.extractfile(m).read().decode("utf-8").splitlines():
                lines.append(json.loads(line))
    return lines


def test_corpus_is_in_the_qampari_chunk_format():
    chunks = _chunks()
    assert 300 <= len(chunks) <= 1200
    assert len({c["id"] for c in chunks}) == len(chunks)
    for c in chunks:
        assert re.fullmatch(r"\d+__\d+", c["id"])
        meta = c["meta"]
        assert c["contents"] == f"{meta['title']} {meta['content']}"
        assert meta["chunk_id"] == c["id"] and meta["page_id"] == c["id"].split("__")[0]
        assert meta["url"] == f"https://en.wikipedia.org/wiki?curid={meta['page_id']}"
        assert 80 <= len(meta["content"].split()) <= 140  # ~100-word passages


def test_every_demo_answer_occurs_in_the_corpus(normalized):
    passages = [c["contents"] for c in _chunks()]
    for (d, split), (records, _) in normalized.items():
        entities = [e for r in records for e in r["answers"]]
        found = find_hits(passages, entities)
        missing = [entities[i] for i in range(len(entities)) if i not in found]
        assert not missing, (d, split, missing)


def test_drops_cover_every_reason_and_the_demo_mix_builds(normalized):
    reasons = set()
    for _, summary in normalized.values():
        reasons |= {k.split(":")[0] for k in summary.dropped}
    assert reasons == set(DROP_REASONS) - {"duplicate_id"}  # a repeated id: tests/data/test_sources.py

    mix = _config()["mix"]
    train, val, stats = _mix(normalized)
    evals = {d: records_frame(normalized[d, "test"][0], record_schema(d)) for d in DATASETS}
    assert len(train) == sum(mix["counts"].values()) and len(val) == 4 * mix["val_per_dataset"]
    assert stats["datasets"]["qampari"]["removed"]["eval_overlap"] == 1
    # the demo's repeated QAMPARI question is dropped as it is normalized; the mix finds none left
    assert normalized["qampari", "train"][1].dropped["duplicate_question"] == 1
    assert stats["datasets"]["qampari"]["removed"]["duplicate_question"] == 0
    assert len(verl_rows(train, "train")) == len(train)
    for d in DATASETS:
        assert len(eval_rows(evals[d], limit=mix["eval_limit"], seed=mix["seed"])) == mix["eval_limit"]


def _mix(normalized):
    mix = _config()["mix"]
    cfg = MixConfig.model_validate(mix)
    pools = {d: records_frame(normalized[d, "train"][0], record_schema(d)) for d in DATASETS}
    evals = {d: records_frame(normalized[d, "test"][0], record_schema(d)) for d in DATASETS}
    return build_mix(pools, evals, cfg)


def test_every_evaluation_set_asks_at_least_fifty_questions(normalized):
    """The demo evaluates 50 questions per dataset (``mix.eval_limit``): each test split holds at
    least that many after its drops, so the paired tests can reach p well below 0.05."""
    limit = _config()["mix"]["eval_limit"]
    assert limit >= 50
    for d in DATASETS:
        records, _ = normalized[d, "test"]
        assert len(records) >= limit, (d, len(records))


def test_question_ids_stay_unique_for_a_larger_evaluation_side():
    """WebQSP's dropped test question takes an id past the split's, whatever its size."""
    from spader.demo.releases import webqsp_splits
    from spader.demo.world import SEED, build_world

    for n_eval in (70, 81, 95):
        ids = [q["QuestionId"] for q in webqsp_splits(build_world(SEED, n_eval=n_eval))["test"]["Questions"]]
        assert len(ids) == len(set(ids)) == n_eval + 1, n_eval


def test_no_evaluation_topic_or_answer_reaches_training_or_the_warm_start(normalized):
    """The demo world's two sides: every evaluation question asks about the evaluation side only,
    and no name of that side (topic subject, answer entity or alias) occurs, as whole words up to
    norm_v1, in a question or gold answer of the training mix (train and validation) or of the
    warm start's scripted questions (the demo world's and the generated worlds'), taken here without
    the evaluation filter the warm start applies besides (``exclude`` empty)."""
    from spader.core.text import normalize
    from spader.demo.trajectories import generated_questions, world_questions
    from spader.demo.world import EVAL_TOPICS, SEED, build_world, topic_names

    world = build_world(n_eval=EVAL_TOPICS)
    held = {normalize(n) for n in topic_names(world.eval_topics)}
    first = {normalize(n) for n in topic_names(world.topics)}
    assert held and not held & first
    for d in DATASETS:
        for r in normalized[d, "test"][0]:
            # each answer is an evaluation-side entity (QUEST adds a title with its disambiguator)
            stray = [aliases for aliases in r["answers"] if not {normalize(a) for a in aliases} & held]
            assert r["answers"] and not stray, (d, r["question"], stray)

    train, val, _ = _mix(normalized)
    texts = [q for df in (train, val) for q in df["question"].to_list()]
    texts += [a for df in (train, val) for aliases in df["answers"].to_list() for ans in aliases for a in ans]
    warm = build_world()
    generated = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())["backbones"]["demo"]["warmstart"]
    seeds = [SEED + k for k in range(1, generated["generated_worlds"] + 1)]
    questions = world_questions(warm, []) + [q for qs, _ in generated_questions(seeds, []) for q in qs]
    assert len(questions) > 100
    texts += [q.question for q in questions] + [a for q in questions for aliases in q.gold for a in aliases]
    padded = [f" {normalize(t)} " for t in texts]
    leaks = sorted({n for n in held if any(f" {n} " in t for t in padded)})
    assert not leaks, f"evaluation names in training or warm-start text: {leaks[:10]}"


def test_release_files_have_the_real_layouts():
    with zipfile.ZipFile(DEMO / "qampari.zip") as zf:
        assert sorted(zf.namelist()) == [f"qampari_data/{s}_data.jsonl" for s in ("dev", "test", "train")]
        first = json.loads(zf.read("qampari_data/train_data.jsonl").splitlines()[0])
        assert {"qid", "question_text", "answer_list", "entities"} <= set(first)
        assert {"answer_text", "aid", "aliases", "answer_url", "proof"} <= set(first["answer_list"][0])
        assert zf.read("qampari_data/train_data.jsonl").isascii()  # json.dumps escapes, as QAMPARI writes
    text = (DEMO / "mintaka_train.json").read_text(encoding="utf-8")
    assert text.startswith('[\n    {\n        "id": "') and '"translations":\n        {' in text
    assert not text.endswith("\n")
    mintaka = json.loads(text)
    assert all(re.fullmatch(r"[0-9a-f]{8}", r["id"]) for r in mintaka)
    labels = [a["label"] for r in mintaka for a in (r["answer"]["answer"] or []) if isinstance(a, dict)]
    assert labels and all(isinstance(lab, dict) and "en" in lab for lab in labels)  # v1.1 label dicts
    with zipfile.ZipFile(DEMO / "WebQSP.zip") as zf:
        doc = json.loads(zf.read("WebQSP/data/WebQSP.test.json"))
        assert set(doc) == {"Version", "FreeBaseVersion", "Questions"}
        assert all(q["QuestionId"].startswith("WebQTest-") for q in doc["Questions"])
    quest = [json.loads(line) for line in (DEMO / "quest" / "train_aug.jsonl").read_text().splitlines()]
    assert all(set(q) == {"query", "docs", "original_query", "scores", "metadata"} for q in quest)
    assert any(re.search(r" \(\d{4} film\)$", d) for q in quest for d in q["docs"])


def test_bm25_search_finds_the_answers(tmp_path, normalized):
    """Index the demo corpus with the project's Lucene indexer and search every demo question (in a
    subprocess: one JVM per process, whatever heap the other tests start it with)."""
    questions = [
        {"q": r["question"], "answers": r["answers"]}
        for (d, split), (records, _) in normalized.items()
        for r in records
    ]
    (tmp_path / "questions.json").write_text(json.dumps(questions))
    script = textwrap.dedent(
        """
        import json, sys
        from spader.retrieval.index import build_bm25_index
        from spader.retrieval.searcher import Bm25Searcher
        from spader.core.rewards import find_hits

        archive, index, questions = sys.argv[1:4]
        build_bm25_index(archive, index, heap="1g")
        searcher = Bm25Searcher(index, k1=0.9, b=0.4)
        qs = json.load(open(questions))
        recalls = []
        for q, hits in zip(qs, searcher.search([q["q"] for q in qs], 10)):
            found = find_hits([f"{h.title} {h.text}" for h in hits], q["answers"])
            recalls.append(len(found) / len(q["answers"]))
        print("RESULT " + json.dumps(recalls))
        """
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(DEMO / "chunked_wikipedia.tar.gz"),
            str(tmp_path / "index"),
            str(tmp_path / "questions.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recalls = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert len(recalls) == len(questions)
    assert min(recalls) > 0, "a demo question whose answers BM25 does not find in the top 10"
    assert sum(recalls) / len(recalls) >= 0.9
