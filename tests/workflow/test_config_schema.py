"""The configuration schema: both shipped configs pass, bad keys fail before any job, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spader.config import ConfigError, check_config, resolved_config, verl_config_chain

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
VERL_DIR = REPO / "config" / "verl"


@pytest.fixture
def paper() -> dict:
    return resolved_config(REPO / "config" / "config.yaml")


@pytest.fixture
def demo() -> dict:
    return resolved_config(REPO / "config" / "config.yaml", REPO / "config" / "demo.yaml")


def test_both_shipped_configs_pass(paper, demo):
    check_config(paper, VERL_DIR)
    check_config(demo, VERL_DIR)


def test_schema_documents_every_key():
    """Every property carries a description, and a default unless it is required (the template's
    convention; a backbone's model or a release file's URL has no sensible default)."""
    schema = yaml.safe_load(SCHEMA.read_text())
    missing = []

    def walk(node, path):
        if not isinstance(node, dict):
            return
        required = set(node.get("required") or ())
        for name, sub in (node.get("properties") or {}).items():
            if "description" not in sub or ("default" not in sub and name not in required):
                missing.append(f"{path}.{name}")
            walk(sub, f"{path}.{name}")
        for key in ("additionalProperties", "then"):
            if isinstance(node.get(key), dict):
                walk(node[key], path)
        for sub in (node.get("patternProperties") or {}).values():
            walk(sub, path)
        for name, sub in (node.get("$defs") or {}).items():
            walk(sub, f"$defs.{name}")

    walk(schema, "")
    assert not missing, f"keys without description/default: {missing}"


def test_every_object_rejects_unknown_keys():
    schema = yaml.safe_load(SCHEMA.read_text())
    loose = []

    def walk(node, path):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and node.get("additionalProperties") is not False
            ):
                loose.append(path)
            for k, v in node.items():
                walk(v, f"{path}.{k}")

    walk(schema, "")
    # a variant's keys beyond the bundled methods' are a plug-in method's, which only its settings
    # know: the model refuses any other (below, and tests/methods/test_plugin_method.py)
    assert loose == [".$defs.VariantConfig"], loose
    from spader.config import VariantConfig

    with pytest.raises(ValueError, match="unknown keys"):
        VariantConfig.model_validate({"gamma2": 0.5})


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["mix"].update(bogus=1), "config key 'mix.bogus' is not allowed"),
        (lambda c: c.update(surprise=True), "config key 'surprise' is not allowed"),
        (
            lambda c: c["training"].update(lr="fast"),
            "config key 'training.lr': 'fast' is not of type 'number'",
        ),
        (
            lambda c: c["retrieval"]["bm25"].update(b=2),
            "config key 'retrieval.bm25.b': 2 is greater than the maximum of 1",
        ),
        (
            lambda c: c["variants"]["spader"].update(advantage="magic"),
            "config key 'variants.spader.advantage'",
        ),
        (lambda c: c["backbones"]["qwen3_8b"].update(gpus="eight"), "config key 'backbones.qwen3_8b.gpus'"),
    ],
)
def test_schema_errors_name_the_key(paper, mutate, expected):
    mutate(paper)
    with pytest.raises(
        ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        check_config(paper, VERL_DIR)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c.update(targets=["gpt5"]), "config key 'targets': 'gpt5' is not a key of 'backbones'"),
        (
            lambda c: c["backbones"]["llama3_1_8b"]["variants"].append("dpo"),
            "'backbones.llama3_1_8b.variants': 'dpo'",
        ),
        (lambda c: c["variants"]["spader"].update(verl_config="nope"), "'variants.spader.verl_config'"),
        (
            lambda c: c["datasets"]["quest"]["splits"]["test"].update(file="missing.jsonl"),
            "'datasets.quest.splits.test.file'",
        ),
        (
            lambda c: c["backbones"]["qwen3_8b"].update(model="/no/such/model/dir"),
            "'backbones.qwen3_8b.model'",
        ),
    ],
)
def test_cross_reference_errors_name_the_key(paper, mutate, expected):
    mutate(paper)
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        check_config(paper, VERL_DIR)


def test_bad_config_fails_before_any_job(tmp_path, smk):
    overlay = tmp_path / "bad.yaml"
    overlay.write_text("mix:\n  seed: forty-two\n")
    proc = smk.run("results/qwen3_8b/f1.tsv", "-n", "--nolock", "--configfile", str(overlay), check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "config key 'mix.seed'" in out
    assert "rule " not in out  # no job was even listed


def test_verl_config_chain_follows_project_defaults():
    chain = verl_config_chain("stepsearch", VERL_DIR)
    assert chain[0].endswith("stepsearch.yaml")
    assert any(p.endswith("step_baselines.yaml") for p in chain) and any(
        p.endswith("base.yaml") for p in chain
    )
    assert all(p.startswith(str(VERL_DIR)) or p.startswith("config") for p in chain)
