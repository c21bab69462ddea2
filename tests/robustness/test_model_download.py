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


def test_a_download_checks_the_disk_for_the_snapshot_less_what_the_cache_holds(tmp_path):
    """The rule's snapshot size comes from the plan's estimate of the shipped shape (Qwen3-8B's bf16
    weights; Meta's repositories hold them twice); a snapshot larger than the free disk is refused
    in one line before anything is fetched, unless the hub cache already holds its bytes."""
    import pytest

    from spader.infra.node import PreflightError
    from spader.planning.needs import snapshot_gib

    qwen, llama = snapshot_gib("Qwen/Qwen3-8B"), snapshot_gib("meta-llama/Llama-3.1-8B-Instruct")
    assert 14.0 < qwen < 16.0 and 28.0 < llama < 31.0  # 8.2 and 8.0 billion parameters in bf16
    assert snapshot_gib("org/unknown-model") is None
    free = shutil.disk_usage(tmp_path).free / float(1 << 30)
    out = tmp_path / "hub" / "org--tiny"
    with pytest.raises(PreflightError) as exc:
        download_model("org/tiny", out, local_files_only=True, size_gib=free * 4)
    assert "\n" not in str(exc.value) and str(exc.value).startswith("download_model org/tiny cannot run")
    assert "disk: " in str(exc.value) and "the snapshot" in str(exc.value)
    assert not (tmp_path / "hub" / ".cache").exists() and not out.exists()
    # the cache holds it all: nothing left to fetch, nothing to check against the disk
    _hub_cache(tmp_path / "hub" / ".cache")
    size = sum(len(d) for d in FILES.values()) / float(1 << 30)
    download_model("org/tiny", out, local_files_only=True, size_gib=size)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
