"""Shared fixtures: a small corpus in the QAMPARI chunk format, its BM25 index, a tiny reranker.

The JVM is one per process (spader.retrieval.jvm), so the index is built once per session.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

# (page id, title, [chunk texts]); ids become "<page>__<n>" as in the real dump.
PAGES = [
    (
        "1001",
        "The Salt Orchard",
        [
            "The Salt Orchard is a 1961 drama film directed by Ilse Varga and set in a coastal village.",
            "The film was shot near the salt marshes of the northern coast during the winter of 1960.",
        ],
    ),
    (
        "1002",
        "Winter Quay",
        [
            "Winter Quay is a 1964 film directed by Ilse Varga about dock workers in a frozen harbour.",
        ],
    ),
    (
        "1003",
        "Ilse Varga",
        [
            "Ilse Varga (1921-1999) was a Hungarian film director and screenwriter.",
            "Varga directed eleven feature films, among them The Salt Orchard and Winter Quay.",
        ],
    ),
    (
        "2001",
        "Lake Ørnes",
        [
            "Lake Ørnes is a glacial lake in Norway fed by the rivers Ørna and Kvitelva.",
        ],
    ),
    (
        "2002",
        "Kvitelva",
        [
            "The Kvitelva is a river that flows into Lake Ørnes after a short course through birch forest.",
        ],
    ),
    (
        "3001",
        "Halcyon & Rust",
        [
            "Halcyon & Rust is the debut album by the band Saint-Malo Express, released in 2004.",
        ],
    ),
    (
        "3002",
        "Saint-Malo Express",
        [
            "Saint-Malo Express is a French indie rock band formed in Rennes; "
            "its albums include Halcyon & Rust.",
        ],
    ),
    (
        "4001",
        "Łowicz Górny",
        [
            "Łowicz Górny is a village in central Poland known for its wooden church 😀 "
            "and its cheese market.",
        ],
    ),
    (
        "5001",
        "Lucene",
        [
            "Apache Lucene builds an inverted index and ranks documents with BM25 by default.",
        ],
    ),
]


def chunk_records() -> list[dict]:
    """The fixture corpus as chunk records (meta.content missing on one record, meta on another)."""
    records = []
    for page, title, chunks in PAGES:
        for n, text in enumerate(chunks):
            cid = f"{page}__{n}"
            records.append(
                {
                    "id": cid,
                    "contents": f"{title} {text}",
                    "meta": {
                        "revid": "1",
                        "url": f"https://en.wikipedia.org/wiki?curid={page}",
                        "title": title,
                        "file_path": "wiki_00",
                        "page_id": page,
                        "content": text,
                        "chunk_id": cid,
                    },
                }
            )
    del records[-1]["meta"]["content"]  # text falls back to contents minus the title
    del records[-2]["meta"]  # no meta at all: title unknown, text = contents
    return records


def write_corpus(
    root: Path, records: list[dict], files: int = 2, prefix: str = "wikipedia_chunks/chunks_v5"
) -> Path:
    """Write ``records`` as ``<root>/<prefix>/wikipedia_chunks_<i>.jsonl`` (round-robin)."""
    out = root / prefix
    out.mkdir(parents=True, exist_ok=True)
    handles = [open(out / f"wikipedia_chunks_{i}.jsonl", "w", encoding="utf-8") for i in range(files)]
    for i, rec in enumerate(records):
        handles[i % files].write(json.dumps(rec, ensure_ascii=False) + "\n")
    for h in handles:
        h.close()
    return root


def write_tar(src_root: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tf:
        for path in sorted(src_root.rglob("*")):
            tf.add(path, arcname=str(path.relative_to(src_root)), recursive=False)
    return archive


@pytest.fixture(scope="session")
def chunks() -> SimpleNamespace:
    """The corpus helpers for tests that write their own variants (conftest is not importable)."""
    return SimpleNamespace(records=chunk_records, write_corpus=write_corpus, write_tar=write_tar)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), chunk_records())


@pytest.fixture(scope="session")
def corpus_tar(corpus_dir, tmp_path_factory) -> Path:
    return write_tar(corpus_dir, tmp_path_factory.mktemp("dump") / "chunked_wikipedia.tar.gz")


@pytest.fixture(scope="session")
def bm25_index(corpus_tar, tmp_path_factory) -> Path:
    from spader.retrieval.index import build_bm25_index

    out = tmp_path_factory.mktemp("index") / "bm25"
    build_bm25_index(corpus_tar, out, threads=1)
    return out
