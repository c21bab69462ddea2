"""The paper's four datasets, in table order (their formats and how answers are taken: docs/data.md).

Each is one :class:`~spader.datasets.Dataset` entry; the extractors are in
:mod:`spader.data.sources`, the demo's writers in :mod:`spader.demo.releases` (named by path, so
that nothing here imports them).
"""

from __future__ import annotations

from spader.datasets import Dataset, ReleaseFile, Split

__all__ = ["BUILTIN", "MINTAKA", "QAMPARI", "QUEST", "WEBQSP"]

QAMPARI = Dataset(
    name="qampari",
    title="QAMPARI",
    files=(ReleaseFile("qampari.zip", "https://aggreg-qa.s3.amazonaws.com/qampari.zip"),),
    train=Split("qampari.zip", "qampari_data/train_data.jsonl"),
    test=Split("qampari.zip", "qampari_data/test_data.jsonl"),
    zip_member="qampari_data/{split}_data.jsonl",
    layout="jsonl",
    extract="spader.data.sources:extract_qampari",
    meta={"qtype": "string"},
    paper_count=6000,
    demo_writer="spader.demo.releases:write_qampari",
)

_MINTAKA_DATA = "https://raw.githubusercontent.com/amazon-science/mintaka/main/data"
MINTAKA = Dataset(
    name="mintaka",
    title="Mintaka",
    files=(
        ReleaseFile("mintaka_train.json", f"{_MINTAKA_DATA}/mintaka_train.json"),
        ReleaseFile("mintaka_test.json", f"{_MINTAKA_DATA}/mintaka_test.json"),
    ),
    train=Split("mintaka_train.json"),
    test=Split("mintaka_test.json"),
    layout="json",
    extract="spader.data.sources:extract_mintaka",
    meta={
        "category": "string",
        "complexity_type": "string",
        "answer_type": "string",
        "mintaka_version": "string",  # "1.0" (labels are strings), "1.1" (label dicts), null (no labels)
    },
    paper_count=2000,
    demo_writer="spader.demo.releases:write_mintaka",
)

WEBQSP = Dataset(
    name="webqsp",
    title="WebQSP",
    files=(
        ReleaseFile(
            "WebQSP.zip",
            None,
            supply="WebQSP is not redistributable: download WebQSP.zip from "
            "https://www.microsoft.com/en-us/download/details.aspx?id=52763",
        ),
    ),
    train=Split("WebQSP.zip", "WebQSP/data/WebQSP.train.json"),
    test=Split("WebQSP.zip", "WebQSP/data/WebQSP.test.json"),
    zip_member="WebQSP/data/WebQSP.{split}.json",
    layout="json",
    records_key="Questions",
    extract="spader.data.sources:extract_webqsp",
    meta={
        "parse_ids": "list[string]",  # the valid (Good + Complete) parses, in file order
        "parse_answers": "list[list[string]]",  # entity names per valid parse (max-over-parses metrics)
    },
    paper_count=2000,
    demo_writer="spader.demo.releases:write_webqsp",
)

_QUEST_DATA = "https://storage.googleapis.com/gresearch/quest"
QUEST = Dataset(
    name="quest",
    title="QUEST",
    files=(
        ReleaseFile("train_aug.jsonl", f"{_QUEST_DATA}/train_aug.jsonl"),
        ReleaseFile("test.jsonl", f"{_QUEST_DATA}/test.jsonl"),
    ),
    train=Split("train_aug.jsonl"),
    test=Split("test.jsonl"),
    layout="jsonl",
    extract="spader.data.sources:extract_quest",
    meta={
        "template": "string",
        "domain": "string",
        "original_query": "string",
        "docs_raw": "list[string]",
    },
    paper_count=2000,
    demo_writer="spader.demo.releases:write_quest",
)

#: The paper's datasets, in the order of its tables.
BUILTIN = (QAMPARI, MINTAKA, WEBQSP, QUEST)
