"""GPU smoke test: two verl steps of the SPADER variant with sglang, with a policy that searches,
against the demo corpus; then the checks of what only a GPU run shows.

Validates a GPU install (the ``gpu`` extra: verl + sglang) in minutes. It builds the same
:class:`~spader.training.run.TrainJob` as rule ``train_policy`` from the demo config and runs it
through the same :func:`~spader.training.run.run_training` (preflight with the memory plan,
retrieval service, composed verl command, checkpoints, final.json); :data:`SMOKE_TRAINING` and
:data:`SMOKE_OVERRIDES` shrink the run and put it on the GPU whatever the demo config says (it
trains on the CPU with the transformers rollout replica): ``training.device: cuda``,
``training.rollout_backend: sglang``, the paper config's ``training.max_response_length`` as the
episode's budget, and the packed actor path (``training.remove_padding`` with a token cap;
then the padded one (``training.remove_padding: false``) in ``<out>/padded``; ``--padded`` or
``--packed-only`` runs one of them).

The policy is the demo's warm-started tiny Qwen3 (rule ``warmstart_policy``: it searches, reads
and answers in the agent's format, ending its turns on the closing tags), copied with its output
projection untied by :func:`build_smoke_policy`, so that FSDP2 shards it as a unit of its own as
for Qwen3-8B and Llama-3.1-8B. After the run, :func:`check_run` reads its per-step metrics and
checkpoint and requires, at every step: searches the service answered (entities found, no search
step the service failed; a malformed call of the policy is the policy's), turns that end at a closing tag and none that
sglang ran past (sglang stops at the stop strings itself), rewards that differ and non-zero
advantages, the seeds sglang's servers report (the training seed + each replica's rank); the
retrieval service's own count of failed queries at 0; and weights that changed. With two or more GPUs visible it trains on two (FSDP2's collectives over
NCCL, two sglang replicas with their own seeds). ``scripts/gpu_smoke.sh`` runs::

    python -m spader.training.smoke --prepare --out results/gpu_smoke  # inputs via Snakemake, train, check

``--prepare`` first builds the inputs with the workflow's own CPU rules (demo data in verl's
format, the demo corpus's BM25 index, the tiny models and the warm start); ``--dry-run`` prints
the composed command (checked by Hydra and verl's config validation), the settings it resolves to
(device, rollout backend, lengths, attention, FSDP strategy, fused log-probs, stop tags, seeds...)
and what the run will check, instead of training.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spader.config import load_config as load_workflow_config
from spader.config.command import add_config_arguments, config_files, configured, repository, run_command

log = logging.getLogger(__name__)

__all__ = [
    "SMOKE_AGENT",
    "SMOKE_OVERRIDES",
    "SMOKE_STEPS",
    "SMOKE_TRAINING",
    "SmokeCheck",
    "build_smoke_policy",
    "changed_weights",
    "check_run",
    "main",
    "paper_response_length",
    "prepare_command",
    "smoke_gpus",
    "smoke_inputs",
    "smoke_job",
    "warm_backbone",
    "warm_start_dir",
]

# config["training"] values for a run on the GPU with sglang that takes two steps; the response
# budget is the paper config's (paper_response_length), not the demo's. 16 trajectories a step
# (4 prompts x 4 rollouts) make a step without a search, or with equal rewards, unlikely.
SMOKE_TRAINING = {
    "device": "cuda",
    "rollout_backend": "sglang",
    "max_steps": None,
    "epochs": 1,
    "train_batch_size": 4,
    "ppo_mini_batch_size": 4,
    "ppo_micro_batch_size_per_gpu": 2,
    "rollout_n": 4,
    "max_prompt_length": 2048,
    "gpu_memory_utilization": 0.3,
    "save_freq": 1,
    "test_freq": 2,
    "remove_padding": True,
}

#: config["agent"] values of the smoke run: the demo's turn (its per-turn cap and stop tags).
SMOKE_AGENT: dict[str, Any] = {}

#: The paper setup, whose response length the smoke run trains at.
PAPER_CONFIG = "config/config.yaml"

#: Steps the smoke run trains (each checked).
SMOKE_STEPS = 2

# verl keys with no config counterpart: stop after 2 steps, few workers, few samples.
SMOKE_OVERRIDES = (
    f"trainer.total_training_steps={SMOKE_STEPS}",
    "trainer.val_before_train=false",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "data.train_max_samples=8",
    "data.val_max_samples=2",
    "data.dataloader_num_workers=0",
    "data.filter_overlong_prompts=true",
)


def paper_response_length(root: str | os.PathLike = ".") -> int:
    """``training.max_response_length`` of the paper config (:data:`PAPER_CONFIG`)."""
    config = load_workflow_config(Path(root) / PAPER_CONFIG, verl_config_dir=Path(root) / "config" / "verl")
    return int(config.training.max_response_length)


def build_smoke_policy(model_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A copy of the warm-started tiny Qwen3 at ``model_dir`` with its output projection untied
    (a copy of the embedding), saved to ``out``: the same function, but FSDP2 shards the head as a
    unit of its own, as it does for Qwen3-8B and Llama-3.1-8B (the plug-in's fused log-prob route).

    Returns:
        ``out``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    embeddings = model.get_input_embeddings().weight
    model.config.tie_word_embeddings = False
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(embeddings.detach().clone())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("TINY_MODEL.json",):
        if (Path(model_dir) / name).is_file():
            (out / name).write_text((Path(model_dir) / name).read_text())
    log.info("smoke policy (the warm start, head untied) saved to %s", out)
    return out


def _tiny_dir(name: str | None, root: Path) -> str | None:
    if name is None or name == "none":
        return None
    if not name.startswith("tiny:"):
        raise ValueError(f"the GPU smoke test runs the demo setup with tiny models; got model {name!r}")
    return str(root / "results" / "models" / "tiny" / name.split(":", 1)[1])


def warm_backbone(config: Mapping[str, Any]) -> str:
    """The demo backbone whose warm start the smoke run trains (the first with ``warmstart``)."""
    for name, spec in config["backbones"].items():
        if spec.get("warmstart"):
            return name
    raise ValueError(
        "the GPU smoke test trains the demo's warm-started policy, but no backbone of the config has "
        "backbones.<name>.warmstart (run it with config/demo.yaml)"
    )


def warm_start_dir(config: Mapping[str, Any], root: str | os.PathLike = ".") -> Path:
    """Where rule ``warmstart_policy`` writes the warm-started policy."""
    return Path(root) / "results" / warm_backbone(config) / "warmstart" / "model"


def _smoke_retrieval(config: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """The demo's retrieval section with its tiny reranker's directory under ``root``."""
    retrieval = copy.deepcopy(dict(config["retrieval"]))
    reranker = dict(retrieval["reranker"])
    reranker_dir = _tiny_dir(reranker["model"], root)
    if reranker_dir:
        reranker["path"] = reranker_dir
    retrieval["reranker"] = reranker
    return retrieval


def _smoke_training(config: Mapping[str, Any], root: Path, *, gpus: int, device: str, padded: bool
                    ) -> dict[str, Any]:  # fmt: skip
    """The smoke run's training section: the demo's with :data:`SMOKE_TRAINING`, the paper's response
    budget, the actor path and the device."""
    training = {**config["training"], **SMOKE_TRAINING, "max_response_length": paper_response_length(root)}
    if padded:
        training["remove_padding"] = False
    else:  # token-capped micro-batches: room for the two longest sequences
        training["max_token_len_per_gpu"] = 2 * (
            training["max_prompt_length"] + training["max_response_length"]
        )
    if device == "cpu":
        training.update(device="cpu", rollout_backend="transformers", cpu_workers=int(gpus))
    return training


def smoke_job(
    config: Mapping[str, Any],
    out: str | os.PathLike,
    *,
    root: str | os.PathLike = ".",
    threads: int | None = None,
    gpus: int = 1,
    device: str = "cuda",
    padded: bool = False,
):
    """The smoke test's :class:`~spader.training.run.TrainJob` (variant ``spader``, sglang, the
    paper's response budget, the policy of :func:`build_smoke_policy` in ``out/policy``).

    Args:
        config: the demo config (:func:`spader.config.resolved_config` of config.yaml + demo.yaml).
        out: output directory (work directory, final.json, the smoke policy).
        root: repository root holding results/ and config/verl.
        threads: CPUs for Ray (default: all of this machine's).
        gpus: GPUs (training workers, one sglang replica each) to train on.
        device: ``cuda`` (sglang) or ``cpu`` (the transformers replica, ``gpus`` FSDP ranks): the
            same job on the CPU path.
        padded: the padded actor path instead of the packed one.
    """
    from spader.training.run import TrainJob

    root = Path(os.path.abspath(root))
    suite = config["suite"]
    retrieval = _smoke_retrieval(config, root)
    out = Path(out)
    training = _smoke_training(config, root, gpus=gpus, device=device, padded=padded)
    return TrainJob(
        backbone="smoke",
        variant="spader",
        backbone_spec={"model": "tiny:qwen3", "gpus": int(gpus), "variants": ["spader"], "prompting": []},
        variant_spec=dict(config["variants"]["spader"]),
        training=training,
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
    demo corpus, the warm-started policy (and the tiny reranker when the demo reranks)."""
    suite = config["suite"]
    targets = [
        f"results/{suite}/data/verl/train.parquet",
        f"results/{suite}/data/verl/val.parquet",
        f"results/{suite}/index/bm25",
        f"results/{warm_backbone(config)}/warmstart/model",
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


def smoke_gpus(visible: int) -> int:
    """GPUs the smoke run trains on: two when two or more are visible (the collectives), else one."""
    return 2 if visible >= 2 else 1


HELP = "GPU smoke test: two verl steps of SPADER with sglang that search, on one GPU (two when visible)"


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
    parser.add_argument(
        "--padded",
        action="store_true",
        help="the padded actor path only (default: the packed, then the padded)",
    )
    parser.add_argument("--packed-only", action="store_true", help="the packed actor path only")
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs to train on (default: 2 when 2 or more are visible, else 1)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spader.training.smoke`` (an alias of ``spader smoke``)."""
    return run_command("python -m spader.training.smoke", add_arguments, run, argv, description=HELP)


def run(args: argparse.Namespace) -> int:
    from spader.training.preflight import gpu_count

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
    gpus = args.gpus or (1 if args.dry_run else smoke_gpus(gpu_count()))
    job = smoke_job(config, args.out, root=root, gpus=gpus, padded=args.padded)
    warm = warm_start_dir(config, root)
    if (warm / "config.json").is_file() and not (job.model_dir / "config.json").is_file():
        build_smoke_policy(warm, job.model_dir)
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

    failed = 0
    for padded, out in smoke_paths(args.out, padded=args.padded, packed_only=args.packed_only):
        path_job = (
            job if out == Path(args.out) else smoke_job(config, out, root=root, gpus=gpus, padded=padded)
        )
        if not (path_job.model_dir / "config.json").is_file():
            build_smoke_policy(warm, path_job.model_dir)
        failed += _train_and_check(path_job, gpus, "padded" if padded else "packed")
    return 1 if failed else 0


def smoke_paths(out: str | os.PathLike, *, padded: bool, packed_only: bool) -> list[tuple[bool, Path]]:
    """The actor paths a smoke run trains, each with its output directory: the packed one in
    ``out``, then the padded one in ``out/padded`` (``--padded``: the padded one alone, in ``out``;
    ``--packed-only``: the packed one alone)."""
    out = Path(out)
    if padded:
        return [(True, out)]
    return [(False, out)] if packed_only else [(False, out), (True, out / "padded")]


def _train_and_check(job, gpus: int, path: str) -> int:
    """Train the smoke ``job`` and print its checks; 1 when one fails."""
    from spader.training.run import run_training

    final = run_training(job)
    print(json.dumps({k: final[k] for k in ("steps_done", "checkpoint", "metrics")}, indent=2))  # noqa: T201
    results = check_run(job, start_model=job.model_dir, replicas=gpus)
    for result in results:
        print(result.line())  # noqa: T201
    failed = [r for r in results if not r.ok]
    print(f"smoke test, {path} path: {len(results) - len(failed)} of {len(results)} checks passed")  # noqa: T201
    return 1 if failed else 0


def checks(job, cfg) -> dict[str, Any]:
    """What a run of the smoke job exercises, as the dry run states it."""
    data, rollout = cfg.data, cfg.actor_rollout_ref.rollout
    actor = cfg.actor_rollout_ref.actor
    packed = bool(cfg.actor_rollout_ref.model.use_remove_padding)
    out: dict[str, Any] = {
        "device": f"trainer.device={cfg.trainer.device}: verl trains on the GPU",
        "rollout": f"actor_rollout_ref.rollout.name={rollout.name}: sglang generates the rollouts",
        "lengths": (
            f"max_prompt_length={data.max_prompt_length}, max_response_length={data.max_response_length} "
            "(the paper config's response length: an episode's budget)"
        ),
        "actor_path": (
            f"packed sequences (verl's remove-padding path, attention "
            f"{cfg.actor_rollout_ref.model.override_config.attn_implementation}), micro-batches of up to "
            f"{actor.ppo_max_token_len_per_gpu} tokens"
            if packed
            else f"padded micro-batches of {actor.ppo_micro_batch_size_per_gpu} sequences (sdpa with a mask)"
        ),
        "after_the_run": [
            f"steps 1..{SMOKE_STEPS} trained, and at each: searches the service answered (entities found, no "
            "search the service failed), turns ending at a closing tag, none that "
            "sglang ran past, rewards that differ, non-zero advantages, the seeds sglang reports "
            f"(training.seed + replica rank, {job.workers} replica(s))",
            "the retrieval service failed no query (its counters at its end)",
            "the last checkpoint's weights differ from the policy's",
        ],
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


@dataclass(frozen=True)
class SmokeCheck:
    """One check of a finished smoke run."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


def _per_step(steps: Mapping[int, Mapping[str, float]], name: str, what, describe) -> SmokeCheck:
    bad = {s: m for s, m in steps.items() if not what(m)}
    detail = "; ".join(f"step {s}: {describe(m)}" for s, m in sorted(steps.items()))
    return SmokeCheck(name, bool(steps) and not bad, detail or "no step logged")


def _value(m: Mapping[str, float], key: str) -> float:
    value = m.get(key)
    return math.nan if value is None else float(value)


def check_run(
    job, *, start_model: str | os.PathLike, replicas: int, steps: int = SMOKE_STEPS
) -> list[SmokeCheck]:
    """The smoke run's checks on its per-step metrics and its last checkpoint.

    Args:
        job: the finished :class:`~spader.training.run.TrainJob` (its metrics and checkpoints).
        start_model: the policy it started from (its weights are compared with the checkpoint's).
        replicas: rollout replicas (one per GPU): the seeds expected are ``training.seed`` + rank.
        steps: training steps the run took.
    Returns:
        One :class:`SmokeCheck` per property (see the module docstring).
    """
    from spader.training.checkpoints import read_step_metrics

    logged = {s: m for s, m in read_step_metrics(job.metrics_dir).items() if "critic/score/mean" in m}
    seed = int(job.training.seed)
    return [
        SmokeCheck(
            "steps",
            sorted(logged) == list(range(1, steps + 1)),
            f"steps logged {sorted(logged)}, expected 1..{steps}",
        ),
        *_metric_checks(logged, seed=seed, replicas=replicas),
        service_answered(job),
        changed_weights(job, start_model),
    ]


def service_answered(job) -> SmokeCheck:
    """The retrieval service's own counters at its end (kept next to its log): queries, none failed."""
    from spader.retrieval.service import stats_path

    path = stats_path(job.service_log)
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
        queries, failed = int(stats["queries"]), int(stats.get("failed_queries", 0))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return SmokeCheck(
            "service answered", False, f"no counters of the retrieval service in {path} ({exc})"
        )
    return SmokeCheck(
        "service answered", queries > 0 and failed == 0, f"{queries} queries, {failed} failed ({path.name})"
    )


def _metric_checks(
    logged: Mapping[int, Mapping[str, float]], *, seed: int, replicas: int
) -> list[SmokeCheck]:
    """The checks of :func:`check_run` on each logged step's metrics."""
    expected = (float(seed), float(seed + replicas - 1), float(replicas))
    return [
        _per_step(
            logged,
            "searches answered",
            lambda m: (
                _value(m, "episode/searches_answered") > 0
                and _value(m, "episode/search_errors") == 0  # the service's; call_errors are the policy's
                and _value(m, "episode/entities") > 0
            ),
            lambda m: (
                f"{_value(m, 'episode/searches_answered'):.2f} answered of {_value(m, 'episode/searches'):.2f} "
                f"per trajectory, {_value(m, 'episode/search_errors'):.0f} the service failed "
                f"({_value(m, 'episode/call_errors'):.0f} malformed call(s) of the policy), "
                f"{_value(m, 'episode/entities'):.2f} entities found"
            ),
        ),
        _per_step(
            logged,
            "turns end at a closing tag",
            lambda m: _value(m, "episode/turns_closed") > 0 and _value(m, "episode/turns_cut") == 0,
            lambda m: (
                f"{_value(m, 'episode/turns_closed'):.0%} closed, {_value(m, 'episode/turns_cut'):.0%} "
                "run past the tag by the engine"
            ),
        ),
        _per_step(
            logged,
            "rewards differ",
            lambda m: _value(m, "critic/score/max") > _value(m, "critic/score/min"),
            lambda m: f"{_value(m, 'critic/score/min'):.3f}..{_value(m, 'critic/score/max'):.3f}",
        ),
        _per_step(
            logged,
            "advantages",
            lambda m: _value(m, "episode/advantage_std") > 0,
            lambda m: f"std {_value(m, 'episode/advantage_std'):.4f}",
        ),
        _per_step(
            logged,
            "rollout seeds",
            lambda m: (
                (
                    _value(m, "episode/rollout_seed_min"),
                    _value(m, "episode/rollout_seed_max"),
                    _value(m, "episode/rollout_seeds"),
                )
                == expected
            ),
            lambda m: (
                f"{_value(m, 'episode/rollout_seeds'):.0f} seed(s) "
                f"{_value(m, 'episode/rollout_seed_min'):.0f}..{_value(m, 'episode/rollout_seed_max'):.0f} "
                f"(expected {replicas}: {seed}..{seed + replicas - 1})"
            ),
        ),
    ]


def changed_weights(job, start_model: str | os.PathLike) -> SmokeCheck:
    """The last checkpoint, merged by verl's model merger, against the starting policy: finite,
    and most tensors changed."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from spader.training.hf_export import export_checkpoint

    if not Path(job.final_json).is_file():
        return SmokeCheck("weights changed", False, f"no {job.final_json}")
    with tempfile.TemporaryDirectory(dir=Path(job.final_json).parent) as tmp:
        export_checkpoint(
            job.final_json, Path(tmp) / "model", Path(tmp) / "model.json", keep_checkpoints=True
        )
        trained = AutoModelForCausalLM.from_pretrained(Path(tmp) / "model", dtype=torch.float32).state_dict()
    start = AutoModelForCausalLM.from_pretrained(start_model, dtype=torch.float32).state_dict()
    changed = sum(
        int(not torch.equal(value, start[name])) for name, value in trained.items() if name in start
    )
    finite = all(torch.isfinite(value).all() for value in trained.values())
    return SmokeCheck(
        "weights changed",
        finite and changed > len(trained) // 2,
        f"{changed} of {len(trained)} tensors differ from the policy's, {'all' if finite else 'not all'} finite",
    )


if __name__ == "__main__":
    raise SystemExit(main())
