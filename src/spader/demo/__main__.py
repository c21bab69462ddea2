"""``python -m spader.demo <outdir>``: regenerate the bundled demo files (resources/demo)."""

from __future__ import annotations

import argparse
import logging
import sys

from spader.demo import generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spader.demo", description=__doc__)
    parser.add_argument("outdir", help="output directory, e.g. resources/demo")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for path in generate(args.outdir):
        logging.getLogger("spader.demo").info("wrote %s (%d bytes)", path, path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
