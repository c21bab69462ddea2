"""The `gpu` extra resolves, and installs the attention implementation the verl configs name.

Resolution only: uv's resolver reads the package metadata from the registry (no wheel is
downloaded, nothing is installed), for Python 3.11 on manylinux x86-64, the GPU nodes' platform.
uv runs from a throwaway virtual environment. Without access to the registry the test is skipped
within seconds (CI machines without network).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INDEX = "https://pypi.org/simple"
# attn_implementation -> the distribution that provides it on a GPU node
PROVIDER = {
    "sdpa": "torch",
    "eager": "torch",
    "flash_attention_2": "flash-attn",
    "flash_attention_3": "flash-attn-3",
}


def _registry_reachable() -> bool:
    try:
        with urllib.request.urlopen(f"{INDEX}/uv/", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def _configured_attention() -> set[str]:
    """attn_implementation of every model block of the project's verl YAMLs (actor/ref, critic)."""
    found = set()
    for path in (REPO / "config" / "verl").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text()) or {}
        for block in (doc.get("actor_rollout_ref", {}).get("model"), doc.get("critic", {}).get("model")):
            impl = ((block or {}).get("override_config") or {}).get("attn_implementation")
            if impl:
                found.add(impl)
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_extra_resolves_with_the_configured_attention(tmp_path):
    if not _registry_reachable():
        pytest.skip(f"no access to the package registry ({INDEX})")
    configured = _configured_attention()
    assert configured, (
        "no attention implementation configured in config/verl (verl defaults to flash_attention_2)"
    )
    venv = tmp_path / "uv-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--index-url", INDEX, "uv"],
        check=True,
        timeout=300,
        capture_output=True,
    )
    out = tmp_path / "gpu.txt"
    # the caller's environment carries the machine's certificate and proxy settings
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "UV_PYTHON_DOWNLOADS": "never"}
    proc = subprocess.run(
        [str(venv / "bin" / "uv"), "pip", "compile", str(REPO / "pyproject.toml"), "--extra", "gpu",
         "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_34",
         "--index-url", INDEX, "--no-header", "-o", str(out)],
        env=env, capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    assert proc.returncode == 0, f"the gpu extra does not resolve:\n{proc.stderr[-4000:]}"
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", out.read_text(), flags=re.MULTILINE))
    pins = {name.lower().replace("_", "-"): version for name, version in pins.items()}
    assert (pins.get("verl"), pins.get("sglang"), pins.get("transformers")) == ("0.9.1", "0.5.14", "5.8.1")
    for impl in configured:
        provider = PROVIDER.get(impl)
        assert provider is not None, f"unknown attention implementation {impl!r} in config/verl"
        assert provider in pins, (
            f"attn_implementation {impl!r} needs {provider}, which the gpu extra does not install"
        )
