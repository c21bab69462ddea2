"""``spader plan``: :mod:`spader.training.plan`."""

from spader.training.plan import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
