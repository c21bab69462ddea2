"""download_model keeps the bytes in the hub cache and builds the output of hard links, so that an
output deleted by Snakemake (a rerun of a job it marked incomplete) is rebuilt without the network.
The cache is laid out as huggingface_hub lays it out; huggingface_hub itself resolves it."""

from __future__ import annotations

import hashlib
import os
import shutil

from spader.models.hub import download_model

REV = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"model_type": "qwen3"}', "model.safetensors": os.urandom(4096)}


def _hub_cache(cache, repo="org/tiny"):
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REV)
    for name, data in FILES.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / REV / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return root


def test_output_is_hard_links_into_the_cache_and_survives_deletion(tmp_path):
    cache = tmp_path / "hub" / ".cache"
    root = _hub_cache(cache)
    out = tmp_path / "hub" / "org--tiny"
    download_model("org/tiny", out, local_files_only=True)
    for name, data in FILES.items():
        assert (out / name).read_bytes() == data and not (out / name).is_symlink()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        assert (out / name).stat().st_ino == blob.stat().st_ino  # no second copy of the weights
    shutil.rmtree(out)  # what Snakemake does to a directory output before rerunning its job
    download_model("org/tiny", out, revision=REV, local_files_only=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert not list(out.parent.glob(".org--tiny.tmp"))


def test_a_gated_model_is_not_fetched_without_a_hub_token(tmp_path, monkeypatch):
    """The download rule's code refuses a gated repository (Llama) before touching the network or
    the cache when no hub token is configured, and says where the token goes."""
    import pytest

    from spader.models.gated import HubTokenError

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    out = tmp_path / "hub" / "meta-llama--Llama-3.1-8B-Instruct"
    with pytest.raises(HubTokenError, match=r"gated model and no hub token.*HF_TOKEN.*hf auth login"):
        download_model("meta-llama/Llama-3.1-8B-Instruct", out)
    assert not (tmp_path / "hub").exists()  # nothing fetched, no cache started

    # with the token `hf auth login` writes, the same call goes on to the hub client (which fails
    # here for want of a network or of that repository, not for want of a token)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("hf_abc\n")
    with pytest.raises(RuntimeError, match="could not download model") as err:
        download_model("meta-llama/Llama-3.1-8B-Instruct", out)
    assert not isinstance(err.value, HubTokenError)
