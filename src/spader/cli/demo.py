"""``spader demo``: :mod:`spader.demo.__main__`."""

from spader.demo.__main__ import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
