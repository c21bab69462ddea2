"""GPU smoke test: two verl steps of the SPADER variant with a tiny random Qwen3 on the demo corpus.

Validates a GPU install (the ``gpu`` extra: verl + sglang) in minutes. It builds the same
:class:`~spader.training.run.TrainJob` as rule ``train_policy`` from the demo config and runs it
through the same :func:`~spader.training.run.run_training` (preflight, retrieval service,
composed verl command, checkpoints, final.json); only :data:`SMOKE_TRAINING` and
:data:`SMOKE_OVERRIDES` shrink the run. ``scripts/gpu_smoke.sh`` runs::

    python -m spader.training.smoke --prepare --out results/gpu_smoke  # inputs via Snakemake, then train

``--prepare`` first builds the inputs with the workflow's own CPU rules (demo data in verl's
format, the demo corpus's BM25 index, the tiny models); ``--dry-run`` prints the composed
command (checked by Hydra and verl's config validation) and the settings it resolves to for model
loading and the agent's turn (attention, FSDP strategy, stop tags, per-turn cap...) instead of
training.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spader.config import load_config as load_workflow_config

log = logging.getLogger(__name__)

__all__ = [
    "SMOKE_AGENT",
    "SMOKE_OVERRIDES",
    "SMOKE_TRAINING",
    "load_config",
    "main",
    "prepare_command",
    "smoke_inputs",
    "smoke_job",
]

# config["training"] values for a run that fits one GPU and takes two short steps.
SMOKE_TRAINING = {
    "epochs": 1,
    "train_batch_size": 2,
    "ppo_mini_batch_size": 2,
    "ppo_micro_batch_size_per_gpu": 1,
    "rollout_n": 2,
    "max_prompt_length": 2048,
    "max_response_length": 256,
    "gpu_memory_utilization": 0.3,
    "save_freq": 1,
    "test_freq": 2,
}

# config["agent"] values: two short turns (the stop tags and the rest as configured).
SMOKE_AGENT = {"max_turns": 2, "max_turn_tokens": 64}

# verl keys with no config counterpart: stop after 2 steps, one GPU, few workers, few samples.
SMOKE_OVERRIDES = (
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "data.train_max_samples=4",
    "data.val_max_samples=2",
    "data.dataloader_num_workers=0",
    "data.filter_overlong_prompts=true",
)


def load_config(paths: Sequence[str | os.PathLike], root: str | os.PathLike = ".") -> dict:
    """Load and check the workflow config (later files overlay earlier ones); ``root`` is the
    repository root (schema and verl YAMLs)."""
    return load_workflow_config(*paths, verl_config_dir=Path(root) / "config" / "verl").model_dump(
        mode="json"
    )


def _tiny_dir(name: str | None, root: Path) -> str | None:
    if name is None or name == "none":
        return None
    if not name.startswith("tiny:"):
        raise ValueError(f"the GPU smoke test runs the demo setup with tiny models; got model {name!r}")
    return str(root / "results" / "models" / "tiny" / name.split(":", 1)[1])


def smoke_job(
    config: Mapping[str, Any],
    out: str | os.PathLike,
    *,
    root: str | os.PathLike = ".",
    threads: int | None = None,
):
    """The smoke test's :class:`~spader.training.run.TrainJob` (variant ``spader``, 1 GPU).

    Args:
        config: the demo config (:func:`load_config` of config.yaml + demo.yaml).
        out: output directory (work directory, final.json).
        root: repository root holding results/ and config/verl.
        threads: CPUs for Ray (default: all of this machine's).
    """
    from spader.training.run import TrainJob

    root = Path(os.path.abspath(root))
    suite = config["suite"]
    retrieval = copy.deepcopy(dict(config["retrieval"]))
    reranker = dict(retrieval["reranker"])
    reranker_dir = _tiny_dir(reranker["model"], root)
    if reranker_dir:
        reranker["path"] = reranker_dir
    retrieval["reranker"] = reranker
    out = Path(out)
    return TrainJob(
        backbone="smoke",
        variant="spader",
        backbone_spec={"model": "tiny:qwen3", "gpus": 1, "variants": ["spader"], "prompting": []},
        variant_spec=dict(config["variants"]["spader"]),
        training={**config["training"], **SMOKE_TRAINING},
        agent={**config["agent"], **SMOKE_AGENT},
        retrieval=retrieval,
        train_file=root / "results" / suite / "data" / "verl" / "train.parquet",
        val_file=root / "results" / suite / "data" / "verl" / "val.parquet",
        index_dir=root / "results" / suite / "index" / "bm25",
        model_dir=Path(_tiny_dir("tiny:qwen3", root)),
        verl_config_dir=root / "config" / "verl",
        workdir=out / "work",
        final_json=out / "final.json",
        threads=threads or os.cpu_count() or 1,
        extra_overrides=SMOKE_OVERRIDES,
    )


def smoke_inputs(config: Mapping[str, Any]) -> list[str]:
    """The workflow targets the smoke run reads: demo data in verl's format, the BM25 index of the
    demo corpus, the tiny policy (and the tiny reranker when the demo reranks)."""
    suite = config["suite"]
    targets = [
        f"results/{suite}/data/verl/train.parquet",
        f"results/{suite}/data/verl/val.parquet",
        f"results/{suite}/index/bm25",
        "results/models/tiny/qwen3",
    ]
    if str(config["retrieval"]["reranker"]["model"]).startswith("tiny:"):
        targets.append("results/models/tiny/" + config["retrieval"]["reranker"]["model"].split(":", 1)[1])
    return targets


def prepare_command(
    config: Mapping[str, Any], configfiles: Sequence[str | os.PathLike], cores: int
) -> list[str]:
    """The Snakemake command that builds :func:`smoke_inputs` (CPU rules only)."""
    # targets first: --configfile takes every following word as a config file
    return [
        sys.executable,
        "-m",
        "snakemake",
        *smoke_inputs(config),
        "--cores",
        str(cores),
        "--configfile",
        *[str(c) for c in configfiles],
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spader.training.smoke", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", default="results/gpu_smoke", help="output directory (default: %(default)s)")
    parser.add_argument("--root", default=".", help="repository root (default: the current directory)")
    parser.add_argument(
        "--configfile",
        action="append",
        help="workflow config files, later ones overlaying earlier ones (default: config/config.yaml config/demo.yaml)",
    )
    parser.add_argument(
        "--prepare", action="store_true", help="first build the inputs with Snakemake (CPU rules)"
    )
    parser.add_argument("--cores", type=int, default=4, help="cores for --prepare (default: %(default)s)")
    parser.add_argument(
        "--dry-run", action="store_true", help="compose and check the verl command, print it, stop"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    root = Path(args.root)
    configfiles = args.configfile or ["config/config.yaml", "config/demo.yaml"]
    config = load_config([root / c for c in configfiles], root)
    if args.prepare:
        cmd = prepare_command(config, configfiles, args.cores)
        log.info("building the inputs: %s", " ".join(cmd))
        subprocess.run(cmd, cwd=root, check=True)
    job = smoke_job(config, args.out, root=root)
    if args.dry_run:
        from spader.training.checkpoints import latest_checkpoint, new_metrics_file
        from spader.training.launch import compose_config
        from spader.training.lineage import RunLink
        from spader.training.run import plan_launch

        plan = plan_launch(
            job,
            resume_from=latest_checkpoint(job.ckpt_dir),
            metrics_file=new_metrics_file(job.metrics_dir),
            link=RunLink(None, None),
        )
        from spader.integrations.verl.compose import gpu_path_settings

        cfg = compose_config(plan)
        # the command, and what it resolves to for model loading and the agent's turn
        print(json.dumps({**plan.to_json(), "resolved": gpu_path_settings(cfg)}, indent=2))  # noqa: T201
        return 0

    from spader.training.run import run_training

    final = run_training(job)
    print(json.dumps({k: final[k] for k in ("steps_done", "checkpoint", "metrics")}, indent=2))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
