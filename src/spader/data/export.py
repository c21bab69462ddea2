"""Exports of normalized records: the verl training parquet and the per-dataset evaluation files.

verl parquet (docs/data.md, "Normalized record"; read by
``verl.utils.dataset.rl_dataset.RLHFDataset``), one row per question::

    data_source   the dataset: "qampari" | "mintaka" | "webqsp" | "quest" | ...   (reward dispatch key)
    prompt        spader.core.prompt.build_messages(question, template): the template's instructions
                  as a system message and its question line as the user turn
                  (agent.prompt_role: system), or the whole prompt as one user message (user)
    ability       "multi-answer-qa"
    reward_model  {"style": "rule", "ground_truth": {"target": [primary names],
                                                     "entities": [[aliases...], ...]}}
    extra_info    {"index", "split", "id", "question", "need_tools_kwargs": true,
                   "tools_kwargs": {"search": {"create_kwargs": {"entities", "data_source", "id"}}}}

``RLHFDataset`` lifts ``extra_info.index`` and ``extra_info.tools_kwargs`` to the sample, and the
agent loop hands ``tools_kwargs["search"]["create_kwargs"]`` to the search tool named ``search``,
which needs the gold entities to find step-wise discoveries in the passages it returns.

Evaluation jsonl, one line per question: ``{"id", "question_text", "ground_truth": [[aliases...]],
"data_source"}``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random

import polars as pl

from spader.core.prompt import PromptTemplate, build_messages
from spader.data.records import MIX_SCHEMA, read_records, record_schema, write_frame

log = logging.getLogger(__name__)

__all__ = [
    "ABILITY",
    "EVAL_SCHEMA",
    "SEARCH_TOOL_NAME",
    "VERL_SCHEMA",
    "eval_rows",
    "export_eval_set",
    "export_rl_dataset",
    "verl_rows",
]

ABILITY = "multi-answer-qa"
# Name of the search tool in the verl tool config; the key of ``tools_kwargs``.
SEARCH_TOOL_NAME = "search"

_ENTITIES = pl.List(pl.List(pl.String))

VERL_SCHEMA = pl.Schema(
    {
        "data_source": pl.String,
        "prompt": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
        "ability": pl.String,
        "reward_model": pl.Struct(
            {
                "style": pl.String,
                "ground_truth": pl.Struct({"target": pl.List(pl.String), "entities": _ENTITIES}),
            }
        ),
        "extra_info": pl.Struct(
            {
                "index": pl.Int64,
                "split": pl.String,
                "id": pl.String,
                "question": pl.String,
                "need_tools_kwargs": pl.Boolean,
                "tools_kwargs": pl.Struct(
                    {
                        SEARCH_TOOL_NAME: pl.Struct(
                            {
                                "create_kwargs": pl.Struct(
                                    {"entities": _ENTITIES, "data_source": pl.String, "id": pl.String}
                                )
                            }
                        )
                    }
                ),
            }
        ),
    }
)

EVAL_SCHEMA = pl.Schema(
    {"id": pl.String, "question_text": pl.String, "ground_truth": _ENTITIES, "data_source": pl.String}
)


def verl_rows(records: pl.DataFrame, split: str, template: PromptTemplate | None = None) -> pl.DataFrame:
    """verl training rows of normalized (or mixed) records, in their order.

    Args:
        records: frame with ``id``, ``dataset``, ``question``, ``answers``.
        split: written to ``extra_info.split`` (``train`` or ``val``).
        template: the user-prompt template (default: the project's).
    Returns:
        Frame with :data:`VERL_SCHEMA`, checked (``index`` = row number).
    """
    rows = []
    for i, r in enumerate(records.select("id", "dataset", "question", "answers").iter_rows(named=True)):
        entities = r["answers"]
        rows.append(
            {
                "data_source": r["dataset"],
                "prompt": build_messages(r["question"], template),
                "ability": ABILITY,
                "reward_model": {
                    "style": "rule",
                    "ground_truth": {"target": [e[0] for e in entities], "entities": entities},
                },
                "extra_info": {
                    "index": i,
                    "split": split,
                    "id": r["id"],
                    "question": r["question"],
                    "need_tools_kwargs": True,
                    "tools_kwargs": {
                        SEARCH_TOOL_NAME: {
                            "create_kwargs": {
                                "entities": entities,
                                "data_source": r["dataset"],
                                "id": r["id"],
                            }
                        }
                    },
                },
            }
        )
    if not rows:
        return pl.DataFrame(schema=VERL_SCHEMA)
    # Through JSON Lines into polars' reader: much faster than building nested structs from Python.
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    return check_verl(pl.read_ndjson(io.BytesIO(text), schema=VERL_SCHEMA))


def check_verl(df: pl.DataFrame) -> pl.DataFrame:
    """Schema and content checks of verl rows before they are written.

    Raises:
        ValueError naming the first offending row.
    """
    if df.schema != VERL_SCHEMA:
        raise ValueError(f"verl rows: schema {df.schema} differs from {VERL_SCHEMA}")
    gt = pl.col("reward_model").struct.field("ground_truth")
    bad = df.with_row_index("_row").filter(
        pl.col("data_source").is_null()
        # the user turn, after the system message when the prompt is sent as one (agent.prompt_role)
        | ~pl.col("prompt").list.len().is_between(1, 2)
        | (pl.col("prompt").list.last().struct.field("role") != "user")
        | (gt.struct.field("target").list.len() == 0)
        | (gt.struct.field("target").list.len() != gt.struct.field("entities").list.len())
        | pl.col("extra_info").struct.field("id").is_null()
    )
    if len(bad):
        raise ValueError(f"verl rows: row {bad['_row'][0]} has no data source, prompt or gold entity")
    return df


def export_rl_dataset(
    train: str | os.PathLike,
    val: str | os.PathLike,
    out_train: str | os.PathLike,
    out_val: str | os.PathLike,
    template: PromptTemplate | None = None,
) -> dict[str, int]:
    """Write the verl training and validation parquet files from the mix.

    Args:
        train, val: mix record files (:data:`~spader.data.records.MIX_SCHEMA`).
        out_train, out_val: ``.parquet`` outputs.
        template: the user-prompt template (``agent.prompt_template``; default: the project's).
    Returns:
        Row counts ``{"train": n, "val": m}``.
    """
    counts = {}
    for split, src, dst in (("train", train, out_train), ("val", val, out_val)):
        rows = verl_rows(read_records(src, MIX_SCHEMA), split, template)
        write_frame(rows, dst)
        counts[split] = len(rows)
        log.info("verl %s: %d rows -> %s", split, len(rows), dst)
    return counts


def eval_rows(records: pl.DataFrame, *, limit: int | None = None, seed: int = 42) -> pl.DataFrame:
    """Evaluation rows of one dataset's normalized test records.

    Duplicate ids are removed (first kept, count logged). With ``limit`` smaller than the number of
    records, ``random.Random(seed).sample`` over the records sorted by id picks ``limit`` of them.
    The result is sorted by id.

    Returns:
        Frame with :data:`EVAL_SCHEMA`.
    """
    df = records.sort("id", maintain_order=True).unique(subset="id", keep="first", maintain_order=True)
    if len(df) < len(records):
        log.warning("evaluation set: %d duplicate ids removed", len(records) - len(df))
    if limit is not None and limit < len(df):
        idx = sorted(random.Random(seed).sample(range(len(df)), limit))
        df = df.select(pl.all().gather(idx))
    out = df.select(
        pl.col("id"),
        pl.col("question").alias("question_text"),
        pl.col("answers").alias("ground_truth"),
        pl.col("dataset").alias("data_source"),
    )
    if out.schema != EVAL_SCHEMA:
        raise ValueError(f"evaluation rows: schema {out.schema} differs from {EVAL_SCHEMA}")
    return out


def export_eval_set(
    records: str | os.PathLike,
    output: str | os.PathLike,
    dataset: str,
    *,
    limit: int | None = None,
    seed: int = 42,
) -> int:
    """Write one dataset's evaluation file (``.jsonl``) from its normalized test records.

    Returns:
        The number of evaluation questions written.
    """
    rows = eval_rows(read_records(records, record_schema(dataset)), limit=limit, seed=seed)
    write_frame(rows, output)
    log.info("evaluation %s: %d questions -> %s", dataset, len(rows), output)
    return len(rows)
