"""The first hour on a GPU node, as one command: preflight, plan, calibration, smoke test, one step at
the paper's shape, in order, stopping at the first failure (``spader first-hour``, which
``scripts/gpu_first_hour.sh`` runs with the project's environment; docs/gpu.md, "The first hour").

Each :class:`HourStep` is a command of the project run as its own process from the repository root,
with what it prints when it passes and how long it takes. ``--cpu`` runs the steps a machine
without GPUs can run on its CPU path (the preflight's CPU checks, the plan, the smoke test's dry
run, the paper step's dry run) and skips the GPU-only ones with a line that says so. Every step runs this interpreter
(``scripts/gpu_first_hour.sh`` starts it with the project's ``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HELP", "STEPS", "HourStep", "add_arguments", "main", "run", "run_steps", "steps"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HourStep:
    """One command of the first hour.

    Attributes:
        name: short name.
        argv: the command on a GPU node (``{python}`` is this interpreter; ``{python} -m spader.cli``
            is the ``spader`` command, as docs/gpu.md writes it).
        cpu_argv: the command with ``--cpu`` (None: the step is GPU-only and skipped).
        expect: what it prints when it passes.
        duration: how long it takes on a GPU node.
    """

    name: str
    argv: tuple[str, ...]
    cpu_argv: tuple[str, ...] | None
    expect: str
    duration: str


#: The steps, in order (docs/gpu.md lists the same commands).
STEPS = (
    HourStep(
        "preflight",
        ("{python}", "-m", "spader.cli", "preflight", "{configfiles}"),
        ("{python}", "-m", "spader.cli", "preflight", "{configfiles}", "--cpu"),
        "one `ok` line each for Python, glibc (2.34+, the manylinux_2_34 wheel tag), the driver (580+), the "
        "GPUs and their memory against the plan's peak, nvcc (CUDA 13), host memory, disk and /dev/shm against "
        "the plan and `hardware`, verl and sglang",
        "seconds",
    ),
    HourStep(
        "plan",
        ("{python}", "-m", "spader.cli", "plan", "{configfiles}"),
        ("{python}", "-m", "spader.cli", "plan", "{configfiles}"),
        "every job's GPU memory, time per step and run, host memory and disk on the node of `hardware`; "
        "exit 0 when all fit",
        "under a minute",
    ),
    HourStep(
        "calibration",
        ("{python}", "scripts/gpu_memory_calibration.py", "--out", "results/calibration/gpu_memory.yaml"),
        None,
        "the measured activation and log-prob constants per backbone, written to "
        "results/calibration/gpu_memory.yaml (set hardware.calibration to it and rerun the plan)",
        "5-10 minutes",
    ),
    HourStep(
        "smoke",
        ("bash", "scripts/gpu_smoke.sh"),
        ("bash", "scripts/gpu_smoke.sh", "--dry-run"),
        "the inputs built by the CPU rules, two training steps with sglang, then `ok` for steps, searches, "
        "turns ending at a closing tag, rewards that differ, advantages, rollout seeds and changed weights",
        "15-25 minutes (the warm start on the CPU about 3, the training a few)",
    ),
    HourStep(
        "paper step",
        ("{python}", "-m", "spader.training.paper_step", "{configfiles}"),
        ("{python}", "-m", "spader.training.paper_step", "{configfiles}", "--dry-run"),
        "one SPADER step on Qwen3-8B at the paper's shape (every visible GPU, rollout TP 2): its measured "
        "step seconds, phases, GPU and host peaks and checkpoint beside the plan's, exit 1 when over the plan "
        "by training.over_plan_factor; skipped with one line where the weights, data or index are not there yet",
        "15-30 minutes (loading Qwen3-8B, one step of the paper's batch, its checkpoint)",
    ),
)


def steps(
    *, cpu: bool, configfiles: Sequence[str], python: str = sys.executable
) -> list[tuple[HourStep, list[str] | None]]:
    """Each step with the command it runs here (None: skipped, GPU-only)."""
    out = []
    for step in STEPS:
        template = step.cpu_argv if cpu else step.argv
        if template is None:
            out.append((step, None))
            continue
        argv: list[str] = []
        for word in template:
            if word == "{configfiles}":
                for c in configfiles:
                    argv += ["--configfile", c]
            else:
                argv.append(word.replace("{python}", python))
        out.append((step, argv))
    return out


def run_steps(
    planned: Sequence[tuple[HourStep, list[str] | None]], *, root: str | Path = ".", echo=print
) -> int:
    """Run the steps in order from ``root``; stop at the first that fails. Returns the exit code."""
    for i, (step, argv) in enumerate(planned, 1):
        head = f"== step {i}/{len(planned)}: {step.name}"
        if argv is None:
            echo(f"{head}: skipped (GPU-only; run on a GPU node without --cpu)")
            continue
        echo(f"{head}: {shlex.join(argv)}")
        echo(f"   expect: {step.expect} ({step.duration})")
        start = time.monotonic()
        # the smoke test's script runs the same interpreter (its PYTHON)
        env = {**os.environ, "PYTHON": sys.executable}
        rc = subprocess.run(argv, cwd=root, env=env, check=False).returncode
        took = time.monotonic() - start
        if rc != 0:
            rest = [s.name for s, _ in planned[i:]]
            echo(
                f"== FAILED at step {i}/{len(planned)}: {step.name} (exit {rc}, {took:.0f} s); "
                f"not run: {', '.join(rest) if rest else 'none'}"
            )
            return 1
        echo(f"== step {i}/{len(planned)}: {step.name} passed ({took:.0f} s)")
    echo("== first hour: every step passed")
    return 0


HELP = (
    "the first hour on a GPU node: preflight, plan, calibration, smoke test, in order, stopping at the "
    "first failure (--cpu: the steps a machine without GPUs can run)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``spader first-hour`` (``scripts/gpu_first_hour.sh``, ``python -m spader.training.first_hour``):
    ``--cpu``, ``--root``, ``--configfile``."""
    parser.add_argument("--cpu", action="store_true", help="a machine without GPUs: skip the GPU-only steps")
    parser.add_argument("--root", default=".", help="repository root (default: the current directory)")
    parser.add_argument(
        "--configfile",
        action="append",
        help="the paper config the plan reads, later files overlaying earlier ones (default: config/config.yaml)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the steps; exit 1 at the first that fails."""
    planned = steps(cpu=args.cpu, configfiles=args.configfile or ["config/config.yaml"])
    return run_steps(planned, root=args.root, echo=lambda line: print(line, flush=True))  # noqa: T201


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/gpu_first_hour.sh`` and ``python -m spader.training.first_hour`` (aliases of
    ``spader first-hour``)."""
    parser = argparse.ArgumentParser(prog="scripts/gpu_first_hour.sh", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
