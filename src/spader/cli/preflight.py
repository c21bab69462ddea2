"""``spader preflight``: :mod:`spader.training.preflight`."""

from spader.training.preflight import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
