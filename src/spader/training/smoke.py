"""GPU smoke test: two verl steps of the SPADER variant on one GPU, with sglang, at the paper's
response length, against the demo corpus.

Validates a GPU install (the ``gpu`` extra: verl + sglang) in minutes. It builds the same
:class:`~spader.training.run.TrainJob` as rule ``train_policy`` from the demo config and runs it
through the same :func:`~spader.training.run.run_training` (preflight with the memory plan,
retrieval service, composed verl command, checkpoints, final.json); :data:`SMOKE_TRAINING`,
:data:`SMOKE_AGENT` and :data:`SMOKE_OVERRIDES` shrink the run and put it on the GPU whatever
the demo config says (it trains on the CPU with the transformers rollout replica):
``training.device: cuda``, ``training.rollout_backend: sglang`` and the paper config's
``training.max_response_length`` (8,192 tokens).

Every response runs to that length: the policy is the demo's tiny Qwen3 rebuilt by
:func:`build_smoke_policy` so that it repeats the last token of its prompt and never writes an
end-of-turn token or a stop tag. Each episode is then one turn of the whole response budget, and
every training micro-batch is a full-length one (prompt + 8,192 tokens, padded): the log-prob,
reference and update passes, the fused log-prob kernel and sglang's KV cache run at the paper's
length (with a tiny model's memory, so the 8B memory plan is checked by
``python -m spader.training.plan`` and the calibration script instead). ``scripts/gpu_smoke.sh``
runs::

    python -m spader.training.smoke --prepare --out results/gpu_smoke  # inputs via Snakemake, then train

``--prepare`` first builds the inputs with the workflow's own CPU rules (demo data in verl's
format, the demo corpus's BM25 index, the tiny models); ``--dry-run`` prints the composed
command (checked by Hydra and verl's config validation), the settings it resolves to (device,
rollout backend, lengths, attention, FSDP strategy, fused log-probs, stop tags, seeds...) and what
the run will check, instead of training.
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
from spader.config.command import add_config_arguments, config_files, configured, repository, run_command

log = logging.getLogger(__name__)

__all__ = [
    "SMOKE_AGENT",
    "SMOKE_OVERRIDES",
    "SMOKE_TRAINING",
    "build_smoke_policy",
    "load_config",
    "main",
    "paper_response_length",
    "prepare_command",
    "smoke_inputs",
    "smoke_job",
]

# config["training"] values for a run on one GPU with sglang that takes two steps; the response
# length is the paper config's (paper_response_length), not the demo's.
SMOKE_TRAINING = {
    "device": "cuda",
    "rollout_backend": "sglang",
    "max_steps": None,
    "epochs": 1,
    "train_batch_size": 2,
    "ppo_mini_batch_size": 2,
    "ppo_micro_batch_size_per_gpu": 1,
    "rollout_n": 2,
    "max_prompt_length": 2048,
    "gpu_memory_utilization": 0.3,
    "save_freq": 1,
    "test_freq": 2,
}

# config["agent"] values: no per-turn cap, so the one turn of an episode may use the whole response
# budget (the stop tags and the rest as configured).
SMOKE_AGENT = {"max_turns": 2, "max_turn_tokens": None}

#: The paper setup, whose response length the smoke run trains at.
PAPER_CONFIG = "config/config.yaml"

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


def paper_response_length(root: str | os.PathLike = ".") -> int:
    """``training.max_response_length`` of the paper config (:data:`PAPER_CONFIG`)."""
    config = load_workflow_config(Path(root) / PAPER_CONFIG, verl_config_dir=Path(root) / "config" / "verl")
    return int(config.training.max_response_length)


def build_smoke_policy(tiny_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A copy of the tiny Qwen3 at ``tiny_dir`` that never ends its turn, saved to ``out``.

    Its decoder layers write nothing into the residual stream (attention and MLP output
    projections zeroed) and its token embeddings have unit variance, so the last hidden state of
    a position is its token's embedding and the largest logit, by about 80 over a vocabulary of
    ~2,000 at temperature 1, is that same token: the model repeats the last token of its prompt,
    never an end-of-turn token or a stop tag, until the response budget is spent. The output
    projection is untied from the embedding (a copy), so FSDP2 shards it as a unit of its own, as
    it does for Qwen3-8B and Llama-3.1-8B. Gradients still flow through every weight.

    Returns:
        ``out``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    embeddings = model.get_input_embeddings().weight
    with torch.no_grad():
        embeddings.copy_(torch.randn(embeddings.shape, generator=torch.Generator().manual_seed(0)))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(embeddings.detach().clone())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("TINY_MODEL.json",):
        if (Path(tiny_dir) / name).is_file():
            (out / name).write_text((Path(tiny_dir) / name).read_text())
    log.info("smoke policy (repeats its prompt's last token, never stops) saved to %s", out)
    return out


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
    """The smoke test's :class:`~spader.training.run.TrainJob` (variant ``spader``, 1 GPU, sglang,
    the paper's response length, the smoke policy of :func:`build_smoke_policy` in ``out/policy``).

    Args:
        config: the demo config (:func:`load_config` of config.yaml + demo.yaml).
        out: output directory (work directory, final.json, the smoke policy).
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
        training={**config["training"], **SMOKE_TRAINING, "max_response_length": paper_response_length(root)},
        agent={**config["agent"], **SMOKE_AGENT},
        retrieval=retrieval,
        train_file=root / "results" / suite / "data" / "verl" / "train.parquet",
        val_file=root / "results" / suite / "data" / "verl" / "val.parquet",
        index_dir=root / "results" / suite / "index" / "bm25",
        model_dir=out / "policy",
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


HELP = "GPU smoke test: two verl steps of SPADER on one GPU with sglang at the paper's response length"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results/gpu_smoke", help="output directory (default: %(default)s)")
    add_config_arguments(parser, overlays=["config/demo.yaml"])
    parser.add_argument(
        "--prepare", action="store_true", help="first build the inputs with Snakemake (CPU rules)"
    )
    parser.add_argument("--cores", type=int, default=4, help="cores for --prepare (default: %(default)s)")
    parser.add_argument(
        "--dry-run", action="store_true", help="compose and check the verl command, print it, stop"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spader.training.smoke`` (an alias of ``spader smoke``)."""
    return run_command("python -m spader.training.smoke", add_arguments, run, argv, description=HELP)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    root = repository(args)
    config = configured(args).model_dump(mode="json")
    if args.prepare:
        overlays = [str(p) for p in config_files(args)[1:]]  # snakemake reads config/config.yaml itself
        cmd = prepare_command(config, overlays, args.cores)
        log.info("building the inputs: %s", " ".join(cmd))
        subprocess.run(cmd, cwd=root, check=True)
    job = smoke_job(config, args.out, root=root)
    tiny = Path(_tiny_dir("tiny:qwen3", root))
    if (tiny / "config.json").is_file() and not (job.model_dir / "config.json").is_file():
        build_smoke_policy(tiny, job.model_dir)
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
        # the command, what it resolves to (device, rollout, lengths, model loading, the agent's
        # turn) and what the run checks
        printed = {**plan.to_json(), "resolved": gpu_path_settings(cfg), "checks": checks(job, cfg)}
        print(json.dumps(printed, indent=2))  # noqa: T201
        return 0

    from spader.training.run import run_training

    final = run_training(job)
    print(json.dumps({k: final[k] for k in ("steps_done", "checkpoint", "metrics")}, indent=2))  # noqa: T201
    return 0


def checks(job, cfg) -> dict[str, Any]:
    """What a run of the smoke job exercises, as the dry run states it."""
    data, rollout = cfg.data, cfg.actor_rollout_ref.rollout
    micro = int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)
    out: dict[str, Any] = {
        "device": f"trainer.device={cfg.trainer.device}: verl trains on the GPU",
        "rollout": f"actor_rollout_ref.rollout.name={rollout.name}: sglang generates the rollouts",
        "lengths": (
            f"max_prompt_length={data.max_prompt_length}, max_response_length={data.max_response_length} "
            "(the paper config's response length)"
        ),
        "full_length_micro_batch": (
            f"every response runs to {data.max_response_length} tokens (the smoke policy never ends a turn), "
            f"so each micro-batch of {micro} holds up to {micro * (data.max_prompt_length + data.max_response_length)} "
            "padded tokens through the log-prob, reference and update passes"
        ),
    }
    if (Path(job.model_dir) / "config.json").is_file():
        from spader.training.preflight import check_job_memory

        try:
            out["memory_plan"] = [line for j in check_job_memory(job, cfg) for line in j.lines()]
        except Exception as exc:  # noqa: BLE001  (the dry run reports it; the run's preflight refuses)
            out["memory_plan"] = str(exc).splitlines()
    else:
        out["memory_plan"] = f"built at the run, from {job.model_dir} (prepare the inputs first)"
    return out


if __name__ == "__main__":
    raise SystemExit(main())
