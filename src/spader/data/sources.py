"""One extractor per dataset: release record -> unified record (docs/data.md, "How answers are taken"
of each dataset).

Which extractor, which record layout and which default zip member a dataset has is its registry
entry's (:mod:`spader.datasets`); the paper's four extractors are here. Each extractor takes one
raw record and returns ``(source_id, question, groups, meta)``, where ``groups`` are raw alias
groups for :func:`~spader.data.records.build_entities`, or raises
:class:`~spader.data.records.Drop` for a record the spec drops (counted by reason). Malformed
records raise :class:`~spader.data.records.DataFormatError` naming file and line.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from spader.core.text import clean_text, question_key
from spader.data.readers import (
    Source,
    check_type,
    has_lone_surrogate,
    iter_json_records,
    iter_jsonl,
    lone_surrogate_path,
    looks_like_zip,
    open_release,
    optional,
    require,
)
from spader.data.records import (
    DataFormatError,
    Drop,
    build_entities,
    has_visible_text,
    record_schema,
    records_frame,
    strip_parenthetical,
    write_frame,
)
from spader.datasets import Dataset
from spader.datasets import dataset as registry_entry

log = logging.getLogger(__name__)

__all__ = ["NormalizeSummary", "drops_path_for", "normalize_file", "normalize_release"]

Extracted = tuple[str, str, list[list[Any]], dict[str, Any]]


def _question(value: Any, src: Source, line: int, key: str) -> str:
    text = clean_text(value)
    if not text:
        raise DataFormatError(src.name, line, f"field '{key}' is empty")
    if not has_visible_text(text):
        raise DataFormatError(
            src.name, line, f"field '{key}' is empty: it holds only invisible characters {ascii(text)[:80]}"
        )
    return text


def extract_qampari(obj: dict, src: Source, line: int, split: str) -> Extracted:
    """QAMPARI: one entity per ``answer_list`` item, ``[answer_text] + aliases``."""
    qid = require(obj, "qid", str, src, line)
    question = _question(require(obj, "question_text", str, src, line), src, line, "question_text")
    answers = require(obj, "answer_list", list, src, line)
    if not answers:
        raise Drop("empty_answer_list")
    groups = []
    for i, item in enumerate(answers):
        at = f"answer_list[{i}]"
        check_type(item, dict, src, line, at)
        text = optional(item, "answer_text", str, src, line, at=f"{at}.")
        aliases = optional(item, "aliases", list, src, line, at=f"{at}.") or []
        for j, alias in enumerate(aliases):
            check_type(alias, str, src, line, f"{at}.aliases[{j}]", nullable=True)
        groups.append([text, *aliases])
    parts = qid.split("__")
    return qid, question, groups, {"qtype": parts[1] if len(parts) >= 3 else None}


_MINTAKA_NON_LIST = {"boolean", "numerical", "number", "date"}


def _mintaka_label(entity: Any, src: Source, line: int, at: str) -> tuple[str | None, str | None]:
    """English label of an answer entity and the release version its shape reveals."""
    if isinstance(entity, str):  # a bare label: not seen in either version, but unambiguous
        return entity, None
    check_type(entity, dict, src, line, at)
    label = entity.get("label")
    if isinstance(label, dict):
        return optional(label, "en", str, src, line, at=f"{at}.label."), "1.1"
    if isinstance(label, str):
        return label, "1.0"
    check_type(label, (str, dict), src, line, f"{at}.label", nullable=True)
    return None, None


def extract_mintaka(obj: dict, src: Source, line: int, split: str) -> Extracted:
    """Mintaka v1.0 and v1.1: entity/string answers; count, yes/no, numbers and dates dropped."""
    qid = str(require(obj, "id", (str, int), src, line))
    question = _question(require(obj, "question", str, src, line), src, line, "question")
    answer = require(obj, "answer", dict, src, line)
    answer_type = require(answer, "answerType", str, src, line, at="answer.")
    complexity = optional(obj, "complexityType", str, src, line)
    meta = {
        "category": optional(obj, "category", str, src, line),
        "complexity_type": complexity,
        "answer_type": answer_type,
    }
    if complexity == "count":
        raise Drop("count_question")
    if answer_type not in ("entity", "string"):
        raise Drop(f"non_list_answer_type:{answer_type}")
    values = optional(answer, "answer", list, src, line, at="answer.")
    mention = clean_text(optional(answer, "mention", str, src, line, at="answer."))
    groups: list[list[Any]] = []
    version = None
    if not values:
        # Unlinked answer: the annotator's text is the only answer (never split on commas).
        if not mention:
            raise Drop("empty_answer_list")
        groups.append([mention])
    elif answer_type == "string":
        for i, v in enumerate(values):
            # the official evaluation compares str(value); numbers are taken as written
            groups.append([str(check_type(v, (str, int, float), src, line, f"answer.answer[{i}]"))])
    else:
        for i, entity in enumerate(values):
            label, shape = _mintaka_label(entity, src, line, f"answer.answer[{i}]")
            version = version or shape
            if label and label.strip():
                groups.append([label])
            elif len(values) == 1 and mention:
                groups.append([mention])
    meta["mintaka_version"] = version
    return qid, question, groups, meta


def _valid_parse(parse: dict, src: Source, line: int, at: str) -> bool:
    comment = require(parse, "AnnotatorComment", dict, src, line, at=f"{at}.")
    return comment.get("ParseQuality") == "Complete" and comment.get("QuestionQuality") == "Good"


def extract_webqsp(obj: dict, src: Source, line: int, split: str) -> Extracted:
    """WebQSP: union of Entity answer names over the Good + Complete parses."""
    qid = require(obj, "QuestionId", str, src, line)
    raw_q = optional(obj, "RawQuestion", str, src, line)
    processed = optional(obj, "ProcessedQuestion", str, src, line)
    raw_q = raw_q or processed
    if raw_q is None:
        raise DataFormatError(src.name, line, "missing required field 'RawQuestion' (or 'ProcessedQuestion')")
    question = _question(raw_q, src, line, "RawQuestion")
    parses = require(obj, "Parses", list, src, line)
    valid = []
    for i, p in enumerate(parses):
        check_type(p, dict, src, line, f"Parses[{i}]")
        if _valid_parse(p, src, line, f"Parses[{i}]"):
            valid.append((i, p))
    if not valid:
        raise Drop("no_valid_parse")
    parse_ids, parse_answers, names = [], [], []
    for i, p in valid:
        at = f"Parses[{i}]"
        answers = optional(p, "Answers", list, src, line, at=f"{at}.") or []
        entity_names = []
        for j, a in enumerate(answers):
            check_type(a, dict, src, line, f"{at}.Answers[{j}]")
            kind = optional(a, "AnswerType", str, src, line, at=f"{at}.Answers[{j}].")
            name = clean_text(optional(a, "EntityName", str, src, line, at=f"{at}.Answers[{j}]."))
            if kind == "Entity" and name:
                entity_names.append(name)
        parse_ids.append(str(require(p, "ParseId", (str, int), src, line, at=f"{at}.")))
        parse_answers.append(entity_names)
        names.extend(entity_names)
    if not names:
        raise Drop("no_entity_answers")
    meta = {"parse_ids": parse_ids, "parse_answers": parse_answers}
    return qid, question, [[n] for n in names], meta


def extract_quest(obj: dict, src: Source, line: int, split: str) -> Extracted:
    """QUEST: one entity per ``docs`` title, ``[title without trailing "(...)", title]``."""
    question = _question(require(obj, "query", str, src, line), src, line, "query")
    docs = require(obj, "docs", list, src, line)
    if not docs:
        raise Drop("empty_answer_list")
    for i, d in enumerate(docs):
        check_type(d, str, src, line, f"docs[{i}]")
    metadata = optional(obj, "metadata", dict, src, line) or {}
    meta = {
        "template": optional(metadata, "template", str, src, line, at="metadata."),
        "domain": optional(metadata, "domain", str, src, line, at="metadata."),
        "original_query": optional(obj, "original_query", str, src, line),
        "docs_raw": list(docs),
    }
    groups = [[strip_parenthetical(t), t] for t in docs]
    return f"{split}:{line - 1:05d}", question, groups, meta


def _iter_raw(entry: Dataset, stream: IO[bytes], src: Source) -> Iterator[tuple[int, Any]]:
    """The raw records of a release file, laid out as the dataset's entry says."""
    if entry.layout == "jsonl":
        return iter_jsonl(stream, src)
    return iter_json_records(stream, src, key=entry.records_key)


@dataclass
class NormalizeSummary:
    """What one normalization read, kept and dropped (by reason)."""

    dataset: str
    split: str
    source_file: str
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "split": self.split,
            "source_file": self.source_file,
            "read": self.read,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
        }

    def metrics(self) -> dict[str, float]:
        """Flat numeric view for MLflow (``:`` in reasons becomes ``/``)."""
        out = {"records_read": float(self.read), "records_kept": float(self.kept)}
        out.update({f"dropped/{k.replace(':', '/')}": float(v) for k, v in self.dropped.items()})
        return out


def normalize_release(
    dataset: str, split: str, path: str | os.PathLike, member: str | None = None
) -> tuple[list[dict], NormalizeSummary]:
    """Unified records of one split of one release file.

    Args:
        dataset: a dataset of the registry (``qampari``, ``mintaka``, ``webqsp``, ``quest``, ...).
        split: split name, written into the records (``train``, ``test``, ...).
        path: the release file or zip archive; for an archive the member defaults to the official
            path of ``split`` when the dataset's entry has one (QAMPARI's and WebQSP's ``zip_member``).
        member: zip member to read.
    Returns:
        ``(records, summary)``: records in file order, and the counts of read/kept/dropped records.
    """
    entry = registry_entry(dataset)  # unknown: a ValueError naming the known datasets
    if member is None and entry.zip_member and looks_like_zip(path):
        member = entry.member(split)
    extract = entry.extractor()
    records: list[tuple[int, dict]] = []
    with open_release(path, member) as (stream, src):
        summary = NormalizeSummary(dataset, split, src.member_name)
        for line, obj in tqdm(
            _iter_raw(entry, stream, src), desc=f"{dataset}/{split}", unit=" rec", mininterval=5
        ):
            summary.read += 1
            if not isinstance(obj, dict):
                raise DataFormatError(src.name, line, "expected a JSON object for each record")
            try:
                record = _record(dataset, split, extract, obj, src, line)
            except Drop as d:
                summary.dropped[d.reason] += 1
                log.debug("%s: dropped (%s)", src.where(line), d.reason)
                continue
            _check_unicode(_texts(record["meta"], []), obj, src, line)
            records.append((line, record))
    if not summary.read:
        raise DataFormatError(
            src.name,
            None,
            "holds no records (an empty or blank file, or an empty list of records): a damaged, "
            "truncated or wrong release file",
        )
    kept = _without_repeats(records, summary, src)
    summary.kept = len(kept)
    log.info(
        "%s %s: read %d, kept %d, dropped %s",
        dataset,
        split,
        summary.read,
        summary.kept,
        dict(summary.dropped) or 0,
    )
    return kept, summary


def _without_repeats(records: list[tuple[int, dict]], summary: NormalizeSummary, src: Source) -> list[dict]:
    """The records without repeats (docs/data.md, "Normalized record"), in file order: a record whose id an earlier
    line holds is dropped (``duplicate_id``); of records whose questions are one question
    (:func:`spader.core.text.question_key`), the one with the smallest id is kept, the others
    dropped (``duplicate_question``), as the training mix keeps them. Each drop is counted in the
    summary and logged with its line."""
    first: dict[str, int] = {}
    unique: list[tuple[int, dict]] = []
    for line, record in records:
        if record["id"] in first:
            summary.dropped["duplicate_id"] += 1
            log.info(
                "%s: dropped (duplicate_id: line %d has id %s)",
                src.where(line),
                first[record["id"]],
                record["id"],
            )
            continue
        first[record["id"]] = line
        unique.append((line, record))
    owner: dict[str, tuple[int, dict]] = {}
    for line, record in sorted(unique, key=lambda item: item[1]["id"]):
        owner.setdefault(question_key(record["question"]), (line, record))
    kept = []
    for line, record in unique:
        held = owner[question_key(record["question"])]
        if held[1] is record:
            kept.append(record)
            continue
        summary.dropped["duplicate_question"] += 1
        log.info(
            "%s: dropped (duplicate_question: the question of line %d, id %s)",
            src.where(line),
            held[0],
            held[1]["id"],
        )
    return kept


def _record(
    dataset: str,
    split: str,
    extract: Callable[[dict, Source, int, str], Extracted],
    obj: dict,
    src: Source,
    line: int,
) -> dict:
    """The unified record of raw record ``obj``; raises Drop (with its reason) for one to leave out."""
    source_id, question, groups, meta = extract(obj, src, line, split)
    # before build_entities: an answer of lone surrogates alone shows nothing and would
    # be dropped as empty, hiding a record that cannot be written as UTF-8
    texts = [source_id, question, *(t for g in groups for t in g if isinstance(t, str))]
    _check_unicode(texts, obj, src, line)
    answers, answers_norm = build_entities(groups)
    if not answers:
        raise Drop("empty_answer")
    return {
        "id": f"{dataset}:{source_id}",
        "dataset": dataset,
        "split": split,
        "question": question,
        "answers": answers,
        "answers_norm": answers_norm,
        "meta": {"source_file": src.member_name, "source_id": source_id, **meta},
    }


def _texts(value: Any, out: list[str]) -> list[str]:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _texts(v, out)
    elif isinstance(value, list):
        for v in value:
            _texts(v, out)
    return out


def _check_unicode(texts: list[str], raw: dict, src: Source, line: int) -> None:
    """Refuse a record whose ``texts`` (what it keeps of the raw record) hold a lone surrogate
    (half of a ``\\u`` escape pair), naming the raw field the text came from; such text could
    never be written as UTF-8."""
    if has_lone_surrogate(texts):
        bad = {t for t in texts if has_lone_surrogate([t])}
        where = lone_surrogate_path(raw, among=bad) or lone_surrogate_path(raw) or "a text field"
        raise DataFormatError(
            src.name,
            line,
            f"field '{where}' holds a lone surrogate (an unpaired \\ud800-\\udfff escape), not valid Unicode",
        )


def drops_path_for(output: str | os.PathLike) -> Path:
    """``x/train.jsonl`` -> ``x/train.drops.json`` (the drop counts live beside the records)."""
    output = Path(output)
    return output.with_name(output.name.rsplit(".", 1)[0] + ".drops.json")


def normalize_file(
    dataset: str,
    split: str,
    input_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    member: str | None = None,
    drops_path: str | os.PathLike | None = None,
) -> NormalizeSummary:
    """Normalize one split and write the records (``.jsonl`` or ``.parquet``) and drop counts.

    Args:
        dataset, split, input_path, member: as in :func:`normalize_release`.
        output: records file; its suffix picks the format. The schema is checked on write.
        drops_path: JSON file of the summary; default: beside ``output`` (:func:`drops_path_for`).
    Returns:
        The summary (also written to ``drops_path``).
    """
    records, summary = normalize_release(dataset, split, input_path, member)
    schema = record_schema(dataset)
    write_frame(records_frame(records, schema), output, schema)
    drops = Path(drops_path) if drops_path else drops_path_for(output)
    drops.parent.mkdir(parents=True, exist_ok=True)
    drops.write_text(json.dumps(summary.as_dict(), indent=2) + "\n", encoding="utf-8")
    return summary
