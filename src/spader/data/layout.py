"""Writers of release files in their on-disk layout (used by the demo generator, the hub
conversion and the tests).

Mintaka's JSON layout (docs/data.md, Mintaka's "Release files"): 4-space indent; a non-empty object
or array value starts on its own line under its key, at the key's indentation; array scalars one per
line; raw UTF-8; no trailing newline.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["dump_jsonl", "dump_mintaka_json"]

_PAD = "    "


def _container(value: Any) -> bool:
    return isinstance(value, dict | list) and len(value) > 0


def _dump(value: Any, level: int) -> str:
    if not _container(value):
        return json.dumps(value, ensure_ascii=False)
    inner = _PAD * (level + 1)
    if isinstance(value, dict):
        parts = []
        for key, v in value.items():
            k = json.dumps(str(key), ensure_ascii=False)
            if _container(v):
                parts.append(f"{inner}{k}:\n{inner}{_dump(v, level + 1)}")
            else:
                parts.append(f"{inner}{k}: {_dump(v, level + 1)}")
        return "{\n" + ",\n".join(parts) + "\n" + _PAD * level + "}"
    parts = [inner + _dump(v, level + 1) for v in value]
    return "[\n" + ",\n".join(parts) + "\n" + _PAD * level + "]"


def dump_mintaka_json(records: list[dict]) -> str:
    """A Mintaka release file's text (array of records, Mintaka's indentation, no final newline).

    >>> print(dump_mintaka_json([{"id": "a1", "span": [3, 7], "answer": {"answer": None}}]))
    [
        {
            "id": "a1",
            "span":
            [
                3,
                7
            ],
            "answer":
            {
                "answer": null
            }
        }
    ]
    """
    return _dump(list(records), 0)


def dump_jsonl(records: Iterable[dict], *, ensure_ascii: bool = True) -> str:
    """JSON Lines as QAMPARI and QUEST write them (``json.dumps(row) + "\\n"``, ASCII escapes)."""
    return "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in records)
