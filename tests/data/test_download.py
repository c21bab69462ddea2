"""download_dataset: URLs and paths through spader.infra.download.fetch, the user-supplied WebQSP error,
and the Hugging Face hub option against a local directory laid out like the hub repository (these
machines have no hub access; huggingface_hub itself resolves the file there)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from spader.data import DatasetSourceError, download_dataset, normalize_release
from spader.data.layout import dump_jsonl
from spader.infra.download import DownloadError

QUEST_ROWS = [
    {
        "query": "Films directed by Ilse Varga",
        "docs": ["Winter Quay (1961 film)"],
        "original_query": None,
        "scores": None,
        "metadata": {"template": "_", "domain": "films"},
    }
]


def test_file_url_relative_and_plain_paths(tmp_path, monkeypatch):
    src = tmp_path / "release" / "train_aug.jsonl"
    src.parent.mkdir()
    src.write_text(dump_jsonl(QUEST_ROWS))
    monkeypatch.chdir(tmp_path)  # relative sources resolve against the working directory (repo root)
    for i, url in enumerate(["file:release/train_aug.jsonl", f"file://{src}", "release/train_aug.jsonl"]):
        dest = tmp_path / "resources" / str(i) / "train_aug.jsonl"
        assert (
            download_dataset({"url": url, "hub": None}, dest, key="datasets.quest.files.train_aug.jsonl")
            == dest
        )
        assert dest.read_bytes() == src.read_bytes()
    with pytest.raises(DownloadError, match="missing.jsonl"):
        download_dataset({"url": "file:release/missing.jsonl"}, tmp_path / "x.jsonl", key="k")


def test_null_url_names_the_key_and_what_to_do(tmp_path):
    with pytest.raises(DatasetSourceError) as err:
        download_dataset(
            {"url": None, "hub": None}, tmp_path / "WebQSP.zip", key="datasets.webqsp.files.WebQSP.zip"
        )
    message = str(err.value)
    assert "config key 'datasets.webqsp.files.WebQSP.zip.url' is null" in message
    assert "https://www.microsoft.com/en-us/download/details.aspx?id=52763" in message
    assert not (tmp_path / "WebQSP.zip").exists()


def test_hub_raw_file_from_a_local_mirror(tmp_path):
    mirror = tmp_path / "cmalaviya--quest"
    mirror.mkdir()
    (mirror / "train_aug.jsonl").write_text(dump_jsonl(QUEST_ROWS))
    hub = {
        "repo_id": "cmalaviya/quest",
        "filename": "train_aug.jsonl",
        "revision": "main",
        "repo_type": "dataset",
        "format": "raw",
        "split": None,
        "local_dir": str(mirror),
    }
    dest = tmp_path / "resources" / "train_aug.jsonl"
    download_dataset({"url": None, "hub": hub}, dest, key="datasets.quest.files.train_aug.jsonl")
    assert dest.read_bytes() == (mirror / "train_aug.jsonl").read_bytes()
    records, _ = normalize_release("quest", "train", dest)
    assert records[0]["answers"] == [["Winter Quay", "Winter Quay (1961 film)"]]

    with pytest.raises(
        DatasetSourceError,
        match=r"config key 'datasets.quest.files.test.jsonl.hub': cannot get 'test.jsonl' "
        r"of cmalaviya/quest from local directory",
    ):
        download_dataset(
            {"url": None, "hub": {**hub, "filename": "test.jsonl"}},
            tmp_path / "test.jsonl",
            key="datasets.quest.files.test.jsonl",
        )
    with pytest.raises(DatasetSourceError, match="config key 'k.hub'.*format.*'raw' or 'mintaka_parquet'"):
        download_dataset({"url": None, "hub": {**hub, "format": "csv"}}, tmp_path / "t.jsonl", key="k")


def _answer_entity(name, label):
    return {"name": name, "label": label}


def test_hub_mintaka_parquet_is_rebuilt_as_mintaka_json(tmp_path):
    # The parquet export of AmazonScience/mintaka (branch refs/convert/parquet) is flattened: one row
    # per (question, language), answers as answerText + answerEntity; answerType is lost.
    entity_t = pl.List(pl.Struct({"name": pl.String, "label": pl.String}))
    rows = pl.DataFrame(
        {
            "id": ["m1", "m1", "m2", "m3", "m4", "m5"],
            "lang": ["en", "de", "en", "en", "en", "en"],
            "question": [
                "Who directed The Salt Orchard?",
                "Wer?",
                "Is it long?",
                "How many films?",
                "Which band recorded Rust Songs?",
                "When did it open?",
            ],
            "answerText": ["Ilse Varga", "Ilse Varga", "True", "4", "Halcyon & Rust", "1961-10-20"],
            "category": ["movies"] * 6,
            "complexityType": ["generic", "generic", "yesno", "count", "generic", "generic"],
            "answerEntity": [
                [_answer_entity("Q1", "Ilse Varga")],
                [_answer_entity("Q1", "Ilse Varga")],
                [],
                [],
                [],
                [],
            ],
        },
        schema_overrides={"answerEntity": entity_t},
    )
    mirror = tmp_path / "mintaka"
    (mirror / "en").mkdir(parents=True)
    rows.write_parquet(mirror / "en" / "mintaka-train.parquet")
    hub = {
        "repo_id": "AmazonScience/mintaka",
        "filename": "en/mintaka-train.parquet",
        "revision": "refs/convert/parquet",
        "repo_type": "dataset",
        "format": "mintaka_parquet",
        "split": None,
        "local_dir": str(mirror),
    }
    dest = tmp_path / "mintaka_train.json"
    download_dataset({"url": None, "hub": hub}, dest, key="datasets.mintaka.files.mintaka_train.json")
    text = dest.read_text(encoding="utf-8")
    assert text.startswith('[\n    {\n        "id": "m1",') and not text.endswith("\n")  # Mintaka's layout
    assert [r["answer"]["answerType"] for r in json.loads(text)] == [
        "entity",
        "boolean",
        "numerical",
        "entity",
        "date",
    ]
    records, summary = normalize_release("mintaka", "train", dest)
    assert [(r["id"], r["answers"]) for r in records] == [
        ("mintaka:m1", [["Ilse Varga"]]),
        ("mintaka:m4", [["Halcyon & Rust"]]),
    ]
    assert records[0]["meta"]["mintaka_version"] == "1.1"
    assert summary.dropped == {
        "non_list_answer_type:boolean": 1,
        "count_question": 1,
        "non_list_answer_type:date": 1,
    }


def test_mintaka_parquet_without_the_needed_columns(tmp_path):
    mirror = tmp_path / "m"
    mirror.mkdir()
    pl.DataFrame({"id": ["a"], "question": ["q"]}).write_parquet(mirror / "x.parquet")
    hub = {
        "repo_id": "AmazonScience/mintaka",
        "filename": "x.parquet",
        "format": "mintaka_parquet",
        "local_dir": str(mirror),
    }
    with pytest.raises(
        DatasetSourceError,
        match=r"not a Mintaka parquet export, missing columns \['answerText', 'complexityType'\]",
    ):
        download_dataset({"url": None, "hub": hub}, tmp_path / "mintaka_train.json", key="k")
