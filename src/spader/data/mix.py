"""The training mix (docs/data.md, "Training mix"): the paper's is 6,000 QAMPARI + 2,000 Mintaka +
2,000 WebQSP + 2,000 QUEST (the registry's counts, the defaults of ``mix.counts``).

Per dataset, the pool is the normalized *train* split, sorted by id, with duplicate ids removed,
filtered by answer count (``min_answers``/``max_answers``), without questions that are also an
evaluation question of any dataset, and de-duplicated by question (the smallest id is kept).
Questions are compared by :func:`spader.core.text.question_key`: norm_v1 after removing the
characters that render as nothing, so a zero-width space or a soft hyphen does not make an
evaluation question new. ``random.Random(seed).sample(pool, k)`` then picks the training records; a
pool smaller than ``k`` is an error that names the dataset (never up-sampled). The validation
records are drawn the same way from what is left of each pool, so they are disjoint from both the
mix and the evaluation split. The training records of all datasets are shuffled with
``random.Random(seed)``.

The settings are the configuration's section ``mix`` (:class:`spader.config.model.MixConfig`).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from spader.config.model import MixConfig
from spader.core.text import question_key
from spader.data.records import (
    MIX_SCHEMA,
    empty_frame,
    read_records,
    record_schema,
    to_mix_meta,
    write_frame,
)

log = logging.getLogger(__name__)

__all__ = ["MixError", "build_mix", "mix_metrics", "mix_training_set", "prepare_pool"]


class MixError(ValueError):
    """The mix cannot be built as configured; the message names the dataset."""


def _counts(cfg: MixConfig) -> dict[str, int]:
    """``mix.counts`` as a map (every dataset of the registry)."""
    return cfg.counts.model_dump()


def _check(cfg: MixConfig) -> None:
    """The one rule between the section's keys (checked with the whole configuration too)."""
    if cfg.max_answers is not None and cfg.max_answers < cfg.min_answers:
        raise MixError(f"mix.max_answers ({cfg.max_answers}) is below mix.min_answers ({cfg.min_answers})")


def _question_keys(df: pl.DataFrame) -> pl.Series:
    return pl.Series("qkey", [question_key(q) for q in df["question"].to_list()], dtype=pl.String)


def _eval_keys(evals: Mapping[str, pl.DataFrame]) -> set[str]:
    """The question keys of every evaluation set, whatever its dataset."""
    return {k for df in evals.values() if df is not None and len(df) for k in _question_keys(df).to_list()}


def prepare_pool(
    dataset: str,
    records: pl.DataFrame,
    eval_records: pl.DataFrame | Mapping[str, pl.DataFrame] | None,
    cfg: MixConfig,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """The sampling pool of one dataset and how many records each step removed.

    Args:
        dataset: the dataset name (checked against the records' ``dataset`` column).
        records: normalized train records.
        eval_records: normalized evaluation records, per dataset (every evaluation set: a test
            question of another dataset is excluded too), or one frame, or None.
        cfg: the mix settings.
    Returns:
        ``(pool, removed)``: the pool sorted by id (with a ``qkey`` column, the question key) and
        counts by step: ``duplicate_id``, ``answer_count``, ``eval_overlap``, ``duplicate_question``.
    """
    evals = eval_records if isinstance(eval_records, Mapping) else {dataset: eval_records}
    return _pool(dataset, records, _eval_keys(evals), cfg)


def _pool(
    dataset: str, records: pl.DataFrame, eval_keys: set[str], cfg: MixConfig
) -> tuple[pl.DataFrame, dict[str, int]]:
    others = set(records["dataset"].unique().to_list()) - {dataset}
    if others:
        raise MixError(f"dataset '{dataset}': train records of other datasets {sorted(others)} were given")
    removed: dict[str, int] = {}

    def step(name: str, df: pl.DataFrame, before: int) -> pl.DataFrame:
        removed[name] = before - len(df)
        return df

    df = records.with_columns(_question_keys(records)).sort("id", maintain_order=True)
    df = step("duplicate_id", df.unique(subset="id", keep="first", maintain_order=True), len(df))
    n_answers = pl.col("answers").list.len()
    keep = n_answers >= cfg.min_answers
    if cfg.max_answers is not None:
        keep = keep & (n_answers <= cfg.max_answers)
    df = step("answer_count", df.filter(keep), len(df))
    df = step("eval_overlap", df.filter(~pl.col("qkey").is_in(sorted(eval_keys))), len(df))
    df = step("duplicate_question", df.unique(subset="qkey", keep="first", maintain_order=True), len(df))
    return df, removed


def _sample(pool: pl.DataFrame, k: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``random.Random(seed).sample(pool, k)`` (pool sorted by id) and the rest of the pool."""
    idx = random.Random(seed).sample(range(len(pool)), k)
    picked = pool.select(pl.all().gather(idx))
    rest = pool.with_row_index("_row").filter(~pl.col("_row").is_in(idx)).drop("_row")
    return picked, rest


def _mix_dataset(
    d: str, pools: Mapping[str, pl.DataFrame], eval_keys, cfg: MixConfig
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """``(train, val, stats)`` of dataset ``d``: its sampled records (:data:`MIX_SCHEMA`) and counts."""
    if d not in pools:
        raise MixError(f"dataset '{d}': mix.counts.{d} = {_counts(cfg)[d]} but no train records were given")
    k = _counts(cfg)[d]
    pool, removed = _pool(d, pools[d], eval_keys, cfg)
    if len(pool) < k:
        raise MixError(
            f"dataset '{d}': the pool has {len(pool)} usable training questions but mix.counts.{d} asks "
            f"for {k} (read {len(pools[d])}, removed {removed}); lower mix.counts.{d} or provide more "
            "data: the mix never up-samples"
        )
    picked, rest = _sample(pool, k, cfg.seed)
    if len(rest) < cfg.val_per_dataset:
        raise MixError(
            f"dataset '{d}': {len(rest)} training questions are left after sampling {k} for the mix, but "
            f"mix.val_per_dataset asks for {cfg.val_per_dataset}"
        )
    val, _ = _sample(rest, cfg.val_per_dataset, cfg.seed)
    train_part, val_part = to_mix_meta(picked.drop("qkey"), d), to_mix_meta(val.drop("qkey"), d)
    stats = {
        "records": len(pools[d]),
        "removed": removed,
        "pool": len(pool),
        "train": len(picked),
        "val": len(val),
        "train_multi_answer": int((picked["answers"].list.len() >= 2).sum()),
    }
    log.info("mix %s: pool %d (removed %s), train %d, val %d", d, len(pool), removed, len(picked), len(val))
    return train_part, val_part, stats


def build_mix(
    pools: Mapping[str, pl.DataFrame], evals: Mapping[str, pl.DataFrame], cfg: MixConfig
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Sample the training and validation records (frames in, frames out).

    Args:
        pools: normalized train records per dataset.
        evals: normalized evaluation records per dataset (their questions are excluded from every
            dataset's pool).
        cfg: the mix settings.
    Returns:
        ``(train, val, stats)``; ``train`` and ``val`` have :data:`MIX_SCHEMA`.
    Raises:
        MixError naming the dataset when its pool is missing or too small.
    """
    _check(cfg)
    train_parts, val_parts = [], []
    stats: dict[str, Any] = {
        "seed": cfg.seed,
        "counts": dict(sorted(_counts(cfg).items())),  # by name, as the workflow's param holds them
        "min_answers": cfg.min_answers,
        "max_answers": cfg.max_answers,
        "val_per_dataset": cfg.val_per_dataset,
        "datasets": {},
    }
    eval_keys = _eval_keys(evals)
    for d in cfg.drawn:
        picked, val, stats["datasets"][d] = _mix_dataset(d, pools, eval_keys, cfg)
        train_parts.append(picked)
        val_parts.append(val)
    train = pl.concat(train_parts) if train_parts else empty_frame(MIX_SCHEMA)
    order = list(range(len(train)))
    random.Random(cfg.seed).shuffle(order)
    train = train.select(pl.all().gather(order)) if order else train
    val = pl.concat(val_parts) if val_parts else empty_frame(MIX_SCHEMA)
    stats["train_total"], stats["val_total"] = len(train), len(val)
    return train, val, stats


def mix_metrics(stats: Mapping[str, Any]) -> dict[str, float]:
    """Flat numeric view of the mix stats for MLflow: ``<dataset>/pool``, ``<dataset>/removed/<step>``..."""
    out: dict[str, float] = {
        "train_total": float(stats["train_total"]),
        "val_total": float(stats["val_total"]),
    }
    for d, s in stats["datasets"].items():
        for key, value in s.items():
            if key == "removed":
                out.update({f"{d}/removed/{step}": float(n) for step, n in value.items()})
            else:
                out[f"{d}/{key}"] = float(value)
    return out


def mix_training_set(
    train: Mapping[str, str | os.PathLike],
    test: Mapping[str, str | os.PathLike],
    out_train: str | os.PathLike,
    out_val: str | os.PathLike,
    out_stats: str | os.PathLike,
    cfg: MixConfig,
) -> dict[str, Any]:
    """Build the mix from normalized files and write ``train``/``val`` records and ``stats.json``.

    Args:
        train: normalized train records file per dataset.
        test: normalized evaluation records file per dataset (every dataset evaluated, also those
            the mix does not draw from).
        out_train, out_val: record files (``.jsonl`` or ``.parquet``), schema :data:`MIX_SCHEMA`.
        out_stats: JSON file of per-dataset pool sizes, removals and sample sizes.
        cfg: the configuration's section ``mix`` (``eval_limit`` is not read here).
    Returns:
        The stats.
    """
    pools = {d: read_records(train[d], record_schema(d)) for d in cfg.drawn if d in train}
    evals = {d: read_records(path, record_schema(d)) for d, path in test.items()}
    train_df, val_df, stats = build_mix(pools, evals, cfg)
    write_frame(train_df, out_train, MIX_SCHEMA)
    write_frame(val_df, out_val, MIX_SCHEMA)
    Path(out_stats).parent.mkdir(parents=True, exist_ok=True)
    Path(out_stats).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats
