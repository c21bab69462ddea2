"""StepSearch's evidence built with the project's real search: a Lucene index of the retrieval
tests' corpus, the tiny random cross-encoder as reranker, the FastAPI service started as the rule
starts it (only the reranker's weights are random, so the ranking is arbitrary but fixed)."""

from __future__ import annotations

import json
import zipfile

import pytest

from spader.core.matching import find_hits
from spader.data.records import MIX_SCHEMA, DataFormatError, records_frame, write_frame
from spader.scorers.evidence import (
    EvidenceSettings,
    build_evidence,
    build_evidence_with_service,
    coverage_metrics,
    entity_query,
    read_evidence,
)

RECORDS = [
    {
        "id": "qampari:q1",
        "dataset": "qampari",
        "question": "Which films did Ilse Varga direct?",
        # Harbour Lights is in no passage: left out
        "answers": [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"], ["Harbour Lights"]],
        "source_id": "q1",
    },
    {
        "id": "mintaka:m1",
        "dataset": "mintaka",
        "question": "Which rivers flow into Lake Ørnes?",
        "answers": [["Kvitelva"], ["Ørna", "Orna river"]],
        "source_id": "m1",
    },
]


def write_mix(path):
    from spader.core.text import normalize

    rows = [
        {
            "id": r["id"],
            "dataset": r["dataset"],
            "split": "train",
            "question": r["question"],
            "answers": r["answers"],
            "answers_norm": [[normalize(a) for a in e] for e in r["answers"]],
            "meta": {"source_file": "x", "source_id": r["source_id"]},
        }
        for r in RECORDS
    ]
    write_frame(records_frame(rows, MIX_SCHEMA), path, MIX_SCHEMA)
    return path


def retrieval_settings(reranker):
    return {
        "bm25": {"k1": 0.9, "b": 0.4},
        "initial_k": 50,
        "topk": 5,
        "reranker": {
            "model": "tiny:reranker",
            "path": str(reranker),
            "batch_size": 16,
            "max_length": 256,
            "fp16": False,
        },
        "service": {
            "host": "127.0.0.1",
            "max_queries_per_request": 64,
            "max_query_chars": 1000,
            "startup_timeout_s": 180,
            "request_timeout_s": 60,
            "retries": 1,
        },
    }


@pytest.mark.slow
def test_evidence_with_the_real_search(bm25_index, tiny_reranker, tmp_path):
    from spader.retrieval.backend import SearchSettings
    from spader.retrieval.service import connected_client

    mix = write_mix(tmp_path / "train.jsonl")
    settings = EvidenceSettings(depth=20, queries_per_request=2, concurrency=2)
    out, cov = tmp_path / "evidence.jsonl", tmp_path / "coverage.json"
    retrieval = SearchSettings.from_config(retrieval_settings(tiny_reranker))
    with connected_client(bm25_index, retrieval, threads=1) as client:
        coverage = build_evidence(mix, out, cov, client=client, settings=settings)
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert [x["id"] for x in lines] == ["qampari:q1", "mintaka:m1"]
        for record, line in zip(RECORDS, lines, strict=True):
            for ev in line["evidence"]:
                aliases = record["answers"][ev["entity"]]
                ranked = client.retrieve(
                    [entity_query(record["question"], aliases[0])], topk=20, initial_k=20
                )[0]
                containing = [p for p in ranked if find_hits([p["title"], p["text"]], [aliases])]
                # the highest-ranked passage that contains an alias, never one that does not
                assert (
                    ev["passage_id"] == containing[0]["id"] and ev["rank"] == ranked.index(containing[0]) + 1
                )
                assert ev["source"] == "search"
    assert [e["entity"] for e in lines[0]["evidence"]] == [0, 1]  # Harbour Lights left out
    assert [e["entity"] for e in lines[1]["evidence"]] == [0, 1]
    assert coverage["datasets"]["qampari"] == {
        "questions": 1,
        "entities": 3,
        "with_evidence": 2,
        "coverage": 2 / 3,
    }
    assert coverage["datasets"]["mintaka"]["coverage"] == 1.0
    assert coverage["total"]["coverage"] == pytest.approx(4 / 5)
    assert json.loads(cov.read_text()) == coverage
    assert coverage_metrics(coverage)["evidence/coverage/qampari"] == pytest.approx(2 / 3)
    texts = read_evidence(out)
    assert len(texts["qampari:q1"]) == 2 and "Winter Quay" in " ".join(texts["qampari:q1"])

    # QAMPARI's proof_text option: its entities take the release's proofs, the others still search
    release = tmp_path / "qampari.zip"
    answers = [
        {
            "answer_text": "The Salt Orchard",
            "aliases": [],
            "proof": [{"proof_text": "The Salt Orchard (1961) by Varga."}],
        },
        {"answer_text": "Winter Quay", "aliases": [], "proof": []},
        {
            "answer_text": "Harbour Lights",
            "aliases": [],
            "proof": [{"proof_text": "Harbour Lights, her last film."}],
        },
    ]
    with zipfile.ZipFile(release, "w") as zf:
        zf.writestr(
            "qampari_data/train_data.jsonl",
            json.dumps({"qid": "q1", "question_text": "x", "answer_list": answers}) + "\n",
        )
    proof = EvidenceSettings(depth=20, queries_per_request=64, concurrency=1, qampari_proof_text=True)
    coverage = build_evidence_with_service(
        mix,
        bm25_index,
        retrieval,
        out,
        cov,
        settings=proof,
        qampari_release=release,
        qampari_member="qampari_data/train_data.jsonl",
    )
    first = json.loads(out.read_text().splitlines()[0])
    assert [(e["entity"], e["source"], e["text"]) for e in first["evidence"]] == [
        (0, "proof_text", "The Salt Orchard (1961) by Varga."),
        (2, "proof_text", "Harbour Lights, her last film."),
    ]
    assert coverage["datasets"]["mintaka"]["with_evidence"] == 2


def test_settings_and_bad_artifacts(tmp_path):
    with pytest.raises(ValueError, match="depthh"):
        EvidenceSettings.model_validate({"depthh": 5})  # the stepsearch.evidence section: unknown key
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        EvidenceSettings(depth=0)
    bad = tmp_path / "evidence.jsonl"
    bad.write_text('{"id": "q1", "evidence": [{"title": "t"}]}\n')
    with pytest.raises(DataFormatError, match="evidence.jsonl, line 1"):
        read_evidence(bad)
    with pytest.raises(ValueError, match="needs the QAMPARI train release"):
        build_evidence(
            write_mix(tmp_path / "m.jsonl"),
            tmp_path / "o",
            tmp_path / "c",
            client=None,
            settings=EvidenceSettings(qampari_proof_text=True),
        )
