"""What a local model directory is: a released or trained model, or a tiny random one.

Tiny randomly initialised models (built for the CPU demo and the tests by
:mod:`spader.demo.tiny`) carry a marker file next to their weights, so every consumer (evaluation,
export, the report) can say plainly that their outputs are meaningless.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TINY_MARKER", "is_tiny"]

#: Written next to the weights of a tiny random model (and kept by its warm start and export).
TINY_MARKER = "spader_tiny_model.json"


def is_tiny(model_dir: str | os.PathLike) -> bool:
    """True when ``model_dir`` holds a tiny random model (or one trained from it).

    >>> is_tiny("/nonexistent")
    False
    """
    return (Path(model_dir) / TINY_MARKER).exists()
