"""The workflow configuration as one typed model: every key's type, default, description and the
rules that tie keys together.

``config/config.yaml`` (the paper's setup) and any ``--configfile`` overlay are read into
:class:`Config` (``workflow/rules/common.smk`` does it at start-up and hands the jobs the model's
values, every default filled in). The JSON schema (``workflow/schemas/config.schema.yaml``, for
editors and other tools) and the key reference ``config/README.md`` are generated
from these classes (:mod:`spader.config.schema`, :mod:`spader.config.docs`; a test fails when the
committed files drift), so the model is the one place a key is defined.

Each section is a class of its own module in :mod:`spader.config.sections` (one module per
top-level key or small group: ``mlflow``, ``corpus``, ``datasets``, ``mix``, ``retrieval``,
``backbones``, ``variants``, ``training``, ``agent``, ``evaluation``, ``baselines`` for
``stepsearch`` and ``judge``, ``hardware`` with ``code_reruns``; ``base`` holds what they share).
This module holds :class:`Config`, which puts them together, the rules between them, the
named-run helpers, and re-exports every section, so that ``from spader.config.model import
TrainingConfig`` reads the same class wherever it is defined.

Rules that cross keys (a target naming a backbone, a backbone naming a variant, an advantage that
does not train a reward, a judge that leaves verl a GPU count that does not divide a step's
trajectories, ...) are validators of :class:`Config` (those within one section are its own
validators), checked after every default is filled in. Checks that read the file system (a
variant's verl YAML, a local model path) take the directories from the validation context
(:func:`spader.config.checks.check_config`).

Jobs receive the sections they use as ``params:`` (plain dicts, so that editing a value reruns
exactly the jobs that use it) and turn them back into these classes with ``model_validate``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo, model_validator

from spader.config.sections.agent import AgentConfig
from spader.config.sections.backbones import BackboneConfig, WarmstartConfig
from spader.config.sections.base import DATASETS, MAX_INITIAL_K, PROMPTING, Name, Section, _once, model_kind
from spader.config.sections.baselines import JUDGE_CLIENT_KEYS, EvidenceConfig, JudgeConfig, StepSearchConfig
from spader.config.sections.corpus import CorpusConfig
from spader.config.sections.datasets import (
    DatasetConfig,
    DatasetsConfig,
    HubSource,
    SourceConfig,
    SplitConfig,
    SplitsConfig,
    dataset_defaults,
)
from spader.config.sections.evaluation import EvaluationConfig
from spader.config.sections.hardware import CodeRerunsConfig, HardwareConfig
from spader.config.sections.mix import MixConfig, MixCounts
from spader.config.sections.mlflow import MlflowConfig
from spader.config.sections.retrieval import Bm25Config, RerankerConfig, RetrievalConfig, ServiceConfig
from spader.config.sections.training import CostWarmup, DivergencesConfig, TimeLimitConfig, TrainingConfig
from spader.config.sections.variants import VariantConfig
from spader.datasets import registry
from spader.methods import REWARDS, needs, pairing_rule, verl_yaml

__all__ = [
    "CROSS_KEY_RULES",
    "DATASETS",
    "JUDGE_CLIENT_KEYS",
    "MAX_INITIAL_K",
    "PROMPTING",
    "RUNS_DIR",
    "USER_SUPPLIED",
    "AgentConfig",
    "BackboneConfig",
    "Bm25Config",
    "CodeRerunsConfig",
    "Config",
    "CorpusConfig",
    "CostWarmup",
    "DatasetConfig",
    "DatasetsConfig",
    "DivergencesConfig",
    "EvaluationConfig",
    "EvidenceConfig",
    "HardwareConfig",
    "HubSource",
    "JudgeConfig",
    "MixConfig",
    "MixCounts",
    "MlflowConfig",
    "RerankerConfig",
    "RetrievalConfig",
    "ServiceConfig",
    "SourceConfig",
    "SplitConfig",
    "SplitsConfig",
    "StepSearchConfig",
    "TimeLimitConfig",
    "TrainingConfig",
    "VariantConfig",
    "WarmstartConfig",
    "dataset_defaults",
    "model_kind",
    "named_run_root",
    "rebase_run_paths",
]

#: The rules between keys, as ``config/README.md`` states them (each is a validator below).
CROSS_KEY_RULES = (
    "`targets` name keys of `backbones` (a repeat is ignored).",
    "`backbones.<name>.variants` name keys of `variants`; no variant is called like a prompting "
    "method (`rag`, `react`).",
    "`backbones.<name>.model`: a tiny backbone is `tiny:qwen3`, and only tiny backbones take a "
    "`warmstart`; a local path must exist.",
    "`retrieval.reranker.model`: a tiny reranker is `tiny:reranker`.",
    f"`variants.<name>.advantage` trains `variants.<name>.reward`: {pairing_rule()}.",
    "`variants.<name>`: a key the variant's reward does not read keeps its default ("
    + "; ".join(
        f"{', '.join(f'`{k}`' for k in spec.keys)}: `{spec.name}`" for spec in REWARDS.values() if spec.keys
    )
    + ").",
    "`variants.<name>.verl_config` names a YAML in `config/verl/`.",
    "`variants.<name>.judge: reranker` needs `retrieval.reranker.model`.",
    "`judge.gpus`: when a backbone trains an LLM-judged R3-RAG variant and `judge.url` is null, the "
    "GPUs left to verl (`backbones.<name>.gpus - judge.gpus`) are at least 1 and divide "
    "`training.train_batch_size * training.rollout_n`.",
    "`training.rollout_backend`: `cuda` trains with `sglang`, `cpu` with `transformers`.",
    "`datasets.<name>.splits.<split>.file` names a key of `datasets.<name>.files`.",
    "`evaluation.seeds`: distinct seeds; more than one needs `evaluation.temperature` > 0.",
    "`training.time_limit.hours`: keys other than `default` name keys of `variants`.",
    "`mix.min_answers` <= `mix.max_answers`; `mix.counts` draw at least one instance.",
    "`training.ppo_mini_batch_size` <= `training.train_batch_size` <= the instances `mix.counts` draw.",
    "`training.ppo_mini_batch_size` divides `training.train_batch_size`; a mini-batch's trajectories "
    "(`training.ppo_mini_batch_size * training.rollout_n`) divide over a training's ranks (its GPUs, or "
    "`training.cpu_workers`, on each node, less a judge it serves), and with fixed micro-batches "
    "(`training.max_token_len_per_gpu` null) each rank's share divides into "
    "`training.ppo_micro_batch_size_per_gpu` (verl 0.9.1's rules).",
    "`retrieval.topk` <= `retrieval.initial_k`; `stepsearch.evidence.queries_per_request` and "
    "`agent.max_queries_per_call` (unless null) <= `retrieval.service.max_queries_per_request`.",
    "More than one node for an LLM-judged R3-RAG variant (its `variants.<name>.nodes`, else "
    "`training.nodes`) with `judge.url` null: the judge is served on the last node (`judge.gpus` <= "
    "`backbones.<name>.gpus`) and verl trains on the GPUs of the others, whose number must divide "
    "`training.train_batch_size * training.rollout_n`.",
)


class Config(Section):
    """Configuration of the SPADER reproduction pipeline (config/config.yaml, optionally overlaid
    by --configfile files such as config/demo.yaml). Every key has a description and a default
    where one makes sense; unknown keys are rejected."""

    suite: Name = Field(
        "paper",
        description="Name of the data setup; data outputs live under resources/<suite>/ and results/<suite>/.",
    )
    run: Name | None = Field(
        None,
        description="Name of a run beside the default one (for example `authors`, config/authors.yaml): "
        "its outputs live in results/runs/<run>/ (a working directory of its own: results/, logs/, "
        ".snakemake/), sharing downloads, tiny models, the demo's warm start and results/<suite>/ "
        "(index, datasets, mix) with the default run; null: the default run.",
    )
    targets: Annotated[list[str], AfterValidator(_once)] = Field(
        min_length=1,
        description="Backbones built by `rule all` (results/<backbone>/f1.tsv; a set: order and "
        "repeats mean nothing).",
    )
    mlflow: MlflowConfig = Field(
        default_factory=MlflowConfig, description="MLflow tracking (not a rerun trigger)."
    )
    corpus: CorpusConfig = Field(
        default_factory=CorpusConfig,
        description='The QAMPARI Wikipedia 2021 chunk dump (docs/data.md, "The chunked Wikipedia corpus").',
    )
    retrieval: RetrievalConfig = Field(
        default_factory=RetrievalConfig, description='The search tool (docs/method.md, "Retrieval").'
    )
    datasets: DatasetsConfig = Field(
        default_factory=DatasetsConfig,
        description="The datasets' release files (docs/data.md), one section per dataset of the registry "
        "(spader.datasets), laid over the registry's files and splits.",
    )
    mix: MixConfig = Field(
        default_factory=MixConfig, description='The training mix (docs/data.md, "Training mix").'
    )
    backbones: dict[Name, BackboneConfig] = Field(min_length=1, description="Backbones by name.")
    variants: dict[Name, VariantConfig] = Field(default_factory=dict, description="Trained variants by name.")
    training: TrainingConfig = Field(
        default_factory=TrainingConfig,
        description='verl training hyperparameters (docs/method.md, "Training setup").',
    )
    agent: AgentConfig = Field(
        default_factory=AgentConfig,
        description="One agent turn, the same in training rollouts and evaluation (docs/method.md, "
        '"Prompt and format").',
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig,
        description='Agent inference for evaluation (docs/method.md, "Evaluation").',
    )
    stepsearch: StepSearchConfig = Field(
        default_factory=StepSearchConfig,
        description="StepSearch (docs/baselines.md): its evidence and reward computation.",
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="R3-RAG's LLM judge (variants with judge llm)."
    )
    hardware: HardwareConfig = Field(
        default_factory=HardwareConfig,
        description="The node the GPU jobs are planned for and the plan's assumptions (GPU memory, time, "
        "host memory and disk plan, docs/gpu.md; not a rerun trigger).",
    )
    code_reruns: CodeRerunsConfig = Field(
        default_factory=CodeRerunsConfig,
        description="Whether a change to the code a stage runs reruns its jobs (per group of rules).",
    )

    @model_validator(mode="after")
    def _cross_key_rules(self, info: ValidationInfo) -> Config:
        errors = self.cross_key_errors((info.context or {}).get("verl_config_dir"))
        if errors:
            raise ValueError("\n".join(errors))
        return self

    def cross_key_errors(self, verl_config_dir: str | os.PathLike | None = None) -> list[str]:
        """Rules between sections, each message naming the key (``config key 'a.b': ...``)."""
        errors = []
        for t in self.targets:
            if t not in self.backbones:
                errors.append(
                    f"config key 'targets': '{t}' is not a key of 'backbones' ({', '.join(self.backbones)})"
                )
        for name in self.variants:
            if name in PROMPTING:
                errors.append(f"config key 'variants.{name}': '{name}' is a prompting method's name")
        for b, spec in self.backbones.items():
            for v in spec.variants:
                if v not in self.variants:
                    errors.append(f"config key 'backbones.{b}.variants': '{v}' is not a key of 'variants'")
        for v, spec in self.variants.items():
            if verl_config_dir is not None:
                path = Path(verl_config_dir) / f"{verl_yaml(spec.model_dump())}.yaml"
                if not path.exists():
                    errors.append(f"config key 'variants.{v}.verl_config': {path} does not exist")
            if (
                needs(spec.reward, "judge")
                and spec.judge == "reranker"
                and not self.retrieval.reranker.enabled
            ):
                errors.append(
                    f"config key 'variants.{v}.judge': the reranker judge needs retrieval.reranker.model"
                )
        errors += self._size_errors()
        errors += self._served_judge_errors()
        errors += self._batch_errors()
        for key in self.training.time_limit.hours:
            if key != "default" and key not in self.variants:
                errors.append(
                    f"config key 'training.time_limit.hours': '{key}' is not a key of 'variants' (or `default`)"
                )
        return errors

    def _size_errors(self) -> list[str]:
        """Sizes that must fit into each other (each would fail a job, or silently do nothing)."""
        errors = []
        mix, training, retrieval = self.mix, self.training, self.retrieval
        if mix.max_answers is not None and mix.max_answers < mix.min_answers:
            errors.append(
                f"config key 'mix.max_answers': {mix.max_answers} is below mix.min_answers ({mix.min_answers})"
            )
        drawn = sum(getattr(mix.counts, d) for d in DATASETS)
        if drawn == 0:
            errors.append("config key 'mix.counts': every count is 0, the training mix would be empty")
        if training.ppo_mini_batch_size > training.train_batch_size:
            errors.append(
                f"config key 'training.ppo_mini_batch_size': {training.ppo_mini_batch_size} is larger than "
                f"training.train_batch_size ({training.train_batch_size})"
            )
        if 0 < drawn < training.train_batch_size:
            errors.append(
                f"config key 'training.train_batch_size': {training.train_batch_size} is larger than the "
                f"{drawn} instances mix.counts draw (no training step would run)"
            )
        if retrieval.topk > retrieval.initial_k:
            errors.append(
                f"config key 'retrieval.topk': {retrieval.topk} is larger than retrieval.initial_k "
                f"({retrieval.initial_k})"
            )
        most = retrieval.service.max_queries_per_request
        for key, value in (
            ("stepsearch.evidence.queries_per_request", self.stepsearch.evidence.queries_per_request),
            ("agent.max_queries_per_call", self.agent.max_queries_per_call),
        ):
            if value is not None and value > most:  # null: uncapped calls are searched in slices
                errors.append(
                    f"config key '{key}': {value} is larger than retrieval.service.max_queries_per_request "
                    f"({most}), which the service refuses"
                )
        return errors

    def _served_judge_errors(self) -> list[str]:
        """A judge served on the training node leaves verl the other GPUs, whose number must
        divide the trajectories of a step (verl's own check, made before anything runs)."""
        if self.judge.url:
            return []
        per_step = self.training.trajectories_per_step
        errors = []
        for b, spec in self.backbones.items():
            served = [v for v in spec.variants if v in self.variants and self.variants[v].serves_judge]
            for v in served:
                nodes = self.training_nodes(v)
                if nodes > 1:  # the judge has the last node; verl trains on the others
                    left = spec.gpus * (nodes - 1)
                    if self.judge.gpus > spec.gpus or per_step % left:
                        errors.append(
                            f"config key 'judge.gpus': backbone '{b}' trains {v} on {nodes} "
                            f"nodes of {spec.gpus} GPUs, the judge on {self.judge.gpus} GPUs of the last one; "
                            f"judge.gpus must be <= {spec.gpus} and the {left} training GPUs must divide the "
                            f"{per_step} trajectories of a step (or set judge.url)"
                        )
                    continue
                left = spec.gpus - self.judge.gpus
                if left < 1 or per_step % left:
                    errors.append(
                        f"config key 'judge.gpus': backbone '{b}' trains {v} on {spec.gpus} GPUs, "
                        f"{self.judge.gpus} of them serving the judge; the {max(left, 0)} left must be >= 1 and "
                        f"divide the {per_step} trajectories of a step (or set judge.url)"
                    )
        return errors

    def training_ranks(self, backbone: str, variant: str) -> int:
        """verl's data-parallel ranks in ``variant``'s training on ``backbone``: the backbone's GPUs
        (``training.cpu_workers`` on a CPU) on each node, less a judge the job serves (on the
        training node, or the last node of its own)."""
        per_node = (
            self.training.cpu_workers if self.training.device == "cpu" else self.backbones[backbone].gpus
        )
        nodes = self.training_nodes(variant)
        served = self.judge.gpus if self.variants[variant].serves_judge and not self.judge.url else 0
        if served and nodes > 1:
            return per_node * (nodes - 1)
        return (per_node - served) * nodes

    def _batch_errors(self) -> list[str]:
        """The batch sizes verl 0.9.1 splits without a remainder (its own checks fail the job after
        Ray and the models have started): each step's prompts into whole mini-batches
        (``make_iterator``), a mini-batch's trajectories over the ranks (``train_mini_batch``), and,
        with fixed micro-batches, each rank's share into whole micro-batches
        (``prepare_micro_batches``)."""
        t = self.training
        if t.train_batch_size % t.ppo_mini_batch_size:
            return [
                f"config key 'training.ppo_mini_batch_size': {t.ppo_mini_batch_size} does not divide "
                f"training.train_batch_size ({t.train_batch_size}); verl trains each step in whole mini-batches"
            ]
        mini = t.ppo_mini_batch_size * t.rollout_n
        errors: dict[int, str] = {}
        for b, spec in self.backbones.items():
            for v in (v for v in spec.variants if v in self.variants):
                ranks = self.training_ranks(b, v)
                if ranks < 1 or ranks in errors:  # none left: the judge's rule says so
                    continue
                where = f"backbone '{b}' trains {v} on {ranks} rank(s)"
                if mini % ranks:
                    errors[ranks] = (
                        f"config key 'training.ppo_mini_batch_size': a mini-batch's {mini} trajectories "
                        f"(ppo_mini_batch_size {t.ppo_mini_batch_size} x rollout_n {t.rollout_n}) do not "
                        f"divide over the ranks: {where}"
                    )
                elif t.max_token_len_per_gpu is None and (mini // ranks) % t.ppo_micro_batch_size_per_gpu:
                    errors[ranks] = (
                        f"config key 'training.ppo_micro_batch_size_per_gpu': {t.ppo_micro_batch_size_per_gpu} "
                        f"does not divide the {mini // ranks} trajectories of a mini-batch on each rank "
                        f"(ppo_mini_batch_size {t.ppo_mini_batch_size} x rollout_n {t.rollout_n} / {ranks}): "
                        f"{where}; verl splits them into whole micro-batches"
                    )
        return list(errors.values())

    def training_nodes(self, variant: str) -> int:
        """Nodes of ``variant``'s training job: its own ``nodes``, else ``training.nodes``."""
        own = self.variants[variant].nodes
        return self.training.nodes if own is None else own

    @property
    def evaluation_context_tokens(self) -> int:
        """The token budget of an evaluation episode: ``evaluation.max_context_tokens``, or when it
        is null training's prompt plus response budget (the budget a trained policy learned in)."""
        if self.evaluation.max_context_tokens is not None:
            return self.evaluation.max_context_tokens
        return self.training.max_prompt_length + self.training.max_response_length

    def context_tokens_of(self, backbone: str | None) -> int:
        """The token budget of ``backbone``'s evaluation episodes: its own ``max_context_tokens``,
        else :attr:`evaluation_context_tokens` (also for ``backbone`` None)."""
        own = None if backbone is None else self.backbones[backbone].max_context_tokens
        return self.evaluation_context_tokens if own is None else own

    def evaluation_params(self, backbone: str | None = None) -> dict[str, Any]:
        """``evaluation`` as rule evaluate_policy's param for ``backbone``: the section with its
        context budget resolved (:meth:`context_tokens_of`)."""
        params = self.evaluation.model_dump(exclude={"cpu_threads"})  # the rule's threads: no score moves
        return {**params, "max_context_tokens": self.context_tokens_of(backbone)}

    def methods_of(self, backbone: str) -> list[str]:
        """What a backbone's tables report: its trained variants, then its prompting methods."""
        spec = self.backbones[backbone]
        return [*spec.variants, *spec.prompting]

    def missing_sources(self) -> list[tuple[str, str]]:
        """Release files with neither a URL nor a hub location (the user must supply them).

        Returns:
            ``[(config key of the url, what to do)]``.
        """
        out = []
        for d in DATASETS:
            for name, source in getattr(self.datasets, d).files.items():
                if not source.url and source.hub is None:
                    hint = USER_SUPPLIED.get(name, f"{name} has no configured source")
                    out.append(
                        (f"datasets.{d}.files.{name}.url", f"{hint}, then set this key to its local path")
                    )
        return out


#: Release files the project cannot fetch for the user, with where to get them (the registry's).
USER_SUPPLIED = {f.name: f.supply for entry in registry().values() for f in entry.files if f.supply}


#: Where a named run (config key ``run``) keeps its outputs, relative to the default run's
#: working directory.
RUNS_DIR = ("results", "runs")


def named_run_root(run: str | None, cwd: str | os.PathLike) -> tuple[Path | None, str]:
    """The working directory of a named run and the prefix that leads from it back to the default
    run's (where the shared outputs live).

    Returns:
        ``(directory to change to, shared prefix)``: ``(None, "")`` for the default run;
        ``(None, prefix)`` when ``cwd`` already is the named run's directory (a cluster job
        started there); else the directory ``cwd/results/runs/<run>`` and ``"../../../"``.

    >>> named_run_root(None, "/w"), named_run_root("authors", "/w")
    ((None, ''), (PosixPath('/w/results/runs/authors'), '../../../'))
    >>> named_run_root("authors", "/w/results/runs/authors")
    (None, '../../../')
    """
    if run is None:
        return None, ""
    parts = (*RUNS_DIR, run)
    prefix = "../" * len(parts)
    cwd = Path(cwd)
    if cwd.parts[-len(parts) :] == parts:
        return None, prefix
    return cwd.joinpath(*parts), prefix


def rebase_run_paths(config: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A copy of ``config`` whose paths relative to the default run's working directory are seen
    from a named run's (``prefix``, :func:`named_run_root`): ``corpus.archive``,
    ``corpus.prebuilt_index``, local model paths (backbones, reranker, judge) and a prompt
    template file (a packaged template's name is kept). Absolute paths, hub ids, ``tiny:`` models
    and URLs are kept.

    >>> c = {"corpus": {"archive": "dl/dump.tar.gz", "prebuilt_index": None}, "agent": {"prompt_template": "authors"}}
    >>> rebase_run_paths(c, "../../../")["corpus"]["archive"]
    '../../../dl/dump.tar.gz'
    """
    import copy

    # the packaged templates' names (spader.core.prompt.packaged_templates), read from the package's
    # files: importing the prompt module would make every job that reads its config depend on it
    packaged = {f.stem for f in (Path(__file__).resolve().parents[1] / "core" / "prompts").glob("*.txt")}
    out = copy.deepcopy(config)
    if not prefix:
        return out

    def rebase(value: Any) -> Any:
        if not isinstance(value, str) or os.path.isabs(value) or "://" in value or value.startswith("file:"):
            return value
        return prefix + value

    corpus = out.get("corpus") or {}
    for key in ("archive", "prebuilt_index"):
        if corpus.get(key):
            corpus[key] = rebase(corpus[key])
    sections = [*(out.get("backbones") or {}).values(), out.get("judge") or {}]
    sections.append((out.get("retrieval") or {}).get("reranker") or {})
    for section in sections:
        if section.get("model") and model_kind(section["model"]) == "path":
            section["model"] = rebase(section["model"])
    agent = out.get("agent") or {}
    template = agent.get("prompt_template")
    if template and template not in packaged:
        agent["prompt_template"] = rebase(template)
    return out
