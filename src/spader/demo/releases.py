"""Demo release records in each dataset's real format (docs/data.md), built from the demo world, and
the writers of each dataset's release files (``write_<dataset>``, named by its registry entry's
``demo_writer``: :func:`spader.demo.generate` calls them in the registry's order).

Besides ordinary questions, each split carries records that exercise the drop rules and the mix:
an empty answer list, answers that normalize to nothing, Mintaka yes/no, count, date and number
questions, a Mintaka label missing in English, an unlinked Mintaka answer, WebQSP questions with
several parses of mixed quality, no valid parse or only Value answers, a QUEST query whose two
films share a title, a training question duplicated up to case and punctuation, and a training
question that is also a test question (removed from the mix).
"""

from __future__ import annotations

import json
import random
import zipfile
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

from spader.data.layout import dump_jsonl, dump_mintaka_json
from spader.demo.archive import write_zip
from spader.demo.world import KINDS, Entity, Topic, World

__all__ = [
    "held_out_topics",
    "mintaka_splits",
    "qampari_splits",
    "quest_splits",
    "topics_of_records",
    "webqsp_splits",
    "write_mintaka",
    "write_qampari",
    "write_quest",
    "write_webqsp",
]

_LANGS = ("ar", "de", "ja", "hi", "pt", "es", "it", "fr")
_WIKI = "https://en.wikipedia.org/wiki/"


def _url(name: str) -> str:
    return _WIKI + name.replace("\u00a0", " ").replace(" ", "_")


# ------------------------------------------------------------------------------------------------
# QAMPARI (qampari_data/<split>_data.jsonl)
# ------------------------------------------------------------------------------------------------
def _qampari(
    topic: Topic, n: int, split: str, question: str | None = None, qtype: str = "wikidata_simple"
) -> dict:
    qid = f"{n}__{qtype}__{split}"
    answers = []
    for i, o in enumerate(topic.objects):
        aid = f"{qid}__{i}"
        answers.append(
            {
                "answer_text": o.name,
                "aid": aid,
                "aliases": [o.name, *o.aliases],
                "answer_url": _url(o.plain),
                "proof": [
                    {
                        "proof_text": f"{o.plain} ({KINDS[topic.kind][1]}), {topic.subject.plain}.",
                        "found_in_url": _url(o.plain),
                        "pid": f"{aid}__0",
                    }
                ],
            }
        )
    s = topic.subject
    return {
        "qid": qid,
        "question_text": question or topic.question(),
        "answer_list": answers,
        "entities": [
            {"entity_text": s.plain, "entity_url": _url(s.plain), "aliases": [], "entity_id": s.qid}
        ],
    }


def qampari_splits(world: World) -> dict[str, list[dict]]:
    t = world.topics
    train = [
        _qampari(x, 100 + i, "train", qtype="wikidata_simple" if i % 3 else "wikitables_simple")
        for i, x in enumerate(t[:20])
    ]
    test = [_qampari(x, 500 + i, "test") for i, x in enumerate(world.eval_topics)]
    dev = [_qampari(x, 700 + i, "dev") for i, x in enumerate(t[28:32])]
    held = world.eval_topics[0]
    train += [
        # the same question as train[1] up to case and punctuation: removed by the mix's dedupe
        _qampari(t[1], 140, "train", question=t[1].question().lower().rstrip("?")),
        # a test question also in train: removed from the pool by the eval-overlap rule
        _qampari(held, 141, "train", question=held.question()),
        {
            "qid": "142__wikidata_comp__train",
            "question_text": "Which films were directed by nobody?",
            "answer_list": [],
            "entities": [],
        },  # drop: empty_answer_list
        {
            "qid": "143__wikidata_intersection__train",
            "question_text": "Which titles are punctuation only?",
            "answer_list": [
                {"answer_text": "?!", "aid": "143__0", "aliases": ["..."], "proof": []},
                {"answer_text": "", "aid": "143__1", "aliases": [], "proof": []},
            ],
            "entities": [],
        },  # drop: empty_answer
    ]
    return {"train": train, "dev": dev, "test": test}


# ------------------------------------------------------------------------------------------------
# Mintaka (mintaka_<split>.json, v1.1)
# ------------------------------------------------------------------------------------------------
_MINTAKA_Q = {
    "film": ("Who directed {o}?", "movies"),
    "novel": ("Who wrote the novel {o}?", "books"),
    "river": ("Which lake does the {o} flow into?", "geography"),
    "village": ("In which district is the village of {o}?", "geography"),
    "album": ("Which band released the album {o}?", "music"),
    "player": ("Which club did {o} play for?", "sports"),
    "plant": ("To which genus does {o} belong?", "geography"),
}


def _span_entity(question: str, e: Entity) -> dict:
    start = max(question.find(e.plain), 0)
    return {
        "name": e.qid,
        "entityType": "entity",
        "label": e.plain,
        "mention": e.plain,
        "span": [start, start + len(e.plain)],
    }


def _labels(name: str | None) -> dict:
    return {
        lang: (name if lang in ("en", "de", "es", "fr", "it", "pt") else None) for lang in ("en", *_LANGS)
    }


def _mintaka(
    mid: str, question: str, about: list[Entity], answer: dict, category: str, complexity: str
) -> dict:
    return {
        "id": mid,
        "question": question,
        # The demo world is English-only: the eight translation slots repeat the question.
        "translations": {lang: question for lang in _LANGS},
        "questionEntity": [_span_entity(question, e) for e in about],
        "answer": answer,
        "category": category,
        "complexityType": complexity,
    }


def _entity_answer(entities: list[Entity], mention: str | None = None, english: bool = True) -> dict:
    return {
        "answerType": "entity",
        "answer": [{"name": e.qid, "label": _labels(e.plain if english else None)} for e in entities],
        "mention": mention if mention is not None else ", ".join(e.plain for e in entities),
    }


def _one_answer_pairs(topics: list[Topic], rng: random.Random) -> list[tuple[Topic, Entity]]:
    """(topic, object) pairs of ``topics`` for one-answer questions, shuffled by ``rng``.

    Objects whose name is shared by two topics (the two films called "Heat") would give one
    question two different answers: they are left out of Mintaka's one-answer questions.
    """
    seen: dict[str, int] = {}
    for t in topics:
        for o in t.objects:
            seen[o.plain] = seen.get(o.plain, 0) + 1
    pairs = [(t, o) for t in topics for o in t.objects if seen[o.plain] == 1]
    rng.shuffle(pairs)
    return pairs


def _mintaka_simple(ids: Iterator[str], t: Topic, o: Entity, answer: dict | None = None) -> dict:
    """The one-answer question about object ``o`` whose answer is ``t``'s subject (or ``answer``)."""
    template, category = _MINTAKA_Q[t.kind]
    q = template.format(o=o.plain)
    if answer is None:
        answer = _entity_answer([t.subject])
    return _mintaka(next(ids), q, [o], answer, category, "generic")


def _mintaka_listing(ids: Iterator[str], t: Topic) -> dict:
    """The "difference" question whose answer is all of ``t``'s objects but the first."""
    q = f"Which {KINDS[t.kind][1]}s are linked to {t.subject.plain}, besides the first one?"
    return _mintaka(
        next(ids), q, [t.subject], _entity_answer(t.objects[1:]), _MINTAKA_Q[t.kind][1], "difference"
    )


def _mintaka_edge_cases(ids: Iterator[str], t: Topic) -> list[dict]:
    """A yes/no, a count, a date and a superlative number question about ``t``."""
    a, b = t.objects[0], t.objects[1]
    s, noun = t.subject, KINDS[t.kind][1]
    oldest = min(o.year for o in t.objects)
    yesno = {
        "answerType": "boolean",
        "answer": [a.year < b.year],
        "mention": "Yes" if a.year < b.year else "No",
    }
    count = {
        "answerType": "numerical",
        "answer": [len(t.objects)],
        "mention": str(len(t.objects)),
        "supportingEnt": [{"name": o.qid, "label": _labels(o.plain)} for o in t.objects],
    }
    date = {"answerType": "date", "answer": [f"{a.year}-05-01"], "mention": f"1-May-{a.year % 100:02d}"}
    number = {
        "answerType": "numerical",
        "answer": [oldest],
        "mention": str(oldest),
        "supportingNum": [oldest],
    }
    return [
        _mintaka(next(ids), f"Is {a.plain} older than {b.plain}?", [a, b], yesno, "history", "yesno"),
        _mintaka(next(ids), f"How many {noun}s are linked to {s.plain}?", [s], count, "history", "count"),
        _mintaka(next(ids), f"When did {a.plain} first appear?", [a], date, "history", "generic"),
        _mintaka(
            next(ids),
            f"In what year did the oldest {noun} linked to {s.plain} appear?",
            [s],
            number,
            "history",
            "superlative",
        ),
    ]


_HELD_MINTAKA = 60  # one-answer test questions (the evaluation side has over 300 objects)


def mintaka_splits(world: World, rng: random.Random) -> dict[str, list[dict]]:
    pairs = _one_answer_pairs(world.topics, rng)
    held = _one_answer_pairs(world.eval_topics, rng)
    ids = iter(f"{rng.getrandbits(32):08x}" for _ in range(1000))
    train = [_mintaka_simple(ids, t, o) for t, o in pairs[:10]]
    train.append(_mintaka_listing(ids, world.topics[0]))
    t, o = pairs[10]  # label missing in English: the mention is the answer
    train.append(
        _mintaka_simple(ids, t, o, _entity_answer([t.subject], mention=t.subject.plain, english=False))
    )
    t, o = pairs[11]  # unlinked answer: only the annotator's text
    train.append(
        _mintaka_simple(ids, t, o, {"answerType": "entity", "answer": None, "mention": t.subject.plain})
    )
    train += _mintaka_edge_cases(ids, world.topics[2])
    dev = [_mintaka_simple(ids, t, o) for t, o in pairs[12:16]]
    test = (
        [_mintaka_simple(ids, t, o) for t, o in held[:_HELD_MINTAKA]]
        + [_mintaka_listing(ids, world.eval_topics[3])]
        + _mintaka_edge_cases(ids, world.eval_topics[4])[:2]
    )
    return {"train": train, "dev": dev, "test": test}


# ------------------------------------------------------------------------------------------------
# WebQSP (WebQSP/data/WebQSP.<split>.json)
# ------------------------------------------------------------------------------------------------
def _parse(
    qid: str, k: int, t: Topic, answers: list[dict], quality: str = "Complete", qquality: str = "Good"
) -> dict:
    chain = [f"demo.{t.kind}.{KINDS[t.kind][0].replace(' ', '_')}", f"demo.{t.kind}.{KINDS[t.kind][1]}"]
    return {
        "ParseId": f"{qid}.P{k}",
        "AnnotatorId": k % 2,
        "AnnotatorComment": {
            "ParseQuality": quality,
            "QuestionQuality": qquality,
            "Confidence": "Normal",
            "FreeFormComment": "First-round parse verification",
        },
        "Sparql": (
            "PREFIX ns: <http://rdf.freebase.com/ns/>\nSELECT DISTINCT ?x\nWHERE {\n"
            f"ns:{t.subject.mid} ns:{chain[0]} ?x .\n}}\n"
        ),
        "PotentialTopicEntityMention": t.subject.plain.lower(),
        "TopicEntityName": t.subject.plain,
        "TopicEntityMid": t.subject.mid,
        "InferentialChain": chain,
        "Constraints": [],
        "Time": None,
        "Order": None,
        "Answers": answers,
    }


def _entity_answers(entities: list[Entity]) -> list[dict]:
    return [{"AnswerType": "Entity", "AnswerArgument": e.mid, "EntityName": e.plain} for e in entities]


def _webqsp(qid: str, t: Topic, parses: list[dict] | None = None, question: str | None = None) -> dict:
    text = question or KINDS[t.kind][3].format(s=t.subject.plain)
    processed, raw = text.lower(), text + "?"
    return {
        "QuestionId": qid,
        "RawQuestion": raw,
        "ProcessedQuestion": processed,
        "Parses": parses if parses is not None else [_parse(qid, 0, t, _entity_answers(t.objects))],
    }


def webqsp_splits(world: World) -> dict[str, dict]:
    t = world.topics

    def split(prefix: str, topics: list[Topic], start: int) -> list[dict]:
        out = []
        for i, topic in enumerate(topics):
            qid = f"{prefix}-{start + i}"
            if i % 3 == 1:  # two valid parses (answers united) and a partial parse (ignored)
                parses = [
                    _parse(qid, 0, topic, _entity_answers(topic.objects[:2])),
                    _parse(qid, 1, topic, _entity_answers(topic.objects[1:])),
                    _parse(qid, 2, topic, _entity_answers(topics[0].objects), quality="Partial"),
                ]
                out.append(_webqsp(qid, topic, parses))
            else:
                out.append(_webqsp(qid, topic))
        return out

    train = split("WebQTrn", t[8:18], 10)
    a = t[3]
    train.append(
        _webqsp(
            "WebQTrn-90",
            a,
            [_parse("WebQTrn-90", 0, a, _entity_answers(a.objects), qquality="Poor")],
            question=f"which {KINDS[a.kind][1]}s does {a.subject.plain} have",
        )
    )  # drop: no_valid_parse
    train.append(
        _webqsp(
            "WebQTrn-91",
            a,
            [
                _parse(
                    "WebQTrn-91",
                    0,
                    a,
                    [{"AnswerType": "Value", "AnswerArgument": f"{a.objects[0].year}", "EntityName": None}],
                )
            ],
            question=f"when did {a.objects[0].plain} appear",
        )
    )  # drop: no_entity_answers
    test = split("WebQTest", world.eval_topics, 10)
    b = world.eval_topics[5]
    dropped = f"WebQTest-{max(90, 10 + len(test))}"  # past the split's ids whatever its size
    test.append(
        _webqsp(
            dropped,
            b,
            [_parse(dropped, 0, b, _entity_answers(b.objects), quality="Incomplete")],
            question=f"what did {b.subject.plain} make",
        )
    )  # drop: no_valid_parse
    return {
        s: {"Version": "1.0", "FreeBaseVersion": "2015-08-09", "Questions": q}
        for s, q in (("train", train), ("test", test))
    }


# ------------------------------------------------------------------------------------------------
# QUEST (<split>.jsonl; docs are Wikipedia-style titles with disambiguators)
# ------------------------------------------------------------------------------------------------
_DOMAIN = {"film": "films", "novel": "books", "plant": "plants"}


def _title(t: Topic, o: Entity) -> str:
    return o.plain + KINDS[t.kind][5].format(year=o.year)


def _quest(topics: list[Topic], annotated: bool) -> dict:
    phrase = " or ".join(KINDS[x.kind][4].format(s=x.subject.plain) for x in topics)
    docs = [_title(x, o) for x in topics for o in x.objects]
    domain = _DOMAIN[topics[0].kind]
    marked = " or ".join(f"<mark>{KINDS[x.kind][4].format(s=x.subject.plain)}</mark>" for x in topics)
    rated = annotated and domain != "plants"
    return {
        "query": phrase.lower()[0] + phrase[1:] if len(topics) > 1 else phrase,
        "docs": docs,
        "original_query": marked if annotated else None,
        "scores": None,
        "metadata": {
            "template": " or ".join("_" for _ in topics),
            "domain": domain,
            "fluency": ["Fluent: It is clear, and grammatically correct."] if rated else None,
            "meaning": ["Same Meaning"] if rated else None,
            "naturalness": ["Yes - A user could plausibly issue this query."] if rated else None,
            "relevance_ratings": {d: ["Definitely relevant"] for d in docs} if rated else None,
            "evidence_ratings": {d: ["Complete"] for d in docs} if rated else None,
            "attributions": {d: [None] for d in docs} if rated else None,
        },
    }


def _held_quest(world: World) -> list[dict]:
    """The test queries: one per evaluation topic of a QUEST domain, then the union of each two
    such topics of one kind next to each other ("films directed by A or films directed by B")."""
    eligible = [t for t in world.eval_topics if t.kind in _DOMAIN]
    queries = [_quest([t], annotated=i % 2 == 0) for i, t in enumerate(eligible)]
    for kind in _DOMAIN:
        same = [t for t in eligible if t.kind == kind]
        queries += [_quest([a, b], annotated=False) for a, b in pairwise(same)]
    return queries


def quest_splits(world: World) -> dict[str, list[dict]]:
    eligible = [t for t in world.topics if t.kind in _DOMAIN]
    queries = [_quest([t], annotated=i % 2 == 0) for i, t in enumerate(eligible)]
    queries.insert(1, _quest([world.topics[4], world.topics[5]], annotated=True))  # two films titled "Heat"
    queries.append(_quest([eligible[6], eligible[12]], annotated=False))
    queries.append(_quest([eligible[7], eligible[13]], annotated=True))
    empty = {
        "query": "Films directed by nobody",
        "docs": [],
        "original_query": None,
        "scores": None,
        "metadata": {
            "template": "_",
            "domain": "films",
            "relevance_ratings": None,
            "evidence_ratings": None,
            "attributions": None,
        },
    }  # drop: empty_answer_list
    return {"train_aug": [*queries[:11], empty], "val": queries[11:14], "test": _held_quest(world)}


# ------------------------------------------------------------------------------------------------
# The writers: (output directory, world, the demo's random generator) -> the files written,
# relative to the directory. Only Mintaka's draws from the generator.
# ------------------------------------------------------------------------------------------------
def write_qampari(out: Path, world: World, rng: random.Random) -> list[str]:
    """``qampari.zip`` with ``qampari_data/<split>_data.jsonl``."""
    splits = qampari_splits(world)
    write_zip(
        out / "qampari.zip",
        {f"qampari_data/{s}_data.jsonl": dump_jsonl(r).encode() for s, r in splits.items()},
    )
    return ["qampari.zip"]


def write_mintaka(out: Path, world: World, rng: random.Random) -> list[str]:
    """``mintaka_<split>.json`` (v1.1, Mintaka's indentation)."""
    names = []
    for split, records in mintaka_splits(world, rng).items():
        (out / f"mintaka_{split}.json").write_text(dump_mintaka_json(records), encoding="utf-8")
        names.append(f"mintaka_{split}.json")
    return names


def write_webqsp(out: Path, world: World, rng: random.Random) -> list[str]:
    """``WebQSP.zip`` with ``WebQSP/data/WebQSP.<split>.json``."""
    docs = webqsp_splits(world)
    write_zip(
        out / "WebQSP.zip",
        {
            f"WebQSP/data/WebQSP.{s}.json": json.dumps(doc, indent=2, ensure_ascii=False).encode()
            for s, doc in docs.items()
        },
    )
    return ["WebQSP.zip"]


def write_quest(out: Path, world: World, rng: random.Random) -> list[str]:
    """``quest/<split>.jsonl`` (ASCII escapes, as QUEST writes them)."""
    (out / "quest").mkdir(parents=True, exist_ok=True)
    names = []
    for split, records in quest_splits(world).items():
        (out / "quest" / f"{split}.jsonl").write_text(dump_jsonl(records), encoding="ascii")
        names.append(f"quest/{split}.jsonl")
    return names


# ------------------------------------------------------------------------------------------------
# The topics of the test questions (topics.tsv: the evaluation's unit over datasets)
# ------------------------------------------------------------------------------------------------
def _topic_of_name(topics: list[Topic]) -> dict[str, str]:
    """Every name (subject, object, QUEST title) of ``topics`` -> its topic's subject."""
    out: dict[str, str] = {}
    for t in topics:
        for name in (t.subject.plain, *(o.plain for o in t.objects), *(_title(t, o) for o in t.objects)):
            if out.setdefault(name, t.subject.plain) != t.subject.plain:
                raise ValueError(f"demo world: the name {name!r} belongs to two evaluation topics")
    return out


def held_out_topics(world: World, out: Path) -> list[tuple[str, str]]:
    """:func:`topics_of_records` of the four releases' test splits as written under ``out``."""
    with zipfile.ZipFile(out / "qampari.zip") as z:
        qampari = [json.loads(line) for line in z.read("qampari_data/test_data.jsonl").decode().splitlines()]
    with zipfile.ZipFile(out / "WebQSP.zip") as z:
        webqsp = json.loads(z.read("WebQSP/data/WebQSP.test.json"))
    mintaka = json.loads((out / "mintaka_test.json").read_text(encoding="utf-8"))
    lines = (out / "quest" / "test.jsonl").read_text(encoding="ascii").splitlines()
    return topics_of_records(world, qampari, mintaka, webqsp, [json.loads(line) for line in lines])


def topics_of_records(
    world: World, qampari: list[dict], mintaka: list[dict], webqsp: dict, quest: list[dict]
) -> list[tuple[str, str]]:
    """``(question id, topic)`` of every test record of the four releases, as the normalized
    records name the question (``<dataset>:<source id>``; QUEST's source id is its line). A topic
    is an evaluation topic's subject; a record names the topics of the entities it is about:
    QAMPARI's question entities, WebQSP's topic entities, Mintaka's question entities (an object
    belongs to its topic), QUEST's answer titles (a union of two topics has both)."""
    of = _topic_of_name(world.eval_topics)
    rows: list[tuple[str, list[str]]] = []
    rows += [(f"qampari:{r['qid']}", [e["entity_text"] for e in r["entities"]]) for r in qampari]
    rows += [(f"mintaka:{r['id']}", [e["label"] for e in r["questionEntity"]]) for r in mintaka]
    rows += [
        (f"webqsp:{q['QuestionId']}", [p["TopicEntityName"] for p in q["Parses"]])
        for q in webqsp["Questions"]
    ]
    rows += [(f"quest:test:{i:05d}", list(r["docs"])) for i, r in enumerate(quest)]
    return [(qid, topic) for qid, names in rows for topic in dict.fromkeys(of[n] for n in names)]
