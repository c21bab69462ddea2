"""``spader rerun``: :mod:`spader.infra.replace_guard`."""

from spader.infra.replace_guard import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
