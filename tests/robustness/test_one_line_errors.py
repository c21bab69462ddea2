"""Bad input at the edges of the tools gets one line naming what is wrong, never a traceback:
values that look like environment variables, a config file that is not UTF-8 (from ``spader``
and from ``snakemake`` itself), a path to verify that does not exist, the process supervisor's
usage, a rerun named by an absolute path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
SPADER = [sys.executable, "-m", "spader.cli"]


def _run(argv, cwd=REPO, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess, status: int = 2) -> str:
    """The one error line of a command that failed on bad input."""
    assert proc.returncode == status, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


# --- values that look like environment variables ------------------------------------------------
ENVIRONMENT = [
    ("mlflow:\n  tracking_uri: ${MLFLOW_URI}\n", "mlflow.tracking_uri", "${MLFLOW_URI}"),
    ("mlflow:\n  tracking_uri: ${MLFLOW_URI:-sqlite:///x.db}\n", "mlflow.tracking_uri", "${MLFLOW_URI:-"),
    ("datasets:\n  webqsp:\n    files:\n      WebQSP.zip:\n        url: $HOME/WebQSP.zip\n",
     "datasets.webqsp.files.WebQSP.zip.url", "$HOME"),
    ("agent:\n  prompt_template: prompts/$(whoami).txt\n", "agent.prompt_template", "$("),
    ("corpus:\n  archive: /data/${USER}/dump.tar.gz\n", "corpus.archive", "${USER}"),
    ("backbones:\n  qwen3_8b:\n    model: $MODEL_DIR\n", "backbones.qwen3_8b.model", "$MODEL_DIR"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "found"), ENVIRONMENT, ids=[e[1] + "-" + e[2] for e in ENVIRONMENT])
def test_a_value_that_looks_like_an_environment_variable_is_refused_naming_its_key(
    tmp_path, text, key, found
):
    from spader.config import ConfigError, load_config

    overlay = tmp_path / "env.yaml"
    overlay.write_text(text, encoding="utf-8")
    with pytest.raises(
        ConfigError, match=rf"config key '{key}': .* looks like an environment variable"
    ) as err:
        load_config(REPO / "config" / "config.yaml", overlay)
    assert repr(found)[:-1] in str(err.value)


def test_a_dollar_sign_that_expands_nothing_is_kept(tmp_path):
    from spader.config import load_config

    overlay = tmp_path / "ok.yaml"
    overlay.write_text("mlflow:\n  experiment: cost in $ and 5$\n", encoding="utf-8")
    assert load_config(REPO / "config" / "config.yaml", overlay).mlflow.experiment == "cost in $ and 5$"


def test_the_command_refuses_it_in_one_line(tmp_path):
    overlay = tmp_path / "env.yaml"
    overlay.write_text(ENVIRONMENT[0][0], encoding="utf-8")
    line = _one_line(_run([*SPADER, "config", "show", "--configfile", str(overlay)]))
    assert "config key 'mlflow.tracking_uri': '${MLFLOW_URI}' looks like an environment variable" in line


# --- a config file that is not UTF-8 -----------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"mix:\n  seed: \xff\xfe 7\n", "line 2: not UTF-8 text (byte 0xff at column 9)"),
        (
            "mix:\n  seed: 7 # caf\u00e9\n".encode("latin-1"),
            "line 2: not UTF-8 text (byte 0xe9 at column 16)",
        ),
        ("\ufeffmix: {seed: 7}\n".encode("utf-16"), "line 1: not UTF-8 text (byte 0xff at column 1)"),
    ],
    ids=["invalid-bytes", "latin-1", "utf-16"],
)
def test_a_config_file_that_is_not_utf8_is_one_line_naming_it(tmp_path, data, where):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_bytes(data)
    spader = _one_line(_run([*SPADER, "config", "show", "--configfile", str(overlay)]))
    assert spader == f"spader config: error: config file {overlay} {where}; save it as UTF-8"
    # Snakemake reads --configfile files itself, before the workflow: the default profile checks them
    smk = _one_line(
        _run([str(SNAKEMAKE), "-n", "--configfile", "config/demo.yaml", str(overlay)], timeout=120)
    )
    assert smk == f"snakemake: error: config file {overlay} {where}; save it as UTF-8"


def test_the_profile_finds_every_spelling_of_the_configfile_option():
    from spader.config.files import configfile_arguments

    argv = ["-n", "--configfile", "a.yaml", "b.yaml", "--cores", "2", "--configfiles=c.yaml", "-F", "t"]
    assert configfile_arguments(argv) == ["a.yaml", "b.yaml", "c.yaml"]
    assert configfile_arguments(["--configfiles", "d.yaml", "--", "target"]) == ["d.yaml"]


# --- integrity verify --------------------------------------------------------------------------
def test_verifying_a_path_that_does_not_exist_fails(tmp_path):
    missing = tmp_path / "results" / "nothing.json"
    present = tmp_path / "present.txt"
    present.write_text("x\n")
    proc = _run([*SPADER, "integrity", "verify", str(present), str(missing)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{missing}: no such file or directory (nothing to verify)" in proc.stderr
    assert f"{present}: no record, none expected" in proc.stderr
    assert _run([*SPADER, "integrity", "record", str(missing)]).returncode == 2


# --- the process supervisor's usage ------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "no command given: give the command to supervise after --"),
        (["--"], "no command given: give the command to supervise after --"),
        (["--parent", "1"], "no command given: give the command to supervise after --"),
        (["--grace", "5"], "no command given"),
        (["--watch", "token", "--", "ls"], "--watch takes a job token and no command"),
        (["--watch"], "argument --watch: expected one argument"),
        (["--parent", "abc", "--", "ls"], "argument --parent: invalid process id value: 'abc'"),
        (["--parent", "0", "--", "ls"], "argument --parent: invalid process id value: '0'"),
        (["--grace", "-1", "--", "ls"], "argument --grace: invalid number of seconds value: '-1'"),
        (["--grace", "inf", "--", "ls"], "argument --grace: invalid number of seconds value: 'inf'"),
        (["--", "no-such-program-here"], "cannot run 'no-such-program-here': no such program"),
    ],
)
def test_the_supervisor_says_what_to_give_in_words(args, said):
    line = _one_line(_run([*SPADER, "procs", *args], timeout=60))
    assert line.startswith(f"spader procs: error: {said}"), line
    assert "[" not in line.split(":", 1)[0] and "Errno" not in line  # no Python list, no errno
    module = _one_line(_run([sys.executable, "-m", "spader.infra.procs", *args], timeout=60))
    assert module.startswith(f"python -m spader.infra.procs: error: {said}"), module
