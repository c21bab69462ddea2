"""Expensive outputs are never replaced by accident; recomputing them on purpose is one command.

A training (``final.json``, hundreds of GPU-hours), its export, an evaluation (~4 GPU-hours each)
and the BM25 index (hours) are *guarded*: a run that would replace one that exists and is complete
because something upstream changed (settings, code, an input) stops before its first job, naming
the outputs and the command below (:func:`unintended_replacements`, called by the workflow's
``onstart`` hook). Only this run's own ``--forcerun`` (or ``--forceall``) makes a replacement
intended, for the forced jobs and everything downstream of them. Outputs left incomplete by a
killed run are not guarded (they are no result).

The guard looks at what Snakemake plans, not at file permissions (Snakemake's ``protected()`` makes
outputs read-only, which a job run as root, common in containers, writes anyway, and which refuses
a deliberate ``--forcerun`` too).

``spader rerun OUTPUT... [--from-scratch] [-- SNAKEMAKE OPTIONS...]`` (alias ``python -m
spader.infra.replace_guard``) recomputes ``OUTPUT`` (a file, or a rule's name) and everything
downstream of it in the targets given (default: the workflow's ``all``): ``snakemake <options>
--forcerun OUTPUT...``. With ``--from-scratch`` a
training record's work directory (its checkpoints) is first moved aside, so the training starts
from step 0 instead of resuming (``results/<b>/train/<v>/work`` becomes ``work.replaced-<time>``,
kept until deleted by hand).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "GUARDED_RULES",
    "PlannedJob",
    "as_target",
    "guard_message",
    "main",
    "move_workdir_aside",
    "rerun",
    "snakemake_command",
    "unintended_replacements",
]

#: Rules whose outputs no run replaces unless it was asked to (what one of their jobs costs).
GUARDED_RULES = {
    "build_bm25_index": "the BM25 index (hours)",
    "train_policy": "a training's record (hundreds of GPU-hours)",
    "export_checkpoint": "a trained policy's export",
    "evaluate_policy": "an evaluation (GPU-hours)",
}
_DRY_RUN = ("-n", "--dry-run", "--dryrun")


@dataclass
class PlannedJob:
    """A job a run would execute, as the guard sees it.

    Attributes:
        key: unique among the run's jobs.
        rule: its rule.
        label: how to name it (rule and wildcards).
        existing: its outputs that exist and are complete (not left incomplete by a killed run).
        forced: this run was asked to run it (``--forcerun``, ``--forceall``, ``--force``).
        upstream: keys of the planned jobs it takes inputs from.
    """

    key: str
    rule: str
    label: str
    existing: list[str] = field(default_factory=list)
    forced: bool = False
    upstream: list[str] = field(default_factory=list)


def unintended_replacements(jobs: Sequence[PlannedJob]) -> list[PlannedJob]:
    """The jobs of :data:`GUARDED_RULES` that would replace existing outputs although neither they nor
    a job upstream of them were forced by this run."""
    by_key = {j.key: j for j in jobs}
    intended: dict[str, bool] = {}
    for job in jobs:  # iteratively (a deep DAG must not hit the recursion limit)
        todo = [job.key]
        while todo:
            key = todo[-1]
            if key in intended:
                todo.pop()
                continue
            current = by_key[key]
            pending = [u for u in current.upstream if u in by_key and u not in intended]
            if pending:
                todo.extend(pending)
                continue
            intended[key] = current.forced or any(intended.get(u, False) for u in current.upstream)
            todo.pop()
    return [j for j in jobs if j.rule in GUARDED_RULES and j.existing and not intended[j.key]]


def guard_message(blocked: Sequence[PlannedJob], *, shown: int = 12) -> str:
    """Why the run stops, what it would replace, and the command that replaces them on purpose."""
    lines = [
        f"this run would replace {len(blocked)} expensive result(s) that exist, because something they "
        "depend on changed (see the `reason:` lines of `snakemake -n`); it replaces none without being "
        "asked to:"
    ]
    for job in blocked[:shown]:
        lines.append(f"  {job.label}: {', '.join(job.existing)}")
    if len(blocked) > shown:
        lines.append(f"  ... and {len(blocked) - shown} more")
    outputs = " ".join(job.existing[0] for job in blocked)
    lines.append(
        "To recompute them on purpose: spader rerun "
        f"{outputs} -- <your snakemake options and targets>; to keep them, undo the change "
        "(docs/running.md#recomputing-on-purpose)"
    )
    return "\n".join(lines)


def training_workdir(final_json: str | os.PathLike) -> Path | None:
    """The work directory of the training whose record is ``final_json``
    (``results/<b>/train/<v>/final.json`` -> ``.../work``, as rule train_policy's ``workdir``)."""
    path = Path(final_json)
    if path.name != "final.json" or path.parent.parent.name != "train":
        return None
    return path.parent / "work"


def move_workdir_aside(final_json: str | os.PathLike, *, stamp: str | None = None) -> Path | None:
    """Move the training's work directory (its checkpoints) to ``work.replaced-<stamp>``, so that the
    training starts from scratch. Returns where it went (None: there was none).

    Raises:
        ValueError: ``final_json`` is no training record, or a training job holds the directory.
    """
    workdir = training_workdir(final_json)
    if workdir is None:
        raise ValueError(
            f"{final_json} is not a training record (results/<backbone>/train/<variant>/final.json); "
            "--from-scratch applies to those"
        )
    if not workdir.exists():
        return None
    if (workdir / "trainer.lock").exists():
        raise ValueError(
            f"{workdir / 'trainer.lock'} exists: a training job holds {workdir} (or one died holding it: "
            "delete the lock once no job runs)"
        )
    target = workdir.with_name(f"work.replaced-{stamp or time.strftime('%Y%m%d-%H%M%S')}")
    workdir.rename(target)
    return target


def snakemake_command(outputs: Sequence[str], snakemake_args: Sequence[str]) -> list[str]:
    """``snakemake <args> --forcerun <outputs>`` (``--forcerun`` last: it takes every word after it)."""
    return [sys.executable, "-m", "snakemake", *snakemake_args, "--forcerun", *outputs]


def _working_directory(snakemake_args: Sequence[str]) -> Path:
    """The directory snakemake runs in: its ``-d``/``--directory``, else the current one."""
    for i, arg in enumerate(snakemake_args):
        if arg in ("-d", "--directory") and i + 1 < len(snakemake_args):
            return Path(snakemake_args[i + 1]).resolve()
        if arg.startswith("--directory="):
            return Path(arg.split("=", 1)[1]).resolve()
    return Path.cwd().resolve()


def as_target(output: str, workdir: str | os.PathLike) -> str:
    """``output`` as Snakemake names it, relative to its working directory ``workdir`` (a rule's
    name as it is): an absolute path inside ``workdir``, or one with ``./`` or ``..`` in it, made
    relative and normal; a path outside ``workdir`` is an error naming both.

    >>> as_target("/repo/results/q/f1.tsv", "/repo"), as_target("./results//q/f1.tsv", "/repo")
    ('results/q/f1.tsv', 'results/q/f1.tsv')
    >>> as_target("train_policy", "/repo")
    'train_policy'
    """
    if not os.path.isabs(output) and "/" not in output:
        return output
    workdir = Path(workdir)
    path = Path(os.path.normpath(output if os.path.isabs(output) else workdir / output))
    for base, candidate in ((workdir, path), (workdir.resolve(), path.resolve())):
        try:
            return str(candidate.relative_to(base))
        except ValueError:
            continue
    raise ValueError(
        f"{output} is outside the directory the workflow runs in ({workdir}); name an output under it"
    )


def rerun(
    outputs: Sequence[str],
    snakemake_args: Sequence[str] = (),
    *,
    from_scratch: bool = False,
    run=None,
) -> int:
    """Recompute ``outputs`` (files or rule names) and what depends on them, on purpose.

    Args:
        outputs: what to recompute (``--forcerun`` values).
        snakemake_args: options and targets for ``snakemake`` (``--profile slurm``, ``--cores 8``,
            ``-n``, targets; default target: the workflow's ``all``).
        from_scratch: training records retrain from step 0 (their work directories moved aside;
            not in a dry run).
        run: runs the command, returns its exit status (default :func:`subprocess.call`).
    Returns:
        snakemake's exit status.
    """
    if not outputs:
        raise ValueError("name at least one output (or rule) to recompute")
    workdir = _working_directory(snakemake_args)
    outputs = [as_target(o, workdir) for o in outputs]
    dry = any(a in _DRY_RUN for a in snakemake_args)
    if from_scratch:
        workdirs = {o: training_workdir(o) for o in outputs}
        not_training = [o for o, w in workdirs.items() if w is None]
        if not_training:
            raise ValueError(
                f"--from-scratch applies to training records (results/<backbone>/train/<variant>/"
                f"final.json), not to {', '.join(not_training)}"
            )
        for output in outputs:
            if dry:
                log.info("dry run: %s would be moved aside (training from scratch)", workdirs[output])
                continue
            moved = move_workdir_aside(workdir / output)
            if moved is not None:
                log.info("moved %s to %s: the training starts from scratch", workdirs[output], moved)
    command = snakemake_command(outputs, snakemake_args)
    log.info("%s", " ".join(command))
    return (run or subprocess.call)(command)


HELP = "recompute expensive outputs on purpose, and everything that depends on them (snakemake --forcerun)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from-scratch",
        action="store_true",
        help="training records: move the work directory (checkpoints) aside and train from step 0",
    )
    parser.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="OUTPUT... [-- SNAKEMAKE OPTIONS...]",
        help="output files (or rule names) to recompute; options after `--` go to snakemake",
    )


def run(ns: argparse.Namespace) -> int:
    args = list(ns.args)
    ours, theirs = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    from_scratch = ns.from_scratch or "--from-scratch" in ours
    outputs = [a for a in ours if a != "--from-scratch"]
    if not outputs:
        raise ValueError("name at least one output (or rule) to recompute")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return rerun(outputs, theirs, from_scratch=from_scratch)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m spader.infra.replace_guard OUTPUT... [--from-scratch] [-- SNAKEMAKE OPTIONS...]``
    (an alias of ``spader rerun``)."""
    parser = argparse.ArgumentParser(prog="python -m spader.infra.replace_guard", description=HELP)
    add_arguments(parser)
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return run(ns)
    except ValueError as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
