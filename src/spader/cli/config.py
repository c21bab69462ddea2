"""``spader config``: :mod:`spader.config.__main__`."""

from spader.config.__main__ import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
