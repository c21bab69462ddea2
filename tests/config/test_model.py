"""The typed configuration model is the one source of every key: the committed schema and key
reference are generated from it, Snakemake's default-filling equals the model's defaults, every
rule between keys fires with the key named, and the sections round-trip as jobs receive them."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from snakemake.utils import validate

from spader.config import (
    AgentConfig,
    Config,
    ConfigError,
    TrainingConfig,
    check_config,
    load_config,
    merge_files,
    resolved_config,
)
from spader.config.docs import render, rows
from spader.config.model import CROSS_KEY_RULES

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
VERL_DIR = REPO / "config" / "verl"


def _merged(*names: str) -> dict:
    """The raw configuration a run with these files validates (no defaults filled in)."""
    return merge_files([REPO / "config" / name for name in names])


def test_generated_schema_and_reference_are_up_to_date():
    proc = subprocess.run(
        [sys.executable, "-m", "spader.config", "check"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_check_detects_a_stale_reference(tmp_path):
    for rel in ("workflow/schemas", "config"):
        (tmp_path / rel).mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "spader.config", "write", "--root", str(tmp_path)], check=True)
    readme = tmp_path / "config" / "README.md"
    readme.write_text(readme.read_text().replace("AdamW learning rate", "learning rate"))
    proc = subprocess.run(
        [sys.executable, "-m", "spader.config", "check", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "config/README.md" in proc.stderr


@pytest.mark.parametrize("files", [("config.yaml",), ("config.yaml", "demo.yaml")])
def test_snakemake_fills_the_same_defaults_as_the_model(files):
    raw = _merged(*files)
    filled = copy.deepcopy(raw)
    validate(filled, str(SCHEMA))  # a tool filling defaults from the schema gets the model's
    assert filled == check_config(raw, VERL_DIR).model_dump(mode="json")


def test_every_key_is_described_and_rendered():
    schema = yaml.safe_load(SCHEMA.read_text())
    readme = (REPO / "config" / "README.md").read_text()
    table = list(rows(schema))
    assert len(table) > 120
    undescribed = [key for key, _, _, text in table if not text]
    assert not undescribed
    for key in ("training.lr", "variants.<name>.beta", "retrieval.reranker.revision", "mix.counts.qampari"):
        assert f"`{key}`" in readme
    for rule in CROSS_KEY_RULES:
        assert rule in readme


def test_reference_renders_nested_and_free_keys():
    schema = {
        "type": "object",
        "$defs": {"thing": {"type": "object", "properties": {"x": {"type": "integer", "default": 3}}}},
        "properties": {
            "a": {"type": "object", "description": "A | pipe", "properties": {"b": {"type": "string"}}},
            "m": {"type": "object", "patternProperties": {"^[a-z]+$": {"$ref": "#/$defs/thing"}}},
            "o": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        },
    }
    assert [r[0] for r in rows(schema)] == ["a", "a.b", "m", "m.<name>", "m.<name>.x", "o"]
    text = render(schema)
    assert "| `m.<name>.x` | integer | `3` |" in text and "A \\| pipe" in text
    assert "| `o` | integer or null | `null` |" in text


def test_free_key_names_are_checked():
    paper = resolved_config(REPO / "config" / "config.yaml")
    paper["backbones"]["Qwen-8B"] = paper["backbones"].pop("qwen3_8b")
    with pytest.raises(
        ConfigError, match=r"config key 'backbones\.Qwen-8B' is not allowed \(names must match"
    ):
        check_config(paper, VERL_DIR)


def _paper(mutate):
    config = resolved_config(REPO / "config" / "config.yaml")
    mutate(config)
    return config


# One case per rule of CROSS_KEY_RULES (same order), each naming the key it is about.
RULE_CASES = [
    (
        lambda c: c.update(targets=["qwen3_8b", "qwen3"]),
        "config key 'targets': 'qwen3' is not a key of 'backbones'",
    ),
    (lambda c: c["variants"].update(rag=dict(c["variants"]["grpo"])), "config key 'variants.rag'"),
    (
        lambda c: c["backbones"]["qwen3_8b"].update(model="tiny:llama"),
        "config key 'backbones.qwen3_8b.model'",
    ),
    (lambda c: c["retrieval"]["reranker"].update(model="tiny:bert"), "config key 'retrieval.reranker.model'"),
    (lambda c: c["variants"]["ppo"].update(reward="step"), "config key 'variants.ppo.advantage'"),
    (lambda c: c["variants"]["grpo"].update(beta=2.0), "config key 'variants.grpo.beta': reward 'terminal'"),
    (
        lambda c: c["variants"]["spader"].update(verl_config="nope"),
        "config key 'variants.spader.verl_config'",
    ),
    (
        lambda c: (
            c["variants"]["r3rag"].update(judge="reranker"),
            c["retrieval"]["reranker"].update(model=None),
        ),
        "config key 'variants.r3rag.judge'",
    ),
    (lambda c: c["judge"].update(gpus=5), "config key 'judge.gpus': backbone 'qwen3_8b'"),
    (lambda c: c["training"].update(device="cpu"), "config key 'training.rollout_backend'"),
    (
        lambda c: c["datasets"]["quest"]["splits"]["test"].update(file="missing.jsonl"),
        "config key 'datasets.quest.splits.test.file'",
    ),
    (
        lambda c: c["evaluation"].update(seeds=[1, 2], temperature=0.0),
        "config key 'evaluation.seeds': greedy decoding",
    ),
    (
        lambda c: c["training"].update(time_limit={"hours": {"default": 1.0, "nope": 2.0}}),
        "config key 'training.time_limit.hours': 'nope'",
    ),
    (lambda c: c["mix"].update(min_answers=3, max_answers=2), "config key 'mix.max_answers': 2 is below"),
    (
        lambda c: c["training"].update(ppo_mini_batch_size=64),
        "config key 'training.ppo_mini_batch_size': 64 is larger",
    ),
    (
        lambda c: c["training"].update(ppo_micro_batch_size_per_gpu=3),
        "config key 'training.ppo_micro_batch_size_per_gpu': 3 does not divide the 64 trajectories",
    ),
    (lambda c: c["retrieval"].update(topk=60), "config key 'retrieval.topk': 60 is larger"),
    (
        lambda c: (c["variants"]["r3rag"].update(nodes=2), c["judge"].update(gpus=9)),
        "config key 'judge.gpus': backbone 'qwen3_8b' trains r3rag on 2 nodes",
    ),
]


def test_every_rule_has_a_case():
    assert len(RULE_CASES) == len(CROSS_KEY_RULES)


@pytest.mark.parametrize(("mutate", "message"), RULE_CASES)
def test_each_rule_between_keys_names_the_key(mutate, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        check_config(_paper(mutate), VERL_DIR)


@pytest.mark.parametrize(
    ("training", "message"),
    [
        (
            {"ppo_micro_batch_size_per_gpu": 5},
            "5 does not divide the 64 trajectories of a mini-batch on each rank",
        ),
        ({"ppo_micro_batch_size_per_gpu": 128}, "128 does not divide the 64 trajectories"),
        # the same micro-batch fits a full node and not the 5 GPUs R3-RAG leaves its judge of 3
        (
            {"ppo_micro_batch_size_per_gpu": 80, "ppo_mini_batch_size": 40, "train_batch_size": 40},
            "trains r3rag on 5 rank(s)",
        ),
        ({"ppo_mini_batch_size": 24}, "24 does not divide training.train_batch_size (32)"),
        ({"ppo_mini_batch_size": 3, "train_batch_size": 3, "rollout_n": 1}, "3 trajectories"),
        ({"device": "cpu", "rollout_backend": "transformers", "cpu_workers": 3}, "on 3 rank(s)"),
    ],
)
def test_batch_sizes_verl_cannot_split_are_refused_before_any_job(training, message):
    """verl 0.9.1 splits a step into whole mini-batches, a mini-batch's trajectories over the
    ranks and each rank's share into whole micro-batches; it checks after Ray and the models
    started. A size that does not divide is refused by the config check, naming the key."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(_paper(lambda c: (c["training"].update(training), c["judge"].update(gpus=3))), VERL_DIR)


def test_token_capped_micro_batches_need_no_divisible_micro_batch():
    config = _paper(
        lambda c: c["training"].update(
            ppo_micro_batch_size_per_gpu=5, remove_padding=True, max_token_len_per_gpu=1_048_576
        )
    )
    assert check_config(config, VERL_DIR).training.ppo_micro_batch_size_per_gpu == 5


def test_a_variants_nodes_overrides_training_nodes():
    """training.nodes is every variant's default; variants.<name>.nodes sets one variant's own (R3-RAG
    takes a second node for its judge while the others stay on one); bounded."""
    config = check_config(_paper(lambda c: c["variants"]["r3rag"].update(nodes=2)), VERL_DIR)
    assert config.training_nodes("r3rag") == 2 and config.training_nodes("spader") == 1
    config = check_config(
        _paper(lambda c: (c["training"].update(nodes=2), c["variants"]["spader"].update(nodes=1))), VERL_DIR
    )
    assert config.training_nodes("spader") == 1 and config.training_nodes("grpo") == 2
    for bad in (0, 65, 1.5):
        with pytest.raises(ConfigError, match=r"variants\.r3rag\.nodes"):
            check_config(_paper(lambda c, n=bad: c["variants"]["r3rag"].update(nodes=n)), VERL_DIR)


def test_warmstart_only_for_tiny_backbones():
    cfg = _paper(lambda c: c["backbones"]["qwen3_8b"].update(warmstart={"steps": 5}))
    with pytest.raises(ConfigError, match=r"'backbones\.qwen3_8b\.warmstart': only tiny backbones"):
        check_config(cfg, VERL_DIR)


def test_sections_round_trip_as_jobs_receive_them():
    config = load_config(REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml")
    as_param = config.model_dump(mode="json")["training"]  # what a rule's params hand a job
    assert TrainingConfig.model_validate(as_param) == config.training
    assert AgentConfig.model_validate(config.model_dump(mode="json")["agent"]).max_turns == 3
    with pytest.raises(ValueError, match="lr"):
        TrainingConfig.model_validate({**as_param, "lr": -1})


def _section_classes(model: type) -> dict[str, type]:
    """Every section class reachable from ``model``'s fields, by name."""
    out: dict[str, type] = {}
    todo = [model]
    while todo:
        for field in todo.pop().model_fields.values():
            args = [field.annotation]
            while args:
                arg = args.pop()
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    if arg.__name__ not in out:
                        out[arg.__name__] = arg
                        todo.append(arg)
                else:
                    args += typing.get_args(arg)
    return out


def test_each_section_lives_in_its_module_and_the_model_exports_it():
    """The sections are classes of ``spader.config.sections`` (one module per top-level key or small
    group, each named where docs/ARCHITECTURE.md says where a section lives), ``Config`` alone is in
    ``spader.config.model``, which re-exports the sections the package imports by name."""
    import spader.config.model as model
    import spader.config.sections as sections

    classes = _section_classes(Config)
    assert {c.__module__.rsplit(".", 1)[0] for c in classes.values()} == {"spader.config.sections"}
    assert Config.__module__ == "spader.config.model"
    for name in model.__all__:
        cls = getattr(model, name)
        if isinstance(cls, type) and cls is not Config:
            assert cls.__module__.startswith("spader.config.sections."), name
    modules = {p.stem for p in Path(sections.__file__).parent.glob("*.py")} - {"__init__"}
    assert {c.__module__.rsplit(".", 1)[1] for c in classes.values()} <= modules
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text().split("\n## Configuration\n")[1].split("\n## ")[0]
    assert sorted(m for m in modules if f"`{m}`" not in doc) == []


def test_the_paper_config_is_typed():
    config = load_config(REPO / "config" / "config.yaml")
    assert isinstance(config, Config)
    assert config.training.trajectories_per_step == 512
    assert config.methods_of("llama3_1_8b") == [
        "spader",
        "grpo",
        "ppo",
        "stepsearch",
        "r3rag",
        "rag",
        "react",
    ]
    assert (
        config.missing_sources() and config.missing_sources()[0][0] == "datasets.webqsp.files.WebQSP.zip.url"
    )


def test_a_config_without_the_paper_variants_validates():
    """Defaults name no variant the user did not configure: a setup of its own, with one variant and
    no time limits of its own, validates (it used to fail on `'ppo' is not a key of 'variants'`)."""
    raw = merge_files([REPO / "config" / "config.yaml"])
    raw["variants"] = {"mine": {"verl_config": "spader", "beta": 2.0}}
    raw["backbones"] = {"qwen3_8b": {**raw["backbones"]["qwen3_8b"], "variants": ["mine"]}}
    raw["targets"] = ["qwen3_8b"]
    del raw["training"]
    config = check_config(raw, VERL_DIR)
    assert config.training.time_limit.hours == {"default": 40.0}
    assert config.training.time_limit.estimate_minutes("mine") == 2400


def test_a_key_a_variant_does_not_read_is_refused_or_documented():
    """A variant's key its reward does not read is refused; `training.gamma`, shared by all
    variants, says which it reaches."""
    with pytest.raises(ValueError, match="'variants.spader.lambda_s': reward 'step' does not read it"):
        check_config(_paper(lambda c: c["variants"]["spader"].update(lambda_s=1.6)), VERL_DIR)
    with pytest.raises(ValueError, match="'variants.ppo.judge': reward 'terminal' does not read it"):
        check_config(_paper(lambda c: c["variants"]["ppo"].update(judge="reranker")), VERL_DIR)
    gamma = TrainingConfig.model_fields["gamma"].description
    assert "reward step only" in gamma and "stepsearch and r3rag use 1.0" in gamma
