"""Configurations that used to be accepted and fail later are refused before any job, naming the key:
numbers out of finite bounds (inf, nan), floats for integers, sizes that do not fit into each other,
a key given twice in a YAML file, release file names that are directories. Each class has the
reported cases and one held out (written after the fix, not looked at while fixing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from spader.config import ConfigError, check_config, load_config, load_yaml, resolved_config
from spader.config.schema import json_schema

REPO = Path(__file__).resolve().parents[2]
VERL_DIR = REPO / "config" / "verl"


def _paper(**sections) -> dict:
    """The resolved paper configuration with ``sections`` merged in one level deep."""
    config = resolved_config(REPO / "config" / "config.yaml")
    for name, values in sections.items():
        config[name] = {**config[name], **values} if isinstance(values, dict) else values
    return config


def _refused(config: dict, key: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_config(config, VERL_DIR)
    assert f"config key '{key}'" in str(err.value), str(err.value)
    return str(err.value)


def test_every_number_has_finite_bounds():
    """Every integer or number in the schema has a lower and an upper bound."""
    open_ended = []

    def walk(node, path):
        if isinstance(node, dict):
            kinds = node.get("type")
            kinds = kinds if isinstance(kinds, list) else [kinds]
            if {"integer", "number"} & set(kinds):
                low = "minimum" in node or "exclusiveMinimum" in node
                high = "maximum" in node or "exclusiveMaximum" in node
                if not (low and high):
                    open_ended.append(path)
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(json_schema(), "")
    assert not open_ended, open_ended


@pytest.mark.parametrize(
    ("section", "values", "key"),
    [
        ("evaluation", {"temperature": float("inf")}, "evaluation.temperature"),
        ("training", {"lr": float("inf")}, "training.lr"),
        ("variants", "spader.beta", "variants.spader.beta"),
        ("judge", {"timeout_s": float("nan")}, "judge.timeout_s"),  # held out
    ],
)
def test_infinite_and_nan_numbers_are_refused(section, values, key):
    if values == "spader.beta":
        config = _paper()
        config["variants"]["spader"]["beta"] = float("inf")
    else:
        config = _paper(**{section: values})
    _refused(config, key)


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda c: c["mix"]["counts"].update(qampari=6000.0, mintaka=2000.0), "mix.counts.qampari"),
        (lambda c: c["training"].update(rollout_n=16.0), "training.rollout_n"),
        (lambda c: c["training"].update(epochs=True), "training.epochs"),  # held out: a bool
        (lambda c: c["backbones"]["qwen3_8b"].update(gpus=8.0), "backbones.qwen3_8b.gpus"),  # held out
        (lambda c: c["evaluation"].update(seeds=[1.0, 2.0], temperature=1.0), "evaluation.seeds.0"),
    ],
)
def test_integer_keys_refuse_floats(mutate, key):
    config = _paper()
    mutate(config)
    _refused(config, key)


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda c: c["mix"].update(min_answers=5, max_answers=3), "mix.max_answers"),
        (lambda c: c["mix"].update(counts=dict.fromkeys(c["mix"]["counts"], 0)), "mix.counts"),
        (lambda c: c["training"].update(ppo_mini_batch_size=64, train_batch_size=32), "training.ppo_mini_batch_size"),
        (lambda c: c["mix"].update(counts={"qampari": 10, "mintaka": 0, "webqsp": 0, "quest": 0}), "training.train_batch_size"),
        (lambda c: c["retrieval"].update(initial_k=1001), "retrieval.initial_k"),
        # held out: a tool call's queries above what the service accepts in one request
        (lambda c: c["agent"].update(max_queries_per_call=600), "agent.max_queries_per_call"),
    ],
)  # fmt: skip
def test_sizes_that_do_not_fit_are_refused(mutate, key):
    config = _paper()
    mutate(config)
    _refused(config, key)


def test_a_key_given_twice_is_refused_naming_key_and_file(tmp_path, smk):
    overlay = tmp_path / "twice.yaml"
    overlay.write_text("mix:\n  seed: 1\ntraining:\n  lr: 1.0e-6\nmix:\n  seed: 2\n")
    with pytest.raises(
        ConfigError, match=rf"config key 'mix' is given twice .*{re.escape(str(overlay))} \(lines 1 and 5\)"
    ):
        load_yaml(overlay)
    with pytest.raises(ConfigError, match="'mix' is given twice"):
        load_config(REPO / "config" / "config.yaml", overlay)
    # held out: a nested key, and a variant given twice in its map
    nested = tmp_path / "nested.yaml"
    nested.write_text("variants:\n  spader: {verl_config: spader}\n  spader: {verl_config: no_np}\n")
    with pytest.raises(
        ConfigError, match=r"config key 'spader' is given twice .*nested.yaml \(lines 2 and 3\)"
    ):
        load_yaml(nested)
    assert load_yaml(REPO / "config" / "config.yaml")["suite"] == "paper"  # anchors and merges still load
    # at the workflow's start, before any job
    proc = smk.run("results/qwen3_8b/f1.tsv", "-n", "--nolock", "--configfile", str(overlay), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config key 'mix' is given twice" in out and str(overlay) in out
    assert "rule " not in out


@pytest.mark.parametrize("name", [".", "..", "./"])
def test_release_file_names_that_are_directories_are_refused(name):
    config = _paper()
    files = config["datasets"]["quest"]["files"]
    files[name] = files.pop("test.jsonl")
    config["datasets"]["quest"]["splits"]["test"]["file"] = name
    _refused(config, f"datasets.quest.files.{name}")


def test_ordinary_release_file_names_still_pass():
    config = _paper()
    files = config["datasets"]["mintaka"]["files"]
    files[".hidden.json"] = files.pop("mintaka_test.json")
    files["...json"] = files.pop("mintaka_train.json")
    config["datasets"]["mintaka"]["splits"] = {"train": {"file": "...json"}, "test": {"file": ".hidden.json"}}
    check_config(config, VERL_DIR)
    assert yaml.safe_load("a: .inf")["a"] == float("inf")  # what a user writes for infinity in YAML
