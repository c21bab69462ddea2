"""``python -m spader.config write|check``: the generated schema and key reference of the repository.

Run from the repository root (or pass ``--root``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spader.config.docs import render
from spader.config.schema import dump_yaml, json_schema

SCHEMA = Path("workflow/schemas/config.schema.yaml")
REFERENCE = Path("config/README.md")


def generated() -> dict[Path, str]:
    """The text of each generated file, by path relative to the repository root."""
    schema = json_schema()
    return {SCHEMA: dump_yaml(schema), REFERENCE: render(schema)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spader.config", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["write", "check"])
    parser.add_argument("--root", default=".", help="repository root (default: the current directory)")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in generated().items():
        path = Path(args.root) / rel
        if args.action == "write":
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(str(rel))
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m spader.config write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
