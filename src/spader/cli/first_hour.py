"""``spader first-hour``: :mod:`spader.training.first_hour`."""

from spader.training.first_hour import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
