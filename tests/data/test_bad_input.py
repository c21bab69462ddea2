"""Malformed release files end in a DataFormatError naming the file and the line (never a bare
traceback from deep inside), for JSON Lines, JSON documents and zip archives, and through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from spader.data import DataFormatError, normalize_release
from spader.data.layout import dump_mintaka_json

GOOD_QAMPARI = {
    "qid": "1__wikidata_simple__train",
    "question_text": "Which films?",
    "answer_list": [{"answer_text": "Winter Quay", "aliases": []}],
}
GOOD_MINTAKA = {
    "id": "a1",
    "question": "Who?",
    "answer": {"answerType": "entity", "answer": None, "mention": "Ilse"},
    "category": "movies",
    "complexityType": "generic",
}


def _jsonl(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


GOOD = json.dumps(GOOD_QAMPARI)


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        (
            _jsonl(GOOD, GOOD[:40]),
            2,
            "the line looks truncated",
        ),  # truncated last line (interrupted download)
        (_jsonl(GOOD, GOOD[:40], GOOD), 2, "invalid JSON"),  # truncated line in the middle
        (_jsonl(GOOD, '["not", "an", "object"]'), 2, "expected a JSON object, got an array"),
        (
            _jsonl(GOOD, GOOD, json.dumps({k: v for k, v in GOOD_QAMPARI.items() if k != "question_text"})),
            3,
            "missing required field 'question_text'",
        ),
        (
            _jsonl(json.dumps({**GOOD_QAMPARI, "answer_list": {"a": 1}})),
            1,
            "field 'answer_list' must be an array",
        ),
        (
            _jsonl(json.dumps({**GOOD_QAMPARI, "question_text": 17})),
            1,
            "field 'question_text' must be a string",
        ),
        (_jsonl(GOOD, GOOD).replace(b"Which", b"Wh\xffch", 1), 1, "invalid UTF-8 (byte 0xff"),
        (
            _jsonl(json.dumps({**GOOD_QAMPARI, "answer_list": ["Winter Quay"]})),
            1,
            "'answer_list[0]' must be an object",
        ),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, content, line, fragment):
    path = tmp_path / "train_data.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataFormatError) as err:
        normalize_release("qampari", "train", path)
    assert err.value.line == line
    assert str(err.value).startswith(f"{path}, line {line}: ")
    assert fragment in str(err.value)


def test_quest_missing_docs(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"query": "a"}) + "\n" + json.dumps({"query": "b", "docs": [1, 2]}) + "\n")
    with pytest.raises(DataFormatError, match=r"test.jsonl, line 1: missing required field 'docs'"):
        normalize_release("quest", "test", path)
    path.write_text(json.dumps({"query": "b", "docs": [1, 2]}) + "\n")
    with pytest.raises(DataFormatError, match=r"line 1: field 'docs\[0\]' must be a string"):
        normalize_release("quest", "test", path)


def _mintaka_text(records) -> str:
    return dump_mintaka_json(records)


@pytest.mark.parametrize(
    ("make", "line", "fragment"),
    [
        # the file ends in the middle of the second record
        (lambda: _mintaka_text([GOOD_MINTAKA, GOOD_MINTAKA])[:-40], 24, "the file looks truncated"),
        # an object at the top level instead of the array of records
        (
            lambda: json.dumps({"data": [GOOD_MINTAKA]}),
            1,
            "expected a JSON array of records at the top level, got an object",
        ),
        # the third record (starting on line 26 in Mintaka's layout: 12 lines a record) has no answer
        (
            lambda: _mintaka_text(
                [GOOD_MINTAKA, GOOD_MINTAKA, {k: v for k, v in GOOD_MINTAKA.items() if k != "answer"}]
            ),
            26,
            "missing required field 'answer'",
        ),
        (
            lambda: _mintaka_text([{**GOOD_MINTAKA, "answer": {"answer": None}}]),
            2,
            "missing required field 'answer.answerType'",
        ),
        (lambda: _mintaka_text([GOOD_MINTAKA, "just a string"]), 14, "expected a JSON object"),
        (lambda: _mintaka_text([GOOD_MINTAKA]) + "\n]", 15, "unexpected content after the end"),
        (lambda: "", 1, "got an empty file"),
    ],
)
def test_json_document_errors_name_file_and_line(tmp_path, make, line, fragment):
    path = tmp_path / "mintaka_train.json"
    path.write_text(make(), encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        normalize_release("mintaka", "train", path)
    assert fragment in str(err.value)
    assert err.value.line == line, str(err.value)
    assert str(err.value).startswith(f"{path}, line {line}: ")


def test_json_document_invalid_utf8_line(tmp_path):
    text = _mintaka_text([GOOD_MINTAKA, {**GOOD_MINTAKA, "question": "Wh@t?"}]).encode()
    path = tmp_path / "mintaka_test.json"
    path.write_bytes(text.replace(b"Wh@t", b"Wh\xc3t"))
    with pytest.raises(DataFormatError, match=r"mintaka_test.json, line 16: invalid UTF-8 \(byte 0xc3\)"):
        normalize_release("mintaka", "test", path)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ([], "expected a JSON object with a 'Questions' array at the top level, got an array"),
        ({"Version": "1.0"}, "missing required top-level field 'Questions'"),
        ({"Questions": {"a": 1}}, "field 'Questions' must be an array of records"),
        ({"Questions": [{"RawQuestion": "q", "Parses": []}]}, "line 3: missing required field 'QuestionId'"),
        ({"Questions": [{"QuestionId": "W-1", "Parses": []}]}, "missing required field 'RawQuestion'"),
    ],
)
def test_webqsp_errors(tmp_path, doc, fragment):
    path = tmp_path / "WebQSP.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("WebQSP/data/WebQSP.train.json", json.dumps(doc, indent=1))
    with pytest.raises(DataFormatError) as err:
        normalize_release("webqsp", "train", path)
    assert str(err.value).startswith(f"{path}/WebQSP/data/WebQSP.train.json")
    assert fragment in str(err.value)


def test_zip_member_and_file_errors(tmp_path):
    path = tmp_path / "qampari.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("qampari_data/dev_data.jsonl", "")
    with pytest.raises(
        DataFormatError,
        match=r"no member 'qampari_data/train_data.jsonl' \(members: qampari_data/dev_data.jsonl\)",
    ):
        normalize_release("qampari", "train", path)
    with pytest.raises(DataFormatError, match="file not found"):
        normalize_release("quest", "train", tmp_path / "missing.jsonl")
    plain = tmp_path / "train.jsonl"
    plain.write_text("")
    with pytest.raises(DataFormatError, match="not a zip archive"):
        normalize_release("quest", "train", plain, member="x.jsonl")


def test_cli_reports_one_clear_line(tmp_path):
    path = tmp_path / "train_data.jsonl"
    path.write_bytes(_jsonl(GOOD, GOOD[:30]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spader.data",
            "normalize",
            "--dataset",
            "qampari",
            "--split",
            "train",
            "--input",
            str(path),
            "--output",
            str(tmp_path / "out.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"error: {path}, line 2: invalid JSON" in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def _sparse_line(path, head: bytes, size: int) -> None:
    """``head`` then a line of ``size`` zero bytes, written sparse (no disk, no time)."""
    with open(path, "wb") as f:
        f.write(head)
        f.seek(len(head) + size)
        f.write(b"\n")


def _limited(argv: list[str], limit_bytes: int) -> subprocess.CompletedProcess:
    """``argv`` run with its address space capped (the memory limit of a job)."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=cap)


@pytest.mark.parametrize(
    ("dataset", "name", "size"),
    [
        ("quest", "train_aug.jsonl", 3 << 30),  # a 3 GiB line under a 1 GiB memory limit
        ("qampari", "train_data.jsonl", (64 << 20) + 1),  # held out: one byte over the bound
    ],
)
def test_an_oversized_line_is_one_error_naming_file_and_line_under_a_memory_limit(
    tmp_path, dataset, name, size
):
    path = tmp_path / name
    good = (
        json.dumps({"query": "Novels by Robert B. Parker", "docs": ["High Profile"]})
        if dataset == "quest"
        else GOOD
    )
    _sparse_line(path, (good + "\n").encode(), size)
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "spader.data", "normalize", "--dataset", dataset, "--split", "train"]
    proc = _limited([*argv, "--input", str(path), "--output", str(out)], 1 << 30)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: {path}, line 2: line longer than 67,108,864 bytes" in proc.stderr
    assert not out.exists()


def test_an_oversized_json_document_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    import spader.data.readers as readers

    monkeypatch.setattr(readers, "MAX_DOCUMENT_BYTES", 1000)
    path = tmp_path / "mintaka_train.json"
    path.write_text(dump_mintaka_json([GOOD_MINTAKA] * 20))
    with pytest.raises(
        DataFormatError, match=r"mintaka_train\.json: a JSON document larger than 1,000 bytes"
    ):
        normalize_release("mintaka", "train", path)
