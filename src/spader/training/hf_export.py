"""The ``export_checkpoint`` job: the final verl checkpoint of a training run as a Hugging Face
model, plus a metadata file that ties it to its config, data, index and verl version.

The FSDP actor shards are merged with verl's own model merger (``python -m verl.model_merger
merge --backend fsdp``), which runs on CPU. The merge writes into a temporary sibling directory
that replaces the output only when complete. Paths in the metadata, like those in
``final.json``, are relative to the working directory (absolute only outside it), so a results
tree stays valid when moved.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from spader.infra.atomic import atomic_write
from spader.infra.tracking import fingerprint
from spader.training.checkpoints import portable_path, retire_checkpoints
from spader.training.launch import log_stream

log = logging.getLogger(__name__)

__all__ = ["ExportError", "export_checkpoint", "merge_command"]

# Carried from final.json into the model's metadata file.
_LINEAGE_KEYS = (
    "backbone",
    "variant",
    "steps_done",
    "base_model",
    "config_hash",
    "data_hash",
    "train_hash",
    "val_hash",
    "index_hash",
    "verl_version",
    "mlflow_run_id",
    "lineage",
    "checkpoint",
)


class ExportError(RuntimeError):
    """The checkpoint named by final.json cannot be exported; the message names the path."""


def merge_command(actor_dir: str | os.PathLike, target_dir: str | os.PathLike) -> list[str]:
    """verl's model-merger command for an FSDP actor checkpoint."""
    return [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        os.path.abspath(actor_dir),
        "--target_dir",
        os.path.abspath(target_dir),
    ]


def _keep_tiny_marker(final: dict, target: Path) -> None:
    """A policy trained from a tiny demo model stays marked as one (its evaluation reports say
    the model is tiny); the marker records the training it went through."""
    from spader.models.local import TINY_MARKER

    base = Path(final.get("model_dir") or "")
    if not (base / TINY_MARKER).is_file():
        return
    marker = json.loads((base / TINY_MARKER).read_text())
    marker["trained"] = {k: final.get(k) for k in ("variant", "steps_done", "verl_version")}
    (target / TINY_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def export_checkpoint(
    final_json: str | os.PathLike,
    model_out: str | os.PathLike,
    meta_out: str | os.PathLike,
    *,
    keep_checkpoints: bool,
) -> dict:
    """Merge the checkpoint named by ``final_json`` into ``model_out``; write ``meta_out``; then,
    unless ``keep_checkpoints``, delete the training's intermediate checkpoints (the final one
    stays: :func:`spader.training.checkpoints.retire_checkpoints`).

    Args:
        final_json: ``train_policy``'s output (``actor_dir``, ``steps_done``, hashes, ...).
        model_out: directory for the Hugging Face model (weights, config, tokenizer).
        meta_out: JSON metadata: steps done, config/data/index hashes, verl version, source
            checkpoint, MLflow run, and a fingerprint of the exported model.
        keep_checkpoints: ``training.keep_checkpoints``.

    Returns:
        The metadata.
    """
    final = json.loads(Path(final_json).read_text())
    actor_dir = Path(final["actor_dir"])
    if not (actor_dir / "fsdp_config.json").is_file():
        raise ExportError(
            f"{final_json} names checkpoint {actor_dir}, which is missing or incomplete (no fsdp_config.json); "
            f"rerun train_policy for {final.get('backbone')}/{final.get('variant')} "
            f"(snakemake --forcerun train_policy ...)"
        )
    model_out = Path(model_out)
    tmp = model_out.with_name(f".{model_out.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    argv = merge_command(actor_dir, tmp)
    log.info("merging %s: %s", actor_dir, " ".join(argv))
    out = log_stream()
    if out is not None:
        out.flush()
    rc = subprocess.run(
        argv, stdout=out, stderr=subprocess.STDOUT if out is not None else None, check=False
    ).returncode
    if rc != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"verl's model merger exited with code {rc} on {actor_dir}")
    if not (tmp / "config.json").is_file() or not any(tmp.glob("*.safetensors")):
        raise ExportError(f"verl's model merger wrote no config.json/safetensors weights into {tmp}")
    _keep_tiny_marker(final, tmp)
    if model_out.exists():
        shutil.rmtree(model_out)
    tmp.replace(model_out)

    meta = {k: final.get(k) for k in _LINEAGE_KEYS}
    meta["model_dir"] = portable_path(model_out)
    meta["model_hash"] = fingerprint(model_out)
    meta_out = Path(meta_out)
    atomic_write(meta_out, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    log.info("exported %s step %s to %s", final.get("variant"), final.get("steps_done"), model_out)
    if not keep_checkpoints:
        retire_checkpoints(actor_dir.parent)
    return meta
