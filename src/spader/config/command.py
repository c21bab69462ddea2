"""What every command of the project shares: the ``--configfile`` options, and errors as one line.

A command is two functions, ``add_arguments(parser)`` and ``run(args) -> exit status``, defined
beside the code it runs; ``spader <command>`` (:mod:`spader.cli`) and the module's own
``python -m`` entry point both call them through :func:`run_command`, so the two behave alike:

* ``--configfile A B ...`` overlays the workflow's ``config/config.yaml`` exactly as
  ``snakemake --configfile A B ...`` does (:func:`spader.config.files.merge_files`), and the
  result is checked as at a workflow's start (:func:`configured`);
* every error ends the command with one line on stderr (``<prog>: error: ...``) and a non-zero
  status: 2 for bad input (a configuration, a file, an argument), 1 for any other failure, 130
  for an interrupt. ``traceback=True`` (``spader --traceback``) lets the exception through.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from spader.config.checks import ConfigError
from spader.config.files import config_paths, load_config
from spader.config.model import Config

__all__ = [
    "CommandParser",
    "add_config_arguments",
    "call",
    "config_files",
    "configured",
    "error_line",
    "repository",
    "run_command",
]


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``<prog>: error: ...``, exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_config_arguments(parser: argparse.ArgumentParser, *, overlays: Sequence[str] = ()) -> None:
    """``--configfile FILE [FILE ...]`` and ``--root DIR``, read by :func:`configured`.

    Args:
        overlays: the overlays used when ``--configfile`` is not given (the GPU smoke test's
            ``config/demo.yaml``), relative to the repository.
    """
    default = f" (default: {' '.join(overlays)})" if overlays else ""
    parser.add_argument(
        "--configfile",
        "--configfiles",
        nargs="+",
        action="extend",
        metavar="FILE",
        help="config files overlaying config/config.yaml in this order, as snakemake --configfile does"
        + default,
    )
    parser.add_argument(
        "--root",
        default=None,
        help="the repository holding the workflow (config/config.yaml, config/verl/); "
        "default: the checkout this package is installed from",
    )
    parser.set_defaults(_config_overlays=list(overlays))


def config_files(args: argparse.Namespace) -> list[Path]:
    """``config/config.yaml`` of the repository, then the ``--configfile`` files (or the command's
    default overlays, relative to the repository)."""
    root = repository(args)
    if args.configfile:
        return config_paths(args.configfile, root)
    return config_paths([root / o for o in getattr(args, "_config_overlays", [])], root)


def repository(args: argparse.Namespace) -> Path:
    """``--root``, or the repository this package is installed from."""
    return config_paths(root=args.root)[0].parents[1]


def configured(args: argparse.Namespace, *, check_paths: bool = True) -> Config:
    """The configuration ``--configfile`` names, overlaid and checked as a workflow run checks it.

    Raises:
        ConfigError: a file cannot be read, gives a key twice, or the configuration is invalid.
    """
    root = repository(args)
    return load_config(*config_files(args), verl_config_dir=root / "config" / "verl", check_paths=check_paths)


def error_line(exc: BaseException) -> str:
    """A command's error on one line: the exception's message (a multi-line message joined with
    ``; ``), with its type only where it is not a known error (a bad file, value or key). A failed
    job's cause is :func:`spader.infra.failures.one_line`."""
    text = ""
    for part in (p.strip() for p in str(exc).splitlines()):
        if part:
            text += ("" if not text else " " if text.endswith(":") else "; ") + part
    if isinstance(exc, ConfigError | OSError | ValueError | LookupError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_command(
    prog: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
    *,
    description: str | None = None,
    traceback: bool = False,
) -> int:
    """Parse ``argv`` with the command's arguments and run it; errors as one line (module doc).

    Returns:
        The exit status.
    """
    parser = CommandParser(prog=prog, description=description)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return call(prog, run, args, traceback=traceback)


def call(
    prog: str, run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace, *, traceback: bool
) -> int:
    """``run(args)`` with errors as one line on stderr (``traceback`` lets them through)."""
    if traceback:
        return int(run(args) or 0)
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except (ConfigError, OSError, ValueError, LookupError) as exc:
        sys.stderr.write(f"{prog}: error: {error_line(exc)}\n")
        return 2
    except Exception as exc:  # noqa: BLE001  (any failure ends the command with one line)
        sys.stderr.write(f"{prog}: error: {error_line(exc)} (rerun with spader --traceback to see where)\n")
        return 1
