"""Values on verl's Hydra command line: the one renderer of override values.

Every override the project passes to verl (the method's, the job's, the resume point, the step
scorers') renders its value here, so a path with a space, a string that reads as a number and a
nested mapping all parse back to themselves.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["hydra_value"]

# Unquoted Hydra values may use these characters (hydra/grammar/OverrideLexer.g4, ID and
# UNQUOTED_CHAR, minus the ones that start interpolations or escapes).
_PLAIN = re.compile(r"^[A-Za-z0-9_\-+./:@%*?|]+$")
# Strings Hydra would read as another type unless quoted.
_TYPED = re.compile(
    r"^([+-]?(\d[\d_]*)?(\.\d*)?([eE][+-]?\d+)?|[+-]?(inf|nan)|true|false|null)$", re.IGNORECASE
)


def hydra_value(value: Any) -> str:
    """Render ``value`` as a Hydra command-line override value that parses back to itself.

    Strings that are not plain identifiers/paths, or that would read as a number, bool or null,
    are single-quoted (with ``\\`` and ``'`` escaped); lists become ``[a,b]``, mappings ``{k:v}``. A string containing
    ``${`` is refused (OmegaConf would resolve it as an interpolation).

    >>> hydra_value("/data/train.parquet"), hydra_value("1e-5"), hydra_value(["console", "mlflow"])
    ('/data/train.parquet', "'1e-5'", '[console,mlflow]')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"cannot pass {value!r} to verl")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{hydra_value(str(k))}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"cannot render {type(value).__name__} {value!r} as a Hydra override value")
    if value and _PLAIN.match(value) and not _TYPED.match(value):
        return value
    if "${" in value:
        # OmegaConf would resolve it as an interpolation inside verl; no path or name needs one.
        raise ValueError(f"refusing to pass {value!r} to verl: '${{' starts an OmegaConf interpolation")
    # Inside quotes Hydra unescapes backslashes only where they precede a quote or end the string.
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
    return f"'{escaped}'"
