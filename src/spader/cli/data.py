"""``spader data``: :mod:`spader.data.__main__`."""

from spader.data.__main__ import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
