"""``spader stage-code``: :mod:`spader.infra.stage_code`."""

from spader.infra.stage_code import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
