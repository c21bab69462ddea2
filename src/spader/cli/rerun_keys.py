"""``spader rerun-keys``: :mod:`spader.infra.rerun_keys`."""

from spader.infra.rerun_keys import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
