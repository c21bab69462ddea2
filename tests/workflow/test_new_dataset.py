"""A fifth dataset is one registry entry, its release files and one config overlay: an entry point
of a package outside the repository (tests/support/plugin_dataset.py) is enough for the paper DAG
to plan its download, normalization, evaluation set, its share of the mix and its evaluation by
every method, and for its normalization to read its release files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import plugin_dataset as plugin
import pytest
import yaml

from spader.config import resolved_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fifth(tmp_path_factory):
    """The plug-in's directory, its release files and the overlay that names them."""
    root = tmp_path_factory.mktemp("fifth")
    plugin.write_package(root / "site")
    releases = plugin.write_releases(root / "releases")
    overlay = root / "trivia.yaml"
    files = {plugin.FILES[split]: {"url": str(path)} for split, path in releases.items()}
    overlay.write_text(
        yaml.safe_dump({"datasets": {plugin.NAME: {"files": files}}, "mix": {"counts": {plugin.NAME: 4}}})
    )
    return root / "site", releases, overlay


def test_the_paper_dag_plans_a_fifth_dataset(smk, fifth):
    site, _, overlay = fifth
    target = "results/qwen3_8b/f1.tsv"
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    proc = subprocess.run(
        [snakemake, target, "-n", "--forceall", "--nolock", "--configfile", str(overlay)],
        cwd=REPO,
        env=plugin.env_with(site, smk.env(REPO)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = smk.parse_jobs(proc.stdout + proc.stderr)
    mine = [j for j in jobs if j.wildcards.get("dataset") == plugin.NAME]
    planned = {
        (j.rule, j.wildcards.get("file") or j.wildcards.get("split") or j.wildcards.get("method"))
        for j in mine
    }
    spec = resolved_config(REPO / "config" / "config.yaml")["backbones"]["qwen3_8b"]
    methods = [*spec["variants"], *spec["prompting"]]
    assert planned == {
        ("download_dataset", plugin.FILES["train"]),
        ("download_dataset", plugin.FILES["test"]),
        ("normalize_dataset", "train"),
        ("normalize_dataset", "test"),
        ("export_eval_set", None),
        *(("evaluate_policy", m) for m in methods),
    }
    (mix,) = [j for j in jobs if j.rule == "mix_training_set"]
    for split in ("train", "test"):  # the mix draws from it and leaves out its test questions
        assert f"results/paper/data/normalized/{plugin.NAME}/{split}.jsonl" in mix.fields["input"]
    (tables,) = [j for j in jobs if j.rule == "aggregate_results"]
    assert f"results/qwen3_8b/eval/spader/{plugin.NAME}.json" in tables.fields["input"]
    # the four datasets of the paper are planned as before
    assert sum(j.rule == "normalize_dataset" for j in jobs) == 10


def test_without_its_entry_point_the_overlay_names_the_unknown_dataset(smk, fifth):
    _, _, overlay = fifth
    proc = smk.run("results/qwen3_8b/f1.tsv", "-n", "--nolock", "--configfile", str(overlay), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "rule " not in out
    assert f"config key 'datasets.{plugin.NAME}' is not allowed" in out
    assert f"config key 'mix.counts.{plugin.NAME}' is not allowed" in out


def test_its_release_files_normalize_with_its_extractor(fifth, tmp_path):
    site, releases, _ = fifth
    code = (
        "import json, sys\n"
        "from spader.data import normalize_file\n"
        "from spader.data.records import MIX_SCHEMA\n"
        f"s = normalize_file('{plugin.NAME}', 'train', sys.argv[1], sys.argv[2])\n"
        "print(json.dumps({**s.as_dict(), 'mix_meta': list(MIX_SCHEMA['meta'].to_schema())}))\n"
    )
    out = tmp_path / "train.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(releases["train"]), str(out)],
        env=plugin.env_with(site),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert (summary["read"], summary["kept"], summary["dropped"]) == (8, 7, {"empty_answer_list": 1})
    assert summary["mix_meta"][-1] == "topic"  # the training mix holds its meta field too
    first = json.loads(out.read_text().splitlines()[0])
    assert first["id"] == f"{plugin.NAME}:train-0" and first["answers_norm"] == [["town 0"], ["port 0"]]
    assert first["meta"] == {"source_file": plugin.FILES["train"], "source_id": "train-0", "topic": "geo"}
