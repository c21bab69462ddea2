"""Command line: ``spader data normalize --dataset D --split S --input F --output O`` (also
``python -m spader.data normalize ...``).

Writes unified records (``.jsonl`` or ``.parquet``) and the drop counts beside them
(``<output stem>.drops.json``). A malformed input ends with one line naming file and line, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spader.config.command import run_command
from spader.data.records import DATASETS
from spader.data.sources import drops_path_for, normalize_file

HELP = "release file -> unified records (normalize)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(p))
    n = sub.add_parser(
        "normalize", help='release file -> unified records (docs/data.md, "Normalized record")'
    )
    n.add_argument("--dataset", required=True, choices=DATASETS)
    n.add_argument("--split", required=True, help="split name written into the records (train, dev, test)")
    n.add_argument("--input", required=True, help="release file or zip archive")
    n.add_argument("--member", default=None, help="zip member (default: the official path of --split)")
    n.add_argument("--output", required=True, help="records file, .jsonl or .parquet")
    n.add_argument("--drops", default=None, help="drop counts JSON (default: beside --output)")
    n.add_argument("-v", "--verbose", action="store_true", help="log every dropped record")


def run(args: argparse.Namespace) -> int:
    """Normalize; a malformed input ends with one line naming file and line (exit 2)."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    summary = normalize_file(
        args.dataset, args.split, args.input, args.output, member=args.member, drops_path=args.drops
    )
    drops = args.drops or drops_path_for(args.output)
    logging.getLogger("spader.data").info(
        "wrote %d records to %s (read %d; drop counts in %s)", summary.kept, args.output, summary.read, drops
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m spader.data`` (an alias of ``spader data``)."""
    return run_command("python -m spader.data", add_arguments, run, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
