"""The generation engine of an evaluation job, as ``evaluation.engine`` names it."""

from __future__ import annotations

import os
from pathlib import Path

from spader.agent.generation import Engine, TransformersEngine

__all__ = ["ENGINES", "build_engine"]

ENGINES = ("transformers", "sglang")


def build_engine(
    engine: str,
    model_dir: str | os.PathLike,
    *,
    gpus: int = 0,
    batch_size: int = 8,
    mem_fraction: float = 0.7,
    context_length: int | None = None,
    seed: int = 0,
    threads: int | None = None,
) -> Engine:
    """Construct the engine named by ``evaluation.engine``.

    Args:
        engine: ``transformers`` or ``sglang``.
        model_dir: the policy's Hugging Face directory.
        gpus: GPUs of the job (0 = CPU; sglang needs at least one).
        threads: CPU threads of the job (transformers on CPU).
    """
    if not Path(model_dir, "config.json").exists():
        raise FileNotFoundError(f"model directory {model_dir} has no config.json (not a Hugging Face model)")
    if engine == "transformers":
        device = "cuda" if gpus > 0 else "cpu"
        return TransformersEngine(model_dir, device=device, batch_size=batch_size, threads=threads)
    if engine == "sglang":
        if gpus < 1:
            raise ValueError(
                "evaluation.engine 'sglang' needs a GPU (evaluation.gpus >= 1); use 'transformers' on CPU"
            )
        from spader.integrations.sglang import SglangEngine

        return SglangEngine(
            model_dir, tp_size=gpus, mem_fraction=mem_fraction, context_length=context_length, seed=seed
        )
    raise ValueError(f"evaluation.engine must be one of {ENGINES}, got {engine!r}")
