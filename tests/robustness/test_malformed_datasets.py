"""A corpus of malformed release files, in each dataset's real container (QAMPARI JSON Lines in a
zip, Mintaka's JSON array, WebQSP's JSON document in a zip, QUEST JSON Lines): every one either
fails with a DataFormatError that names the file and a line of the bad record, or is a counted drop
where the data spec says to drop. Nothing may escape as another exception (RecursionError,
UnicodeEncodeError, a polars schema error), and nothing may be written for a failed file.

The bad record is always the second of three, so the line in each message is checked against the
exact line span of that record in the file.
"""

from __future__ import annotations

import copy
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from spader.data import DataFormatError, normalize_file
from spader.data.layout import dump_mintaka_json

RAW = "__RAW__"  # a string value replaced by raw JSON text (deep nesting, huge numbers, surrogates)
DEEP = "[" * 5000 + "]" * 5000
DEEP_OBJ = '{"a":' * 3000 + "1" + "}" * 3000
HUGE = "9" * 5000
SURROGATE = '"Wh\\ud800t?"'

QAMPARI = {
    "qid": "1__wikidata_simple__train",
    "question_text": "Which films did Ilse Varga direct?",
    "answer_list": [
        {"answer_text": "Winter Quay", "aid": "1__wikidata_simple__train__0", "aliases": ["Quay"]}
    ],
}
MINTAKA = {
    "id": "9ace9041",
    "question": "What is the fourth book in the series?",
    "answer": {
        "answerType": "entity",
        "answer": [{"name": "Q1", "label": {"en": "Breaking Dawn", "de": None}}],
        "mention": "Breaking Dawn",
    },
    "category": "books",
    "complexityType": "ordinal",
}
WEBQSP = {
    "QuestionId": "WebQTrn-1",
    "RawQuestion": "who did ben stiller play in megamind?",
    "ProcessedQuestion": "who did ben stiller play in megamind",
    "Parses": [
        {
            "ParseId": "WebQTrn-1.P0",
            "AnnotatorComment": {"ParseQuality": "Complete", "QuestionQuality": "Good"},
            "Answers": [{"AnswerType": "Entity", "AnswerArgument": "m.0", "EntityName": "Bernard"}],
        }
    ],
}
QUEST = {
    "query": "Novels by Robert B. Parker",
    "docs": ["Split Image (novel)", "High Profile"],
    "original_query": "<mark>Novels by Robert B. Parker</mark>",
    "scores": None,
    "metadata": {"template": "_", "domain": "books"},
}
GOOD = {"qampari": QAMPARI, "mintaka": MINTAKA, "webqsp": WEBQSP, "quest": QUEST}


# ------------------------------------------------------------------------------------------------
# Writing a release file with a bad second record, and knowing that record's lines
# ------------------------------------------------------------------------------------------------
@dataclass
class Release:
    path: Path
    name: str  # what messages must name: the file, or archive/member
    span: tuple[int, int]  # first and last line of the bad record


def _jsonl_text(records: list[str]) -> tuple[str, tuple[int, int]]:
    return "".join(r + "\n" for r in records), (2, 2)


def _array_text(records: list[str], indent: str) -> tuple[list[str], tuple[int, int]]:
    """Lines of a JSON array of pre-rendered records, and the span of the second one."""
    lines, span = [], (0, 0)
    for i, rec in enumerate(records):
        rec_lines = [indent + line for line in rec.split("\n")]
        if i < len(records) - 1:
            rec_lines[-1] += ","
        if i == 1:
            span = (len(lines) + 1, len(lines) + len(rec_lines))
        lines.extend(rec_lines)
    return lines, span


def _mintaka_text(records: list[str]) -> tuple[str, tuple[int, int]]:
    lines, span = _array_text(records, "    ")
    return "\n".join(["[", *lines, "]"]), (span[0] + 1, span[1] + 1)  # Mintaka: no final newline


def _webqsp_text(records: list[str]) -> tuple[str, tuple[int, int]]:
    lines, span = _array_text(records, "  ")
    head = ["{", ' "Version": "1.0",', ' "FreebaseVersion": "2015-08-09",', ' "Questions": [']
    return "\n".join([*head, *lines, " ]", "}"]) + "\n", (span[0] + len(head), span[1] + len(head))


def _render(dataset: str, record: object, raw: str | None) -> str:
    if dataset == "mintaka":
        text = dump_mintaka_json([record])
        text = "\n".join(line[4:] for line in text.split("\n")[1:-1])  # the record alone, unindented
    elif dataset == "webqsp":
        text = json.dumps(record, indent=1)
    else:
        text = json.dumps(record)
    if raw is not None:
        assert f'"{RAW}"' in text
        text = text.replace(f'"{RAW}"', raw)
    return text


# the fields holding a record's id and its question (QUEST's id is its line)
_ID_AND_QUESTION = {
    "qampari": ("qid", "question_text"),
    "mintaka": ("id", "question"),
    "webqsp": ("QuestionId", "RawQuestion"),
    "quest": (None, "query"),
}


def _another(dataset: str, tag: str) -> dict:
    """The good record of ``dataset`` as another question (its own id and question): a release
    holds each question once, a repeat is dropped."""
    record = copy.deepcopy(GOOD[dataset])
    id_field, question_field = _ID_AND_QUESTION[dataset]
    if id_field:
        record[id_field] = f"{tag}{record[id_field]}"
    record[question_field] = f"{tag} {record[question_field]}"
    return record


def write_release(tmp_path: Path, dataset: str, bad: object, raw: str | None = None) -> Release:
    """Three records, the second one ``bad`` (an object, or raw text when ``bad`` is a str), the
    others good questions of their own."""
    first, last = (_render(dataset, _another(dataset, tag), None) for tag in ("X", "Z"))
    middle = bad if isinstance(bad, str) and raw is None else _render(dataset, bad, raw)
    records = [first, middle, last]
    if dataset in ("qampari", "quest"):
        text, span = _jsonl_text(records)
    elif dataset == "mintaka":
        text, span = _mintaka_text(records)
    else:
        text, span = _webqsp_text(records)
    data = text.encode("utf-8", "surrogatepass")
    if dataset == "qampari":
        path, member = tmp_path / "qampari.zip", "qampari_data/train_data.jsonl"
    elif dataset == "webqsp":
        path, member = tmp_path / "WebQSP.zip", "WebQSP/data/WebQSP.train.json"
    elif dataset == "mintaka":
        path, member = tmp_path / "mintaka_train.json", None
    else:
        path, member = tmp_path / "train_aug.jsonl", None
    if member:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(member, data)
    else:
        path.write_bytes(data)
    return Release(path, f"{path}/{member}" if member else str(path), span)


# ------------------------------------------------------------------------------------------------
# The corpus
# ------------------------------------------------------------------------------------------------
def _with(dataset: str, edit: Callable[[dict], None]) -> dict:
    record = copy.deepcopy(GOOD[dataset])
    edit(record)
    return record


def _set(path: str, value: object) -> Callable[[dict], None]:
    """Edit that sets (or with ``...`` deletes) the value at a dotted path (``a.0.b``)."""

    def edit(record: dict) -> None:
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        target = record
        for k in keys[:-1]:
            target = target[k]
        if value is ...:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value

    return edit


# (id, dataset, bad record: dict | raw text | (dict, raw), expected: ("error", fragment) | ("drop", reason))
CASES: list[tuple[str, str, object, tuple[str, str]]] = []


def case(cid: str, dataset: str, bad: object, expected: tuple[str, str]) -> None:
    CASES.append((cid, dataset, bad, expected))


# Syntax and encoding, in every format. The raw value replaces the question string.
QUESTION_KEY = {"qampari": "question_text", "mintaka": "question", "webqsp": "RawQuestion", "quest": "query"}
ANSWER_PATH = {
    "qampari": "answer_list.0.answer_text",
    "mintaka": "answer.answer.0.label.en",
    "webqsp": "Parses.0.Answers.0.EntityName",
    "quest": "docs.0",
}
for ds in GOOD:
    q, a = QUESTION_KEY[ds], ANSWER_PATH[ds]
    case(f"{ds}-deep-array", ds, (_with(ds, _set("extra", RAW)), DEEP), ("error", "nested too deeply"))
    case(f"{ds}-deep-object", ds, (_with(ds, _set("extra", RAW)), DEEP_OBJ), ("error", "nested too deeply"))
    case(f"{ds}-huge-int", ds, (_with(ds, _set("extra", RAW)), HUGE), ("error", "5000 digits"))
    case(f"{ds}-huge-int-question", ds, (_with(ds, _set(q, RAW)), HUGE), ("error", "5000 digits"))
    case(f"{ds}-surrogate-question", ds, (_with(ds, _set(q, RAW)), SURROGATE), ("error", "lone surrogate"))
    case(f"{ds}-surrogate-answer", ds, (_with(ds, _set(a, RAW)), SURROGATE), ("error", "lone surrogate"))
    case(f"{ds}-not-an-object", ds, '["a", "list"]', ("error", "expected a JSON object"))
    case(f"{ds}-string-record", ds, '"just a string"', ("error", "expected a JSON object"))
    case(f"{ds}-bad-syntax", ds, '{"a": 1,, "b": 2}', ("error", "invalid JSON"))
    case(f"{ds}-nul-byte", ds, '{"a": "x\x00y"}', ("error", "invalid JSON"))
    case(f"{ds}-question-number", ds, _with(ds, _set(q, 17)), ("error", f"'{q}' must be a string"))
    case(f"{ds}-question-empty", ds, _with(ds, _set(q, "  ")), ("error", f"'{q}' is empty"))

# QAMPARI
case(
    "qampari-no-question",
    "qampari",
    _with("qampari", _set("question_text", ...)),
    ("error", "missing required field 'question_text'"),
)
case("qampari-qid-list", "qampari", _with("qampari", _set("qid", ["x"])), ("error", "'qid' must be a string"))
case(
    "qampari-answers-object",
    "qampari",
    _with("qampari", _set("answer_list", {"a": 1})),
    ("error", "'answer_list' must be an array"),
)
case(
    "qampari-answer-string",
    "qampari",
    _with("qampari", _set("answer_list.0", "Heat")),
    ("error", "'answer_list[0]' must be an object"),
)
case(
    "qampari-answer-text-list",
    "qampari",
    _with("qampari", _set("answer_list.0.answer_text", ["x"])),
    ("error", "'answer_list[0].answer_text' must be a string"),
)
case(
    "qampari-aliases-string",
    "qampari",
    _with("qampari", _set("answer_list.0.aliases", "Quay")),
    ("error", "'answer_list[0].aliases' must be an array"),
)
case(
    "qampari-alias-object",
    "qampari",
    _with("qampari", _set("answer_list.0.aliases", [{"a": 1}])),
    ("error", "'answer_list[0].aliases[0]' must be a string"),
)
case(
    "qampari-alias-number",
    "qampari",
    _with("qampari", _set("answer_list.0.aliases", [1.5])),
    ("error", "'answer_list[0].aliases[0]' must be a string"),
)
case(
    "qampari-empty-answers",
    "qampari",
    _with("qampari", _set("answer_list", [])),
    ("drop", "empty_answer_list"),
)
case(
    "qampari-blank-answers",
    "qampari",
    _with("qampari", _set("answer_list", [{"answer_text": "?", "aliases": ["", None]}])),
    ("drop", "empty_answer"),
)

# Mintaka
case(
    "mintaka-no-answer",
    "mintaka",
    _with("mintaka", _set("answer", ...)),
    ("error", "missing required field 'answer'"),
)
case(
    "mintaka-answer-list",
    "mintaka",
    _with("mintaka", _set("answer", [])),
    ("error", "'answer' must be an object"),
)
case(
    "mintaka-no-type",
    "mintaka",
    _with("mintaka", _set("answer.answerType", ...)),
    ("error", "missing required field 'answer.answerType'"),
)
case(
    "mintaka-type-number",
    "mintaka",
    _with("mintaka", _set("answer.answerType", 3)),
    ("error", "'answer.answerType' must be a string"),
)
case(
    "mintaka-values-object",
    "mintaka",
    _with("mintaka", _set("answer.answer", {"a": 1})),
    ("error", "'answer.answer' must be an array or null"),
)
case(
    "mintaka-entity-number",
    "mintaka",
    _with("mintaka", _set("answer.answer.0", 5)),
    ("error", "'answer.answer[0]' must be an object"),
)
case(
    "mintaka-label-number",
    "mintaka",
    _with("mintaka", _set("answer.answer.0.label.en", 5)),
    ("error", "'answer.answer[0].label.en' must be a string"),
)
case(
    "mintaka-label-list",
    "mintaka",
    _with("mintaka", _set("answer.answer.0.label", ["x"])),
    ("error", "'answer.answer[0].label' must be"),
)
case(
    "mintaka-mention-list",
    "mintaka",
    _with("mintaka", _set("answer.mention", ["x"])),
    ("error", "'answer.mention' must be a string"),
)
case(
    "mintaka-category-number",
    "mintaka",
    _with("mintaka", _set("category", 1)),
    ("error", "'category' must be a string"),
)
case(
    "mintaka-complexity-list",
    "mintaka",
    _with("mintaka", _set("complexityType", ["count"])),
    ("error", "'complexityType' must be a string"),
)
case(
    "mintaka-id-float",
    "mintaka",
    _with("mintaka", _set("id", 1.5)),
    ("error", "'id' must be a string or an integer"),
)
case(
    "mintaka-string-value-object",
    "mintaka",
    _with("mintaka", lambda r: r["answer"].update(answerType="string", answer=[{"a": 1}])),
    ("error", "'answer.answer[0]' must be a string"),
)
case(
    "mintaka-count", "mintaka", _with("mintaka", _set("complexityType", "count")), ("drop", "count_question")
)
case(
    "mintaka-boolean",
    "mintaka",
    _with("mintaka", lambda r: r["answer"].update(answerType="boolean", answer=[True])),
    ("drop", "non_list_answer_type:boolean"),
)
case(
    "mintaka-unlinked-empty",
    "mintaka",
    _with("mintaka", lambda r: r["answer"].update(answer=None, mention=" ")),
    ("drop", "empty_answer_list"),
)

# WebQSP
case(
    "webqsp-no-id",
    "webqsp",
    _with("webqsp", _set("QuestionId", ...)),
    ("error", "missing required field 'QuestionId'"),
)
case(
    "webqsp-raw-question-number",
    "webqsp",
    _with("webqsp", _set("ProcessedQuestion", 5)),
    ("error", "'ProcessedQuestion' must be a string"),
)
case(
    "webqsp-parses-object",
    "webqsp",
    _with("webqsp", _set("Parses", {})),
    ("error", "'Parses' must be an array"),
)
case(
    "webqsp-parse-string",
    "webqsp",
    _with("webqsp", _set("Parses.0", "P0")),
    ("error", "'Parses[0]' must be an object"),
)
case(
    "webqsp-comment-string",
    "webqsp",
    _with("webqsp", _set("Parses.0.AnnotatorComment", "good")),
    ("error", "'Parses[0].AnnotatorComment' must be an object"),
)
case(
    "webqsp-answers-object",
    "webqsp",
    _with("webqsp", _set("Parses.0.Answers", {})),
    ("error", "'Parses[0].Answers' must be an array"),
)
case(
    "webqsp-answer-string",
    "webqsp",
    _with("webqsp", _set("Parses.0.Answers.0", "Bernard")),
    ("error", "'Parses[0].Answers[0]' must be an object"),
)
case(
    "webqsp-name-number",
    "webqsp",
    _with("webqsp", _set("Parses.0.Answers.0.EntityName", 7)),
    ("error", "'Parses[0].Answers[0].EntityName' must be a string"),
)
case(
    "webqsp-parse-id-list",
    "webqsp",
    _with("webqsp", _set("Parses.0.ParseId", ["x"])),
    ("error", "'Parses[0].ParseId' must be a string"),
)
case(
    "webqsp-no-valid-parse",
    "webqsp",
    _with("webqsp", _set("Parses.0.AnnotatorComment.ParseQuality", "Partial")),
    ("drop", "no_valid_parse"),
)
case(
    "webqsp-value-answers",
    "webqsp",
    _with("webqsp", lambda r: r["Parses"][0]["Answers"][0].update(AnswerType="Value", EntityName=None)),
    ("drop", "no_entity_answers"),
)

# QUEST
case("quest-no-docs", "quest", _with("quest", _set("docs", ...)), ("error", "missing required field 'docs'"))
case("quest-docs-string", "quest", _with("quest", _set("docs", "Heat")), ("error", "'docs' must be an array"))
case("quest-doc-number", "quest", _with("quest", _set("docs.1", 3)), ("error", "'docs[1]' must be a string"))
case(
    "quest-metadata-list",
    "quest",
    _with("quest", _set("metadata", [])),
    ("error", "'metadata' must be an object"),
)
case(
    "quest-template-number",
    "quest",
    _with("quest", _set("metadata.template", 1)),
    ("error", "'metadata.template' must be a string"),
)
case(
    "quest-domain-object",
    "quest",
    _with("quest", _set("metadata.domain", {})),
    ("error", "'metadata.domain' must be a string"),
)
case(
    "quest-original-query-list",
    "quest",
    _with("quest", _set("original_query", ["q"])),
    ("error", "'original_query' must be a string"),
)
case("quest-blank-docs", "quest", _with("quest", _set("docs", ["?", "()"])), ("drop", "empty_answer"))
case(
    "mintaka-date",
    "mintaka",
    _with("mintaka", lambda r: r["answer"].update(answerType="date", answer=["1956-10-20"])),
    ("drop", "non_list_answer_type:date"),
)
case("webqsp-no-parses", "webqsp", _with("webqsp", _set("Parses", [])), ("drop", "no_valid_parse"))
case("quest-empty-docs", "quest", _with("quest", _set("docs", [])), ("drop", "empty_answer_list"))

# Numbers JSON has no room for: Python's decoder reads NaN, Infinity and overflowing literals as
# floats, which str() would make the answers "nan" and "inf".
for label, raw, shown in [
    ("nan", "NaN", "NaN"),
    ("infinity", "Infinity", "Infinity"),
    ("minus-infinity", "-Infinity", "-Infinity"),
    ("overflow", "1e999", "Infinity"),
    ("minus-overflow", "-1E400", "-Infinity"),
]:
    case(
        f"mintaka-string-{label}",
        "mintaka",
        (_with("mintaka", lambda r: r["answer"].update(answerType="string", answer=["12", RAW])), raw),
        ("error", f"field 'answer.answer[1]' is {shown}, not a finite number"),
    )
case(
    "mintaka-id-nan",
    "mintaka",
    (_with("mintaka", _set("id", RAW)), "NaN"),
    ("error", "'id' must be a string or an integer, got a number"),
)
case(
    "webqsp-parse-id-infinity",
    "webqsp",
    (_with("webqsp", _set("Parses.0.ParseId", RAW)), "Infinity"),
    ("error", "'Parses[0].ParseId' must be a string or an integer, got a number"),
)
case(
    "qampari-alias-nan",
    "qampari",
    (_with("qampari", _set("answer_list.0.aliases", [RAW])), "NaN"),
    ("error", "'answer_list[0].aliases[0]' must be a string"),
)

# Text that shows nothing: zero-width and bidi characters, soft hyphens, variation selectors, tag
# characters, Hangul fillers. An answer made only of them is no answer (a counted drop); a question
# made only of them is empty.
INVISIBLE = [
    "\u200b\u200e",  # zero-width space, left-to-right mark
    "\u202a\u202c\u200f",  # embedding, pop, right-to-left mark
    "\u2066\u2069 \u2060",  # isolate, pop isolate, word joiner
    "\u00ad\u034f\ufeff",  # soft hyphen, grapheme joiner, zero-width no-break space
    "\ufe0f\u180e",  # variation selector, Mongolian vowel separator
    "\U000e0041\U000e0042",  # tag characters
    "\u3164\u2800",  # Hangul filler, braille blank
]
for i, blank in enumerate(INVISIBLE):
    case(
        f"qampari-invisible-answer-{i}",
        "qampari",
        _with("qampari", _set("answer_list", [{"answer_text": blank, "aliases": [blank[::-1]]}])),
        ("drop", "empty_answer"),
    )
for ds in GOOD:
    case(
        f"{ds}-invisible-question",
        ds,
        _with(ds, _set(QUESTION_KEY[ds], INVISIBLE[0] + " " + INVISIBLE[2])),
        ("error", "holds only invisible characters"),
    )
case(
    "mintaka-invisible-label",
    "mintaka",
    _with("mintaka", lambda r: r["answer"].update(answer=[{"name": "Q1", "label": {"en": INVISIBLE[1]}}])),
    ("drop", "empty_answer"),
)
case(
    "mintaka-invisible-mention",
    "mintaka",
    _with("mintaka", lambda r: r["answer"].update(answer=None, mention=INVISIBLE[3])),
    ("drop", "empty_answer"),
)
case(
    "mintaka-invisible-string-answer",
    "mintaka",
    _with("mintaka", lambda r: r["answer"].update(answerType="string", answer=[INVISIBLE[4]])),
    ("drop", "empty_answer"),
)
case(
    "webqsp-invisible-entity-name",
    "webqsp",
    _with("webqsp", _set("Parses.0.Answers.0.EntityName", INVISIBLE[5])),
    ("drop", "empty_answer"),
)
case(
    "quest-invisible-docs",
    "quest",
    _with("quest", _set("docs", [INVISIBLE[6], f"{INVISIBLE[0]} ({INVISIBLE[1]})"])),
    ("drop", "empty_answer"),
)


# Answers made only of lone surrogates show nothing either, but they are not text at all: an error
# naming the field, never an `empty_answer` drop (the record could not be written as UTF-8).
ONLY_SURROGATES = '"\\udc00\\ud800"'  # a low surrogate, then a high one: two unpaired halves
ONLY_SURROGATE_FIELD = {
    "qampari": ("answer_list.0.answer_text", "answer_list[0].answer_text"),
    "mintaka": ("answer.answer.0.label.en", "answer.answer[0].label.en"),
    "webqsp": ("Parses.0.Answers.0.EntityName", "Parses[0].Answers[0].EntityName"),
    "quest": ("docs.1", "docs[1]"),
}
for ds, (at, shown) in ONLY_SURROGATE_FIELD.items():
    case(
        f"{ds}-surrogates-only-answer",
        ds,
        (_with(ds, _set(at, RAW)), ONLY_SURROGATES),
        ("error", f"field '{shown}' holds a lone surrogate"),
    )
case(  # held out: an alias, not the primary name, and a single high surrogate
    "qampari-surrogate-only-alias",
    "qampari",
    (_with("qampari", _set("answer_list.0.aliases", ["Quay", RAW])), '"\\udbff"'),
    ("error", "field 'answer_list[0].aliases[1]' holds a lone surrogate"),
)
case(  # held out: Mintaka's mention, the answer of an unlinked question
    "mintaka-surrogate-only-mention",
    "mintaka",
    (_with("mintaka", lambda r: r["answer"].update(answer=None, mention=RAW)), '"\\ud800 "'),
    ("error", "field 'answer.mention' holds a lone surrogate"),
)

# A key given twice in one object: Python's decoder keeps the last value silently. An error naming
# the field (its path in the record), in every format.
QAMPARI_TWICE = (
    '{"qid": "1__wikidata_simple__train", "question_text": "Which films did Ilse Varga direct?", '
    '"question_text": "Which films did Ilse Varga write?", "answer_list": [{"answer_text": "Winter Quay"}]}'
)
case("qampari-question-twice", "qampari", QAMPARI_TWICE, ("error", "field 'question_text' is given twice"))
case(  # held out: a nested object, the key that is read
    "qampari-answer-text-twice",
    "qampari",
    '{"qid": "1__x__train", "question_text": "Which?", '
    '"answer_list": [{"answer_text": "A"}, {"answer_text": "B", "aliases": [], "answer_text": "C"}]}',
    ("error", "field 'answer_list[1].answer_text' is given twice"),
)
case(
    "quest-docs-twice",
    "quest",
    '{"query": "Novels", "docs": ["A"], "metadata": {}, "docs": ["B"]}',
    ("error", "field 'docs' is given twice"),
)
case(
    "mintaka-answer-twice",
    "mintaka",
    (
        _with("mintaka", _set("category", RAW)),
        '"books",\n    "answer": {"answerType": "string", "answer": ["x"]}',
    ),
    ("error", "field 'answer' is given twice"),
)
case(  # held out: deep inside a parse, a key nobody reads
    "webqsp-parse-comment-twice",
    "webqsp",
    (
        _with("webqsp", _set("Parses.0.AnnotatorComment.ParseQuality", RAW)),
        '"Complete", "ParseQuality": "Partial"',
    ),
    ("error", "field 'Parses[0].AnnotatorComment.ParseQuality' is given twice"),
)
case(
    "webqsp-raw-question-twice",
    "webqsp",
    (_with("webqsp", _set("RawQuestion", RAW)), '"who?",\n "RawQuestion": "what?"'),
    ("error", "field 'RawQuestion' is given twice"),
)


def test_an_answer_with_visible_text_among_invisible_characters_is_kept(tmp_path):
    """Only answers that show nothing are dropped: a name with a zero-width joiner in it stays."""
    record = _with("qampari", _set("answer_list", [{"answer_text": "\u200bWinter\u200dQuay", "aliases": []}]))
    release = write_release(tmp_path, "qampari", record)
    summary = normalize_file("qampari", "train", release.path, tmp_path / "out.jsonl")
    assert summary.kept == 3 and not summary.dropped


def _bad(dataset: str, bad: object) -> tuple[object, str | None]:
    return bad if isinstance(bad, tuple) else (bad, None)


@pytest.mark.parametrize(("cid", "dataset", "bad", "expected"), CASES, ids=[c[0] for c in CASES])
def test_malformed_record(tmp_path, cid, dataset, bad, expected):
    record, raw = _bad(dataset, bad)
    release = write_release(tmp_path, dataset, record, raw)
    out = tmp_path / "out" / "train.jsonl"
    kind, detail = expected
    if kind == "drop":
        summary = normalize_file(dataset, "train", release.path, out)
        assert summary.dropped == {detail: 1}, summary.as_dict()
        assert summary.kept == 2 and len(out.read_text().splitlines()) == 2
        return
    with pytest.raises(DataFormatError) as err:
        normalize_file(dataset, "train", release.path, out)
    message = str(err.value)
    first, last = release.span
    assert err.value.line is not None and first <= err.value.line <= last, (message, release.span)
    assert message.startswith(f"{release.name}, line {err.value.line}: "), message
    assert detail in message, message
    assert not out.exists()


def test_corpus_size():
    # the corpus covers every format with dozens of malformed inputs, errors and drops both
    per_dataset = {ds: sum(1 for c in CASES if c[1] == ds) for ds in GOOD}
    assert all(n >= 18 for n in per_dataset.values()), per_dataset
    assert sum(1 for c in CASES if c[3][0] == "drop") >= 10


@pytest.mark.parametrize("dataset", ["mintaka", "webqsp"])
@pytest.mark.parametrize(("raw", "fragment"), [(DEEP, "nested too deeply"), (HUGE, "5000 digits")])
def test_document_level_values_outside_the_records(tmp_path, dataset, raw, fragment):
    """A deeply nested or huge value outside the record array (WebQSP's header fields, or a Mintaka
    file that is not an array at all) names the file and the line where the value starts."""
    if dataset == "webqsp":
        text = '{\n "Version":\n ' + raw + ',\n "Questions": []\n}\n'
        path = tmp_path / "WebQSP.zip"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("WebQSP/data/WebQSP.train.json", text)
        name, line = f"{path}/WebQSP/data/WebQSP.train.json", 3
    else:
        text = "\n\n" + raw
        path = tmp_path / "mintaka_train.json"
        path.write_text(text)
        name, line = str(path), 3
    with pytest.raises(DataFormatError) as err:
        normalize_file(dataset, "train", path, tmp_path / "out.jsonl")
    assert str(err.value).startswith(f"{name}, line {line}: "), str(err.value)
    assert fragment in str(err.value) or "expected a JSON array" in str(err.value)


@pytest.mark.parametrize(
    "twice",
    [
        "Questions",  # the array of records given twice: the first one would be lost
        "Version",  # held out: a header field given twice
    ],
)
def test_a_top_level_field_given_twice_names_the_field_and_its_line(tmp_path, twice):
    record = json.dumps(WEBQSP)
    fields = {"Version": '"1.0"', "Questions": f"[{record}]"}
    lines = ["{", f' "Version": {fields["Version"]},', f' "Questions": {fields["Questions"]},']
    lines += [f' "{twice}": {fields[twice]},', ' "FreebaseVersion": "2015-08-09"', "}"]
    lines.insert(1, ' "Note": "x",')
    path = tmp_path / "WebQSP.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("WebQSP/data/WebQSP.train.json", "\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataFormatError) as err:
        normalize_file("webqsp", "train", path, out)
    name = f"{path}/WebQSP/data/WebQSP.train.json"
    assert str(err.value) == (
        f"{name}, line 5: top-level field '{twice}' is given twice (which value is meant is ambiguous)"
    )
    assert not out.exists()
