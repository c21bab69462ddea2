"""An object named by import path, ``"module:attribute"`` (attributes may be dotted), as verl names
its reward functions: how the method and dataset registries refer to code they may not import."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_object"]


def import_object(path: str) -> Any:
    """The object ``path`` (``"module:attribute.sub"``) names.

    Raises:
        ValueError: ``path`` is not of that form.
        Exception: whatever importing the module or reading an attribute raises (callers name
            the path in their own one-line error).

    >>> import_object("os.path:join").__name__
    'join'
    """
    module_name, _, attribute = str(path).partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not of the form 'module:attribute'")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target
