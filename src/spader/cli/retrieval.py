"""``spader retrieval``: :mod:`spader.retrieval.__main__`."""

from spader.retrieval.__main__ import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
