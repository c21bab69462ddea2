"""Fetching release files (rule ``download_dataset``): a URL or local path through
:func:`spader.infra.download.fetch`, or a Hugging Face hub copy through ``huggingface_hub``
(docs/data.md, "Hub copies").

Config entry of one release file (``datasets.<dataset>.files.<name>``)::

    {url: https://... | file:... | path | null, hub: null | {repo_id, filename, revision, repo_type,
                                                          format: raw | mintaka_parquet, split, local_dir}}

``hub.local_dir`` points ``hf_hub_download`` at a local directory laid out like the hub repository
(offline mirrors, tests): the file is taken from there and nothing is fetched. Format
``mintaka_parquet`` rebuilds ``mintaka_<split>.json`` from the parquet export of
``AmazonScience/mintaka`` (branch ``refs/convert/parquet``); that export is flattened and loses
``answerType``, which is inferred back from the answer text (lossy; prefer the raw JSON).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from spader.config import USER_SUPPLIED as _USER_SUPPLIED
from spader.config.model import HubSource
from spader.data.layout import dump_mintaka_json
from spader.infra.atomic import atomic_path

log = logging.getLogger(__name__)

__all__ = ["DatasetSourceError", "download_dataset", "fetch_from_hub", "mintaka_records_from_parquet"]


class DatasetSourceError(ValueError):
    """A release file cannot be obtained as configured; the message names the config key."""


def download_dataset(
    source: Mapping[str, Any], dest: str | os.PathLike, *, key: str, base_dir: str | os.PathLike | None = None
) -> Path:
    """Fetch one release file to ``dest``.

    Args:
        source: the config entry ``{url, hub}``; with ``sha256``, the digest the copy of a
            ``url`` must have (the workflow gives a local file's: :mod:`spader.infra.sources`).
        dest: output path (its name is the release file name).
        key: dotted config key of the entry, for messages (``datasets.webqsp.files.WebQSP.zip``).
        base_dir: where relative local paths in ``url`` and ``hub.local_dir`` point from (the
            workflow passes its repository); default: the current directory.
    Returns:
        ``dest``.
    Raises:
        DatasetSourceError when the entry has neither a URL nor a hub location, or the hub copy is
        unavailable; :class:`spader.infra.download.DownloadError` when a download fails.
    """
    from spader.infra.download import anchor_source, fetch  # the project's one downloader

    dest = Path(dest)
    hub = source.get("hub")
    if hub:
        if base_dir is not None and hub.get("local_dir"):
            hub = {**hub, "local_dir": anchor_source(str(hub["local_dir"]), base_dir)}
        return fetch_from_hub(hub, dest, key=f"{key}.hub")
    url = source.get("url")
    if not url:
        hint = _USER_SUPPLIED.get(dest.name, f"{dest.name} has no configured source")
        raise DatasetSourceError(
            f"config key '{key}.url' is null. {hint}; then set '{key}.url' to its local path "
            f"(or a file:/http(s) URL), or give a hub location in '{key}.hub'."
        )
    where = anchor_source(str(url), base_dir) if base_dir is not None else str(url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # the record names the source as configured: a relative path stays relative to the repository;
    # a local file's copy must have the content the workflow planned with (its `sha256`)
    return Path(fetch(where, dest, sha256=source.get("sha256"), desc=dest.name, record_source=str(url)))


def fetch_from_hub(hub: HubSource | Mapping[str, Any], dest: str | os.PathLike, *, key: str) -> Path:
    """Get a release file from a hub dataset repository (or a local directory laid out like one).

    Args:
        hub: ``{repo_id, filename, revision, repo_type, format, split, local_dir}``.
        dest: output path.
        key: config key, for messages.
    Returns:
        ``dest``.
    """
    from huggingface_hub import hf_hub_download

    dest = Path(dest)
    try:
        hub = HubSource.model_validate(dict(hub))
    except ValueError as e:
        raise DatasetSourceError(f"config key '{key}': {e}".replace("\n", "; ")) from e
    local_dir = hub.local_dir
    where = f"local directory {local_dir}" if local_dir else "the Hugging Face hub"
    try:
        path = hf_hub_download(
            repo_id=hub.repo_id,
            filename=hub.filename,
            repo_type=hub.repo_type,
            revision=hub.revision,
            local_dir=local_dir,
            local_files_only=local_dir is not None,
        )
    except Exception as e:  # huggingface_hub raises many error types; all mean "not available"
        raise DatasetSourceError(
            f"config key '{key}': cannot get '{hub.filename}' of {hub.repo_id} from {where} ({e})"
        ) from e
    with atomic_path(dest) as tmp:
        if hub.format == "raw":
            shutil.copyfile(path, tmp)
        else:  # mintaka_parquet
            tmp.write_text(dump_mintaka_json(mintaka_records_from_parquet(path, split=hub.split)), "utf-8")
    log.info("%s: %s of %s from %s (%s)", dest, hub.filename, hub.repo_id, where, hub.format)
    return dest


_BOOLEAN = {"true", "false", "yes", "no"}
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2}|\d{1,2}-[A-Za-z]{3}-\d{2})$")


def _answer_type(text: str, entities: list) -> str:
    if entities:
        return "entity"
    t = text.strip().lower()
    if t in _BOOLEAN:
        return "boolean"
    if _NUMBER.match(t):
        return "numerical"
    if _DATE.match(t):
        return "date"
    return "entity"  # unlinked entity or free string: the answer text is the one answer either way


def _entity(e: Any) -> dict:
    if isinstance(e, dict):
        label = e.get("label")
        return {"name": e.get("name"), "label": label if isinstance(label, dict) else {"en": label}}
    return {"name": None, "label": {"en": str(e)}}


def mintaka_records_from_parquet(path: str | os.PathLike, *, split: str | None = None) -> list[dict]:
    """Mintaka records (v1.1 layout) from the hub's flattened parquet export.

    Args:
        path: a parquet file with ``id, question, answerText, category, complexityType`` and
            optionally ``lang``, ``split``, ``questionEntity``, ``answerEntity``.
        split: keep only rows of this split when the file has a ``split`` column.
    Returns:
        English records in file order.
    Raises:
        DatasetSourceError naming the file and the missing columns.
    """
    df = pl.read_parquet(path)
    missing = {"id", "question", "answerText", "complexityType"} - set(df.columns)
    if missing:
        raise DatasetSourceError(f"{path}: not a Mintaka parquet export, missing columns {sorted(missing)}")
    if "lang" in df.columns:
        df = df.filter(pl.col("lang") == "en")
    if split is not None and "split" in df.columns:
        df = df.filter(pl.col("split") == split)
    log.warning("%s: rebuilding Mintaka JSON from the flattened parquet export (answerType inferred)", path)
    records = []
    for row in df.iter_rows(named=True):
        text = row.get("answerText") or ""
        entities = [_entity(e) for e in (row.get("answerEntity") or [])]
        atype = _answer_type(text, entities)
        if atype == "entity":
            answer = entities or None
        else:
            answer = [text]
        records.append(
            {
                "id": row["id"],
                "question": row["question"],
                "questionEntity": row.get("questionEntity") or [],
                "answer": {"answerType": atype, "answer": answer, "mention": text},
                "category": row.get("category"),
                "complexityType": row["complexityType"],
            }
        )
    return records
