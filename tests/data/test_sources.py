"""Each dataset's extractor on small files written here in the real release formats (docs/data.md);
the expected unified records are checked record by record, and the drops by reason."""

from __future__ import annotations

import json
import zipfile

import pytest

from spader.data import normalize_release
from spader.data.layout import dump_jsonl, dump_mintaka_json


def write_zip(path, members: dict[str, str]):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


# ------------------------------------------------------------------------------------------------
# QAMPARI: qampari.zip -> qampari_data/<split>_data.jsonl, ASCII-escaped JSON Lines
# ------------------------------------------------------------------------------------------------
def _qa(qid, answer_text, aliases, **extra):
    item = {"answer_text": answer_text, "aid": f"{qid}__0", "aliases": aliases}
    item.update(extra)
    return item


QAMPARI = [
    {
        "qid": "1041__wikidata_simple__train",
        "question_text": "Which films were directed by  Ilse Varga?",
        "answer_list": [
            _qa(
                "1041",
                "The Salt Orchard",
                ["The Salt Orchard", "Salt Orchard", "A sós gyümölcsös"],
                answer_url="https://en.wikipedia.org/wiki/The_Salt_Orchard",
                proof=[
                    {
                        "proof_text": "The Salt Orchard is a film by Ilse Varga.",
                        "found_in_url": "x",
                        "pid": "p",
                    }
                ],
            ),
            _qa("1041", "Winter Quay", []),  # no aliases: the answer text alone
            _qa("1041", "the salt orchard.", ["Salt orchard"]),  # case/punctuation duplicate: merged
            _qa("1041", "Port\u00a0Hollin", ["Port Hollin"]),  # NBSP: same string after clean_text
            _qa("1041", "", []),  # empty answer text: group dropped
        ],
        "entities": "[{'entity_text': 'Ilse Varga', 'aliases': []}]",  # repr string: not used
    },
    {"qid": "7__wikitables_composition__train", "question_text": "Which rivers?", "answer_list": []},
    {
        "qid": "8__wikidata_intersection__train",
        "question_text": "Which ones?",
        "answer_list": [_qa("8", "?", ["!"]), _qa("8", "", None)],
    },
    {
        "qid": "9__wikidata_comp__train",
        "question_text": "Which villages lie in the Ørnes valley?",
        "answer_list": [
            _qa("9", "İznikköy", []),
            _qa("9", "Łowicz Górny", ["Lowicz Gorny"]),
            {"answer_text": "Viola d'amore", "aid": "9__2"},
        ],  # no aliases key, no url
    },
]


def test_qampari(tmp_path):
    path = write_zip(
        tmp_path / "qampari.zip",
        {"qampari_data/train_data.jsonl": dump_jsonl(QAMPARI), "qampari_data/test_data.jsonl": ""},
    )
    records, summary = normalize_release("qampari", "train", path)
    meta = {"source_file": "qampari_data/train_data.jsonl"}
    assert records == [
        {
            "id": "qampari:1041__wikidata_simple__train",
            "dataset": "qampari",
            "split": "train",
            "question": "Which films were directed by Ilse Varga?",
            "answers": [
                ["The Salt Orchard", "Salt Orchard", "A sós gyümölcsös", "the salt orchard.", "Salt orchard"],
                ["Winter Quay"],
                ["Port Hollin"],
            ],
            "answers_norm": [["salt orchard", "sos gyumolcsos"], ["winter quay"], ["port hollin"]],
            "meta": {**meta, "source_id": "1041__wikidata_simple__train", "qtype": "wikidata_simple"},
        },
        {
            "id": "qampari:9__wikidata_comp__train",
            "dataset": "qampari",
            "split": "train",
            "question": "Which villages lie in the Ørnes valley?",
            "answers": [["İznikköy"], ["Łowicz Górny", "Lowicz Gorny"], ["Viola d'amore"]],
            "answers_norm": [["iznikkoy"], ["łowicz gorny", "lowicz gorny"], ["viola damore"]],
            "meta": {**meta, "source_id": "9__wikidata_comp__train", "qtype": "wikidata_comp"},
        },
    ]
    assert summary.as_dict() == {
        "dataset": "qampari",
        "split": "train",
        "source_file": "qampari_data/train_data.jsonl",
        "read": 4,
        "kept": 2,
        "dropped": {"empty_answer": 1, "empty_answer_list": 1},
    }


# ------------------------------------------------------------------------------------------------
# Mintaka: mintaka_<split>.json, one JSON array in Mintaka's indentation; v1.1 and v1.0 answers
# ------------------------------------------------------------------------------------------------
def _labels(en):
    return {
        "en": en,
        "ar": None,
        "de": en,
        "es": None,
        "fr": None,
        "hi": None,
        "it": None,
        "ja": None,
        "pt": None,
    }


def _mk(mid, question, answer_type, answer, mention, complexity="generic", **extra):
    ans = {"answerType": answer_type, "answer": answer, "mention": mention, **extra}
    return {
        "id": mid,
        "question": question,
        "translations": {"de": "…", "ja": "…"},
        "questionEntity": [
            {"name": "Q1", "entityType": "entity", "label": "X", "mention": "X", "span": [0, 1]}
        ],
        "answer": ans,
        "category": "movies",
        "complexityType": complexity,
    }


MINTAKA_V11 = [
    _mk(
        "a0000001",
        "Who directed The Salt Orchard?",
        "entity",
        [{"name": "Q11", "label": _labels("Ilse Varga")}],
        "Ilse Varga",
    ),
    _mk(
        "a0000002",
        "Which films did Ilse Varga direct?",
        "entity",
        [
            {"name": "Q12", "label": _labels("The Salt Orchard")},
            {"name": "Q13", "label": _labels(None)},
            {"name": "Q14", "label": _labels("Winter Quay")},
        ],
        "The Salt Orchard, Untitled, Winter Quay",
        complexity="intersection",
    ),  # null label in a list: skipped
    _mk(
        "a0000003",
        "What is the second film of Ilse Varga?",
        "entity",
        [{"name": "Q15", "label": _labels(None)}],
        "Winter Quay",
        complexity="ordinal",
    ),  # single: mention
    _mk("a0000004", "Which band recorded Rust Songs?", "entity", None, "Halcyon & Rust"),  # unlinked
    _mk(
        "a0000005",
        "Is the Salt Orchard longer than Winter Quay?",
        "boolean",
        [True],
        "Yes",
        complexity="yesno",
    ),
    _mk(
        "a0000006",
        "How many films did Ilse Varga direct?",
        "numerical",
        [2],
        "2",
        complexity="count",
        supportingEnt=[{"name": "Q12", "label": _labels("The Salt Orchard")}],
    ),
    _mk("a0000007", "When did Winter Quay premiere?", "date", ["1961-10-20"], "20-Oct-61"),
    _mk(
        "a0000008",
        "How long is the longest film by Ilse Varga?",
        "numerical",
        [132],
        "132",
        complexity="superlative",
        supportingNum=[132],
    ),
    _mk("a0000009", "What does the sign say?", "string", ["CROSS STITCH"], "cross stitch"),
    _mk("a0000010", "Which films flopped?", "entity", [], "  "),  # nothing at all
]

MINTAKA_V10 = [
    _mk(
        "b0000001",
        "Which Mario Kart games lack Link?",
        "entity",
        [{"name": "Q1", "label": "Super Mario Kart"}, {"name": "Q2", "label": "Mario Kart 64"}],
        "Super Mario Kart, Mario Kart 64",
        complexity="difference",
    ),
    _mk(
        "b0000002",
        "How many games are in the series?",
        "entity",
        [{"name": "Q1", "label": "Super Mario Kart"}],
        "Super Mario Kart",
        complexity="count",
        answerNum=1,
    ),
]


def _mintaka_meta(mid, complexity, atype, version):
    return {
        "source_file": "mintaka_train.json",
        "source_id": mid,
        "category": "movies",
        "complexity_type": complexity,
        "answer_type": atype,
        "mintaka_version": version,
    }


def test_mintaka_v11(tmp_path):
    path = tmp_path / "mintaka_train.json"
    path.write_text(dump_mintaka_json(MINTAKA_V11), encoding="utf-8")
    records, summary = normalize_release("mintaka", "train", path)
    expected = [
        (
            "a0000001",
            "Who directed The Salt Orchard?",
            [["Ilse Varga"]],
            [["ilse varga"]],
            "generic",
            "entity",
            "1.1",
        ),
        (
            "a0000002",
            "Which films did Ilse Varga direct?",
            [["The Salt Orchard"], ["Winter Quay"]],
            [["salt orchard"], ["winter quay"]],
            "intersection",
            "entity",
            "1.1",
        ),
        (
            "a0000003",
            "What is the second film of Ilse Varga?",
            [["Winter Quay"]],
            [["winter quay"]],
            "ordinal",
            "entity",
            "1.1",
        ),
        (
            "a0000004",
            "Which band recorded Rust Songs?",
            [["Halcyon & Rust"]],
            [["halcyon rust"]],
            "generic",
            "entity",
            None,
        ),
        (
            "a0000009",
            "What does the sign say?",
            [["CROSS STITCH"]],
            [["cross stitch"]],
            "generic",
            "string",
            None,
        ),
    ]
    assert len(records) == len(expected)
    for rec, (mid, q, answers, norm, complexity, atype, version) in zip(records, expected, strict=True):
        assert rec == {
            "id": f"mintaka:{mid}",
            "dataset": "mintaka",
            "split": "train",
            "question": q,
            "answers": answers,
            "answers_norm": norm,
            "meta": _mintaka_meta(mid, complexity, atype, version),
        }
    assert summary.dropped == {
        "non_list_answer_type:boolean": 1,
        "count_question": 1,
        "non_list_answer_type:date": 1,
        "non_list_answer_type:numerical": 1,
        "empty_answer_list": 1,
    }
    assert (summary.read, summary.kept) == (10, 5)


def test_mintaka_v10(tmp_path):
    path = tmp_path / "mintaka_train.json"
    path.write_text(dump_mintaka_json(MINTAKA_V10), encoding="utf-8")
    records, summary = normalize_release("mintaka", "train", path)
    assert records == [
        {
            "id": "mintaka:b0000001",
            "dataset": "mintaka",
            "split": "train",
            "question": "Which Mario Kart games lack Link?",
            "answers": [["Super Mario Kart"], ["Mario Kart 64"]],
            "answers_norm": [["super mario kart"], ["mario kart 64"]],
            "meta": _mintaka_meta("b0000001", "difference", "entity", "1.0"),
        }
    ]
    assert summary.dropped == {"count_question": 1}  # v1.0 counts are entity lists: still dropped


# ------------------------------------------------------------------------------------------------
# WebQSP: WebQSP.zip -> WebQSP/data/WebQSP.<split>.json, {"Version", "FreeBaseVersion", "Questions"}
# ------------------------------------------------------------------------------------------------
def _parse(pid, parse_quality, question_quality, answers):
    return {
        "ParseId": pid,
        "AnnotatorId": 1,
        "AnnotatorComment": {
            "ParseQuality": parse_quality,
            "QuestionQuality": question_quality,
            "Confidence": "Normal",
            "FreeFormComment": "First-round parse verification",
        },
        "Sparql": "PREFIX ns: <http://rdf.freebase.com/ns/>\nSELECT DISTINCT ?x\n",
        "TopicEntityMid": "m.0x",
        "InferentialChain": ["film.actor.film"],
        "Constraints": [],
        "Time": None,
        "Order": None,
        "Answers": answers,
    }


def _ent(name, mid="m.01"):
    return {"AnswerType": "Entity", "AnswerArgument": mid, "EntityName": name}


WEBQSP = {
    "Version": "1.0",
    "FreeBaseVersion": "2015-08-09",
    "Questions": [
        {
            "QuestionId": "WebQTrn-196",
            "RawQuestion": "Who did Ben Stiller play in Megamind?",
            "ProcessedQuestion": "who did ben stiller play in megamind",
            "Parses": [
                _parse("WebQTrn-196.P0", "Complete", "Good", [_ent("Bernard")]),
                _parse("WebQTrn-196.P1", "Complete", "Good", [_ent("bernard"), _ent("Metro Man", "m.02")]),
                _parse("WebQTrn-196.P2", "Partial", "Good", [_ent("Ignored Partial")]),
                _parse("WebQTrn-196.P3", "Complete", "Poor", [_ent("Ignored Poor")]),
            ],
        },
        {
            "QuestionId": "WebQTrn-197",
            "RawQuestion": "what is it?",
            "ProcessedQuestion": "what is it",
            "Parses": [_parse("WebQTrn-197.P0", "Incomplete", "Good", [_ent("X")])],
        },
        {
            "QuestionId": "WebQTrn-198",
            "RawQuestion": "when was it built?",
            "ProcessedQuestion": "when was it built",
            "Parses": [
                _parse(
                    "WebQTrn-198.P0",
                    "Complete",
                    "Good",
                    [{"AnswerType": "Value", "AnswerArgument": "1985-01-01", "EntityName": None}],
                )
            ],
        },
        {
            "QuestionId": "WebQTrn-199",
            "ProcessedQuestion": "what rivers flow into lake morrow",
            "Parses": [
                _parse(
                    "WebQTrn-199.P0",
                    "Complete",
                    "Good",
                    [_ent(None, "m.09"), _ent("Saint-Malo Express"), _ent("  ")],
                )
            ],
        },
    ],
}


def test_webqsp(tmp_path):
    text = "\ufeff" + json.dumps(WEBQSP, indent=2, ensure_ascii=False)  # BOM-tolerant, pretty-printed
    path = write_zip(
        tmp_path / "WebQSP.zip",
        {
            "WebQSP/data/WebQSP.train.json": text,
            "WebQSP/data/WebQSP.test.json": "{}",
            "WebQSP/eval/eval.py": "",
        },
    )
    records, summary = normalize_release("webqsp", "train", path)
    meta = {"source_file": "WebQSP/data/WebQSP.train.json"}
    assert records == [
        {
            "id": "webqsp:WebQTrn-196",
            "dataset": "webqsp",
            "split": "train",
            "question": "Who did Ben Stiller play in Megamind?",
            "answers": [["Bernard", "bernard"], ["Metro Man"]],  # union over the two valid parses
            "answers_norm": [["bernard"], ["metro man"]],
            "meta": {
                **meta,
                "source_id": "WebQTrn-196",
                "parse_ids": ["WebQTrn-196.P0", "WebQTrn-196.P1"],
                "parse_answers": [["Bernard"], ["bernard", "Metro Man"]],
            },
        },
        {
            "id": "webqsp:WebQTrn-199",
            "dataset": "webqsp",
            "split": "train",
            "question": "what rivers flow into lake morrow",  # no RawQuestion: ProcessedQuestion
            "answers": [["Saint-Malo Express"]],
            "answers_norm": [["saintmalo express"]],
            "meta": {
                **meta,
                "source_id": "WebQTrn-199",
                "parse_ids": ["WebQTrn-199.P0"],
                "parse_answers": [["Saint-Malo Express"]],
            },
        },
    ]
    assert summary.dropped == {"no_valid_parse": 1, "no_entity_answers": 1}


# ------------------------------------------------------------------------------------------------
# QUEST: <split>.jsonl, one query per line, no ids
# ------------------------------------------------------------------------------------------------
FILMS = (
    ["Oliver Twist (1912 British film)"]
    + [f"Film Number {i} (film)" for i in range(1, 19)]
    + ["What Price Courage?"]
)


def _quest(query, docs, original=None, domain="films"):
    ratings = {d: ["Definitely relevant"] for d in docs} if domain in ("films", "books") else None
    return {
        "query": query,
        "docs": docs,
        "original_query": original,
        "scores": None,
        "metadata": {
            "template": "_ or _",
            "domain": domain,
            "fluency": ["Fluent"],
            "relevance_ratings": ratings,
            "evidence_ratings": None,
            "attributions": None,
        },
    }


QUEST = [
    _quest(
        "what are Novels by Robert Parker that are not set in Massachusetts",
        ["Saltglass (novel)", "High Profile"],
        original="<mark>Novels by Robert Parker</mark> that are not ...",
    ),
    _quest("Films of 1912 or 1986", FILMS),
    _quest("Plants of Ørnes", [], domain="plants"),
    _quest("Films titled Heat", ["Heat (1986 film)", "Heat (1995 film)"]),
]


def _quest_meta(line, docs, original=None):
    return {
        "source_file": "train_aug.jsonl",
        "source_id": f"train:{line:05d}",
        "template": "_ or _",
        "domain": "films",
        "original_query": original,
        "docs_raw": docs,
    }


def test_quest(tmp_path):
    path = tmp_path / "train_aug.jsonl"
    path.write_text(dump_jsonl(QUEST), encoding="ascii")
    records, summary = normalize_release("quest", "train", path)
    assert len(QUEST[0]["docs"]) == 2 and len(QUEST[1]["docs"]) == 20
    base = {"dataset": "quest", "split": "train"}
    assert records == [
        {
            **base,
            "id": "quest:train:00000",
            "question": "what are Novels by Robert Parker that are not set in Massachusetts",
            "answers": [["Saltglass", "Saltglass (novel)"], ["High Profile"]],
            "answers_norm": [["saltglass", "saltglass novel"], ["high profile"]],
            "meta": _quest_meta(0, QUEST[0]["docs"], "<mark>Novels by Robert Parker</mark> that are not ..."),
        },
        {
            **base,
            "id": "quest:train:00001",
            "question": "Films of 1912 or 1986",
            "answers": [["Oliver Twist", "Oliver Twist (1912 British film)"]]
            + [[f"Film Number {i}", f"Film Number {i} (film)"] for i in range(1, 19)]
            + [["What Price Courage?"]],  # no parenthetical: the title is the only alias
            "answers_norm": [["oliver twist", "oliver twist 1912 british film"]]
            + [[f"film number {i}", f"film number {i} film"] for i in range(1, 19)]
            + [["what price courage"]],
            "meta": _quest_meta(1, FILMS),
        },
        {
            **base,
            "id": "quest:train:00003",  # the line number, also across a dropped record
            "question": "Films titled Heat",
            "answers": [["Heat", "Heat (1986 film)", "Heat (1995 film)"]],  # two films, one text answer
            "answers_norm": [["heat", "heat 1986 film", "heat 1995 film"]],
            "meta": _quest_meta(3, ["Heat (1986 film)", "Heat (1995 film)"]),
        },
    ]
    assert len(records[1]["answers"]) == 20
    assert summary.dropped == {"empty_answer_list": 1}
    assert (summary.read, summary.kept) == (4, 3)


def test_quest_ids_count_physical_lines(tmp_path):
    # A blank line still occupies a line number: ids stay stable if a file has stray blank lines.
    path = tmp_path / "test.jsonl"
    path.write_text(dump_jsonl(QUEST[:1]) + "\n" + dump_jsonl(QUEST[1:2]), encoding="ascii")
    records, _ = normalize_release("quest", "test", path)
    assert [r["id"] for r in records] == ["quest:test:00000", "quest:test:00002"]


@pytest.mark.parametrize("dataset", ["qampari", "webqsp"])
def test_zip_default_member_follows_split(tmp_path, dataset):
    if dataset == "qampari":
        members = {"qampari_data/test_data.jsonl": dump_jsonl(QAMPARI[:1])}
    else:
        members = {"WebQSP/data/WebQSP.test.json": json.dumps(WEBQSP)}
    path = write_zip(tmp_path / "x.zip", members)
    records, summary = normalize_release(dataset, "test", path)
    assert records and all(r["split"] == "test" for r in records)
    assert summary.source_file == next(iter(members))
