"""``spader``: the project's command line, one subcommand per group of tools.

    spader config show [--configfile FILE ...]   the resolved configuration, as YAML
    spader plan --configfile my.yaml             the GPU memory plan of a configuration
    spader --help                                every command

Each command is a module of this package (``spader.cli.<name>``) with ``HELP``,
``add_arguments(parser)`` and ``run(args)``, usually handing over to the functions of the code it
runs, which its ``python -m`` entry point also calls. Adding a command is one such module and one
line in :data:`COMMANDS`. Modules are imported only when their command runs (or for ``--help``),
so ``spader config show`` does not load torch. Errors are one line on stderr with a non-zero
status (:mod:`spader.config.command`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from spader import __version__
from spader.datasets import DatasetRegistryError

__all__ = ["COMMANDS", "main"]

DESCRIPTION = "The SPADER reproduction's command line: one subcommand per group of tools."

#: ``spader <name>`` -> the module that defines it.
COMMANDS = {
    "config": "spader.cli.config",
    "plan": "spader.cli.plan",
    "preflight": "spader.cli.preflight",
    "first-hour": "spader.cli.first_hour",
    "data": "spader.cli.data",
    "retrieval": "spader.cli.retrieval",
    "demo": "spader.cli.demo",
    "smoke": "spader.cli.smoke",
    "stage-code": "spader.cli.stage_code",
    "integrity": "spader.cli.integrity",
    "procs": "spader.cli.procs",
    "rerun": "spader.cli.rerun",
    "rerun-keys": "spader.cli.rerun_keys",
}


def command(name: str) -> ModuleType:
    """The module of command ``name``."""
    return importlib.import_module(COMMANDS[name])


def parser(only: str | None = None):
    """The whole command line (with every command's arguments when ``only`` is None, else only
    that command's, so that running one command imports only its module)."""
    from spader.config.command import CommandParser  # the registry of datasets loads with it

    top = CommandParser(prog="spader", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"spader {__version__}")
    top.add_argument("--traceback", action="store_true", help="show the traceback of an error")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=CommandParser)
    for name in COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name, add_help=False)
            continue
        module = command(name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``spader`` with ``argv`` (default: the process's arguments); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    try:
        from spader.config.command import call

        args = parser(chosen if chosen in COMMANDS else None).parse_args(argv)
    except DatasetRegistryError as exc:  # a broken dataset entry point, before any command runs
        if "--traceback" in argv:
            raise
        sys.stderr.write(f"spader: error: {exc}\n")
        return 2
    return call(f"spader {args.command}", args._run, args, traceback=args.traceback)
