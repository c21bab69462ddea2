"""The workflow configuration as one typed model: every key's type, default, description and the
rules that tie keys together.

``config/config.yaml`` (the paper's setup) and any ``--configfile`` overlay are read into
:class:`Config` (``workflow/rules/common.smk`` does it at start-up and hands the jobs the model's
values, every default filled in). The JSON schema (``workflow/schemas/config.schema.yaml``, for
editors and other tools) and the key reference ``config/README.md`` are generated
from these classes (:mod:`spader.config.schema`, :mod:`spader.config.docs`; a test fails when the
committed files drift), so this module is the one place a key is defined.

Rules that cross keys (a target naming a backbone, a backbone naming a variant, an advantage that
does not train a reward, a judge that leaves verl a GPU count that does not divide a step's
trajectories, ...) are validators here, checked after every default is filled in. Checks that
read the file system (a variant's verl YAML, a local model path) take the directories from the
validation context (:func:`spader.config.checks.check_config`).

Jobs receive the sections they use as ``params:`` (plain dicts, so that editing a value reruns
exactly the jobs that use it) and turn them back into these classes with ``model_validate``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    ValidationInfo,
    create_model,
    model_validator,
)

from spader.datasets import FILE_NAME_PATTERN, NAME_PATTERN, registry
from spader.methods import (
    ADVANTAGES,
    REWARDS,
    TABLES,
    Method,
    bundled_keys,
    load_plugins,
    method_of,
    pairing_errors,
    pairing_rule,
    reward_spec,
    verl_yaml,
)

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

#: The datasets (the registry, :mod:`spader.datasets`: the paper's four, then those of entry
#: points), in table order.
DATASETS = tuple(registry())
#: Prompting methods: evaluated with the backbone as released (or warm-started), never trained.
PROMPTING = ("rag", "react")
#: Most BM25 candidates per query the retrieval service reranks (``retrieval.initial_k``, the
#: evidence search's ``depth``); reranking cost grows linearly with it.
MAX_INITIAL_K = 1000
#: Bounds of keys without a natural limit: seeds (a 32-bit unsigned integer, what numpy and torch
#: accept everywhere), counts, sizes in bytes, durations.
MAX_SEED = 2**32 - 1
MAX_COUNT = 10**9
MAX_BYTES = 2**50
MAX_SECONDS = 7 * 24 * 3600.0

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

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
#: A release file's name: a plain file name (``.`` and ``..`` name directories).
FileName = Annotated[str, StringConstraints(pattern=FILE_NAME_PATTERN)]
Device = Annotated[str, StringConstraints(pattern=r"^(cpu|cuda:[0-9]+)$")]


def _once(items: list[Any]) -> list[Any]:
    """A list the code reads as a set, each item once (a repeat means nothing; the order given is
    kept for display, params compare it sorted: ``spader.infra.reruns.LISTS``)."""
    return list(dict.fromkeys(items))


class Section(BaseModel):
    """A config section: unknown keys are errors, numbers are finite, values are checked on
    assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


def model_kind(name: str) -> str:
    """``tiny`` (``tiny:<kind>``, built locally), ``path`` (a local path) or ``hub`` (a hub id).

    >>> model_kind("tiny:qwen3"), model_kind("Qwen/Qwen3-8B"), model_kind("./weights")
    ('tiny', 'hub', 'path')
    """
    if name.startswith("tiny:"):
        return "tiny"
    if os.path.exists(name) or name.startswith(("/", "./", "../")):
        return "path"
    return "hub"


# ---------------------------------------------------------------------------------------------
# Tracking and data sources
# ---------------------------------------------------------------------------------------------
class MlflowConfig(Section):
    """MLflow tracking (not a rerun trigger)."""

    enabled: bool = Field(True, description="track jobs in MLflow")
    tracking_uri: str = Field(
        "sqlite:///results/mlflow/mlflow.db",
        description="tracking URI; relative sqlite:/// paths resolve against the working directory",
    )
    experiment: str = Field("spader", min_length=1, description="experiment name")
    artifact_root: str = Field(
        "results/mlflow/artifacts", description="artifact root of a newly created experiment"
    )
    state_dir: str = Field(
        "results/mlflow", description="where the pipeline run id of the current invocation is kept"
    )
    stale_run_hours: StrictFloat = Field(
        72,
        gt=0,
        le=24 * 365,
        description="at the start of an invocation, RUNNING runs of other hosts older than this are "
        "marked KILLED (runs of this host are checked by PID)",
    )


class CorpusConfig(Section):
    """The QAMPARI Wikipedia 2021 chunk dump (docs/data.md, "The chunked Wikipedia corpus")."""

    url: str = Field(
        "https://aggreg-qa.s3.amazonaws.com/chunked_wikipedia.tar.gz",
        description="where chunked_wikipedia.tar.gz is downloaded from (http(s), file: or path; "
        "relative paths resolve against the repository root)",
    )
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        None, description="expected sha256 of the archive"
    )
    size_bytes: StrictInt | None = Field(
        None, ge=1, le=MAX_BYTES, description="expected size of the archive in bytes"
    )
    archive: str | None = Field(
        None,
        description="an already downloaded archive (skips download_dump; a relative path is relative "
        "to the working directory)",
    )
    prebuilt_index: str | None = Field(
        None,
        description="a prebuilt Lucene index with stored raw documents (skips download and build; a "
        "relative path is relative to the working directory)",
    )
    expected_documents: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="verified number of indexed passages"
    )


class HubSource(Section):
    """A file on the Hugging Face hub."""

    repo_id: str = Field(description="hub repository id, e.g. cmalaviya/quest")
    filename: str = Field(description="file path inside the repository")
    revision: str = Field("main", description="branch, tag or commit")
    repo_type: Literal["dataset", "model"] = Field("dataset", description="hub repository type")
    format: Literal["raw", "mintaka_parquet"] = Field(
        "raw",
        description="raw: the file as is; mintaka_parquet: rebuild mintaka_<split>.json from the "
        "parquet export",
    )
    split: str | None = Field(
        None,
        description="format mintaka_parquet: keep only the rows of this split when the file has a "
        "`split` column (null: all rows)",
    )
    local_dir: str | None = Field(
        None,
        description="read the hub layout from this local directory instead of the network (offline "
        "mirrors, tests)",
    )


class SourceConfig(Section):
    """Where a release file comes from."""

    url: str | None = Field(
        description="http(s) URL, file: URL, or a path (relative paths resolve against the repository "
        "root). null means the file must be supplied by the user; the download rule then fails "
        "with a message naming this key."
    )
    hub: HubSource | None = Field(
        None, description="Load the file from the Hugging Face hub instead of `url`."
    )


class SplitConfig(Section):
    """Which release file (and zip member) holds one split."""

    file: str = Field(description="a key of the dataset's `files`")
    member: str | None = Field(None, description="member path inside a zip archive")


class SplitsConfig(Section):
    """train (the mix pool) and test (the evaluation set)."""

    train: SplitConfig = Field(description="the split the training mix draws from")
    test: SplitConfig = Field(description="the evaluation set")


class DatasetConfig(Section):
    """One dataset's release files and splits (docs/data.md)."""

    files: dict[FileName, SourceConfig] = Field(
        min_length=1, description="Release files by name; each is fetched by rule download_dataset."
    )
    splits: SplitsConfig = Field(description="train (the mix pool) and test (the evaluation set).")

    @model_validator(mode="after")
    def _splits_name_files(self) -> DatasetConfig:
        for split in ("train", "test"):
            name = getattr(self.splits, split).file
            if name not in self.files:
                raise ValueError(
                    f"splits.{split}.file: '{name}' is not a key of files ({', '.join(self.files)})"
                )
        return self


def dataset_defaults(datasets: Any) -> Any:
    """``datasets`` (the config's section) laid over the registry's entries (:mod:`spader.datasets`),
    key by key as a config file is laid over another: the registry is the layer below
    ``config/config.yaml``, so a config gives only what it changes (a release file's source, a split's
    member) and keeps the entry's other files. A dataset the registry does not know is kept, for the
    check to name it; a section that is not a mapping is returned as it is, for the check to refuse."""
    from spader.config.files import overlay  # (files imports this module)

    if not isinstance(datasets, Mapping):
        return datasets
    out: dict[str, Any] = {}
    for name, entry in registry().items():
        given = datasets.get(name, {})
        out[name] = overlay(entry.config_default(), given) if isinstance(given, Mapping) else given
    return {**out, **{k: v for k, v in datasets.items() if k not in out}}


def _section_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _dataset_section(name: str) -> type[DatasetConfig]:
    """``datasets.<name>``: :class:`DatasetConfig` with the registry entry's release files and
    splits as its defaults (a class per dataset, so that the schema states them)."""
    default = registry()[name].config_default()
    splits = create_model(
        f"{_section_name(name)}Splits",
        __base__=SplitsConfig,
        __doc__=SplitsConfig.__doc__,
        **{
            split: (
                SplitConfig,
                Field(
                    default_factory=lambda s=split: SplitConfig.model_validate(default["splits"][s]),
                    description=SplitsConfig.model_fields[split].description,
                ),
            )
            for split in ("train", "test")
        },
    )
    files = DatasetConfig.model_fields["files"]
    return create_model(
        f"{_section_name(name)}Dataset",
        __base__=DatasetConfig,
        __doc__=DatasetConfig.__doc__,
        files=(
            dict[FileName, SourceConfig],
            Field(
                default_factory=lambda: {
                    k: SourceConfig.model_validate(v) for k, v in default["files"].items()
                },
                min_length=1,
                description=files.description,
            ),
        ),
        splits=(
            splits,
            Field(default_factory=splits, description=DatasetConfig.model_fields["splits"].description),
        ),
    )


class _Datasets(Section):
    @model_validator(mode="before")
    @classmethod
    def _over_the_registry(cls, data: Any) -> Any:
        return dataset_defaults(data)


#: ``datasets``: one section per dataset of the registry.
DatasetsConfig = create_model(
    "DatasetsConfig",
    __base__=_Datasets,
    __doc__="The datasets' release files (docs/data.md), one section per dataset of the registry "
    "(spader.datasets); a config gives only what it changes.",
    **{
        name: (section, Field(default_factory=section, description=entry.description))
        for name, entry in registry().items()
        for section in [_dataset_section(name)]
    },
)

#: ``mix.counts``: training instances per dataset, by default the paper's (the registry's).
MixCounts = create_model(
    "MixCounts",
    __base__=Section,
    __doc__="Training instances per dataset.",
    **{
        name: (
            StrictInt,
            Field(entry.paper_count, ge=0, le=MAX_COUNT, description=f"{entry.title} instances"),
        )
        for name, entry in registry().items()
    },
)


class MixConfig(Section):
    """The training mix (docs/data.md, "Training mix")."""

    seed: StrictInt = Field(42, ge=0, le=MAX_SEED, description="sampling seed")
    counts: MixCounts = Field(default_factory=MixCounts, description="Training instances per dataset.")
    min_answers: StrictInt = Field(
        1, ge=1, le=MAX_COUNT, description="fewest answers a training question may have"
    )
    max_answers: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="most answers a training question may have"
    )
    val_per_dataset: StrictInt = Field(
        50,
        ge=0,
        le=MAX_COUNT,
        description="validation instances per dataset (from the train pools, disjoint from the mix)",
    )
    eval_limit: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="cap on instances per evaluation set"
    )

    @property
    def drawn(self) -> list[str]:
        """The datasets the mix draws from (a count above 0), in table order."""
        return [d for d in DATASETS if getattr(self.counts, d) > 0]


# ---------------------------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------------------------
class Bm25Config(Section):
    """BM25 parameters."""

    k1: StrictFloat = Field(0.9, ge=0, le=100, description="term-frequency saturation")
    b: StrictFloat = Field(0.4, ge=0, le=1, description="length normalization")


class RerankerConfig(Section):
    """Cross-encoder reranker (FlagEmbedding)."""

    model: str | None = Field(
        "BAAI/bge-reranker-v2-m3",
        description="hub id, local path, tiny:reranker, or null for no reranking",
    )
    revision: str | None = Field(
        None,
        description="hub revision (a commit) the weights are downloaded at, when `model` is a hub id; "
        "null: the main branch",
    )
    batch_size: StrictInt = Field(64, ge=1, le=2**20, description="pairs per forward pass")
    max_length: StrictInt = Field(512, ge=16, le=2**20, description="max tokens per query-passage pair")
    max_batch_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**30,
        description="most tokens per forward pass (pairs x padded length), which bounds activation "
        "memory; null: batch_size x max_length",
    )
    fp16: bool = Field(True, description="half precision on GPU")
    devices: Device | list[Device] | None = Field(
        None,
        description="reranker devices, one replica each (cpu or cuda:<i>); null: every GPU of a "
        "training job, else the first GPU or the CPU",
    )

    @model_validator(mode="after")
    def _tiny_kind(self) -> RerankerConfig:
        if self.model and self.model.startswith("tiny:") and self.model != "tiny:reranker":
            raise ValueError(f"model: tiny rerankers are 'tiny:reranker', got '{self.model}'")
        return self

    @property
    def enabled(self) -> bool:
        """Whether passages are reranked at all."""
        return self.model not in (None, "none")


class ServiceConfig(Section):
    """The retrieval HTTP service started for the jobs that need it."""

    host: str = Field("127.0.0.1", description="bind address")
    max_queries_per_request: StrictInt = Field(512, ge=1, le=2**20, description="largest accepted batch")
    max_query_chars: StrictInt = Field(1000, ge=1, le=2**20, description="longest accepted query")
    startup_timeout_s: StrictFloat = Field(
        1800, ge=1, le=MAX_SECONDS, description="how long to wait for /health"
    )
    request_timeout_s: StrictFloat = Field(
        120, ge=1, le=MAX_SECONDS, description="client timeout per request"
    )
    retries: StrictInt = Field(3, ge=0, le=100, description="client retries on transient errors")
    cache_entries: StrictInt = Field(
        100000, ge=0, le=MAX_COUNT, description="most results the service's LRU cache keeps (0: no cache)"
    )
    cache_bytes: StrictInt = Field(
        268435456,
        ge=0,
        le=MAX_BYTES,
        description="most bytes the cache may hold in memory, keys and passages counted as Python holds them",
    )
    slice_queries: StrictInt = Field(
        64,
        ge=1,
        le=2**20,
        description="queries per search step; larger and merged requests are cut into slices",
    )
    overlap: bool = Field(True, description="BM25 of the next slice while the current one is reranked")
    header_timeout_s: StrictFloat = Field(
        20,
        gt=0,
        le=MAX_SECONDS,
        description="seconds a request's headers may take to arrive; then 408 and the connection is closed",
    )
    body_timeout_s: StrictFloat = Field(
        60,
        gt=0,
        le=MAX_SECONDS,
        description="seconds a request's body may take to arrive after its headers; then 408 and closed",
    )
    max_connections: StrictInt = Field(
        1024,
        ge=1,
        le=2**20,
        description="most open connections; one more is answered 503 (clients retry) and closed",
    )


class RetrievalConfig(Section):
    """The search tool (docs/method.md, "Retrieval")."""

    bm25: Bm25Config = Field(default_factory=Bm25Config, description="BM25 parameters.")
    initial_k: StrictInt = Field(
        50,
        ge=1,
        le=MAX_INITIAL_K,
        description="BM25 candidates per query (reranked; the service's maximum is 1000)",
    )
    topk: StrictInt = Field(5, ge=1, le=MAX_INITIAL_K, description="passages per query after reranking")
    reranker: RerankerConfig = Field(
        default_factory=RerankerConfig, description="Cross-encoder reranker (FlagEmbedding)."
    )
    service: ServiceConfig = Field(
        default_factory=ServiceConfig,
        description="The retrieval HTTP service started for the jobs that need it.",
    )


# ---------------------------------------------------------------------------------------------
# Backbones and variants
# ---------------------------------------------------------------------------------------------
class WarmstartConfig(Section):
    """Supervised warm start of a tiny policy (CPU demo only): fine-tuning on scripted episodes of
    the demo world (search with the question, then with the name in it if nothing, or not
    everything, was found, answer with the gold entities the passages showed), so that a random tiny model writes valid
    actions."""

    steps: StrictInt = Field(300, ge=1, le=MAX_COUNT, description="optimizer steps")
    lr: StrictFloat = Field(
        3.0e-3, gt=0, le=1, description="peak AdamW learning rate (linear warm-up, cosine decay to 10%)"
    )
    batch_size: StrictInt = Field(4, ge=1, le=2**20, description="scripted episodes per step")
    warmup_ratio: StrictFloat = Field(0.05, ge=0, lt=1, description="fraction of the steps spent warming up")
    weight_decay: StrictFloat = Field(0.0, ge=0, le=1, description="AdamW weight decay")
    max_searches: StrictInt = Field(
        2,
        ge=1,
        le=2,
        description="search steps a scripted episode may take (the second as `retry` says)",
    )
    retry: Literal["none_found", "incomplete"] = Field(
        "none_found",
        description="when a scripted episode searches a second time (with `max_searches` 2): "
        "`none_found`, when its first search showed no gold entity; `incomplete`, when it did not "
        "show every gold entity (a list question searched again for the rest)",
    )
    world_questions: bool = Field(
        True,
        description="besides the training mix, script the bundled demo world's questions about topics "
        "no evaluation question asks about or answers",
    )
    first_turn_examples: bool = Field(
        True,
        description="also train on each multi-turn episode's first turn alone (prompt and first search)",
    )
    generated_worlds: StrictInt = Field(
        0,
        ge=0,
        le=1000,
        description="also script this many demo-like worlds generated with other seeds (names the demo "
        "world never uses), searched over their own passages, so that the policy learns to copy "
        "names from what it reads",
    )
    copy_weight: StrictFloat = Field(
        0.0,
        ge=0,
        le=1000,
        description="weight of a copying task trained beside the episodes at every step (random spans of "
        "name pieces repeated after noise), so that the policy can write a name it has only read; 0: none",
    )
    copy_batch_size: StrictInt = Field(16, ge=1, le=2**20, description="copying sequences per step")
    copy_length: StrictInt = Field(64, ge=8, le=2**20, description="longest copying sequence (tokens)")
    copy_attention_weight: StrictFloat = Field(
        1.0,
        ge=0,
        le=1000,
        description="weight of the copying task's attention targets (the first layer's first head on the "
        "previous token, the last layer's first head on the current token's earlier occurrence)",
    )
    seed: StrictInt = Field(0, ge=0, le=MAX_SEED, description="seed of the batches and of torch")


class BackboneConfig(Section):
    """One policy backbone and the methods it runs."""

    model: str = Field(
        min_length=1, description="hub id, local path, or tiny:qwen3 (a tiny random model built locally)"
    )
    revision: str | None = Field(
        None,
        description="hub revision (a commit) the weights are downloaded at, when `model` is a hub id; "
        "null: the repository's main branch",
    )
    gpus: StrictInt = Field(8, ge=0, le=1024, description="GPUs per training job (resources: gpu)")
    warmstart: WarmstartConfig | None = Field(
        None,
        description="tiny:qwen3 backbones only: warm-start the policy by supervised fine-tuning (rule "
        "warmstart_policy) before training and the prompting methods use it; null: the model as "
        "built or released",
    )
    variants: list[str] = Field(default_factory=list, description="trained variants (keys of `variants`)")
    prompting: list[Literal["rag", "react"]] = Field(
        default_factory=lambda: list(PROMPTING),
        description="prompting methods evaluated with the backbone as released (or warm-started)",
    )

    @model_validator(mode="after")
    def _model_rules(self, info: ValidationInfo) -> BackboneConfig:
        _unique(self.variants, "variants")
        _unique(self.prompting, "prompting")
        if self.model.startswith("tiny:") and self.model != "tiny:qwen3":
            raise ValueError(f"model: tiny backbones are 'tiny:qwen3', got '{self.model}'")
        if self.warmstart is not None and not self.model.startswith("tiny:"):
            raise ValueError(
                f"warmstart: only tiny backbones (tiny:qwen3) are warm-started, '{self.model}' is used "
                "as released; set it to null"
            )
        if (info.context or {}).get("check_paths") and model_kind(self.model) == "path":
            if not os.path.exists(self.model):
                raise ValueError(f"model: local path '{self.model}' does not exist")
        return self

    @property
    def is_tiny(self) -> bool:
        return self.model.startswith("tiny:")


def _registry_text(registry) -> str:
    return "; ".join(f"{spec.name}: {spec.description}" for spec in registry.values())


#: The variant keys of the bundled methods' rewards (:func:`spader.methods.bundled_keys`): every
#: variant has them, and a key its reward does not read keeps its default.
_BUNDLED_KEYS = bundled_keys()


class _Variant(Section):
    """One trained variant (docs/method.md, "Ablations and baselines"): an advantage and a reward
    of the method registry (:mod:`spader.methods`) with the keys the reward reads. A key that the
    variant's reward does not read keeps its default; a reward of a method from outside the
    repository (an entry point) adds its own keys to its variants only."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, frozen=False, allow_inf_nan=False)

    verl_config: Name | None = Field(
        None,
        description="name of the verl YAML in config/verl/ the variant composes from; null: its "
        "method's (the method of its reward, or of its advantage for the terminal reward)",
    )
    advantage: Name = Field(
        "spa",
        description=f"an advantage of the method registry: {_registry_text(ADVANTAGES)}; pairing: "
        f"{pairing_rule(tuple(ADVANTAGES))}; or one of a method from an entry point (docs/methods.md)",
    )
    reward: Name = Field(
        "step",
        description=f"a reward of the method registry: {_registry_text(REWARDS)} (docs/baselines.md); "
        "or one of a method from an entry point (docs/methods.md)",
    )
    nodes: int | None = Field(
        None,
        ge=1,
        le=64,
        description="nodes of this variant's training job (null: training.nodes); e.g. 2 for an "
        "LLM-judged r3rag, whose judge then has the second node (docs/cluster.md)",
    )
    invalid_format_reward: StrictFloat = Field(
        -1.0,
        ge=-1,
        le=1,
        description="terminal reward of an invalid format (paper: -1; the authors' code gives 0 in "
        "SPADER's reward manager and its ablations, -1 in their GRPO)",
    )
    table: Literal[TABLES] | None = Field(  # type: ignore[valid-type]
        None,
        description="a table of results/{backbone}/ the variant is a row of besides f1.tsv and the "
        "others every method has: ablation (labelled by `label`) or beta_sweep (by its beta); "
        "its method must offer it (SPADER offers both); null: none",
    )
    label: str | None = Field(
        None, min_length=1, max_length=80, description="the variant's name in its `table` (ablation rows)"
    )

    @model_validator(mode="before")
    @classmethod
    def _plugin_keys(cls, data: Any) -> Any:
        """Keys beyond the model's fields: those of a plug-in method's reward, validated by its
        settings (defaults filled in); any other is refused."""
        if not isinstance(data, dict):
            return data
        load_plugins()
        extra = [k for k in data if k not in cls.model_fields]
        for key, known in (("reward", REWARDS), ("advantage", ADVANTAGES)):
            value = data.get(key, cls.model_fields[key].default)
            if not isinstance(value, str) or value not in known:
                names = [repr(n) for n in known]
                either = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
                raise ValueError(f"{key}: Input should be {either} (the method registry's), got {value!r}")
        reward = data.get("reward", cls.model_fields["reward"].default)
        settings = REWARDS[reward].settings
        plugin = settings is not None and not set(settings.model_fields) <= set(_BUNDLED_KEYS)
        if not plugin:
            if extra:
                raise ValueError(f"unknown keys {sorted(extra)} (reward {reward!r} reads no such key)")
            return data
        unknown = [k for k in extra if k not in settings.model_fields]
        if unknown:
            raise ValueError(
                f"unknown keys {sorted(unknown)}: reward {reward!r} reads {', '.join(settings.model_fields)}"
            )
        own = settings.model_validate({k: data[k] for k in extra}).model_dump(mode="json")
        return {**{k: v for k, v in data.items() if k not in extra}, **own}

    @model_validator(mode="after")
    def _advantage_trains_reward(self) -> _Variant:
        errors = [f"advantage: {e}" for e in pairing_errors(self.advantage, self.reward)]
        read = reward_spec(self.reward).keys
        for name in _BUNDLED_KEYS:
            if name not in read and getattr(self, name) != type(self).model_fields[name].default:
                errors.append(
                    f"{name}: reward {self.reward!r} does not read it (set it only for a reward that "
                    f"does, or leave it out); got {getattr(self, name)!r}"
                )
        method = method_of(self.advantage, self.reward)
        offered = {role.table for role in method.tables}
        if self.table is not None and self.table not in offered:
            errors.append(
                f"table: method {method.name!r} offers {sorted(offered) or 'no table'}, got {self.table!r}"
            )
        if self.table == "ablation" and self.label is None:
            errors.append("label: an ablation row needs its label")
        if errors:
            raise ValueError("\n".join(errors))
        return self

    @property
    def method(self) -> Method:
        """The method the variant belongs to (:func:`spader.methods.method_of`)."""
        return method_of(self.advantage, self.reward)

    def settings(self) -> BaseModel:
        """The keys its reward reads, as the reward's settings model."""
        spec = reward_spec(self.reward)
        return spec.settings.model_validate({k: getattr(self, k) for k in spec.keys})

    @property
    def serves_judge(self) -> bool:
        """An R3-RAG variant scored by the LLM judge."""
        return self.reward == "r3rag" and self.judge == "llm"


VariantConfig = create_model(
    "VariantConfig",
    __base__=_Variant,
    __module__=__name__,
    __doc__=_Variant.__doc__,
    **{name: (info.annotation, info) for name, info in _BUNDLED_KEYS.items()},
)


# ---------------------------------------------------------------------------------------------
# Training, agent, evaluation
# ---------------------------------------------------------------------------------------------
class CostWarmup(Section):
    """Tool-cost warm-up schedule of the authors' code."""

    free_steps: StrictInt = Field(100, ge=0, le=MAX_COUNT, description="steps with zero tool cost")
    ramp_steps: StrictInt = Field(
        100, ge=0, le=MAX_COUNT, description="steps of linear ramp to the full cost"
    )


class DivergencesConfig(Section):
    """Options reproducing the authors' published code (docs/method.md, "Known divergences")."""

    novelty: Literal["inverse", "exp_decay"] = Field(
        "inverse", description="inverse: beta/N (paper); exp_decay: beta*exp(-(N-1)) (code)"
    )
    aliases: Literal["aware", "blind"] = Field(
        "aware",
        description="training reward's gold entities: aware (any alias matches, paper) or blind (the "
        "authors' code: each alias list becomes one string, so an entity with two or more aliases "
        "never matches, in the F1 and in step discovery)",
    )
    discovery: Literal["passages", "substring"] = Field(
        "passages",
        description="how the training reward finds an entity at a search step: passages (an alias "
        "occurs as whole words in the normalised text of the passages shown, paper) or substring (the "
        "authors' code: an alias, normalised by their normalize_answer, occurs anywhere in the whole "
        "observation text, which echoes the queries)",
    )
    cost_warmup: CostWarmup | None = Field(
        None, description="tool-cost warm-up by training step (code); null: none"
    )
    epsilon: Literal["outside", "inside_sqrt"] = Field(
        "outside", description="SPA spread: sigma + eps (paper) or sqrt(var + eps) (code)"
    )


class TimeLimitConfig(Section):
    """How a training job lives with a scheduler's time limit (docs/cluster.md): it asks SLURM for
    a warning signal, stops at the next step boundary after a checkpoint and exits with a status
    the workflow retries; the retry resumes. Operational: editing these keys retrains nothing."""

    hours: dict[
        str,
        Annotated[
            StrictFloat, Field(gt=0, le=24 * 365, description="hours of one training run of this variant")
        ],
    ] = Field(
        default_factory=lambda: {"default": 40.0},
        description="wall-time estimate of one training run per variant, in hours (rule train_policy's "
        "runtime, capped by the SLURM profile's max_runtime for train_policy); `default` for variants "
        "not listed",
    )
    warning_s: StrictInt = Field(
        1800,
        ge=60,
        le=MAX_SECONDS,
        description="seconds before the time limit at which SLURM signals the job (SIGURG) to stop at "
        "its next step boundary; must cover the rest of a step plus a checkpoint save",
    )
    retries: StrictInt = Field(
        5,
        ge=0,
        le=100,
        description="automatic reruns of a training job (Snakemake retries); each resumes from the newest "
        "checkpoint, so a run longer than the time limit spans up to retries + 1 allocations",
    )
    failure_retries: StrictInt = Field(
        1,
        ge=0,
        le=100,
        description="how many of those reruns may follow an attempt that failed for another reason than a "
        "stop signal or a time limit (0: such a failure waits for a rerun by hand)",
    )

    @model_validator(mode="after")
    def _default_hours(self) -> TimeLimitConfig:
        if "default" not in self.hours:
            raise ValueError("hours: needs a `default` entry (variants not listed take it)")
        return self

    def estimate_minutes(self, variant: str) -> int:
        """The variant's wall-time estimate in whole minutes (SLURM's ``--time``)."""
        return max(1, round(60 * self.hours.get(variant, self.hours["default"])))


class TrainingConfig(Section):
    """verl training hyperparameters (docs/method.md, "Training setup")."""

    epochs: StrictInt = Field(1, ge=1, le=10**4, description="passes over the training mix")
    train_batch_size: StrictInt = Field(32, ge=1, le=2**20, description="prompts per step")
    ppo_mini_batch_size: StrictInt = Field(32, ge=1, le=2**20, description="prompts per PPO mini-batch")
    ppo_micro_batch_size_per_gpu: StrictInt = Field(4, ge=1, le=2**20, description="micro-batch per GPU")
    lr: StrictFloat = Field(1.0e-5, gt=0, le=1, description="AdamW learning rate")
    lr_warmup_ratio: StrictFloat = Field(0.05, ge=0, le=1, description="warm-up fraction of steps")
    rollout_n: StrictInt = Field(16, ge=1, le=2**16, description="rollouts per prompt (G)")
    temperature: StrictFloat = Field(1.0, ge=0, le=10, description="rollout temperature")
    top_p: StrictFloat = Field(1.0, gt=0, le=1, description="rollout top-p")
    kl_loss_coef: StrictFloat = Field(0.001, ge=0, le=100, description="KL loss coefficient")
    kl_loss_type: str = Field("low_var_kl", description="verl KL loss type")
    gamma: StrictFloat = Field(
        0.9,
        ge=0,
        le=1,
        description="discount over decision steps of the step rewards (variants with reward step only; "
        "the other rewards are trained with their own: terminal has one step, stepsearch and r3rag use 1.0)",
    )
    max_prompt_length: StrictInt = Field(512, ge=1, le=2**24, description="prompt tokens")
    max_response_length: StrictInt = Field(
        8192, ge=1, le=2**24, description="response tokens, tool text included"
    )
    gpu_memory_utilization: StrictFloat = Field(
        0.6,
        gt=0,
        le=1,
        description="sglang's mem_fraction_static: its share, for weights and KV cache, of the GPU memory "
        "free when it starts (after verl's models and the reranker; sglang 0.5.14)",
    )
    save_freq: StrictInt = Field(
        100,
        ge=1,
        le=MAX_COUNT,
        description="checkpoint every N steps at most; a GPU training saves more often when its plan says "
        "so, to bound the work a time limit can lose (max_work_lost_minutes; a CPU training saves every N)",
    )
    test_freq: StrictInt = Field(50, ge=1, le=MAX_COUNT, description="validate every N steps")
    val_before_train: bool = Field(
        True, description="validate once before the first step (verl's trainer.val_before_train)"
    )
    max_actor_ckpt_to_keep: StrictInt | None = Field(
        2, ge=1, le=10**4, description="actor checkpoints kept, the newest (null: all)"
    )
    max_critic_ckpt_to_keep: StrictInt | None = Field(
        2, ge=1, le=10**4, description="critic checkpoints kept, the newest (null: all)"
    )
    max_work_lost_minutes: StrictFloat = Field(
        60.0,
        gt=0,
        le=10**6,
        description="most minutes of training a GPU training may lose when its allocation ends without a "
        "save (a time limit whose warning the step and its save do not fit, a lost node): its plan saves "
        "every N steps with N x step + save within this, and refuses a run whose one step and save exceed "
        "it (operational: retrains nothing)",
    )
    keep_checkpoints: bool = Field(
        False,
        description="keep a training's intermediate checkpoints once its export is written (false: the "
        "export step deletes every checkpoint of the work directory but the final one, which a re-export "
        "reads; operational: retrains nothing)",
    )
    seed: StrictInt = Field(
        1,
        ge=0,
        le=MAX_SEED,
        description="training seed: prompt order, mini-batch shuffling, rollout sampling",
    )
    shuffle: bool = Field(
        True,
        description="shuffle the training prompts each epoch (verl's data.shuffle; the authors' code: "
        "false, the file's order)",
    )
    device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="where verl trains: GPUs, or the CPU (verl's trainer through the project's CPU platform)",
    )
    rollout_backend: Literal["sglang", "transformers"] = Field(
        "sglang", description="rollout engine: sglang (cuda) or the transformers replica (cpu)"
    )
    cpu_workers: StrictInt = Field(
        1, ge=1, le=1024, description="training processes (FSDP ranks) when device is cpu"
    )
    max_steps: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="stop after this many steps (null: the epochs decide)"
    )
    divergences: DivergencesConfig = Field(
        default_factory=DivergencesConfig,
        description='Options reproducing the authors\' published code (docs/method.md, "Known divergences").',
    )
    remove_padding: bool = Field(
        False,
        description="packed micro-batches (verl's remove-padding path) for the actor's, reference's and "
        "critic's passes instead of padded ones with an attention mask: the real tokens only, through "
        "PyTorch's variable-length attention (the project's `spader_varlen` attention; docs/gpu.md)",
    )
    max_token_len_per_gpu: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="token-capped micro-batches (verl's use_dynamic_bsz): each micro-batch holds as many "
        "sequences as fit in this many real tokens, instead of ppo_micro_batch_size_per_gpu sequences; "
        "needs remove_padding (the padded path pads every sequence to the longest, which a token cap does "
        "not bound) and at least max_prompt_length + max_response_length; null: fixed micro-batches",
    )
    nodes: StrictInt = Field(
        1,
        ge=1,
        le=1024,
        description="nodes per training job, each with the backbone's GPUs: a Ray cluster spans them "
        "and verl trains with trainer.nnodes (an LLM-judged R3-RAG variant keeps the last node for its "
        "judge); the default of every variant, variants.<name>.nodes overrides it for one; more than one "
        "needs a cluster executor (docs/cluster.md)",
    )
    time_limit: TimeLimitConfig = Field(
        default_factory=TimeLimitConfig,
        description="How a training job lives with a scheduler's time limit (docs/cluster.md).",
    )
    rollout_timeout_s: StrictFloat = Field(
        1800.0,
        ge=10,
        le=86400,
        description="a training job stops with an error when the rollout engine (sglang, or the CPU replica) "
        "leaves one generation request of a turn unanswered this long, or its server died: a hung or dead "
        "engine would otherwise score every later episode 0; one turn of the paper's sizes takes minutes at most",
    )
    max_search_error_rate: StrictFloat = Field(
        0.2,
        ge=0,
        le=1,
        description="a training job stops with an error when more than this share of the search queries "
        "of a check interval (30 s, at least 50 queries) failed in the retrieval service",
    )
    over_plan_factor: StrictFloat = Field(
        1.5,
        ge=1,
        le=100,
        description="a training job names on the console, in one line, a measured step time (so its run time), GPU "
        "peak or host peak above its plan's by more than this factor (after its first step; docs/gpu.md)",
    )
    stop_when_over_plan: bool = Field(
        False,
        description="a training job over its plan by training.over_plan_factor stops at its next step boundary, "
        "after a checkpoint (a rerun resumes), instead of training on",
    )

    @model_validator(mode="after")
    def _device_runs_backend(self) -> TrainingConfig:
        if (self.device, self.rollout_backend) not in (("cuda", "sglang"), ("cpu", "transformers")):
            raise ValueError(
                f"rollout_backend: {self.rollout_backend!r} cannot serve device {self.device!r} "
                "(cuda trains with sglang, cpu with transformers)"
            )
        return self

    @model_validator(mode="after")
    def _token_cap_on_the_packed_path(self) -> TrainingConfig:
        if self.max_token_len_per_gpu is None:
            return self
        if not self.remove_padding:
            raise ValueError(
                "max_token_len_per_gpu: token-capped micro-batches need remove_padding: true (the padded "
                "path pads every sequence of a micro-batch to its longest, so a cap on real tokens does not "
                "bound the tokens computed)"
            )
        longest = self.max_prompt_length + self.max_response_length
        if self.max_token_len_per_gpu < longest:
            raise ValueError(
                f"max_token_len_per_gpu: {self.max_token_len_per_gpu} is below the longest sequence "
                f"(max_prompt_length + max_response_length = {longest}), which must fit in one micro-batch"
            )
        return self

    @property
    def trajectories_per_step(self) -> int:
        return self.train_batch_size * self.rollout_n


class AgentConfig(Section):
    """One agent turn, the same in training rollouts and evaluation (docs/method.md, "Prompt and
    format")."""

    max_turns: StrictInt = Field(16, ge=1, le=10**4, description="assistant turns per episode")
    max_turn_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="cap on new tokens per assistant turn; null: none, a turn may use the episode's "
        "remaining token budget (as the authors' training)",
    )
    regenerations: StrictInt = Field(
        0,
        ge=0,
        le=100,
        description="a malformed turn is sampled again up to this many times before it counts "
        "(R3-RAG's original: 3); 0: every turn is sampled once",
    )
    max_tool_response_chars: StrictInt = Field(
        11000, ge=1, le=2**30, description="observation cap in characters"
    )
    max_queries_per_call: StrictInt | None = Field(
        10,
        ge=1,
        le=2**20,
        description="queries of one tool call beyond this are not run (they still count in q_t); null: "
        "every query runs (the authors' code)",
    )
    stop: Annotated[list[Literal["</tool_call>", "</answer>"]], AfterValidator(_once)] = Field(
        default_factory=lambda: ["</tool_call>", "</answer>"],
        description="a turn ends right after the first of these closing tags to occur (kept; a set: "
        "their order and repeats mean nothing); [] : no stop string, a turn runs to the model's end "
        "of turn or the budget (the authors' code)",
    )
    parser: Literal["spader", "authors"] = Field(
        "spader",
        description="how turns and answers are read: spader (a turn's call is its first, ended by its "
        "closing tag; the answer is the last turn's last <answer>, a JSON list of strings) or authors "
        "(a turn's call is its last <tool_call>; a turn without one ends the episode; the answer is "
        "the last <answer> anywhere, read as JSON, else a Python literal, else the raw string)",
    )
    observation_format: Literal["spader", "authors"] = Field(
        "spader",
        description="observation text: spader (numbered passages per query, lowest-ranked dropped to "
        "fit max_tool_response_chars) or authors (the authors' search server's JSON with the queries "
        "echoed and each title repeated, indent 2, capped at 10,000 characters with a System Note, "
        "then cut to its first max_tool_response_chars characters; their error messages)",
    )
    prompt_template: Annotated[str, StringConstraints(min_length=1)] | None = Field(
        None,
        description="the user prompt: a packaged template by name (default, authors: the authors' "
        "wording) or a template file (one {question} placeholder); null: default",
    )


class EvaluationConfig(Section):
    """Agent inference for evaluation (docs/method.md, "Evaluation")."""

    engine: Literal["sglang", "transformers"] = Field("sglang", description="generation engine")
    max_context_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="token budget of an episode (prompt and response); null: training's "
        "max_prompt_length + max_response_length",
    )
    max_response_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="cap on the tokens after the prompt (generated and observations), as training's "
        "max_response_length caps a rollout; null: only max_context_tokens (whose prompt share a "
        "short prompt leaves to the response)",
    )
    max_turn_tokens: StrictInt | None = Field(
        None,
        ge=1,
        le=2**24,
        description="cap on new tokens per assistant turn in evaluation only (the authors' evaluation: "
        "5,096); null: agent.max_turn_tokens",
    )
    temperature: StrictFloat = Field(
        1.0,
        ge=0,
        le=10,
        description="sampling temperature (the authors' evaluation: 1.0); 0 is greedy decoding",
    )
    top_p: StrictFloat = Field(1.0, gt=0, le=1, description="top-p when sampling")
    generation_config: bool = Field(
        False,
        description="fill top_k, top_p, min_p and repetition_penalty from the policy's "
        "generation_config.json (vLLM's default since 0.8, which the authors' evaluation served; verl "
        "copies the file into merged checkpoints); false: top_p as configured, no top-k",
    )
    loop: Literal["spader", "authors"] = Field(
        "spader",
        description="evaluation loop: spader (training's ids kept turn by turn, a call in the last turn "
        "is not run, every failure scores 0) or authors (their script: the history re-rendered "
        "through the chat template each turn, the last turn's call runs, an episode stopped by a "
        "generation error is scored on what it wrote, an episode that failed otherwise is left out "
        "of the means)",
    )
    metrics: Literal["spader", "authors"] = Field(
        "spader",
        description="precision, recall and F1 of an instance: spader (norm_v1, each gold entity matched "
        "once by one prediction) or authors (their script: their normalize_answer, a prediction is "
        "correct when it equals any gold alias, so two aliases of one entity are two correct "
        "predictions in precision)",
    )
    seed: StrictInt = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="sampling seed; each request samples with its own seed derived from it",
    )
    max_error_share: StrictFloat = Field(
        0.02,
        ge=0,
        le=1,
        description="an evaluation whose share of episodes lost to generation errors exceeds this fails "
        "instead of writing its records",
    )
    gpus: StrictInt = Field(1, ge=0, le=1024, description="GPUs per evaluation job")
    cpu_threads: StrictInt = Field(
        2,
        ge=1,
        le=1024,
        description="CPU threads of an evaluation job without GPUs (`gpus: 0`), shared by its policy and its "
        "search service; a GPU job's come from the node. Not a result setting: changing it reruns nothing",
    )
    gpu_memory_utilization: StrictFloat = Field(
        0.7,
        gt=0,
        le=1,
        description="sglang mem_fraction_static (the search service's reranker shares the GPU)",
    )
    batch_size: StrictInt = Field(
        64, ge=1, le=2**20, description="transformers engine: prompts per forward batch"
    )
    seeds: list[Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]] | None = Field(
        None,
        description="several sampling seeds: every question is evaluated once per seed and the tables "
        "report the mean over seeds and its spread (needs temperature > 0); null: `seed` alone",
    )
    bootstrap_samples: StrictInt = Field(
        10000,
        ge=100,
        le=10**7,
        description="bootstrap resamples of the questions for the tables' intervals, and random sign "
        "patterns of the paired permutation test",
    )
    bootstrap_seed: StrictInt = Field(
        0, ge=0, le=MAX_SEED, description="seed of the bootstrap resamples and permutations"
    )
    significance_level: StrictFloat = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="level of the paired tests against spader (significance.tsv); intervals are at 1 - level",
    )
    topics: Annotated[str, StringConstraints(min_length=1)] | None = Field(
        None,
        description="a TSV file naming the topics of the evaluation questions (header `id<TAB>topic`, one "
        "line per question and topic): the rows pooled over datasets (`avg`, `all`) resample and test "
        "clusters of questions that share a topic instead of single questions (a relative path resolves "
        "against the repository root); null: every question is its own unit (the paper's four datasets "
        "share no topic; the CPU demo's do)",
    )

    @model_validator(mode="after")
    def _seeds_sample(self) -> EvaluationConfig:
        if self.seeds is not None:
            if not self.seeds or len(set(self.seeds)) != len(self.seeds):
                raise ValueError(f"seeds: a non-empty list of distinct seeds, got {self.seeds}")
            if len(self.seeds) > 1 and self.temperature == 0:
                raise ValueError(
                    "seeds: greedy decoding (temperature 0) gives the same episodes for every seed; "
                    "set temperature > 0 or a single seed"
                )
        return self


class EvidenceConfig(Section):
    """Rule build_evidence, one evidence passage per gold entity of the training mix."""

    depth: StrictInt = Field(
        50, ge=1, le=MAX_INITIAL_K, description="passages per query kept after reranking"
    )
    queries_per_request: StrictInt = Field(
        128, ge=1, le=2**20, description="queries per request to the retrieval service"
    )
    concurrency: StrictInt = Field(2, ge=1, le=1024, description="requests in flight")
    qampari_proof_text: bool = Field(
        False, description="QAMPARI entities take the release's proof_text instead"
    )
    gpus: StrictInt = Field(1, ge=0, le=1024, description="GPUs of the job (the reranker's)")


class StepSearchConfig(Section):
    """StepSearch (docs/baselines.md): its evidence and reward computation."""

    evidence: EvidenceConfig = Field(
        default_factory=EvidenceConfig,
        description="Rule build_evidence, one evidence passage per gold entity of the training mix.",
    )
    workers: StrictInt = Field(
        4, ge=0, le=1024, description="processes computing the per-passage TF-IDF in training (0: none)"
    )


#: The judge settings the trainer's judge client reads (besides ``model`` and ``url``).
JUDGE_CLIENT_KEYS = ("timeout_s", "retries", "concurrency", "max_tokens", "temperature", "unparsable")


class JudgeConfig(Section):
    """R3-RAG's LLM judge (variants with judge llm)."""

    model: str = Field(
        "Qwen/Qwen2.5-14B-Instruct", min_length=1, description="hub id or local path of the judge model"
    )
    revision: str | None = Field(None, description="hub commit of the judge weights")
    url: Annotated[str, StringConstraints(pattern=r"^https?://")] | None = Field(
        None,
        description="OpenAI-compatible base URL of a running judge (null: serve one on the training node)",
    )
    gpus: StrictInt = Field(
        4, ge=1, le=1024, description="GPUs of the training node set aside for the judge server"
    )
    tensor_parallel: StrictInt = Field(1, ge=1, le=1024, description="GPUs per judge replica")
    mem_fraction: StrictFloat = Field(0.85, gt=0, le=1, description="sglang mem_fraction_static of the judge")
    max_tokens: StrictInt = Field(
        4096, ge=1, le=2**24, description="reply budget of the judge (R3-RAG's original: 4,096 tokens)"
    )
    temperature: StrictFloat | None = Field(
        0.0, ge=0, le=10, description="judge sampling temperature; null: the server's default (R3-RAG's code)"
    )
    unparsable: Literal["zero", "raise"] = Field(
        "zero",
        description="a reply without a Relevance verdict: zero (scores 0 and is logged) or raise (an "
        "error, as R3-RAG's code)",
    )
    startup_timeout_s: StrictFloat = Field(
        1800, ge=1, le=MAX_SECONDS, description="how long the judge server may take to load"
    )
    timeout_s: StrictFloat = Field(120, gt=0, le=MAX_SECONDS, description="timeout per judge request")
    retries: StrictInt = Field(
        3, ge=0, le=100, description="retries on connection errors, timeouts, 429 and 5xx"
    )
    concurrency: StrictInt = Field(64, ge=1, le=2**16, description="judge requests in flight")


class CodeRerunsConfig(Section):
    """Whether a change to the code a stage runs reruns its jobs. Every computing rule has a
    fingerprint of its script and of the package modules it runs (docs/ARCHITECTURE.md, "Rerun
    semantics"); with a group switched off, its jobs keep the fingerprint of the code they ran
    (recorded with their outputs) and rerun only when a param or an input changes. The
    fingerprint of the code that actually ran is recorded either way (MLflow tag
    `code.fingerprint`). `python -m spader.infra.stage_code affected <file>` lists the rules a
    change would rerun."""

    data: bool = Field(
        True, description="normalize_dataset, mix_training_set, export_rl_dataset, export_eval_set"
    )
    retrieval: bool = Field(True, description="build_bm25_index")
    models: bool = Field(True, description="build_tiny_model, warmstart_policy (tiny demo models)")
    scorers: bool = Field(True, description="build_evidence (StepSearch's evidence)")
    training: bool = Field(True, description="train_policy, export_checkpoint (GPU-days per variant)")
    evaluation: bool = Field(True, description="evaluate_policy, aggregate_results, compare_runs")


#: GPU models the plan knows the peak bf16 FLOP/s and memory bandwidth of
#: (``spader.training.costs.GPUS``, with their sources).
GPU_MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200")


class HardwareConfig(Section):
    """The node the GPU jobs are planned for, and the assumptions of the plan's time model
    (``spader plan``, docs/gpu.md). A cluster's nodes must match ``cores`` and
    ``host_memory_gib`` (SLURM's ``--cpus-per-task`` and the cap of ``--mem``) and have at least
    ``backbones.<name>.gpus`` GPUs (``--gpus``)."""

    gpu: Literal[GPU_MODELS] = Field(  # type: ignore[valid-type]
        "A100-80GB",
        description="GPU model: its peak dense bf16 FLOP/s, memory and host-link bandwidth (the plan's "
        "table, spader.training.costs.GPUS) drive the time estimates",
    )
    gpu_memory_gib: StrictFloat = Field(
        80,
        gt=0,
        le=1024,
        description="memory of one GPU in GiB; the memory plan fails a job whose per-GPU peak exceeds it "
        "(a training job's preflight uses the memory its GPUs report)",
    )
    gpus: StrictInt = Field(
        8,
        ge=1,
        le=64,
        description="GPUs of one node; a GPU job gets the node's cores and host memory in proportion to the "
        "GPUs it holds (a training job holds backbones.<name>.gpus, evaluation evaluation.gpus)",
    )
    cores: StrictInt = Field(
        64,
        ge=1,
        le=4096,
        description="CPU cores of one node that jobs may use: a GPU job's threads (SLURM --cpus-per-task) are "
        "this share of its GPUs; a cluster's nodes must have at least this many",
    )
    host_memory_gib: StrictFloat = Field(
        480,
        ge=1,
        le=65536,
        description="host memory of one node in GiB that jobs may use; the plan fails a training job whose "
        "host memory (pinned reference model, sglang's weight copies, offloaded states, processes) exceeds "
        "it, and a training job asks SLURM (--mem) for the plan's need with headroom, at most its share of this",
    )
    disk_gib: StrictFloat = Field(
        6000,
        ge=1,
        le=10_000_000,
        description="free space in GiB of the file system holding results/; the plan fails a training job "
        "whose work directory at its peak (checkpoints kept and those coexisting during an attempt) plus "
        "its export exceeds it",
    )
    mfu: StrictFloat = Field(
        0.4,
        ge=0.05,
        le=0.8,
        description="time model: share of the GPUs' peak dense bf16 FLOP/s that the training passes and the "
        "rollouts' prefill reach (model FLOPs utilisation; 0.35-0.45 is typical of FSDP training of 8B "
        "models with activation checkpointing)",
    )
    mfu_low: StrictFloat = Field(
        0.3,
        ge=0.05,
        le=0.8,
        description="time model: the MFU of the high end of the step and run times (mfu gives the low end; "
        "above mfu it counts as mfu)",
    )
    bandwidth_efficiency: StrictFloat = Field(
        0.6,
        ge=0.05,
        le=1,
        description="time model: share of the GPUs' memory bandwidth that decoding reaches (each decoding "
        "step reads the weights and the KV cache of its running sequences) and of the host link that "
        "offloaded states move at",
    )
    length_share: StrictFloat = Field(
        0.5,
        gt=0,
        le=1,
        description="time model: mean trajectory length (prompt, generated tokens and tool observations) as "
        "a share of max_prompt_length + max_response_length; lengths are modelled as uniform with this mean "
        "and the maximum as upper end (docs/gpu.md)",
    )
    length_share_high: StrictFloat = Field(
        0.65,
        gt=0,
        le=1,
        description="time model: the mean trajectory length's share of the high end of the step and run times "
        "(length_share gives the low end; below length_share it counts as length_share)",
    )
    generated_share: StrictFloat = Field(
        0.25,
        gt=0,
        le=1,
        description="time model: share of a trajectory's tokens the policy generates (decoded one by one); "
        "the rest (prompt, tool observations) is prefilled",
    )
    calibration: str | None = Field(
        None,
        min_length=1,
        description="a record written by scripts/gpu_memory_calibration.py (YAML): its measured activation "
        "and log-prob constants replace the plan's estimates for the shapes it measured; null: estimates",
    )


# ---------------------------------------------------------------------------------------------
# The whole configuration
# ---------------------------------------------------------------------------------------------
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
            if spec.reward == "r3rag" and spec.judge == "reranker" and not self.retrieval.reranker.enabled:
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

    def evaluation_params(self) -> dict[str, Any]:
        """``evaluation`` as rule evaluate_policy's param: the section with its context budget
        resolved (:attr:`evaluation_context_tokens`)."""
        params = self.evaluation.model_dump(exclude={"cpu_threads"})  # the rule's threads: no score moves
        return {**params, "max_context_tokens": self.evaluation_context_tokens}

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


def _unique(items: list[Any], key: str) -> None:
    seen = set()
    for item in items:
        if item in seen:
            raise ValueError(f"{key}: '{item}' is listed twice")
        seen.add(item)


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
