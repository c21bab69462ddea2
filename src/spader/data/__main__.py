"""Command line: ``python -m spader.data normalize --dataset D --split S --input F --output O``.

Writes unified records (``.jsonl`` or ``.parquet``) and the drop counts beside them
(``<output stem>.drops.json``). A malformed input ends with one line naming file and line, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spader.data.records import DATASETS, DataFormatError
from spader.data.sources import drops_path_for, normalize_file


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spader.data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    n = sub.add_parser("normalize", help="release file -> unified records (docs/data.md 7.1)")
    n.add_argument("--dataset", required=True, choices=DATASETS)
    n.add_argument("--split", required=True, help="split name written into the records (train, dev, test)")
    n.add_argument("--input", required=True, help="release file or zip archive")
    n.add_argument("--member", default=None, help="zip member (default: the official path of --split)")
    n.add_argument("--output", required=True, help="records file, .jsonl or .parquet")
    n.add_argument("--drops", default=None, help="drop counts JSON (default: beside --output)")
    n.add_argument("-v", "--verbose", action="store_true", help="log every dropped record")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        summary = normalize_file(
            args.dataset, args.split, args.input, args.output, member=args.member, drops_path=args.drops
        )
    except (DataFormatError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    drops = args.drops or drops_path_for(args.output)
    logging.getLogger("spader.data").info(
        "wrote %d records to %s (read %d; drop counts in %s)", summary.kept, args.output, summary.read, drops
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
