"""Download a model repository from the Hugging Face hub into a local directory."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def download_model(repo_id: str, out: str | os.PathLike, revision: str | None = None) -> Path:
    """``snapshot_download`` of ``repo_id`` (weights, tokenizer, config) into ``out``.

    Runs on a machine with network access (the login node of a cluster); jobs then read ``out``.
    """
    from huggingface_hub import snapshot_download

    out = Path(out)
    log.info("downloading %s into %s", repo_id, out)
    try:
        snapshot_download(repo_id=repo_id, revision=revision, local_dir=str(out))
    except Exception as exc:
        raise RuntimeError(
            f"could not download model {repo_id!r} from the Hugging Face hub ({exc}). On a machine without "
            f"network access, download it elsewhere and set the backbone's `model` (or "
            f"retrieval.reranker.model) to the local directory."
        ) from exc
    return out
