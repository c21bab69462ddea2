"""A release that holds nothing is an error naming it; a question a release holds twice is kept
once, the repeat dropped and counted (docs/data.md, "Normalized record")."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from spader.data import DataFormatError, normalize_file, normalize_release


def _qampari(qid: str, question: str, answer: str = "Winter Quay") -> dict:
    return {
        "qid": f"{qid}__wikidata_simple__test",
        "question_text": question,
        "answer_list": [{"answer_text": answer, "aliases": []}],
    }


def _zip(path, members: dict[str, str]):
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


@pytest.mark.parametrize(
    ("dataset", "name", "text"),
    [
        ("quest", "test.jsonl", ""),
        ("quest", "test.jsonl", "\n \n\t\n"),
        ("quest", "test.jsonl", "\ufeff\n"),
        ("mintaka", "mintaka_test.json", "[]"),
        ("mintaka", "mintaka_test.json", " [ \n ] \n"),
    ],
    ids=["empty", "blank", "bom-only", "empty-array", "blank-array"],
)
def test_a_release_without_records_is_an_error_naming_it(tmp_path, dataset, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataFormatError, match=rf"^{path}: holds no records"):
        normalize_file(dataset, "test", path, out)
    assert not out.exists()


def test_an_archive_member_without_records_or_that_is_a_directory_is_named(tmp_path):
    webqsp = _zip(
        tmp_path / "WebQSP.zip", {"WebQSP/data/WebQSP.test.json": '{"Version": "1.0", "Questions": []}'}
    )
    with pytest.raises(DataFormatError, match=rf"^{webqsp}/WebQSP/data/WebQSP.test.json: holds no records"):
        normalize_release("webqsp", "test", webqsp)
    qampari = _zip(tmp_path / "qampari.zip", {"qampari_data/": "", "qampari_data/test_data.jsonl": ""})
    with pytest.raises(DataFormatError, match=rf"^{qampari}/qampari_data/: is a directory of the archive"):
        normalize_release("qampari", "test", qampari, member="qampari_data/")
    with pytest.raises(DataFormatError, match=rf"^{qampari}/qampari_data/test_data.jsonl: holds no records"):
        normalize_release("qampari", "test", qampari)
    with pytest.raises(DataFormatError, match=rf"^{tmp_path}: is a directory, not a release file"):
        normalize_release("quest", "test", tmp_path)


def test_the_command_says_so_in_one_line(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "spader.data", "normalize", "--dataset", "quest", "--split", "test",
         "--input", str(path), "--output", str(tmp_path / "out.jsonl")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: {path}: holds no records" in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_repeated_question_is_kept_once_and_the_repeat_counted(tmp_path):
    """A repeated id keeps its first line; a question asked again under another id (in another
    case, with invisible characters or punctuation) keeps the smallest id, as the training mix
    does; the rest keep their order. Nothing is scored twice."""
    records = [
        _qampari("7", "Which films did Ilse Varga direct?"),
        _qampari("3", "Which rivers cross Ørnes?"),
        _qampari("7", "Which films did Ilse Varga direct?", answer="Salt Orchard"),  # the id again
        _qampari("1", "which films did ilse\u200b varga direct"),  # the question again, smaller id
        _qampari("9", "WHICH RIVERS CROSS ØRNES?!"),  # the question again, larger id
        _qampari("5", "Which films did Ilse Varga write?"),
    ]
    path = _zip(
        tmp_path / "qampari.zip",
        {"qampari_data/test_data.jsonl": "".join(json.dumps(r) + "\n" for r in records)},
    )
    out = tmp_path / "test.jsonl"
    summary = normalize_file("qampari", "test", path, out)
    kept = [json.loads(line)["meta"]["source_id"] for line in out.read_text().splitlines()]
    assert kept == ["3__wikidata_simple__test", "1__wikidata_simple__test", "5__wikidata_simple__test"]
    drops = json.loads((tmp_path / "test.drops.json").read_text())
    assert drops["read"] == 6 and drops["kept"] == 3
    assert drops["dropped"] == {"duplicate_id": 1, "duplicate_question": 2}
    assert summary.kept == 3
