"""The unified record, ``build_entities`` and typed record tables (docs/data.md, "Unified records,
normalisation and the mix").

A normalized record is one question with its gold entities::

    {"id": "qampari:1041__wikidata_simple__train", "dataset": "qampari", "split": "train",
     "question": "Which films were directed by Ilse Varga?",
     "answers": [["The Salt Orchard", "Salt Orchard"], ["Winter Quay"]],
     "answers_norm": [["salt orchard"], ["winter quay"]],
     "meta": {"source_file": "qampari_data/train_data.jsonl", ...}}

Tables of records are polars frames with an explicit schema (:func:`record_schema`); every write
goes through :func:`check_frame`, so a file on disk always has the documented columns and types.
``meta`` is a struct whose fields depend on the dataset (:data:`META_FIELDS`, from its registry
entry); frames that mix datasets (the training mix) use the union of those fields
(:data:`MIX_SCHEMA`).
"""

from __future__ import annotations

import io
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import polars as pl

from spader.config import DATASETS
from spader.core.text import clean_text, normalize, strip_invisible
from spader.datasets import registry
from spader.infra import integrity
from spader.infra.atomic import atomic_path

__all__ = [
    "DATASETS",
    "DROP_REASONS",
    "META_DTYPES",
    "META_FIELDS",
    "MIX_SCHEMA",
    "DataFormatError",
    "Drop",
    "build_entities",
    "check_frame",
    "empty_frame",
    "has_visible_text",
    "read_records",
    "record_schema",
    "records_frame",
    "strip_parenthetical",
    "to_mix_meta",
    "write_frame",
]


# docs/data.md, "build_entities"; ``non_list_answer_type`` is followed by ":<answerType>".
DROP_REASONS = (
    "empty_answer_list",
    "non_list_answer_type",
    "count_question",
    "no_valid_parse",
    "no_entity_answers",
    "empty_answer",
    "duplicate_id",
    "duplicate_question",
)


class DataFormatError(ValueError):
    """A release or record file is malformed; the message names the file and, when known, the line."""

    def __init__(self, source: str, line: int | None, message: str):
        self.source = str(source)
        self.line = line
        self.detail = message
        where = f"{self.source}, line {line}" if line is not None else self.source
        super().__init__(f"{where}: {message}")


class Drop(Exception):
    """Raised by a dataset extractor for a record that docs/data.md says to drop (counted, not an error)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_LIST_STR = pl.List(pl.String)
_LIST_LIST_STR = pl.List(pl.List(pl.String))
#: The polars type of each type a registry entry gives a ``meta`` field (spader.datasets.META_TYPES).
META_DTYPES: dict[str, pl.DataType] = {
    "string": pl.String,
    "integer": pl.Int64,
    "float": pl.Float64,
    "boolean": pl.Boolean,
    "list[string]": _LIST_STR,
    "list[list[string]]": _LIST_LIST_STR,
}

#: Each dataset's ``meta`` fields: where the record was read (``source_file``, ``source_id``),
#: then the fields of its registry entry (spader.datasets), in order.
META_FIELDS: dict[str, dict[str, pl.DataType]] = {
    name: {
        "source_file": pl.String,
        "source_id": pl.String,
        **{key: META_DTYPES[kind] for key, kind in entry.meta.items()},
    }
    for name, entry in registry().items()
}


def _union_meta() -> dict[str, pl.DataType]:
    union: dict[str, pl.DataType] = {}
    for fields in META_FIELDS.values():
        for name, dtype in fields.items():
            union.setdefault(name, dtype)
    return union


def _schema(meta: dict[str, pl.DataType]) -> pl.Schema:
    return pl.Schema(
        {
            "id": pl.String,
            "dataset": pl.String,
            "split": pl.String,
            "question": pl.String,
            "answers": _LIST_LIST_STR,
            "answers_norm": _LIST_LIST_STR,
            "meta": pl.Struct(meta),
        }
    )


def record_schema(dataset: str) -> pl.Schema:
    """Polars schema of one dataset's normalized records."""
    if dataset not in META_FIELDS:
        raise ValueError(f"unknown dataset '{dataset}' (known: {', '.join(DATASETS)})")
    return _schema(META_FIELDS[dataset])


MIX_SCHEMA = _schema(_union_meta())

_REQUIRED = ("id", "dataset", "split", "question", "answers", "answers_norm")


_UNSEEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character that shows: one that is not whitespace, a control or
    format character, nor a code point that renders as nothing (zero-width space, bidi marks...).

    >>> has_visible_text("\u200b\u200e \u2066\u2069"), has_visible_text("\u200bHeat")
    (False, True)
    """
    return any(unicodedata.category(ch) not in _UNSEEN_CATEGORIES for ch in strip_invisible(text))


def build_entities(groups: Iterable[Sequence[object]]) -> tuple[list[list[str]], list[list[str]]]:
    """Gold entities from raw alias groups (docs/data.md, "build_entities").

    Each group is a list of strings, primary name first. Strings are ``clean_text``'ed; empty
    strings, exact duplicates and strings whose normalized form is empty or shows nothing (only
    zero-width or bidi characters, :func:`has_visible_text`) are dropped, and a group left empty is
    skipped. A group whose normalized primary equals the normalized primary of an earlier
    entity is merged into it (its unseen aliases appended); otherwise it starts a new entity.

    Args:
        groups: raw alias groups, e.g. ``[["The Salt Orchard", "Salt Orchard"], ["Winter Quay"]]``.
    Returns:
        ``(answers, answers_norm)``: per entity its raw aliases (primary first) and its normalized
        aliases (deduplicated, order kept). Both lists are empty when no entity is left.

    >>> build_entities([["The Heat", "Heat"], ["heat!", "Heat (1986 film)"], ["?"]])
    ([['The Heat', 'Heat', 'heat!', 'Heat (1986 film)']], [['heat', 'heat 1986 film']])
    """
    # Membership is tested on dicts (insertion-ordered sets), never on the lists: a group of
    # 100,000 aliases is read in linear time (list membership made it quadratic, minutes).
    answers: list[dict[str, None]] = []
    by_primary: dict[str, int] = {}
    norm: dict[str, str] = {}  # each distinct alias is normalized once
    for group in groups:
        kept: dict[str, None] = {}
        for raw in group:
            text = clean_text(raw)
            if not text or text in kept:
                continue
            if text not in norm:
                norm[text] = normalize(text)
            if norm[text] and has_visible_text(norm[text]):
                kept[text] = None
        if not kept:
            continue
        key = norm[next(iter(kept))]
        if key in by_primary:
            answers[by_primary[key]].update(kept)
        else:
            by_primary[key] = len(answers)
            answers.append(kept)
    answers_norm = [list(dict.fromkeys(norm[a] for a in entity)) for entity in answers]
    return [list(entity) for entity in answers], answers_norm


_TRAILING_PAREN = re.compile(r"\s*\([^()]*\)\s*$")


def strip_parenthetical(title: str) -> str:
    """``"Heat (1995 film)"`` -> ``"Heat"``: remove one trailing ``" (...)"`` (docs/data.md, QUEST)."""
    return _TRAILING_PAREN.sub("", title)


def check_frame(df: pl.DataFrame, schema: pl.Schema, *, name: str = "records") -> pl.DataFrame:
    """Check a record table before it is written: exact schema, no missing required value, at
    least one entity per record, one normalized alias list per entity.

    Raises:
        ValueError naming the table, the column and the first offending id.
    """
    if df.schema != schema:
        diff = {k: (str(df.schema.get(k)), str(v)) for k, v in schema.items() if df.schema.get(k) != v}
        extra = sorted(set(df.schema) - set(schema))
        raise ValueError(
            f"{name}: schema mismatch (column: (found, expected)) {diff}; unexpected columns {extra}"
        )
    for col in _REQUIRED:
        if col in df.columns and df[col].null_count():
            bad = df.filter(pl.col(col).is_null())["id"].head(1).to_list()
            raise ValueError(f"{name}: column '{col}' has missing values (first id: {bad})")
    if len(df) and "answers" in df.columns:
        bad = df.filter(
            (pl.col("answers").list.len() == 0)
            | (pl.col("answers").list.len() != pl.col("answers_norm").list.len())
            | (pl.col("question").str.len_chars() == 0)
        )
        if len(bad):
            raise ValueError(
                f"{name}: record {bad['id'][0]!r} has an empty question, no entity, or answers and "
                "answers_norm of different lengths"
            )
    return df


def records_frame(records: Sequence[dict], schema: pl.Schema) -> pl.DataFrame:
    """Records (dicts in the unified layout) as a checked polars frame.

    The dicts go through JSON Lines into polars' reader: for nested lists this is several times
    faster than building the frame from Python objects (bench/data.py).
    """
    if not records:
        return empty_frame(schema)
    # polars' reader ignores unknown keys: check them here so that no field is lost silently.
    columns, meta_fields = set(schema), set(schema["meta"].to_schema())
    for r in records:
        if set(r) != columns or not set(r["meta"]) <= meta_fields:
            extra = sorted((set(r) ^ columns) | (set(r.get("meta") or {}) - meta_fields))
            raise ValueError(f"record {r.get('id')!r} does not fit the schema (fields {extra})")
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    try:
        df = pl.read_ndjson(io.BytesIO(text), schema=schema)
    except Exception as e:  # polars raises several error types for values of the wrong type
        raise ValueError(f"records do not fit the schema {schema} ({e})") from e
    return check_frame(df, schema)


def empty_frame(schema: pl.Schema) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def write_frame(df: pl.DataFrame, path: str | os.PathLike, schema: pl.Schema | None = None) -> Path:
    """Write a checked frame to ``.jsonl`` (one JSON object per line) or ``.parquet``, atomically.

    Args:
        df: the table; checked against ``schema`` when given.
        path: output path; the suffix picks the format.
    Returns:
        The written path; its integrity record (rows, sha256, producing rule) is written beside
        it (:mod:`spader.infra.integrity`).
    """
    path = Path(path)
    if schema is not None:
        check_frame(df, schema, name=str(path))
    if path.suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"{path}: output must end in .jsonl or .parquet")
    with atomic_path(path) as tmp:  # nothing half-written, and no .tmp left when the write fails
        if path.suffix == ".jsonl":
            df.write_ndjson(tmp)
        else:
            df.write_parquet(tmp)
        integrity.forget(path)  # never a stale record next to new content
    integrity.write_record(path, rows=len(df))
    return path


def read_records(path: str | os.PathLike, schema: pl.Schema) -> pl.DataFrame:
    """Read a record table written by :func:`write_frame` (``.jsonl`` or ``.parquet``).

    Raises:
        IntegrityError naming the file and the rule that rebuilds it when the file no longer
        matches its integrity record (lines deleted, truncated...); DataFormatError naming the file
        (and line, for JSON Lines) when it does not parse or does not match ``schema``.
    """
    path = Path(path)
    integrity.verify(path)
    if path.suffix == ".parquet":
        try:
            df = pl.read_parquet(path)
            df = df.select(list(schema)).cast(dict(schema))
        except Exception as e:  # polars raises several error types here
            raise DataFormatError(
                str(path), None, f"not a record table with the expected schema ({e})"
            ) from e
        return check_frame(df, schema, name=str(path))
    if path.stat().st_size == 0:
        return empty_frame(schema)
    try:
        df = pl.read_ndjson(path, schema=schema)
    except Exception as e:
        raise _locate_jsonl_error(path, e) from e
    return check_frame(df, schema, name=str(path))


def _locate_jsonl_error(path: Path, err: Exception) -> DataFormatError:
    """Polars does not say which line failed: find it with the standard library."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                return DataFormatError(str(path), lineno, f"not a JSON object ({e})")
            if not isinstance(obj, dict):
                return DataFormatError(str(path), lineno, f"expected a JSON object, got {type(obj).__name__}")
    return DataFormatError(str(path), None, f"records do not match the expected schema ({err})")


def to_mix_meta(df: pl.DataFrame, dataset: str) -> pl.DataFrame:
    """One dataset's records with ``meta`` widened to the union struct of :data:`MIX_SCHEMA`."""
    own = META_FIELDS[dataset]
    fields = [
        (pl.col("meta").struct.field(name) if name in own else pl.lit(None, dtype=dtype)).alias(name)
        for name, dtype in MIX_SCHEMA["meta"].to_schema().items()
    ]
    return df.with_columns(pl.struct(fields).alias("meta")).select(list(MIX_SCHEMA))
