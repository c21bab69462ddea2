"""``spader demo OUTDIR`` (also ``python -m spader.demo OUTDIR``): regenerate the bundled demo
files (resources/demo)."""

from __future__ import annotations

import argparse
import logging
import sys

from spader.config.command import run_command

HELP = "regenerate the bundled demo files (resources/demo: the demo world's corpus and releases)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("outdir", help="output directory, e.g. resources/demo")


def run(args: argparse.Namespace) -> int:
    from spader.demo import generate

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for path in generate(args.outdir):
        logging.getLogger("spader.demo").info("wrote %s (%d bytes)", path, path.stat().st_size)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command("python -m spader.demo", add_arguments, run, argv, description=HELP)


if __name__ == "__main__":
    sys.exit(main())
