"""``spader procs``: :mod:`spader.infra.procs`."""

from spader.infra.procs import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
