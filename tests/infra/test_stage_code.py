"""spader.infra.stage_code on a small package written here: which modules a script runs (imports,
re-exports, relative and function-level imports, modules named in strings, neutral modules) and
what changes a fingerprint (code) and what does not (comments, docstrings, layout)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from spader.infra.stage_code import PackageGraph, code_hash, stage_fingerprints

FILES = {
    "__init__.py": '__version__ = "1"\n',
    "core/__init__.py": "",
    "core/rewards.py": "from spader.core.matching import hits  # re-exported\n\ndef reward():\n    return 1\n",
    "core/matching.py": "from .text import norm\n\ndef hits():\n    return norm()\n",
    "core/text.py": "def norm():\n    return 0\n",
    "data/__init__.py": "from spader.data.mix import mix\nfrom spader.data.fetch import fetch\n",
    "data/mix.py": "from spader.core.text import norm\n\ndef mix():\n    return norm()\n",
    "data/fetch.py": "from spader.infra import tracking\n\ndef fetch():\n    pass\n",
    "infra/__init__.py": "",
    "infra/tracking.py": "from spader.core import rewards\n",
    "train/__init__.py": 'ENTRY = "spader.train.main"\n',
    "train/run.py": "def run():\n    from spader.train import ENTRY\n    return ENTRY\n",
    "train/main.py": "import spader.core.rewards\n",
    "serve/__init__.py": "",
    "serve/__main__.py": "from spader.core.text import norm\n",
    "serve/client.py": 'CMD = ["python", "-m", "spader.serve"]\n',
}
SCRIPTS = {
    "mix_stage.py": "from spader.data import mix\nfrom spader.infra.tracking import x\nmix()\n",
    "train_stage.py": "from spader.train.run import run\nrun()\n",
    "client_stage.py": "from spader.serve.client import CMD\n",
    "download_stage.py": "from spader.data import fetch\n",
}


def _write(root: Path) -> tuple[Path, Path]:
    package, scripts = root / "spader", root / "scripts"
    for rel, text in FILES.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    scripts.mkdir()
    for name, text in SCRIPTS.items():
        (scripts / name).write_text(text)
    return package, scripts


def test_modules_a_script_runs(tmp_path):
    package, scripts = _write(tmp_path)
    graph = PackageGraph(package, neutral={"spader.infra.tracking"})
    # a package re-export leads to the defining module only, not to its siblings
    assert graph.script_modules(scripts / "mix_stage.py") == {"spader.data.mix", "spader.core.text"}
    # function-level import of a constant that names the entry module; the entry module's imports
    # (the rewards module imports the matcher: importing it runs that import)
    assert graph.script_modules(scripts / "train_stage.py") == {
        "spader.train.run",
        "spader.train",
        "spader.train.main",
        "spader.core.rewards",
        "spader.core.matching",
        "spader.core.text",
    }
    # `python -m spader.serve` runs the package's __main__
    assert graph.script_modules(scripts / "client_stage.py") == {
        "spader.serve.client",
        "spader.serve.__main__",
        "spader.core.text",
    }
    # a neutral module is neither counted nor followed (tracking imports the rewards)
    assert graph.script_modules(scripts / "download_stage.py") == {"spader.data.fetch"}


def test_re_exports_of_a_module_are_followed(tmp_path):
    package, _ = _write(tmp_path)
    graph = PackageGraph(package)
    tree = graph._tree("spader.train.main")
    assert graph.imports_of_tree(tree, "spader.x") == {"spader.core.rewards"}
    script = "from spader.core.rewards import hits\n"
    assert graph.closure(graph.imports_of_tree(ast.parse(script), "__main__")) == {
        "spader.core.matching",
        "spader.core.text",
    }


def test_fingerprints_follow_code_not_comments_or_docstrings(tmp_path):
    package, scripts = _write(tmp_path)
    before = stage_fingerprints(scripts, package)
    text = package / "core" / "text.py"
    original = text.read_text()

    text.write_text(
        '"""Normalisation."""\n# a comment\n\n\ndef norm():\n    """Zero."""\n    return 0  # why\n'
    )
    assert stage_fingerprints(scripts, package) == before

    text.write_text(original.replace("return 0", "return 1"))
    after = stage_fingerprints(scripts, package)
    changed = {s for s in before if before[s] != after[s]}
    assert changed == {"mix_stage", "client_stage", "train_stage"}  # download_stage never runs core.text

    (package / "core" / "rewards.py").write_text(FILES["core/rewards.py"].replace("return 1", "return 2"))
    assert {s for s in after if after[s] != stage_fingerprints(scripts, package)[s]} == {"train_stage"}


def test_code_hash_ignores_layout_but_not_values():
    a = code_hash("x = [1, 2]\n")
    assert a == code_hash("x = [\n    1,\n    2,\n]  # two\n")
    assert a != code_hash("x = [1, 3]\n")
    assert code_hash(textwrap.dedent('def f():\n    "doc"\n    return 1\n')) == code_hash(
        "def f():\n    return 1\n"
    )


def test_stage_groups_cover_every_computing_rule_and_match_the_config():
    from spader.config import Config
    from spader.config.model import CodeRerunsConfig
    from spader.infra.stage_code import STAGE_GROUPS

    repo = Path(__file__).resolve().parents[2]
    rules = {p.stem for p in (repo / "workflow" / "scripts").glob("*.py")}
    downloads = {r for r in rules if r.startswith("download_")}
    grouped = [r for group in STAGE_GROUPS.values() for r in group]
    assert sorted(grouped) == sorted(rules - downloads)  # each computing rule in exactly one group
    assert set(STAGE_GROUPS) == set(CodeRerunsConfig.model_fields)
    assert "code_reruns" in Config.model_fields
    smk = "\n".join(p.read_text() for p in (repo / "workflow" / "rules").glob("*.smk"))
    for rule in grouped:
        assert f'code=code_of("{rule}")' in smk


def test_affected_rules_lists_what_a_change_reruns(tmp_path):
    from spader.infra.stage_code import affected_rules

    package, scripts = _write(tmp_path)
    assert affected_rules(["spader.core.text"], scripts, package) == {
        "client_stage": ["spader.core.text"],
        "mix_stage": ["spader.core.text"],
        "train_stage": ["spader.core.text"],
    }
    by_path = affected_rules([str(package / "core" / "text.py")], scripts, package)
    assert set(by_path) == {"client_stage", "mix_stage", "train_stage"}
    assert affected_rules([str(scripts / "download_stage.py")], scripts, package) == {
        "download_stage": ["workflow/scripts/download_stage.py"]
    }
    assert affected_rules(["spader.infra.tracking"], scripts, package) == {}  # result-neutral
    with pytest.raises(KeyError, match="neither a module"):
        affected_rules(["spader.nowhere"], scripts, package)


def test_affected_command_names_the_switch(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    overlay = tmp_path / "off.yaml"
    overlay.write_text("code_reruns: {training: false}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "spader.infra.stage_code", "affected", "src/spader/core/text.py",
         "--configfile", str(overlay)],
        cwd=repo, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert "kept (code_reruns.training: false)" in lines["train_policy"]
    assert "reruns" in lines["evaluate_policy"]


def test_jobs_tag_the_code_they_run():
    """The fingerprint of what ran is recorded even when the param (and so the plan) differs."""
    from types import SimpleNamespace

    from snakemake.iocontainers import Params

    from spader.infra.glue import code_tags

    repo = Path(__file__).resolve().parents[2]
    params = Params(fromdict={"code": "0123456789abcdef"})
    smk = SimpleNamespace(
        rule="aggregate_results", scriptdir=str(repo / "workflow" / "scripts"), params=params
    )
    tags = code_tags(smk)
    expected = stage_fingerprints(repo / "workflow" / "scripts")["aggregate_results"]
    assert tags == {"code.fingerprint": expected, "code.param": "0123456789abcdef"}


def test_cached_facts_give_the_same_fingerprints_and_follow_every_edit(tmp_path):
    """A workflow start reads each file's parsed facts from the cache, keyed on its bytes: the
    fingerprints are those of a fresh parse, an edited file is parsed again (never a stale entry),
    and a damaged cache entry is only a slower start."""
    package, scripts = _write(tmp_path)
    cache = tmp_path / "cache"
    fresh = stage_fingerprints(scripts, package)
    assert stage_fingerprints(scripts, package, cache_dir=cache) == fresh
    entries = sorted(cache.glob("*.json"))
    assert len(entries) >= len(FILES) - 1  # identical files share one entry
    assert stage_fingerprints(scripts, package, cache_dir=cache) == fresh  # from the cache
    for entry in entries:
        entry.write_text("{not json")
    assert stage_fingerprints(scripts, package, cache_dir=cache) == fresh
    (package / "core" / "text.py").write_text("def norm():\n    return 1\n")
    edited = stage_fingerprints(scripts, package, cache_dir=cache)
    assert edited == stage_fingerprints(scripts, package)
    assert edited["mix_stage"] != fresh["mix_stage"] and edited["client_stage"] != fresh["client_stage"]


def test_affected_command_names_an_unknown_file_in_one_line(capsys):
    from spader.infra.stage_code import main

    assert main(["affected", "src/spader/no_such_module.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_module.py" in err
