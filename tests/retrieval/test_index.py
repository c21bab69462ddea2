"""BM25 index: built from the chunk format (dir or tar.gz), exact hits, counts, checks, errors."""

from __future__ import annotations

import json
import shutil

import pytest

from spader.retrieval.corpus import CorpusFormatError
from spader.retrieval.errors import IndexBuildError, IndexUnavailableError
from spader.retrieval.index import build_bm25_index, verify_index
from spader.retrieval.searcher import Bm25Searcher

# query -> (top-1 id, its BM25 score); k1=0.9, b=0.4, Anserini's default English analyzer.
KNOWN = {
    "films directed by Ilse Varga": ("1003__1", 2.2408),
    "river flowing into Lake Ørnes": ("2002__0", 3.6056),
    "Saint-Malo Express album": ("3002__0", 3.8869),
    "wooden church village Poland": ("4001__0", 3.9683),
    "inverted index BM25": ("5001__0", 3.4185),
}


@pytest.fixture(scope="module")
def searcher(bm25_index):
    s = Bm25Searcher(bm25_index, k1=0.9, b=0.4, threads=2)
    yield s
    s.close()


def test_index_has_every_chunk_and_stats_next_to_it(bm25_index, chunks):
    stats = json.loads((bm25_index.parent / "stats.json").read_text())
    assert stats["documents"] == len(chunks.records()) == verify_index(bm25_index)["documents"]
    assert stats["files"] == 2
    assert stats["index"] == str(bm25_index)
    assert stats["stored_fields"] == ["id", "raw"]
    assert not bm25_index.with_name("bm25.building").exists()


def test_exact_top1_ids_and_scores(searcher):
    queries = list(KNOWN)
    results = searcher.search(queries, 3)
    for query, hits in zip(queries, results, strict=True):
        top_id, top_score = KNOWN[query]
        assert hits[0].id == top_id, query
        assert hits[0].score == pytest.approx(top_score, abs=1e-4), query
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_scores_match_pyserini_luceneSearcher(bm25_index, searcher):
    # The upstream wrapper (one query at a time, docs looked up by id) must agree with our batch path.
    from pyserini.search.lucene import LuceneSearcher

    reference = LuceneSearcher(str(bm25_index))
    reference.set_bm25(0.9, 0.4)
    ours = searcher.search(list(KNOWN), 5)
    for query, hits in zip(KNOWN, ours, strict=True):
        ref = reference.search(query, 5)
        assert [h.id for h in hits] == [r.docid for r in ref]
        assert [h.score for h in hits] == pytest.approx([r.score for r in ref], abs=1e-5)
        assert [json.loads(reference.doc(r.docid).raw())["id"] for r in ref] == [h.id for h in hits]


def test_title_and_text_come_back_separately(searcher):
    by_id = {
        h.id: h
        for hits in searcher.search(["Salt Orchard drama", "Lucene inverted index", "church"], 5)
        for h in hits
    }
    assert by_id["1001__0"].title == "The Salt Orchard"
    assert by_id["1001__0"].text.startswith(
        "The Salt Orchard is a 1961 drama film"
    )  # meta.content, title not prefixed
    # meta.content missing: contents without the leading title
    assert by_id["5001__0"].title == "Lucene"
    assert (
        by_id["5001__0"].text
        == "Apache Lucene builds an inverted index and ranks documents with BM25 by default."
    )
    # no meta at all: the title is unknown, the text is the whole contents
    assert by_id["4001__0"].title == ""
    assert by_id["4001__0"].text.startswith("Łowicz Górny Łowicz Górny is a village")
    assert "😀" in by_id["4001__0"].text  # non-BMP characters survive Java's UTF-16


def test_queries_without_matching_terms_get_empty_lists(searcher):
    assert searcher.search(["zzzz qqq", "the of and", "films"], 2)[:2] == [[], []]


def test_build_from_directory_equals_build_from_archive(corpus_dir, bm25_index, tmp_path, chunks):
    out = tmp_path / "from_dir"
    stats = build_bm25_index(corpus_dir, out, threads=2)
    assert stats["documents"] == len(chunks.records())
    assert stats["indexer"] == "IndexCollection"  # Anserini reads a plain directory itself
    assert json.loads((bm25_index.parent / "stats.json").read_text())["indexer"] == "SimpleIndexer (streamed)"
    a, b = Bm25Searcher(out), Bm25Searcher(bm25_index)
    assert [[(h.id, h.score) for h in hits] for hits in a.search(list(KNOWN), 5)] == [
        [(h.id, h.score) for h in hits] for hits in b.search(list(KNOWN), 5)
    ]


def test_any_prefix_inside_the_archive(tmp_path, chunks):
    root = chunks.write_corpus(tmp_path / "c", chunks.records()[:4], files=1, prefix="some/other/prefix")
    (root / "some" / "README.txt").write_text("not a chunk file")
    stats = build_bm25_index(
        chunks.write_tar(root, tmp_path / "x.tar.gz"), tmp_path / "idx", stats_path=tmp_path / "s.json"
    )
    assert stats["documents"] == 4 and json.loads((tmp_path / "s.json").read_text())["documents"] == 4


def test_directory_with_other_json_files_indexes_only_the_chunk_files(tmp_path, chunks):
    # JsonCollection would also read .json/.gz files; such a tree goes through our reader instead.
    root = chunks.write_corpus(tmp_path / "c", chunks.records()[:4], files=2)
    (root / "wikipedia_chunks" / "manifest.json").write_text('{"files": 2}')
    stats = build_bm25_index(root, tmp_path / "idx")
    assert stats["documents"] == 4 and stats["indexer"] == "SimpleIndexer (streamed)"


def test_expected_documents_is_enforced(corpus_tar, tmp_path):
    with pytest.raises(IndexBuildError, match="indexed 11 documents, expected 12"):
        build_bm25_index(corpus_tar, tmp_path / "idx", expected_documents=12)
    assert not (tmp_path / "idx").exists() and not (tmp_path / "idx.building").exists()


def test_bad_line_is_named_by_file_line_and_field(tmp_path, chunks):
    root = chunks.write_corpus(tmp_path / "c", chunks.records()[:3], files=1)
    path = root / "wikipedia_chunks/chunks_v5/wikipedia_chunks_0.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps({"id": "9__0", "contents": "", "meta": {}}) + "\n")
    with pytest.raises(
        CorpusFormatError, match=r"wikipedia_chunks_0\.jsonl:4: field 'contents' must be a non-empty"
    ):
        build_bm25_index(root, tmp_path / "idx")
    path.write_text('{"id": "1__0", "contents": "ok"}\n{not json\n')
    with pytest.raises(CorpusFormatError, match=r"wikipedia_chunks_0\.jsonl:2: not valid JSON"):
        build_bm25_index(root, tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_existing_output_is_not_overwritten_silently(corpus_dir, tmp_path):
    out = tmp_path / "idx"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(IndexBuildError, match="exists and is not empty"):
        build_bm25_index(corpus_dir, out)
    assert build_bm25_index(corpus_dir, out, overwrite=True)["documents"] == 11


def test_missing_input_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tar.gz does not exist"):
        build_bm25_index(tmp_path / "nope.tar.gz", tmp_path / "idx")


def test_verify_index_names_the_path(bm25_index, tmp_path):
    with pytest.raises(IndexUnavailableError, match=f"{tmp_path / 'missing'} does not exist"):
        verify_index(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexUnavailableError, match="empty is not a Lucene index"):
        verify_index(tmp_path / "empty")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(bm25_index, corrupt)
    for seg in corrupt.iterdir():
        if seg.suffix in (".si", ".cfe", ".cfs", ".fdt", ".tim") or seg.name.startswith("segments_"):
            seg.write_bytes(b"\0" * 16)
    with pytest.raises(IndexUnavailableError, match="corrupt.*(cannot be opened|is corrupt)"):
        verify_index(corrupt)


def test_index_without_raw_documents_is_refused(tmp_path, chunks):
    from jnius import autoclass

    # What `pyserini.index.lucene` builds without --storeRaw: BM25 works, but no text to return.
    indexer = autoclass("io.anserini.index.SimpleIndexer")(
        ["-index", str(tmp_path / "noraw"), "-collection", "JsonCollection", "-input", "", "-threads", "1"]
    )
    indexer.addRawDocuments([json.dumps(r) for r in chunks.records()[:2]])
    indexer.close()
    with pytest.raises(IndexUnavailableError, match="noraw stores no raw documents"):
        verify_index(tmp_path / "noraw")


def test_cli_index(corpus_tar, tmp_path, capsys):
    from spader.retrieval.__main__ import main

    assert (
        main(["index", "--input", str(corpus_tar), "--output", str(tmp_path / "cli"), "--threads", "2"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["documents"] == 11
    assert (tmp_path / "stats.json").exists()
    assert main(["index", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "x")]) == 2
    assert "nope does not exist" in capsys.readouterr().err


def test_index_built_by_pyserinis_own_indexer_is_served_the_same(corpus_dir, bm25_index, tmp_path):
    # A prebuilt index (corpus.prebuilt_index) is what SPADER's build script makes:
    # IndexCollection with positions, docvectors and raw documents.
    from jnius import autoclass

    prebuilt = tmp_path / "qampari_bm25_index"
    autoclass("io.anserini.index.IndexCollection").main(
        ["-collection", "JsonCollection", "-input", str(corpus_dir / "wikipedia_chunks" / "chunks_v5"),
         "-index", str(prebuilt), "-generator", "DefaultLuceneDocumentGenerator", "-threads", "1",
         "-storePositions", "-storeDocvectors", "-storeRaw"]
    )  # fmt: skip
    assert verify_index(prebuilt)["documents"] == 11
    ours, theirs = Bm25Searcher(bm25_index), Bm25Searcher(prebuilt)
    assert ours.search(list(KNOWN), 5) == theirs.search(list(KNOWN), 5)
