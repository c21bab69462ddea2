"""What the training job of a StepSearch or R3-RAG variant adds to the verl launch.

* Both: the search tool records turn details (tool config ``record_turns``).
* ``stepsearch``: the evidence artifact (rule ``build_evidence``) and the TF-IDF processes.
* ``r3rag`` with the LLM judge: the judge's endpoint. With ``judge.url`` the job uses it; without,
  the job serves the judge on the last ``judge.gpus`` GPUs of its node
  (:func:`spader.scorers.judge_server.running_judge`) and verl trains on the others; a job over
  several nodes serves it on a node of its own (:class:`JudgeNode`, through ``srun``) and verl
  trains on every GPU of the others.

:func:`scorer_launch` is known when the launch is planned (and checked with it);
:func:`judge_endpoint` runs around verl and adds the endpoint's URL and the GPU split.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from spader.config.model import JUDGE_CLIENT_KEYS, JudgeConfig, StepSearchConfig, VariantConfig
from spader.integrations.verl.hydra import hydra_value
from spader.methods import needs, reward_spec

__all__ = [
    "OPERATIONAL_JUDGE_KEYS",
    "JudgeNode",
    "ScorerLaunch",
    "judge_endpoint",
    "judge_params",
    "judge_settings",
    "scorer_launch",
]

#: Judge settings that cannot change a result (where it runs, how long and how often the client
#: waits and retries): not params of the training rule; the job reads them from its config.
OPERATIONAL_JUDGE_KEYS = ("url", "startup_timeout_s", "timeout_s", "retries", "concurrency")


@dataclass(frozen=True)
class ScorerLaunch:
    """The step-level scorer's part of a launch (StepSearch's evidence, R3-RAG's judge).

    Attributes:
        record_turns: the search tool records turn details.
        overrides: verl overrides known when planning.
        judge_gpus: GPUs the served judge takes from training (0: none served).
    """

    record_turns: bool = False
    overrides: list[str] = field(default_factory=list)
    judge_gpus: int = 0


def _variant(variant: VariantConfig | Mapping[str, Any]) -> VariantConfig:
    return variant if isinstance(variant, VariantConfig) else VariantConfig.model_validate(dict(variant))


def _judge(judge: JudgeConfig | Mapping[str, Any]) -> JudgeConfig:
    return judge if isinstance(judge, JudgeConfig) else JudgeConfig.model_validate(dict(judge))


def scorer_launch(
    variant: Mapping[str, Any],
    *,
    evidence: str | os.PathLike | None = None,
    stepsearch: Mapping[str, Any] | None = None,
    judge: Mapping[str, Any] | None = None,
) -> ScorerLaunch:
    """The launch additions of a variant (nothing for SPADER and the other variants).

    Args:
        variant: ``config["variants"][v]``.
        evidence: the ``build_evidence`` output (``stepsearch`` variants).
        stepsearch: ``config["stepsearch"]``.
        judge: ``config["judge"]`` (``r3rag`` variants with ``judge: llm``).
    Returns:
        :class:`ScorerLaunch`.
    Raises:
        ValueError: a needed input is missing (the message names it).
    """
    reward = _variant(variant).reward
    if needs(reward, "evidence"):
        if evidence is None:
            raise ValueError(
                f"a variant of reward {reward!r} trains with the evidence of rule build_evidence (input 'evidence')"
            )
        if stepsearch is None:
            raise ValueError(f"a variant of reward {reward!r} trains with the 'stepsearch' config section")
        section = (
            stepsearch
            if isinstance(stepsearch, StepSearchConfig)
            else StepSearchConfig.model_validate(dict(stepsearch))
        )
        workers = section.workers
        return ScorerLaunch(
            record_turns=True,
            overrides=[
                f"++algorithm.stepsearch.evidence_path={hydra_value(os.path.abspath(evidence))}",
                f"++algorithm.stepsearch.workers={workers}",
            ],
        )
    if not needs(reward, "judge"):  # the turns' details where the reward reads them (a plug-in's too)
        return ScorerLaunch(record_turns=reward_spec(reward).record_turns)
    if not _variant(variant).serves_judge:
        return ScorerLaunch(record_turns=True)
    if judge is None:
        raise ValueError("an r3rag variant with judge llm needs the 'judge' config block")
    typed = _judge(judge)
    overrides = [f"++algorithm.r3rag.judge.model={hydra_value(typed.model)}"]
    overrides += [f"++algorithm.r3rag.judge.{k}={hydra_value(getattr(typed, k))}" for k in JUDGE_CLIENT_KEYS]
    served = 0 if typed.url else typed.gpus
    return ScorerLaunch(record_turns=True, overrides=overrides, judge_gpus=served)


@dataclass(frozen=True)
class JudgeNode:
    """A node of the job's allocation that serves the judge alone.

    Attributes:
        name: its host name (for ``srun --nodelist``).
        address: its address on the network the nodes share (the server binds it).
        launcher: the command prefix that starts a process there.
        gpus: the GPU ids the server uses there (the step's own, ``0..judge.gpus-1``).
    """

    name: str
    address: str
    launcher: tuple[str, ...]
    gpus: tuple[str, ...]


@contextlib.contextmanager
def judge_endpoint(
    launch: ScorerLaunch,
    judge: Mapping[str, Any] | None,
    *,
    model_dir: str | os.PathLike | None,
    training_gpus: int,
    environ: Mapping[str, str],
    log_path: str | os.PathLike | None = None,
    command=None,
    node: JudgeNode | None = None,
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Around verl: the judge endpoint's overrides and the environment verl must run with.

    Args:
        launch: :func:`scorer_launch` of the variant.
        judge: ``config["judge"]``.
        model_dir: local directory of the judge model (served judge only).
        training_gpus: GPUs verl trains on (the node's minus ``launch.judge_gpus``).
        environ: the job's environment (its ``CUDA_VISIBLE_DEVICES``).
        log_path: the judge server's log.
        command: replaces the sglang command (tests).
        node: serve the judge there, not on this node's GPUs (verl keeps all of them).
    Yields:
        ``(overrides, env)`` to add to verl's launch; both empty when the variant has no LLM judge.
    """
    if judge is None or not any(o.startswith("++algorithm.r3rag.judge.") for o in launch.overrides):
        yield [], {}
        return
    judge = _judge(judge)
    if judge.url:
        yield [f"++algorithm.r3rag.judge.url={hydra_value(judge.url)}"], {}
        return
    from spader.scorers.judge_server import running_judge, split_gpus, visible_gpus

    if model_dir is None:
        raise ValueError("the served judge needs its model directory (input 'judge_model')")
    if node is None:
        gpus = visible_gpus(environ, training_gpus + launch.judge_gpus)
        train, served = split_gpus(gpus, launch.judge_gpus)
        where: dict[str, Any] = {}
    else:
        train, served = [], list(node.gpus)
        where = {"host": node.address, "launcher": node.launcher}
    with running_judge(
        model_dir,
        gpus=served,
        served_name=judge.model,
        startup_timeout_s=judge.startup_timeout_s,
        mem_fraction=judge.mem_fraction,
        tensor_parallel=judge.tensor_parallel,
        log_path=log_path,
        command=command,
        **where,
    ) as endpoint:  # the key reaches the client through verl's environment, not its (logged) command line
        overrides = [f"++algorithm.r3rag.judge.url={hydra_value(endpoint.url)}"]
        devices = {"CUDA_VISIBLE_DEVICES": ",".join(train)} if train else {}
        yield overrides, {**devices, **endpoint.env()}


def judge_params(variant: Mapping[str, Any], judge: Mapping[str, Any]) -> dict[str, Any] | None:
    """The training rule's ``judge`` param: the judge settings that can change a result, for an
    ``r3rag`` variant with the LLM judge only (None otherwise, so editing them retrains nothing else)."""
    if not _variant(variant).serves_judge:
        return None
    return {k: v for k, v in judge.items() if k not in OPERATIONAL_JUDGE_KEYS}


def judge_settings(
    params_judge: Mapping[str, Any] | None, config: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A job's full judge settings: its ``judge`` param plus the operational keys from its config."""
    if params_judge is None:
        return None
    configured = config["judge"]
    return {**dict(params_judge), **{k: configured[k] for k in OPERATIONAL_JUDGE_KEYS}}
