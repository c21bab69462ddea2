import re
from pathlib import Path

import spader
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate
from spader.infra.config import (
    BASELINES,
    DATASETS,
    check_config,
    hub_slug,
    model_kind,
    verl_config_chain,
)
from spader.core.prompt import PROMPT_VERSION

# ---------------------------------------------------------------------------------------------
# Configuration: checked (keys named in every error) and completed with the schema's defaults
# before any rule is defined.
# ---------------------------------------------------------------------------------------------
check_config(
    config,
    Path(workflow.basedir) / "schemas" / "config.schema.yaml",
    verl_config_dir=Path(workflow.basedir).parent / "config" / "verl",
)
validate(config, "../schemas/config.schema.yaml")

SUITE = config["suite"]
VERSION = spader.__version__
VARIANTS = list(config["variants"])


def _alternatives(names):
    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"


wildcard_constraints:
    suite=re.escape(SUITE),
    dataset=_alternatives(DATASETS),
    split="train|test",
    backbone=_alternatives(config["backbones"]),
    variant=_alternatives(VARIANTS),
    method=_alternatives(VARIANTS + list(BASELINES)),
    file="[A-Za-z0-9._-]+",
    repo="[A-Za-z0-9._-]+--[A-Za-z0-9._-]+",
    kind="qwen3|reranker",


# Downloads run in the main snakemake process, never as cluster jobs: compute nodes often have
# no network access.
localrules:
    download_dump,
    download_dataset,
    download_model,


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------
def get_final_output():
    """Tables of every target backbone, plus the training data of the suite (built even when no
    configured backbone trains, as in the CPU demo)."""
    return expand("results/{backbone}/f1.tsv", backbone=config["targets"]) + expand(
        "results/{suite}/data/verl/{split}.parquet", suite=SUITE, split=["train", "val"]
    )


def methods_of(backbone):
    spec = config["backbones"][backbone]
    return list(spec["variants"]) + list(spec["baselines"])


# ---------------------------------------------------------------------------------------------
# Models: hub ids are downloaded once into resources/models/hub/, tiny:<kind> models are built
# locally (demo, smoke tests), local paths are used as they are.
# ---------------------------------------------------------------------------------------------
def model_dir(name):
    kind = model_kind(name)
    if kind == "tiny":
        return f"results/models/tiny/{name.split(':', 1)[1]}"
    if kind == "hub":
        return f"resources/models/hub/{hub_slug(name)}"
    return name


def get_backbone_model(wildcards):
    return model_dir(config["backbones"][wildcards.backbone]["model"])


def get_policy_model(wildcards):
    if wildcards.method in BASELINES:
        return get_backbone_model(wildcards)
    return f"results/{wildcards.backbone}/models/{wildcards.method}"


def get_reranker(wildcards):
    name = config["retrieval"]["reranker"]["model"]
    return [] if name in (None, "none") else [model_dir(name)]


def retrieval_params():
    """Search settings as the jobs see them (reranker given by its resolved local directory)."""
    settings = dict(config["retrieval"])
    reranker = dict(settings["reranker"])
    if reranker["model"] not in (None, "none"):
        reranker["path"] = model_dir(reranker["model"])
    settings["reranker"] = reranker
    return settings


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------
def get_dump(wildcards):
    return config["corpus"]["archive"] or f"resources/{SUITE}/corpus/chunked_wikipedia.tar.gz"


def get_index(wildcards=None):
    return config["corpus"]["prebuilt_index"] or f"results/{SUITE}/index/bm25"


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------
def get_split_source(wildcards):
    split = config["datasets"][wildcards.dataset]["splits"][wildcards.split]
    return f"resources/{wildcards.suite}/datasets/{wildcards.dataset}/{split['file']}"


def get_split_member(wildcards):
    return config["datasets"][wildcards.dataset]["splits"][wildcards.split].get("member")


def get_mix_datasets():
    """Datasets the mix draws from (mix.counts > 0); only their normalized files are inputs."""
    return [d for d in DATASETS if config["mix"]["counts"].get(d, 0) > 0]


def get_mix_files(split):
    return expand(
        "results/{{suite}}/data/normalized/{dataset}/{split}.jsonl",
        dataset=get_mix_datasets(),
        split=split,
    )


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def get_verl_configs(wildcards):
    """The variant's verl YAML and the project YAMLs it inherits from."""
    return verl_config_chain(config["variants"][wildcards.variant]["verl_config"], "config/verl")


def get_gpu_job_threads():
    """GPU jobs take every core of a workstation run, so Snakemake runs them one at a time
    (it never assigns GPUs itself). A cluster run has no core count; its profile sets these
    jobs' CPUs (set-threads), which replaces this value."""
    try:
        return workflow.cores
    except WorkflowError:
        return 1
