"""``spader rerun``: :mod:`spader.infra.rerun`."""

from spader.infra.rerun import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
