"""Nothing of the dump is skipped without a word: gzip-compressed chunk files are read, chunk files
compressed otherwise and links named like chunk files are refused by name, other members are counted
in the index record, a passage id is indexed once (repeats counted and logged), and a line longer
than the bound is named by file and line without being read whole."""

from __future__ import annotations

import gzip
import io
import json
import logging
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from spader.retrieval.corpus import ChunkReader, CorpusFormatError
from spader.retrieval.index import build_bm25_index
from spader.retrieval.searcher import Bm25Searcher

PREFIX = "wikipedia_chunks/chunks_v5"


def _lines(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def _tar(path: Path, members: list[tuple[str, object]]) -> Path:
    """A .tar.gz of ``(name, bytes)`` files and ``(name, ("symlink" | "hardlink", target))`` links."""
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, tuple):
                info.type = tarfile.SYMTYPE if data[0] == "symlink" else tarfile.LNKTYPE
                info.linkname = data[1]
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def _stats(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "stats.json").read_text())


def test_gzip_compressed_chunk_members_are_read(tmp_path, chunks):
    records = chunks.records()
    dump = _tar(
        tmp_path / "dump.tar.gz",
        [
            (f"{PREFIX}/wikipedia_chunks_0.jsonl", _lines(records[:5])),
            (f"{PREFIX}/wikipedia_chunks_1.jsonl.gz", gzip.compress(_lines(records[5:]))),
        ],
    )
    stats = build_bm25_index(dump, tmp_path / "idx", stats_path=tmp_path / "stats.json")
    assert stats["documents"] == len(records) and stats["files"] == 2
    assert stats["skipped_members"] == {} and stats["duplicate_ids"] == 0


def test_gzip_compressed_chunk_files_of_a_directory_are_read(tmp_path, chunks):
    """Held out: a directory source, one file of each kind."""
    records = chunks.records()
    root = tmp_path / "corpus" / PREFIX
    root.mkdir(parents=True)
    (root / "wikipedia_chunks_0.jsonl").write_bytes(_lines(records[:3]))
    (root / "wikipedia_chunks_1.jsonl.gz").write_bytes(gzip.compress(_lines(records[3:])))
    stats = build_bm25_index(tmp_path / "corpus", tmp_path / "idx", stats_path=tmp_path / "stats.json")
    assert stats["documents"] == len(records) and stats["files"] == 2


@pytest.mark.parametrize(
    ("name", "data"),
    [
        (f"{PREFIX}/wikipedia_chunks_1.jsonl.bz2", b"BZh91AY&SY"),
        (f"{PREFIX}/wikipedia_chunks_1.jsonl.xz", b"\xfd7zXZ\x00"),  # held out
    ],
)
def test_a_chunk_file_compressed_otherwise_is_refused_by_name(tmp_path, chunks, name, data):
    dump = _tar(
        tmp_path / "dump.tar.gz",
        [(f"{PREFIX}/wikipedia_chunks_0.jsonl", _lines(chunks.records())), (name, data)],
    )
    with pytest.raises(CorpusFormatError, match=rf"dump\.tar\.gz:{name}: a chunk file compressed in a way"):
        build_bm25_index(dump, tmp_path / "idx")
    assert not (tmp_path / "idx").exists() and not (tmp_path / "idx.building").exists()


@pytest.mark.parametrize(("kind", "shown"), [("symlink", "symbolic link"), ("hardlink", "hard link")])
def test_a_link_named_like_a_chunk_file_is_refused_by_name(tmp_path, chunks, kind, shown):
    first = f"{PREFIX}/wikipedia_chunks_0.jsonl"
    dump = _tar(
        tmp_path / "dump.tar.gz",
        [(first, _lines(chunks.records())), (f"{PREFIX}/wikipedia_chunks_1.jsonl", (kind, first))],
    )
    with pytest.raises(
        CorpusFormatError,
        match=rf"wikipedia_chunks_1\.jsonl: a {shown} to {first}; chunk files must be regular",
    ):
        build_bm25_index(dump, tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_members_that_are_not_chunk_files_are_counted_in_the_record_and_logged(tmp_path, chunks, caplog):
    dump = _tar(
        tmp_path / "dump.tar.gz",
        [
            (f"{PREFIX}/wikipedia_chunks_0.jsonl", _lines(chunks.records())),
            ("README.txt", b"chunked Wikipedia"),
            ("latest", ("symlink", PREFIX)),
            ("notes/copy", ("hardlink", "README.txt")),
        ],
    )
    with caplog.at_level(logging.WARNING, logger="spader.retrieval.corpus"):
        stats = build_bm25_index(dump, tmp_path / "idx", stats_path=tmp_path / "stats.json")
    assert stats["skipped_members"] == {"hard link": 1, "other file": 1, "symbolic link": 1}
    assert _stats(tmp_path)["skipped_members"] == stats["skipped_members"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "README.txt (other file)" in logged and "latest (symbolic link)" in logged, logged


def test_a_passage_id_is_indexed_once_and_its_repeats_counted_and_logged(tmp_path, chunks, caplog):
    records = chunks.records()
    repeat = dict(records[0])
    dump = _tar(
        tmp_path / "dump.tar.gz",
        [
            (f"{PREFIX}/wikipedia_chunks_0.jsonl", _lines(records)),
            (f"{PREFIX}/wikipedia_chunks_1.jsonl", _lines([records[1], repeat])),
        ],
    )
    with caplog.at_level(logging.WARNING, logger="spader.retrieval.index"):
        stats = build_bm25_index(dump, tmp_path / "idx", stats_path=tmp_path / "stats.json")
    assert stats["documents"] == len(records) and stats["duplicate_ids"] == 2
    where = f"{dump}:{PREFIX}/wikipedia_chunks_1.jsonl"
    assert stats["duplicate_id_examples"] == [
        {"id": records[1]["id"], "at": f"{where}:1"},
        {"id": records[0]["id"], "at": f"{where}:2"},
    ]
    assert f"{where}:2: passage id {records[0]['id']!r} was already indexed" in caplog.text
    searcher = Bm25Searcher(tmp_path / "idx")
    try:
        hits = searcher.search([records[0]["contents"]], 5)[0]
    finally:
        searcher.close()
    assert [h.id for h in hits].count(records[0]["id"]) == 1


def test_a_repeated_id_in_a_directory_keeps_the_first_passage(tmp_path, chunks):
    """Held out: a directory (Anserini would read it itself: the repeat sends it through this
    process), and the repeat carries other text."""
    records = chunks.records()
    other = {**records[2], "contents": "Zanzibar quokka marmalade", "meta": {"title": "Zanzibar"}}
    root = tmp_path / "corpus" / PREFIX
    root.mkdir(parents=True)
    (root / "wikipedia_chunks_0.jsonl").write_bytes(_lines(records))
    (root / "wikipedia_chunks_1.jsonl").write_bytes(_lines([other]))
    stats = build_bm25_index(tmp_path / "corpus", tmp_path / "idx", stats_path=tmp_path / "stats.json")
    assert stats["documents"] == len(records) and stats["duplicate_ids"] == 1
    assert stats["indexer"] == "SimpleIndexer (streamed)"
    searcher = Bm25Searcher(tmp_path / "idx")
    try:
        assert searcher.search(["Zanzibar quokka marmalade"], 3)[0] == []
    finally:
        searcher.close()


READ_ALL = """
import sys
from spader.retrieval.corpus import ChunkReader, CorpusFormatError
try:
    sum(1 for _ in ChunkReader(sys.argv[1]))
except CorpusFormatError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize(
    ("name", "size"), [("wikipedia_chunks_0.jsonl", 3 << 30), ("wikipedia_chunks_1.jsonl", (64 << 20) + 1)]
)
def test_a_line_longer_than_the_bound_is_named_without_being_read_whole(tmp_path, chunks, name, size):
    """A 3 GiB line under a 1 GiB memory limit (held out: one byte over the bound); written sparse."""
    import resource

    root = tmp_path / "corpus" / PREFIX
    root.mkdir(parents=True)
    head = _lines(chunks.records()[:2])
    with open(root / name, "wb") as f:
        f.write(head)
        f.seek(len(head) + size)
        f.write(b"\n")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    proc = subprocess.run(
        [sys.executable, "-c", READ_ALL, str(tmp_path / "corpus")],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        proc.stderr
        == f"error: {root / name}:3: line longer than 67,108,864 bytes (read no further; a damaged or wrong file?)\n"
    )


def test_the_reader_lists_what_it_read_and_what_it_skipped(tmp_path, chunks):
    root = tmp_path / "corpus" / PREFIX
    root.mkdir(parents=True)
    (root / "wikipedia_chunks_0.jsonl").write_bytes(_lines(chunks.records()))
    (root / "manifest.json").write_text("{}")
    reader = ChunkReader(tmp_path / "corpus")
    assert sum(1 for _ in reader) == len(chunks.records())
    assert reader.members == [str(root / "wikipedia_chunks_0.jsonl")]
    assert dict(reader.skipped) == {"other file": 1}


# a macOS tar's AppleDouble twin of a chunk file (binary metadata), a dot-file named like a chunk
# file, a chunk file under a hidden directory, an editor's swap file
HIDDEN = {
    "._wikipedia_chunks_0.jsonl": b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ",
    ".wikipedia_chunks_1.jsonl": None,  # real passages: hidden all the same
    ".git/wikipedia_chunks_2.jsonl": None,
    ".wikipedia_chunks_0.jsonl.swp": b"b0VIM 9.0",
}


@pytest.mark.parametrize("prefix", ["", "./"])
def test_hidden_files_follow_one_rule_in_an_archive_and_a_directory(tmp_path, chunks, caplog, prefix):
    """A member or file whose name or directory starts with a dot is not read, from a tar (with or
    without a leading ./) and from a directory alike: counted as a hidden file and named."""
    records = chunks.records()
    files = {"wikipedia_chunks_0.jsonl": _lines(records)}
    files.update({name: data or _lines(records[:1]) for name, data in HIDDEN.items()})
    tree = tmp_path / "tree" / PREFIX
    for name, data in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    dump = _tar(tmp_path / "dump.tar.gz", [(f"{prefix}{PREFIX}/{n}", d) for n, d in files.items()])
    seen = {}
    for name, source in (("archive", dump), ("directory", tmp_path / "tree")):
        reader = ChunkReader(source)
        lines = list(reader)
        seen[name] = (len(lines), [Path(m).name for m in reader.members], dict(reader.skipped))
        with caplog.at_level(logging.WARNING, logger="spader.retrieval.corpus"):
            stats = build_bm25_index(
                source, tmp_path / name / "idx", stats_path=tmp_path / name / "stats.json"
            )
        assert stats["documents"] == len(records) and stats["skipped_members"] == {"hidden file": 4}, name
    assert (
        seen["archive"]
        == seen["directory"]
        == (len(records), ["wikipedia_chunks_0.jsonl"], {"hidden file": 4})
    )
    assert (
        "._wikipedia_chunks_0.jsonl (hidden file)" in caplog.text
        and ".git/wikipedia_chunks_2.jsonl" in caplog.text
    )
