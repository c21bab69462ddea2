"""One training step at the paper's shape, the first hour's last step on a GPU node: SPADER on
Qwen3-8B (``backbones.qwen3_8b`` of the paper config, its weights where the workflow downloads
them), on every visible GPU, with rollout tensor parallelism 2 and the paper's batch, lengths and
turns, through the same :func:`~spader.training.run.run_training` as rule ``train_policy``.

The job measures itself against its plan (:mod:`spader.training.measure`): its ``final.json``
holds the measured and planned step time, phases, GPU and host peaks and checkpoint size, which
this command prints side by side, exiting 1 when the measurement exceeds the plan by
``training.over_plan_factor``. Where the weights, the training data or the index are not there
yet, the step is skipped with one line naming what is missing. ``--dry-run`` prints the composed
command, the settings it resolves to and the plan of its launch instead (a machine without GPUs
can run it)::

    python -m spader.training.paper_step [--dry-run] [--gpus N] [--out results/gpu_first_hour/paper_step]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spader.config.command import add_config_arguments, configured, repository, run_command

__all__ = ["PAPER_BACKBONE", "PAPER_STEP_OVERRIDES", "main", "missing_inputs", "paper_step_job"]

log = logging.getLogger(__name__)

#: The paper's backbone the step trains.
PAPER_BACKBONE = "qwen3_8b"
#: One step, rollout tensor parallelism 2, no validation.
PAPER_STEP_OVERRIDES = (
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
)


def _hub_dir(root: Path, repo_id: str) -> Path:
    from spader.config.checks import hub_slug

    return root / "resources" / "models" / "hub" / hub_slug(repo_id)


def paper_step_job(config: Mapping[str, Any], out: str | os.PathLike, *, root: str | os.PathLike, gpus: int,
                   threads: int | None = None):  # fmt: skip
    """The step's :class:`~spader.training.run.TrainJob` (the paper config's SPADER on Qwen3-8B)."""
    from spader.training.run import TrainJob

    root, out = Path(os.path.abspath(root)), Path(out)
    suite = config["suite"]
    retrieval = json.loads(json.dumps(config["retrieval"]))
    reranker = retrieval.get("reranker") or {}
    if reranker.get("model"):
        reranker["path"] = str(_hub_dir(root, reranker["model"]))
    spec = {**config["backbones"][PAPER_BACKBONE], "gpus": int(gpus)}
    data = root / "results" / suite / "data" / "verl"
    return TrainJob(
        backbone="paper_step",
        variant="spader",
        backbone_spec=spec,
        variant_spec=dict(config["variants"]["spader"]),
        training={**config["training"], "max_steps": 1, "val_before_train": False},
        agent=dict(config["agent"]),
        retrieval=retrieval,
        train_file=data / "train.parquet",
        val_file=data / "val.parquet",
        index_dir=root / "results" / suite / "index" / "bm25",
        model_dir=_hub_dir(root, spec["model"]),
        verl_config_dir=root / "config" / "verl",
        workdir=out / "work",
        final_json=out / "final.json",
        threads=threads or os.cpu_count() or 1,
        extra_overrides=PAPER_STEP_OVERRIDES,
        hardware=config.get("hardware"),
    )


def missing_inputs(job) -> list[str]:
    """What the step needs and this checkout lacks (one line each, with the target that builds it)."""
    out = []
    if not (Path(job.model_dir) / "config.json").is_file():
        out.append(f"the weights of {job.backbone_spec.model} at {job.model_dir} (snakemake {job.model_dir})")
    for path in (job.train_file, job.val_file):
        if not Path(path).is_file():
            out.append(f"the training data {path} (snakemake {path})")
    if not Path(job.index_dir).is_dir():
        out.append(f"the index {job.index_dir} (snakemake {job.index_dir})")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results/gpu_first_hour/paper_step", help="output directory")
    add_config_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="compose the command and plan it, print, stop")
    parser.add_argument(
        "--gpus", type=int, default=None, help="GPUs (default: every visible one; 8 in a dry run)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spader.training.paper_step``."""
    return run_command("python -m spader.training.paper_step", add_arguments, run, argv, description=__doc__)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from spader.training.preflight import gpu_count

    root = repository(args)
    config = configured(args).model_dump(mode="json")
    gpus = args.gpus or (int(config["backbones"][PAPER_BACKBONE]["gpus"]) if args.dry_run else gpu_count())
    job = paper_step_job(config, args.out, root=root, gpus=gpus)
    if args.dry_run:
        print(json.dumps(dry_run(job), indent=2))  # noqa: T201
        return 0
    missing = missing_inputs(job)
    if missing:
        print(f"paper step: skipped, this checkout lacks {'; '.join(missing)}")  # noqa: T201
        return 0
    from spader.training.measure import over_plan
    from spader.training.run import run_training

    final = run_training(job)
    measured, planned = final["measured"], final["planned"]
    for key in ("step_seconds", "checkpoint_gib", "peak_gpu_gib", "peak_host_gib"):
        print(f"{key}: measured {measured.get(key)}, planned {planned.get(key)}")  # noqa: T201
    for name, seconds in sorted((measured.get("phase_seconds") or {}).items()):
        print(f"phase {name}: measured {seconds:.1f} s, planned {planned['phase_seconds'].get(name)}")  # noqa: T201
    over = over_plan(measured, planned, float(job.training.over_plan_factor))
    for line in over:
        print(f"OVER PLAN  {line}")  # noqa: T201
    return 1 if over else 0


def dry_run(job) -> dict[str, Any]:
    """The composed command, what it resolves to, the plan of its launch and what is missing."""
    from spader.integrations.verl.compose import gpu_path_settings
    from spader.training.checkpoints import new_metrics_file
    from spader.training.launch import compose_config
    from spader.training.lineage import RunLink
    from spader.training.measure import planned_section
    from spader.training.preflight import check_job_memory
    from spader.training.run import plan_launch

    plan = plan_launch(
        job, resume_from=None, metrics_file=new_metrics_file(job.metrics_dir), link=RunLink(None, None)
    )
    cfg = compose_config(plan)
    try:
        planned = check_job_memory(job, cfg)
        section: Any = planned_section(planned[0] if planned else None, device=job.device)
    except Exception as exc:  # noqa: BLE001  (the dry run reports it; the run's preflight refuses)
        section = str(exc).splitlines()
    return {
        **plan.to_json(),
        "resolved": gpu_path_settings(cfg),
        "planned": section,
        "missing": missing_inputs(job),
    }


if __name__ == "__main__":
    raise SystemExit(main())
