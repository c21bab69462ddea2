"""``spader config`` (also ``python -m spader.config``): the resolved configuration and the files
generated from the configuration model.

    spader config show [--configfile FILE ...]   the configuration a run with these overlays validates,
                                                 every default filled in, as YAML
    spader config docs                           regenerate workflow/schemas/config.schema.yaml and
                                                 config/README.md (alias: write)
    spader config check                          exit 1 when either generated file is out of date

Run ``docs`` and ``check`` from the repository root (or pass ``--root``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from spader.config.command import add_config_arguments, configured, run_command
from spader.config.docs import render
from spader.config.schema import dump_yaml, json_schema

SCHEMA = Path("workflow/schemas/config.schema.yaml")
REFERENCE = Path("config/README.md")
HELP = "the resolved configuration (show) and the schema and key reference generated from the model"


def generated() -> dict[Path, str]:
    """The text of each generated file, by path relative to the repository root."""
    schema = json_schema()
    return {SCHEMA: dump_yaml(schema), REFERENCE: render(schema)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(parser))
    show = sub.add_parser("show", help="print the resolved configuration (defaults filled in) as YAML")
    add_config_arguments(show)
    for name, aliases, text in (
        ("docs", ["write"], "regenerate the schema and config/README.md from the model"),
        ("check", [], "exit 1 when the schema or config/README.md is out of date"),
    ):
        p = sub.add_parser(name, aliases=aliases, help=text)
        p.add_argument("--root", default=".", help="repository root (default: the current directory)")
        p.set_defaults(action=name)


def run(args: argparse.Namespace) -> int:
    if args.action == "show":
        config = configured(args).model_dump(mode="json")
        sys.stdout.write(yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=110))
        return 0
    stale = []
    for rel, text in generated().items():
        path = Path(args.root) / rel
        if args.action == "docs":
            path.write_text(text, encoding="utf-8")
            sys.stdout.write(f"wrote {rel}\n")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(str(rel))
    if stale:
        sys.stderr.write(f"out of date: {', '.join(stale)}; run spader config docs\n")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(
        "python -m spader.config", add_arguments, run, argv, description=__doc__.splitlines()[0]
    )


if __name__ == "__main__":
    raise SystemExit(main())
