"""``spader integrity``: :mod:`spader.infra.integrity`."""

from spader.infra.integrity import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
