"""What every job of the DAG reads and depends on, from the checked configuration: its input files
(the input functions of the rules), its params (what reruns it: :mod:`spader.infra.rerun_keys`), the
model directories, the shared training runs and the tables' rows.

The rules hold one :class:`Jobs` (``JOBS`` in ``workflow/rules/common.smk``) and read the
configuration only through it and the typed model. An input function takes the job's
``wildcards`` (anything with the wildcards as attributes); a param is canonical (maps with sorted
keys, values in their keys' types, lists that act as sets sorted without repeats), since Snakemake
compares params by their ``repr``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spader.config import DATASETS, PROMPTING, Config, hub_slug, model_kind, verl_config_chain
from spader.core.prompt import load_template
from spader.infra.rerun_keys import canonical, for_rule
from spader.infra.sources import digest_cache_dir, planned_sha256, source_sha256
from spader.integrations.verl.overrides import shared_training_runs
from spader.methods import assumed_methods, needs, table_rows, verl_yaml
from spader.training.scorer_launch import judge_params

#: Where the suite's dump is downloaded to.
DUMP = "resources/{suite}/corpus/chunked_wikipedia.tar.gz"
#: The keys of ``evaluation`` that the tables' uncertainty reads.
UNCERTAINTY_KEYS = ("bootstrap_samples", "bootstrap_seed", "significance_level")


def workflow_file(path: str | os.PathLike) -> str:
    """A file shipped with the workflow, relative to the working directory when it lies inside it
    (job inputs and params then do not change with where the repository is checked out), else
    absolute (running with ``-d`` elsewhere)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def alternatives(names) -> str:
    """A wildcard constraint matching exactly ``names`` (nothing when there are none)."""
    names = list(names)
    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"


class Jobs:
    """The jobs of the DAG of ``config`` (the checked model), for the workflow in ``repo``.

    Args:
        config: the checked configuration (a named run's with its paths rebased).
        repo: the repository that holds the workflow (files shipped with it resolve there).
        verl_config_dir: the verl YAMLs (:func:`spader.config.verl_config_dir`).
        own_stages: the shared stages a named run builds itself (:func:`spader.infra.named_runs.own_stages`).
        shared: the way back from a named run's working directory to the default run's ("" for it).
    """

    def __init__(
        self,
        config: Config,
        repo: str | os.PathLike,
        verl_config_dir: str | os.PathLike,
        own_stages: Mapping[str, Any] | None = None,
        shared: str = "",
    ) -> None:
        self.config = config
        self.values = config.model_dump(mode="json")
        self.repo = Path(repo)
        self.verl_config_dir = verl_config_dir
        self.own_stages = dict(own_stages or {})
        self.shared_prefix = shared
        self.suite = config.suite
        self.variants = list(config.variants)
        # The prompt template is read by the jobs, not imported: its hash and how it is sent
        # (agent.prompt_role) are the param that reruns data export (and so training) and evaluation.
        template = config.agent.prompt_template
        self.prompt = {
            "path": template,
            "version": load_template(template).version,
            "role": config.agent.prompt_role,
        }
        # Variants whose resolved training config is identical (no_np and beta_0, spader and
        # beta_4 in the paper setup) share one training run per backbone: the first of them.
        self.training_runs = {
            b: shared_training_runs(
                spec.variants, self.values["variants"], self.values["training"], verl_config_dir
            )
            for b, spec in config.backbones.items()
        }

    # -- where a stage's outputs are -------------------------------------------------------------
    def shared(self, path: str) -> str:
        """``path`` of the default run's working directory, seen from this run's."""
        return self.shared_prefix + path

    def stage(self, rule: str, path: str) -> str:
        """``path``, an output of the shared stage ``rule``: in the default run's working directory
        unless this named run builds that stage itself."""
        return path if rule in self.own_stages else self.shared(path)

    def wildcard_constraints(self) -> dict[str, str]:
        """The workflow's wildcard constraints."""
        return {
            "suite": re.escape(self.suite),
            "dataset": alternatives(DATASETS),
            "split": "train|test",
            "backbone": alternatives(self.config.backbones),
            "variant": alternatives(self.variants),
            "method": alternatives(self.variants + list(PROMPTING)),
            "file": "[A-Za-z0-9._-]+",
            "repo": "[A-Za-z0-9._-]+--[A-Za-z0-9._-]+",
            "kind": "qwen3|reranker",
        }

    # -- targets -------------------------------------------------------------------------------------
    def final_outputs(self) -> list[str]:
        """Tables of every target backbone, plus the training data of the suite (built even when no
        configured backbone trains, as in the CPU demo)."""
        tables = [f"results/{b}/f1.tsv" for b in self.config.targets]
        return tables + [f"results/{self.suite}/data/verl/{s}.parquet" for s in ("train", "val")]

    def methods_of(self, backbone: str) -> list[str]:
        """The backbone's methods: its trained variants, then its prompting baselines."""
        return self.config.methods_of(backbone)

    def evaluations(self, backbone: str, exts=("json", "jsonl"), prefix: str = "") -> list[str]:
        """The evaluation files (summaries ``json``, records ``jsonl``) of every method of the
        backbone on every dataset, under ``prefix``."""
        return [
            f"{prefix}results/{backbone}/eval/{m}/{d}.{ext}"
            for m in self.methods_of(backbone)
            for d in DATASETS
            for ext in exts
        ]

    def default_run_evaluations(self, backbone: str) -> list[str]:
        """The default run's evaluation summaries and records of this (named) run's methods: what
        rule compare_runs compares against (the default run makes them; no rule here does)."""
        return self.evaluations(backbone, prefix=self.shared_prefix)

    # -- models ----------------------------------------------------------------------------------
    def model_dir(self, name: str) -> str:
        """A model's directory: a ``tiny:<kind>`` model as built, a hub model as downloaded, a
        local path as it is."""
        kind = model_kind(name)
        if kind == "tiny":
            return self.stage("build_tiny_model", f"results/models/tiny/{name.split(':', 1)[1]}")
        if kind == "hub":
            return self.stage("download_model", f"resources/models/hub/{hub_slug(name)}")
        return name

    def hub_models(self) -> list[str]:
        """The hub models of the configuration (backbones, judge, reranker), sorted."""
        specs = [*self.config.backbones.values(), self.config.judge, self.config.retrieval.reranker]
        return sorted({s.model for s in specs if s.model and model_kind(s.model) == "hub"})

    def hub_revision(self, repo: str) -> str | None:
        """The pinned revision of hub repository ``repo`` (``org--name``), from the config entries
        that name it (backbones and the reranker share one download per repository)."""
        specs = [*self.config.backbones.values(), self.config.retrieval.reranker, self.config.judge]
        revisions = {
            s.revision
            for s in specs
            if s.model and model_kind(s.model) == "hub" and hub_slug(s.model) == repo
        }
        if len(revisions) > 1:
            raise ValueError(
                f"hub model {repo.replace('--', '/', 1)} is configured with revisions {revisions}"
            )
        return revisions.pop() if revisions else None

    def base_model(self, wildcards) -> str:
        """The backbone's model as built (tiny) or released."""
        return self.model_dir(self.config.backbones[wildcards.backbone].model)

    def backbone_model(self, wildcards) -> str:
        """The policy the backbone's methods start from: its warm start (rule warmstart_policy)
        when ``backbones.<name>.warmstart`` is set (tiny models only), else the model itself."""
        if self.config.backbones[wildcards.backbone].warmstart:
            return self.stage("warmstart_policy", f"results/{wildcards.backbone}/warmstart/model")
        return self.base_model(wildcards)

    def policy_model(self, wildcards) -> str:
        """The policy a method is evaluated with: the backbone's for a prompting baseline, else the
        export of the training run it evaluates."""
        if wildcards.method in PROMPTING:
            return self.backbone_model(wildcards)
        return (
            f"results/{wildcards.backbone}/models/{self.training_run(wildcards.backbone, wildcards.method)}"
        )

    def reranker(self, wildcards=None) -> list[str]:
        """The reranker's directory, or nothing without one."""
        name = self.config.retrieval.reranker.model
        return [] if name in (None, "none") else [self.model_dir(name)]

    # -- training runs and tables --------------------------------------------------------------
    def training_run(self, backbone: str, variant: str) -> str:
        """The variant whose training run ``variant`` evaluates (itself unless an identical one
        comes first in the backbone's variants)."""
        return self.training_runs[backbone][variant]

    def shared_runs_of(self, backbone: str) -> dict[str, str]:
        """``{variant: the variant whose training run it evaluates}`` for the backbone's variants."""
        return {v: self.training_run(backbone, v) for v in self.config.backbones[backbone].variants}

    def trained_runs_of(self, backbone: str) -> list[str]:
        """The backbone's training runs (variants sharing one run count once)."""
        return list(dict.fromkeys(self.shared_runs_of(backbone).values()))

    def table_variants(self) -> list:
        """``[[variant, table row], ...]`` of every configured variant in config order
        (:func:`spader.methods.table_rows`): the ablation and beta-sweep rows and the plots' order,
        nothing of a variant's training, so that editing it does not rerun the tables of backbones
        that skip it."""
        return canonical(table_rows(self.values["variants"]))

    def topics_file(self) -> list[str]:
        """The evaluation questions' topics file (``evaluation.topics``, relative to the
        repository, as the demo's bundled files are) as the tables' input, or none."""
        topics = self.config.evaluation.topics
        if not topics:
            return []
        path = (self.repo / topics).resolve()
        try:  # a named run reaches it through the default run's directory, never by an absolute path
            return [self.shared_prefix + str(path.relative_to((Path.cwd() / self.shared_prefix).resolve()))]
        except ValueError:  # the repository outside the working directory (`-d` elsewhere)
            return [workflow_file(path)]

    # -- params ----------------------------------------------------------------------------------
    def section_params(self, rule: str, *path: str) -> Any:
        """The config section at ``path`` (dotted parts) as rule ``rule``'s param: without the keys
        that do not rerun that rule (:func:`spader.infra.rerun_keys.for_rule`)."""
        values = self.values
        for part in path:
            values = values[part]
        return canonical(for_rule(rule, path, values), path)

    def backbone_params(self, backbone: str) -> Any:
        """What training needs of ``backbones.<backbone>`` (not its method lists: adding a
        prompting baseline must not retrain)."""
        return self.section_params("train_policy", "backbones", backbone)

    def variant_params(self, variant: str) -> Any:
        """A variant's training settings, its verl YAML resolved (its method's when it names none)."""
        params = self.section_params("train_policy", "variants", variant)
        return canonical({**params, "verl_config": verl_yaml(self.values["variants"][variant])})

    def training_params(self) -> Any:
        """The ``training`` section without the operational keys (time limits, search error rate):
        editing those retrains nothing."""
        return self.section_params("train_policy", "training")

    def judge_params(self, variant: str) -> Any:
        """The judge settings that can change a variant's training (none unless it serves the
        LLM judge: :func:`spader.training.scorer_launch.judge_params`)."""
        return canonical(judge_params(self.values["variants"][variant], self.values["judge"]))

    def agent_params(self) -> Any:
        """The turn settings shared by training and evaluation (the template is a param of its own)."""
        agent = self.values["agent"]
        return canonical({k: v for k, v in agent.items() if k != "prompt_template"}, ("agent",))

    def retrieval_params(self, rule: str) -> Any:
        """Search settings that can change what rule ``rule``'s searches return (the reranker given
        by its resolved local directory); jobs add the operational ones (host, timeouts, retries,
        cache) from their config (:func:`spader.infra.glue.retrieval_settings`)."""
        settings = self.section_params(rule, "retrieval")
        if self.config.retrieval.reranker.model not in (None, "none"):
            settings["reranker"]["path"] = self.model_dir(self.config.retrieval.reranker.model)
        return canonical(settings)

    def evaluation_params(self, wildcards) -> Any:
        """The ``evaluation`` param of evaluate_policy, the settings that can change a score (not
        the tables' bootstrap, not the job's threads), with the backbone's context budget resolved."""
        budget = {"max_context_tokens": self.config.context_tokens_of(wildcards.backbone)}
        return canonical({**self.section_params("evaluate_policy", "evaluation"), **budget})

    def assumed_methods(self, backbone: str) -> list[str]:
        """The backbone's trained methods the authors' code does not train: a named run's
        comparison says it assumes its options for them (:func:`spader.methods.assumed_methods`)."""
        return assumed_methods(self.config.variants, self.methods_of(backbone))

    def uncertainty(self) -> dict[str, Any]:
        """The tables' bootstrap and test settings (``evaluation``)."""
        return {k: self.values["evaluation"][k] for k in UNCERTAINTY_KEYS}

    def eval_set_params(self) -> dict[str, Any]:
        """The evaluation set's ``limit`` and the ``seed`` that picks its questions (under a limit only)."""
        mix = self.config.mix
        return {"limit": mix.eval_limit, "seed": mix.seed if mix.eval_limit is not None else None}

    # -- corpus ----------------------------------------------------------------------------------
    def dump(self, wildcards=None) -> str:
        """The dump the index is built from: ``corpus.archive``, else the suite's download."""
        return self.config.corpus.archive or self.stage("download_dump", DUMP.format(suite=self.suite))

    def dump_sha256(self) -> str | None:
        """The sha256 the dump's download must have, its param: ``corpus.sha256``, else the content
        of a local file (:mod:`spader.infra.sources`: a dump replaced in place is copied again,
        and what is built from it rebuilt)."""
        corpus = self.config.corpus
        if corpus.sha256:
            return corpus.sha256
        digest = source_sha256(corpus.url, self.repo, digest_cache_dir())
        return planned_sha256(digest, self.stage("download_dump", DUMP.format(suite=self.suite)))

    def index(self, wildcards=None) -> str:
        """The BM25 index: ``corpus.prebuilt_index``, else the suite's."""
        built = self.stage("build_bm25_index", f"results/{self.suite}/index/bm25")
        return self.config.corpus.prebuilt_index or built

    # -- datasets --------------------------------------------------------------------------------
    def release(self, dataset: str, file: str, suite: str | None = None) -> str:
        """Where a dataset's release file is downloaded to."""
        path = f"resources/{suite or self.suite}/datasets/{dataset}/{file}"
        return self.stage("download_dataset", path)

    def dataset_source(self, wildcards) -> Any:
        """A release file's config entry as its download's param; a local file's with the sha256
        of its content, which the copy must have (:mod:`spader.infra.sources`: a release edited or
        replaced in place is copied again, and what is built from it rebuilt)."""
        entry = self.values["datasets"][wildcards.dataset]["files"][wildcards.file]
        copy = self.release(wildcards.dataset, wildcards.file)
        digest = planned_sha256(source_sha256(entry, self.repo, digest_cache_dir()), copy)
        return canonical({**entry, "sha256": digest} if digest else entry)

    def split(self, dataset: str, split: str) -> Any:
        """``datasets.<dataset>.splits.<split>``: its release file and zip member."""
        return getattr(getattr(self.config.datasets, dataset).splits, split)

    def split_source(self, wildcards) -> str:
        """The release file that holds a dataset's split."""
        split = self.split(wildcards.dataset, wildcards.split)
        return self.release(wildcards.dataset, split.file, wildcards.suite)

    def split_member(self, wildcards) -> str | None:
        """The zip member that holds a dataset's split (none for a plain file)."""
        return self.split(wildcards.dataset, wildcards.split).member

    def mix_datasets(self) -> list[str]:
        """Datasets the mix draws from (mix.counts > 0); only their normalized files are inputs."""
        return self.config.mix.drawn

    def mix_files(self, split: str) -> list[str]:
        """Normalized files the mix reads: the train splits of the datasets it draws from, the
        test splits of every dataset (an evaluation question of any dataset stays out of the mix)."""
        datasets = self.mix_datasets() if split == "train" else DATASETS
        path = "results/{{suite}}/data/normalized/{dataset}/{split}.jsonl"
        return [self.stage("normalize_dataset", path).format(dataset=d, split=split) for d in datasets]

    # -- training --------------------------------------------------------------------------------
    def verl_configs(self, wildcards) -> list[str]:
        """The variant's verl YAML and the project YAMLs it inherits from (shipped with the workflow)."""
        yaml = verl_yaml(self.values["variants"][wildcards.variant])
        return [workflow_file(p) for p in verl_config_chain(yaml, self.verl_config_dir)]

    def evidence(self, wildcards) -> Any:
        """StepSearch's evidence for a variant that needs it, else nothing."""
        if not needs(self.config.variants[wildcards.variant].reward, "evidence"):
            return []
        return self.stage("build_evidence", f"results/{self.suite}/data/evidence/train.jsonl")

    def judge_model(self, wildcards) -> Any:
        """The judge model directory for a variant that serves the LLM judge, else nothing."""
        params = judge_params(self.values["variants"][wildcards.variant], self.values["judge"])
        if params is None or self.config.judge.url:
            return []
        return self.model_dir(self.config.judge.model)

    def evidence_release(self, wildcards=None) -> Any:
        """The QAMPARI train release when evidence comes from its proof_text, else nothing."""
        if not self.config.stepsearch.evidence.qampari_proof_text:
            return []
        return self.release("qampari", self.split("qampari", "train").file)

    def evidence_member(self) -> str | None:
        """The zip member of QAMPARI's train split (StepSearch's evidence reads its proof_text)."""
        return self.split("qampari", "train").member

    def gpu_job_cpus(self, gpus: int) -> int | None:
        """--cpus-per-task of a job holding ``gpus`` GPUs of a node: its share of the node's cores
        (hardware.cores x gpus / hardware.gpus); None without GPUs (SLURM follows the job's threads)."""
        if gpus < 1:
            return None
        hardware = self.config.hardware
        return max(1, hardware.cores * min(gpus, hardware.gpus) // hardware.gpus)
