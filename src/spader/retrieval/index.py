"""Build and check the BM25 (Lucene/Anserini) index of the chunk corpus.

The index is what ``python -m pyserini.index.lucene --collection JsonCollection --generator
DefaultLuceneDocumentGenerator --storeRaw`` builds (SPADER's ``build_qampari_index.sh`` adds
``--storePositions --storeDocvectors``, which BM25 never reads and which double the size).

- From the ``.tar.gz`` dump (what the pipeline downloads), the chunk lines are streamed straight
  out of the archive into Anserini's ``SimpleIndexer``: the real dump is never extracted (~30 GB
  of jsonl).
- From a directory of ``.jsonl`` files, Anserini's ``IndexCollection`` (the class the pyserini
  CLI runs) reads the files itself, in this process, so no line crosses into Python.

Either way every non-blank line must become a document: the count is checked, and a line
Anserini skipped (it only logs those) is found again and reported with its file and line number.
A passage id already indexed is not indexed again: the later lines are dropped, logged with their
file and line, and counted in the index record (``stats.json``: ``duplicate_ids``), as are the
members of the dump that are not chunk files (``skipped_members``; :mod:`spader.retrieval.corpus`).
The ids seen are held in memory for the check (measured: 94 bytes per passage, about 2.4 GB
for the 25.9 million passages of the real dump).

The raw JSON line is stored with each document, so search returns title and text without a
second lookup (:mod:`spader.retrieval.searcher`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from spader.infra.atomic import atomic_write
from spader.infra.node import GIB, Needs, check_here
from spader.retrieval.corpus import ChunkReader, CorpusFormatError, check_record_line, is_hidden
from spader.retrieval.errors import IndexBuildError, IndexUnavailableError
from spader.retrieval.jvm import anserini_jar, check_heap, start_jvm

log = logging.getLogger(__name__)

__all__ = ["build_bm25_index", "passage_id", "verify_index"]

_BATCH = 10_000  # lines handed to Java per call: large enough that call overhead vanishes
_INDEX_HEAP = "8g"
#: GiB of index per GiB of the compressed dump: the index with its raw passages stored (~25 GB,
#: docs/running.md) of the 6.4 GB dump (docs/data.md), spader.planning.costs.DATA_GIB.
INDEX_PER_DUMP = 25e9 / 6.4e9
_MEMORY_BUFFER_MB = (
    2048  # Lucene's RAM buffer; Anserini's default 4096 does not fit an 8 GB heap with threads
)


def build_bm25_index(
    source: str | os.PathLike,
    index_dir: str | os.PathLike,
    *,
    stats_path: str | os.PathLike | None = None,
    threads: int = 1,
    expected_documents: int | None = None,
    overwrite: bool = False,
    heap: str | None = None,
    measure: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Index every chunk line of ``source`` into a new Lucene index at ``index_dir``.

    Args:
        source: directory of ``*.jsonl`` chunk files (recursively) or the ``.tar.gz`` dump.
        index_dir: output directory; built under ``<index_dir>.building`` and renamed when done.
        stats_path: where the stats JSON goes (default: ``stats.json`` next to ``index_dir``).
        threads: Anserini indexing threads.
        expected_documents: fail unless exactly this many documents were indexed.
        overwrite: replace an existing ``index_dir`` instead of refusing.
        heap: JVM maximum heap (first JVM start of the process only; default 8g).
        measure: how the node is measured (:func:`_check_room`; tests).

    Returns:
        The stats written to ``stats_path`` (documents, terms, files, seconds, docs/s, ...).

    Raises:
        CorpusFormatError: a line is not a chunk record (message: file, line, field).
        IndexBuildError: the document count is not the expected one, or the output exists.
    """
    index_dir = Path(index_dir)
    stats_path = Path(stats_path) if stats_path is not None else index_dir.parent / "stats.json"
    _check_options(threads, heap or _INDEX_HEAP)  # bad input first, then the node
    _check_room(source, index_dir, heap, measure)  # a given heap available, the disk for the index
    heap = heap or _INDEX_HEAP
    if index_dir.exists() and any(index_dir.iterdir()):
        if not overwrite:
            raise IndexBuildError(f"index directory {index_dir} exists and is not empty (use overwrite)")
        shutil.rmtree(index_dir)
    reader = ChunkReader(source)
    building = _building_dir(index_dir)
    try:  # a build that fails, whatever the reason, leaves no <index>.building behind
        start_jvm(heap)
        started = time.perf_counter()
        duplicates = _Duplicates()
        indexer, indexed = _index(reader, building, threads, duplicates)
        seconds = time.perf_counter() - started
        info = _check_built(building, index_dir, source, indexed, expected_documents)
        os.replace(building, index_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    stats = _index_record(index_dir, source, reader, info, duplicates, indexed, threads, seconds, indexer)
    atomic_write(stats_path, json.dumps(stats, indent=2) + "\n")
    log.info("indexed %d documents from %d files in %.1f s (%.0f docs/s) into %s",
             indexed, stats["files"], seconds, indexed / max(seconds, 1e-9), index_dir)  # fmt: skip
    return stats


def _heap_gib(heap: str) -> float:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return (
        int(heap[:-1] if heap[-1].isalpha() else heap)
        * units[heap[-1].lower() if heap[-1].isalpha() else ""]
        / GIB
    )


def _check_room(
    source: str | os.PathLike, index_dir: Path, heap: str, measure: Callable[..., Any] | None
) -> None:
    """The node against the build (one line naming what is short): a given JVM heap available, and
    free disk where the index goes for a dump's size x :data:`INDEX_PER_DUMP` (an unpacked tree's
    index is not sized: a debug line says so)."""
    dump = Path(source)
    disk = dump.stat().st_size * INDEX_PER_DUMP / GIB if dump.is_file() else None
    needs = Needs(
        f"build_bm25_index {index_dir.name}",
        host_gib=None if heap is None else _heap_gib(check_heap(heap)),
        host_what=f"available for the JVM's heap (-Xmx{heap})",
        disk_gib=disk,
        disk_what=f"the index (the dump's size x {INDEX_PER_DUMP:.1f})",
        unknown=() if disk is not None else (f"the index's size from an unpacked tree {dump}",),
    )
    check_here(needs, index_dir.parent, measure=measure, logger=log)


def _check_options(threads: int, heap: str) -> None:
    """Refuse indexing threads below 1 and a heap the JVM cannot read, before the JVM starts (it
    aborts the whole process on such a heap, and Anserini fails on 0 threads with a Java trace)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"indexing threads must be a whole number of at least 1, got {threads!r}")
    check_heap(heap)


def _index(reader: ChunkReader, building: Path, threads: int, duplicates: _Duplicates) -> tuple[str, int]:
    """Index the corpus into ``building``: ``(the indexer used, documents indexed)``."""
    lines = _count_unique(reader) if reader.files is not None and _plain_jsonl_tree(reader.source) else None
    if lines is not None:
        return "IndexCollection", _index_collection(reader, building, threads, lines)
    return "SimpleIndexer (streamed)", _index_lines(reader, building, threads, duplicates)


def _building_dir(index_dir: Path) -> Path:
    """The empty ``<index_dir>.building`` directory's path (its parent made, an old one removed)."""
    building = index_dir.with_name(index_dir.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    return building


def _check_built(
    building: Path, index_dir: Path, source, indexed: int, expected_documents: int | None
) -> dict[str, Any]:
    """The built index's :func:`verify_index` facts; removes it and raises on a wrong document count."""
    if not indexed:
        raise IndexBuildError(f"{source}: holds no passages, nothing to index (an empty or wrong corpus)")
    info = verify_index(building)
    if info["documents"] != indexed:
        shutil.rmtree(building, ignore_errors=True)
        raise IndexBuildError(
            f"{source}: {indexed} documents were added but the index at {index_dir} holds {info['documents']}"
        )
    if expected_documents is not None and indexed != expected_documents:
        shutil.rmtree(building, ignore_errors=True)
        raise IndexBuildError(
            f"{source}: indexed {indexed} documents, expected {expected_documents} "
            "(corpus.expected_documents)"
        )
    return info


def _index_record(
    index_dir: Path,
    source,
    reader: ChunkReader,
    info: dict[str, Any],
    duplicates: _Duplicates,
    indexed: int,
    threads: int,
    seconds: float,
    indexer: str,
) -> dict[str, Any]:
    """The index record written to ``stats.json`` (documents, terms, files, seconds, docs/s, ...)."""
    return {
        "index": str(index_dir),
        "source": str(source),
        "files": len(reader.files) if reader.files is not None else len(reader.members),
        "documents": indexed,
        "unique_terms": info["unique_terms"] if info["unique_terms"] >= 0 else None,  # Lucene: -1 = unknown
        "total_terms": info["total_terms"],
        "index_bytes": sum(p.stat().st_size for p in index_dir.iterdir() if p.is_file()),
        "skipped_members": dict(sorted(reader.skipped.items())),
        "duplicate_ids": duplicates.count,
        "duplicate_id_examples": duplicates.examples,
        "threads": threads,
        "seconds": round(seconds, 3),
        "docs_per_s": round(indexed / seconds, 1) if seconds > 0 else None,
        "stored_fields": ["id", "raw"],
        "anserini": anserini_jar().name,
        "indexer": indexer,
        "bm25_built_with": "JsonCollection + DefaultLuceneDocumentGenerator, raw documents stored",
    }


class _Duplicates:
    """Lines whose passage id was already indexed: counted, the first ones kept as examples."""

    EXAMPLES = 20

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[dict[str, str]] = []

    def add(self, pid: str, where: str) -> None:
        self.count += 1
        if len(self.examples) < self.EXAMPLES:
            self.examples.append({"id": pid, "at": where})
            log.warning("%s: passage id %r was already indexed; this line is dropped", where, pid)
        elif self.count == self.EXAMPLES + 1:
            log.warning("more lines with passage ids already indexed; counted in stats.json (duplicate_ids)")


_ID_PREFIX = '{"id": "'


def passage_id(line: str, where: str) -> str:
    """The ``id`` of a chunk line (the dump's lines begin with it: read without parsing the line).

    Raises:
        CorpusFormatError: the line is not a chunk record (named by ``where``, field included).
    """
    if line.startswith(_ID_PREFIX):
        end = line.find('"', len(_ID_PREFIX))
        if end > len(_ID_PREFIX) and "\\" not in line[len(_ID_PREFIX) : end]:
            return line[len(_ID_PREFIX) : end]
    check_record_line(line, where)  # raises for anything that is not a chunk record
    return str(json.loads(line)["id"])


def _count_unique(reader: ChunkReader) -> int | None:
    """The number of chunk lines of a directory, or None when a passage id occurs twice (then the
    lines go through this process, which drops the repeats). Reads every line once, before
    Anserini does, so that a bad line is named with its file and line whatever the indexer."""
    seen: set[str] = set()
    for name, number, line in ChunkReader(reader.source):
        pid = passage_id(line, f"{name}:{number}")
        if pid in seen:
            log.info(
                "%s:%d: passage id %r occurs twice: the lines go through this process", name, number, pid
            )
            return None
        seen.add(pid)
    return len(seen)


def _index_lines(reader: ChunkReader, building: Path, threads: int, duplicates: _Duplicates) -> int:
    """Hand every line to Anserini's SimpleIndexer in batches, each passage id once (later lines
    with an id already indexed are counted in ``duplicates``); returns the documents indexed.

    A reader thread decompresses and splits the next batch while Java indexes this one (pyjnius
    releases the GIL during Java calls), so the indexing threads are not left waiting for Python.
    """
    from jnius import autoclass

    args = ["-index", str(building), "-collection", "JsonCollection", "-input", "", "-storeRaw",
            "-threads", str(threads), "-memoryBuffer", str(_MEMORY_BUFFER_MB)]  # fmt: skip
    indexer = autoclass("io.anserini.index.SimpleIndexer")(args)
    batches: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    producer = threading.Thread(target=_read_batches, args=(reader, batches, stop, duplicates), daemon=True)
    producer.start()
    indexed = 0
    try:
        with tqdm(
            total=reader.total_bytes, unit="B", unit_scale=True, desc="indexing", mininterval=5.0
        ) as bar:
            while (item := batches.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                lines, where, consumed = item
                indexed += _add_batch(indexer, lines, where)
                bar.update(consumed - bar.n)
                bar.set_postfix_str(f"{indexed:,} docs", refresh=False)
    except BaseException:
        stop.set()
        producer.join()
        indexer.close()
        shutil.rmtree(building, ignore_errors=True)
        raise
    producer.join()
    indexer.close()  # commits
    return indexed


def _plain_jsonl_tree(root: Path) -> bool:
    """True when JsonCollection would read exactly the ``*.jsonl`` files :class:`ChunkReader` reads
    (it also takes ``.json`` and ``.gz`` files, and has its own idea of hidden ones: a tree with
    anything hidden goes through the reader's one rule, :func:`spader.retrieval.corpus.is_hidden`)."""
    return not any(
        (p.is_file() and p.suffix in (".json", ".gz")) or is_hidden(p.relative_to(root))
        for p in root.rglob("*")
    )


def _index_collection(reader: ChunkReader, building: Path, threads: int, expected: int) -> int:
    """Index a directory with Anserini's IndexCollection; check that every one of the ``expected``
    non-blank lines is a document."""
    from jnius import autoclass

    args = autoclass("io.anserini.index.IndexCollection$Args")()
    autoclass("org.kohsuke.args4j.CmdLineParser")(args).parseArgument(
        "-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator",
        "-input", str(reader.source), "-index", str(building), "-storeRaw",
        "-threads", str(threads), "-memoryBuffer", str(_MEMORY_BUFFER_MB),
    )  # fmt: skip
    indexer = autoclass("io.anserini.index.IndexCollection")(args)
    counters = indexer.getCounters()
    done = threading.Event()

    def progress() -> None:  # pyjnius releases the GIL while run() is in Java
        with tqdm(total=expected, unit="doc", desc="indexing", mininterval=5.0) as bar:
            while not done.wait(5.0):
                bar.update(counters.indexed.get() - bar.n)
            bar.update(counters.indexed.get() - bar.n)

    watcher = threading.Thread(target=progress, daemon=True)
    watcher.start()
    try:
        indexer.run()
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    finally:
        done.set()
        watcher.join()
    counts = {
        k: int(getattr(counters, k).get()) for k in ("indexed", "empty", "unindexable", "skipped", "errors")
    }
    if counts["indexed"] != expected:
        shutil.rmtree(building, ignore_errors=True)
        for name, number, line in reader:  # name the first line Anserini could not index
            check_record_line(line, f"{name}:{number}")
        raise IndexBuildError(
            f"{reader.source}: Anserini indexed {counts['indexed']} of {expected} non-blank lines "
            f"({counts}) and every line is a chunk record; see the log for what it skipped"
        )
    return expected


def _read_batches(
    reader: ChunkReader, out: queue.Queue, stop: threading.Event, duplicates: _Duplicates
) -> None:
    """Put ``(lines, (file, line number) of each, bytes read)`` batches, then ``None`` (or the error);
    a line whose passage id was already put is counted in ``duplicates`` instead."""

    def put(item) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    try:
        lines: list[str] = []
        where: list[tuple[str, int]] = []
        seen: set[str] = set()
        for name, number, line in reader:
            pid = passage_id(line, f"{name}:{number}")
            if pid in seen:
                duplicates.add(pid, f"{name}:{number}")
                continue
            seen.add(pid)
            lines.append(line)
            where.append((name, number))
            if len(lines) >= _BATCH:
                if not put((lines, where, reader.bytes_read())):
                    return
                lines, where = [], []
        if lines and not put((lines, where, reader.total_bytes)):
            return
        put(None)
    except BaseException as exc:  # noqa: BLE001  handed to the indexing thread, which raises it
        put(exc)


def _add_batch(indexer, lines: list[str], where: list[tuple[str, int]]) -> int:
    added = indexer.addRawDocuments(lines)
    if added == len(lines):
        return added
    # Anserini skips lines it cannot index and only logs them: find the first one and name it.
    for line, (name, number) in zip(lines, where, strict=True):
        check_record_line(line, f"{name}:{number}")
    first = f"{where[0][0]}:{where[0][1]}"
    raise CorpusFormatError(
        f"Anserini indexed {added} of {len(lines)} lines of the batch starting at {first}"
    )


def _segments_file(path: Path) -> bool:
    return any(p.name.startswith("segments_") for p in path.iterdir())


def _fingerprint(path: Path) -> tuple:
    """Names, sizes and modification times of the index files (what a rewrite would change)."""
    return tuple(
        sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
    )


# Indexes whose checksums were verified in this process, by fingerprint: the service checks the
# index before it binds its port and again when it loads the searcher; reading a 25.9M-passage
# index twice would double the start-up time.
_VERIFIED: dict[str, tuple] = {}


def _check_checksums(path: Path, reader) -> None:
    """Verify the checksums of every segment file of the open index (Lucene raises on a bad one)."""
    started = time.perf_counter()
    for leaf in reader.leaves().toArray():
        leaf.reader().checkIntegrity()
    _VERIFIED[str(path.resolve())] = _fingerprint(path)
    log.info("BM25 index %s: checksums verified in %.1f s", path, time.perf_counter() - started)


def _first_record(path: Path, reader) -> dict[str, Any]:
    """The first stored chunk record of the open index; raises unless it is one."""
    if reader.numDocs() == 0:
        raise IndexUnavailableError(f"BM25 index {path} holds no documents")
    raw = reader.storedFields().document(0).get("raw")
    if raw is None:
        raise IndexUnavailableError(
            f"BM25 index {path} stores no raw documents; rebuild it with raw documents stored (-storeRaw)"
        )
    try:
        record = json.loads(raw)
    except json.JSONDecodeError:
        record = None
    if not (isinstance(record, dict) and "id" in record and "contents" in record):
        raise IndexUnavailableError(
            f"BM25 index {path}: stored raw documents are not chunk records (JSON with id and contents)"
        )
    return record


def verify_index(index_dir: str | os.PathLike, *, integrity: bool = True) -> dict[str, Any]:
    """Check that ``index_dir`` is a readable, intact Lucene index with raw chunk documents stored.

    The integrity check is Lucene's own: every file of every segment is read and its checksum
    compared with the one in its footer (what ``CheckIndex`` does in checksum-only mode), so a
    file garbled in place, even at the same size, is found. It reads the whole index once per
    process (a second call for unchanged files skips it).

    Args:
        index_dir: the index directory.
        integrity: verify the checksums of all files (else only open the index and read one document).

    Returns:
        ``{"index", "documents", "unique_terms", "total_terms", "generation", "probe_id",
        "probe_text"}``; the last two are a stored document and words of its text, which a
        search must find (:meth:`spader.retrieval.searcher.Bm25Searcher.probe`).

    Raises:
        IndexUnavailableError: missing, not a Lucene index, unreadable, corrupt, empty, or without
            raw documents; the message names the path.
    """
    path = Path(index_dir)
    if not path.is_dir():
        raise IndexUnavailableError(f"BM25 index {path} does not exist (or is not a directory)")
    if not _segments_file(path):
        raise IndexUnavailableError(f"BM25 index {path} is not a Lucene index (no segments_* file)")
    start_jvm()
    from jnius import JavaException, autoclass

    utils = autoclass("io.anserini.index.IndexReaderUtils")
    try:
        reader = utils.getReader(str(path))
    except JavaException as exc:
        raise IndexUnavailableError(f"BM25 index {path} cannot be opened: {exc}") from None
    try:
        if integrity and _VERIFIED.get(str(path.resolve())) != _fingerprint(path):
            _check_checksums(path, reader)
        stats = {str(e.getKey()): int(e.getValue()) for e in utils.getIndexStats(reader).entrySet().toArray()}
        record = _first_record(path, reader)
    except JavaException as exc:
        raise IndexUnavailableError(f"BM25 index {path} is corrupt: {exc}") from None
    finally:
        reader.close()
    return {
        "index": str(path),
        "documents": stats.get("documents", 0),
        "unique_terms": stats.get("unique_terms", 0),
        "total_terms": stats.get("total_terms", 0),
        "generation": max(f.name for f in path.iterdir() if f.name.startswith("segments_")),
        "probe_id": str(record["id"]),
        "probe_text": " ".join(str(record["contents"]).split()[:12]),
    }
