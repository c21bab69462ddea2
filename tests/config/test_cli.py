"""The ``spader`` command: one module per command, ``--configfile`` overlaying config/config.yaml as
Snakemake does, errors as one line, the ``python -m`` tools as aliases of the same code."""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config

from spader.cli import COMMANDS, main
from spader.config import merge_files, merge_into, resolved_config

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "config" / "config.yaml"
DEMO = REPO / "config" / "demo.yaml"


def _snakemake_merge(base: dict, overlays: list[dict]) -> dict:
    """What Snakemake 9.27 does with ``configfile:`` and ``--configfile A B``: the overlays merged
    together (ConfigSettings._get_overwrite_config), then into the workflow's file
    (Workflow.configfile), each with snakemake.utils.update_config."""
    merged: dict = {}
    for o in overlays:
        update_config(merged, copy.deepcopy(o))
    config = copy.deepcopy(base)
    update_config(config, merged)
    return config


OVERLAY_CASES = [
    # a list replaces a list; a nested mapping merges key by key
    ({"a": [1, 2], "b": {"c": 1, "d": 2}}, [{"a": [3]}, {"b": {"d": 5}}]),
    # null replaces a mapping; a mapping replaces a scalar; an empty mapping changes nothing
    ({"a": {"x": 1}, "b": 3, "c": [1]}, [{"a": None, "b": {"y": 2}, "c": {}}]),
    # a later overlay's mapping merges into an earlier overlay's scalar before the base sees it
    ({"k": {"x": 0, "y": 2}}, [{"k": 5}, {"k": {"x": 1}}]),
    ({"k": {"x": 0}}, [{"k": {}}, {"new": {}}]),
]


@pytest.mark.parametrize(("base", "overlays"), OVERLAY_CASES)
def test_overlays_merge_as_snakemake_merges_them(tmp_path, base, overlays):
    paths = []
    for i, doc in enumerate([base, *overlays]):
        paths.append(tmp_path / f"{i}.yaml")
        paths[-1].write_text(yaml.safe_dump(doc))
    assert merge_files(paths) == _snakemake_merge(base, overlays)
    # the shipped files too
    assert merge_files([PAPER, DEMO]) == _snakemake_merge(
        yaml.safe_load(PAPER.read_text()), [yaml.safe_load(DEMO.read_text())]
    )
    assert merge_into({"a": 1}, {}) == {"a": 1}


def test_config_show_prints_the_resolved_overlaid_config(capsys):
    assert main(["config", "show", "--configfile", str(DEMO)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown == resolved_config(PAPER, DEMO)
    assert shown["suite"] == "demo" and shown["training"]["lr"] == 1.0e-4  # the overlay's
    assert (
        shown["training"]["gamma"] == 0.9 and shown["backbones"]["qwen3_8b"]["gpus"] == 8
    )  # defaults, paper


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "--configfile", "missing.yaml"],
            "spader plan: error: config file missing.yaml: No such file",
        ),
        (
            ["config", "show", "--configfile", "{bad}"],
            "config key 'training.lr': 'fast' is not of type 'number'",
        ),
        (["config", "show", "--configfile", "{twice}"], "config key 'mix' is given twice"),
        (["stage-code", "affected", "x.py", "--configfile", "{bad}"], "config key 'training.lr'"),
        (["nope"], "spader: error: argument COMMAND: invalid choice: 'nope'"),
        (["plan", "--bogus"], "spader: error: unrecognized arguments: --bogus"),
        (
            [
                "data",
                "normalize",
                "--dataset",
                "quest",
                "--split",
                "test",
                "--input",
                "{missing}",
                "--output",
                "x.jsonl",
            ],
            "spader data: error:",
        ),
    ],
)
def test_every_error_is_one_line(tmp_path, capsys, monkeypatch, argv, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  lr: fast\n")
    twice = tmp_path / "twice.yaml"
    twice.write_text("mix: {seed: 1}\nmix: {seed: 2}\n")
    argv = [a.format(bad=bad, twice=twice, missing=tmp_path / "none") for a in argv]
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code not in (0, None)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) <= 1 and "Traceback" not in err, err
    assert message in err


def test_every_command_is_a_module_with_help(capsys):
    for name, module in COMMANDS.items():
        mod = importlib.import_module(module)
        assert mod.HELP and callable(mod.add_arguments) and callable(mod.run), name
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert mod.HELP.split()[0] in " ".join(capsys.readouterr().out.split())


def test_a_new_command_is_one_module_and_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "hello_cmd.py").write_text(
        'HELP = "say hello"\n'
        "def add_arguments(p):\n    p.add_argument('--name', default='you')\n"
        "def run(args):\n    print('hello', args.name)\n    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "hello", "hello_cmd")
    assert main(["hello", "--name", "spader"]) == 0
    assert capsys.readouterr().out == "hello spader\n"


def test_the_console_script_and_a_module_alias(tmp_path):
    """Real processes: the installed ``spader`` script, and ``python -m spader.planning.plan``
    answering a missing file with one line (it used to end in a traceback)."""
    spader = Path(sys.executable).with_name("spader")
    proc = subprocess.run(
        [str(spader), "config", "show", "--configfile", str(DEMO)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["targets"] == ["demo"]
    proc = subprocess.run(
        [sys.executable, "-m", "spader.planning.plan", "--configfile", "missing.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "python -m spader.planning.plan: error: config file missing.yaml: No such file or directory"
    )
