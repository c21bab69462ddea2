"""An index build that cannot succeed says so in one line and leaves nothing behind: a corpus
with no passages is an error naming it (no ``<index>.building``), and the indexing threads and
the JVM heap are checked before the JVM starts (the JVM aborts the process on a heap it cannot
read)."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile

import pytest

from spader.retrieval.errors import IndexBuildError
from spader.retrieval.index import build_bm25_index


def _empty_dump(path):
    """A ``.tar.gz`` dump whose only chunk file is blank."""
    with tarfile.open(path, "w:gz") as tar:
        data = b"\n\n"
        info = tarfile.TarInfo("wikipedia_chunks/chunks_v5/wikipedia_chunks_0.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("kind", ["blank-chunk-file", "no-chunk-file", "blank-archive"])
def test_a_corpus_without_passages_is_named_and_leaves_no_building_directory(tmp_path, kind):
    source = tmp_path / "corpus"
    if kind == "blank-archive":
        source = _empty_dump(tmp_path / "chunked_wikipedia.tar.gz")
    else:
        source.mkdir()
        if kind == "blank-chunk-file":
            (source / "wikipedia_chunks_0.jsonl").write_text("\n  \n")
    index = tmp_path / "index" / "bm25"
    with pytest.raises(IndexBuildError, match=rf"^{source}: holds no passages"):
        build_bm25_index(source, index, threads=1)
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == []  # no bm25, bm25.building or stats


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--threads", "0", "indexing threads must be a whole number of at least 1, got 0"),
        ("--threads", "-3", "indexing threads must be a whole number of at least 1, got -3"),
        ("--heap", "banana", "JVM heap 'banana' is not a size"),
        ("--heap", "8 g", "JVM heap '8 g' is not a size"),
        ("--heap", "-Xmx8g", "JVM heap '-Xmx8g' is not a size"),
        ("--heap", "0", "JVM heap '0' is not a size"),
    ],
)
def test_threads_and_heap_are_checked_before_the_jvm_starts(tmp_path, option, value, message):
    source = tmp_path / "corpus"
    source.mkdir()
    (source / "wikipedia_chunks_0.jsonl").write_text(
        '{"id": "1__0", "contents": "Title text", "meta": {"title": "Title"}}\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "spader.retrieval", "index", "--input", str(source),
         "--output", str(tmp_path / "index" / "bm25"), f"{option}={value}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m spader.retrieval: error: {message}"), lines
    assert not (tmp_path / "index").exists()
