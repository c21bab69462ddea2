"""Rules download_dump and build_bm25_index through the real `snakemake` CLI on a copy of the
repository (demo config, a small chunk corpus fetched through a file: URL), and the two shortcuts
of the config: an already downloaded archive and a bad checksum."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _snakemake(smk, work: Path, overlay: str, *args: str) -> subprocess.CompletedProcess:
    return smk.run(
        "--cores", "2", *args, "--configfile", "config/demo.yaml", overlay, cwd=work, check=False, timeout=600
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory, corpus_tar, smk):
    work = smk.copy_repo(tmp_path_factory.mktemp("corpus_rules"))
    shutil.copy2(corpus_tar, work / "dump.tar.gz")
    return work


def _overlay(tmp_path: Path, **corpus) -> str:
    path = tmp_path / "corpus.yaml"
    path.write_text(
        json.dumps(
            {
                "corpus": {
                    "url": "file:dump.tar.gz",
                    "sha256": None,
                    "size_bytes": None,
                    "archive": None,
                    "prebuilt_index": None,
                    "expected_documents": None,
                    **corpus,
                }
            }
        )
    )
    return str(path)


def test_download_and_index(work, tmp_path, smk):
    data = (work / "dump.tar.gz").read_bytes()
    overlay = _overlay(
        tmp_path, sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data), expected_documents=11
    )
    proc = _snakemake(smk, work, overlay, "results/demo/index/bm25")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (work / "resources/demo/corpus/chunked_wikipedia.tar.gz").read_bytes() == data
    stats = json.loads((work / "results/demo/index/stats.json").read_text())
    assert stats["documents"] == 11 and stats["threads"] == 2 and stats["files"] == 2
    assert "indexed 11 documents from 2 files" in (work / "logs/build_bm25_index/demo.log").read_text()
    assert any((work / "results/demo/index/bm25").glob("segments_*"))
    # integrity records, out of the way: the index directory's manifest (Snakemake's own flag file,
    # touched into the directory after the job, is not part of it) and the download's record,
    # which names the source as configured (relative), never an absolute path
    from spader.infra import integrity

    index = work / "results/demo/index/bm25"
    assert (index / ".snakemake_timestamp").exists()
    manifest = integrity.verify(index)
    assert manifest.kind == "directory" and manifest.producer == "build_bm25_index"
    assert integrity.record_path(index) == work / "results/.integrity/demo/index/bm25.json"
    dump = integrity.read_record(work / "resources/demo/corpus/chunked_wikipedia.tar.gz")
    assert dump.extra["source"] == "file:dump.tar.gz" and dump.path == "demo/corpus/chunked_wikipedia.tar.gz"
    assert not [p for p in work.glob("results/**/*.integrity") if p.is_file()]  # no sidecar beside data
    assert str(work) not in integrity.record_path(index).read_text()


def test_existing_archive_skips_the_download(work, tmp_path, smk):
    overlay = _overlay(tmp_path, archive="dump.tar.gz")
    proc = _snakemake(smk, work, overlay, "-n", "--forceall", "results/demo/index/bm25")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "build_bm25_index" in proc.stdout and "download_dump" not in proc.stdout


def test_checksum_mismatch_fails_without_output(work, tmp_path, smk):
    overlay = _overlay(tmp_path, sha256="0" * 64)
    target = "resources/demo/corpus/chunked_wikipedia.tar.gz"
    (work / target).unlink(missing_ok=True)
    proc = _snakemake(smk, work, overlay, target)
    assert proc.returncode != 0
    assert f"expected {'0' * 64}" in (work / "logs/download_dump/demo.log").read_text()
    assert not (work / target).exists() and not (work / (target + ".part")).exists()
