"""Download a model repository from the Hugging Face hub into a local directory.

The files are fetched into a hub cache beside the outputs (``<out>/../.cache``, the hub's own
layout, which resumes partial files and skips complete ones) and the output directory is made of
hard links to them. When Snakemake deletes an output it marked incomplete (an interrupted run),
the cache still holds every byte and the rerun only links them again.

Gated repositories need a hub token: :func:`download_model` checks for one first
(:func:`spader.models.gated.check_hub_token`).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from spader.infra.node import Needs, check_here
from spader.models.gated import check_hub_token

log = logging.getLogger(__name__)

__all__ = ["download_model", "link_tree"]


def link_tree(src: str | os.PathLike, out: str | os.PathLike) -> Path:
    """``out`` as a copy of the tree ``src`` made of hard links (symlinks followed), built beside
    ``out`` and renamed into place; files are copied where hard links are not possible.

    Returns:
        ``out``.
    """
    src, out = Path(src), Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for path in sorted(src.rglob("*")):
        if path.is_dir():
            continue
        target = tmp / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path.resolve(), target)
        except OSError:  # another file system, or none with hard links
            shutil.copy2(path.resolve(), target)
    tmp.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _download_needs(repo_id: str, size_gib: float | None, cache: Path) -> Needs:
    """A model download's disk: the snapshot's size less what the hub cache already holds of it
    (the output is hard links into the cache)."""
    from spader.infra.node import tree_gib

    name = f"download_model {repo_id}"
    if size_gib is None:
        return Needs(name, unknown=(f"its size (no shape of {repo_id} is shipped to estimate it)",))
    held = tree_gib(cache / ("models--" + repo_id.replace("/", "--")))
    return Needs(name, disk_gib=max(0.0, size_gib - held),
                 disk_what=f"the snapshot ({size_gib:.1f} GiB estimated, {held:.1f} GiB already in the hub cache)")  # fmt: skip


def download_model(
    repo_id: str,
    out: str | os.PathLike,
    revision: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    size_gib: float | None = None,
) -> Path:
    """``snapshot_download`` of ``repo_id`` (weights, tokenizer, config) into ``out``.

    Runs on a machine with network access (the login node of a cluster); jobs then read ``out``.

    Args:
        repo_id: hub repository, e.g. ``Qwen/Qwen3-8B``.
        out: the model directory to create.
        revision: commit, branch or tag (default: the hub's default branch).
        cache_dir: hub cache (default: ``.cache`` beside ``out``).
        local_files_only: take the files from the cache only (no network).
        size_gib: GiB the snapshot holds (the plan's estimate), checked against the free disk less
            what the hub cache already holds of it; None: not known, not checked (a debug line).
    Returns:
        ``out``.
    Raises:
        HubTokenError: ``repo_id`` is gated and no hub token is configured (nothing fetched).
    """
    out = Path(out)
    if not local_files_only:
        check_hub_token(repo_id, out)
    cache = Path(cache_dir) if cache_dir is not None else out.parent / ".cache"
    check_here(_download_needs(repo_id, size_gib, cache), out.parent, logger=log)
    from huggingface_hub import snapshot_download

    log.info("downloading %s into %s (hub cache %s)", repo_id, out, cache)
    try:
        snapshot = snapshot_download(
            repo_id=repo_id, revision=revision, cache_dir=str(cache), local_files_only=local_files_only
        )
    except Exception as exc:
        raise RuntimeError(
            f"could not download model {repo_id!r} from the Hugging Face hub ({exc}). On a machine without "
            f"network access, download it elsewhere and set the backbone's `model` (or "
            f"retrieval.reranker.model) to the local directory."
        ) from exc
    return link_tree(snapshot, out)
