"""``spader smoke``: :mod:`spader.training.smoke`."""

from spader.training.smoke import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
