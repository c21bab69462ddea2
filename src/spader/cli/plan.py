"""``spader plan``: :mod:`spader.planning.plan`."""

from spader.planning.plan import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
