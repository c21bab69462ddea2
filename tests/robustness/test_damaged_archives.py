"""Damaged archives, each reported as ``file: what is wrong`` and never as the archive library's own
exception: the zip releases (QAMPARI's JSON Lines and WebQSP's JSON document inside a zip) and the
chunked Wikipedia dump (``.tar.gz``) the BM25 index is built from.

Every damage is made by editing the bytes of a real archive written by the standard library at the
place the zip or tar format puts the field: signatures, sizes, flags, compressed data, checksums,
names. Nothing is written for a release that fails, and the CLI prints one line without a traceback.
"""

from __future__ import annotations

import gzip
import io
import json
import struct
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable

import pytest

from spader.data import DataFormatError, normalize_file
from spader.retrieval.corpus import ChunkReader, CorpusFormatError

QAMPARI = {
    "qid": "1__wikidata_simple__train",
    "question_text": "Which films did Ilse Varga direct?",
    "answer_list": [{"answer_text": "Winter Quay", "aliases": ["Quay"]}],
}
WEBQSP_RECORD = {
    "QuestionId": "WebQTrn-1",
    "RawQuestion": "who did ben stiller play in megamind?",
    "Parses": [
        {
            "ParseId": "WebQTrn-1.P0",
            "AnnotatorComment": {"ParseQuality": "Complete", "QuestionQuality": "Good"},
            "Answers": [{"AnswerType": "Entity", "EntityName": "Bernard"}],
        }
    ],
}
MEMBER = {"qampari": "qampari_data/train_data.jsonl", "webqsp": "WebQSP/data/WebQSP.train.json"}
ARCHIVE = {"qampari": "qampari.zip", "webqsp": "WebQSP.zip"}


def _payload(dataset: str) -> bytes:
    """A few hundred records: enough compressed data to damage in its middle."""
    if dataset == "qampari":
        lines = [
            json.dumps({**QAMPARI, "qid": f"{i}__wikidata_simple__train", "question_text": f"Question {i}?"})
            for i in range(300)
        ]
        return ("\n".join(lines) + "\n").encode()
    records = [
        {**WEBQSP_RECORD, "QuestionId": f"WebQTrn-{i}", "RawQuestion": f"question {i}?"} for i in range(300)
    ]
    return json.dumps({"Version": "1.0", "Questions": records}, indent=1).encode()


def _zip(dataset: str, method: int = zipfile.ZIP_DEFLATED, extra: list[tuple[str, bytes]] = ()) -> bytearray:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as zf:
        zf.writestr(MEMBER[dataset], _payload(dataset))
        for name, data in extra:
            zf.writestr(name, data)
    return bytearray(buf.getvalue())


def _central(z: bytearray) -> tuple[int, int]:
    """Offsets of the first central-directory entry and of the end-of-central-directory record."""
    end = z.rfind(b"PK\x05\x06")
    return struct.unpack_from("<I", z, end + 16)[0], end


def _data_start(z: bytearray) -> int:
    """Offset of the first member's data (after its local header, name and extra field)."""
    name_len, extra_len = struct.unpack_from("<HH", z, 26)
    return 30 + name_len + extra_len


def _set_u16(z: bytearray, offset: int, value: int) -> bytearray:
    struct.pack_into("<H", z, offset, value)
    return z


def _method(z: bytearray, value: int) -> bytearray:
    """The compression method, in the local header (offset 8) and the central entry (offset 10)."""
    cd, _ = _central(z)
    return _set_u16(_set_u16(z, 8, value), cd + 10, value)


def _flags(z: bytearray, value: int) -> bytearray:
    cd, _ = _central(z)
    return _set_u16(_set_u16(z, 6, value), cd + 8, value)


def _overwrite(z: bytearray, offset: int, data: bytes) -> bytearray:
    z[offset : offset + len(data)] = data
    return z


def _truncated_central(z: bytearray) -> bytearray:
    cd, end = _central(z)
    return z[: cd + 20] + z[end:]


def _duplicate(dataset: str, name: str) -> bytearray:
    with pytest.warns(UserWarning, match="Duplicate name"):
        return _zip(dataset, extra=[(name, b'{"qid": "x"}\n')])


# (id, damage of the archive bytes, what the message says)
Damage = Callable[[str], bytes]
ZIP_DAMAGE: list[tuple[str, Damage, str]] = [
    (
        "bad-central-directory-signature",
        lambda ds: _overwrite(_zip(ds), _central(_zip(ds))[0], b"XXXX"),
        "unreadable zip archive: damaged archive (Bad magic number for central directory)",
    ),
    (
        "truncated-central-directory",
        lambda ds: _truncated_central(_zip(ds)),
        "unreadable zip archive: damaged archive",
    ),
    (
        "truncated-archive",
        lambda ds: _zip(ds)[: len(_zip(ds)) // 2],
        "truncated or damaged zip archive: its end-of-central-directory record is missing",
    ),
    (
        "corrupt-deflate-data",  # block type 3 does not exist: zlib.error
        lambda ds: _overwrite(_zip(ds), _data_start(_zip(ds)), b"\xff\xff\xff\xff"),
        "unreadable archive member: damaged compressed data (Error -3 while decompressing data",
    ),
    (
        "corrupt-bzip2-data",
        lambda ds: _overwrite(
            _zip(ds, zipfile.ZIP_BZIP2), _data_start(_zip(ds, zipfile.ZIP_BZIP2)) + 40, b"\xff" * 16
        ),
        "unreadable archive member: damaged",
    ),
    (
        "corrupt-lzma-data",
        lambda ds: _overwrite(
            _zip(ds, zipfile.ZIP_LZMA), _data_start(_zip(ds, zipfile.ZIP_LZMA)) + 40, b"\xff" * 16
        ),
        "unreadable archive member: damaged compressed data",
    ),
    (
        "crc-mismatch",  # the bytes decompress, but not to what the archive's checksum says
        lambda ds: _overwrite(_zip(ds), _central(_zip(ds))[0] + 16, b"\0\0\0\0"),
        "unreadable archive member: damaged archive (Bad CRC-32",
    ),
    (
        "unsupported-compression-method",
        lambda ds: _method(_zip(ds), 99),
        "compression method 99 is not supported",
    ),
    ("encrypted-member", lambda ds: _flags(_zip(ds), 0x1), "member is encrypted (password-protected)"),
    (
        "bad-local-header-signature",
        lambda ds: _overwrite(_zip(ds), 0, b"PK\x09\x09"),
        "unreadable archive member: damaged archive (Bad magic number for file header)",
    ),
    (
        "local-header-past-the-end",
        lambda ds: _overwrite(_zip(ds), _central(_zip(ds))[0] + 42, struct.pack("<I", 10**7)),
        "unreadable archive member: damaged archive (Truncated file header)",
    ),
    (
        "local-name-differs-from-the-directory",
        lambda ds: _overwrite(_zip(ds), 30, b"X"),
        "unreadable archive member: damaged archive (File name in directory",
    ),
    (
        "member-data-cut-short",  # the local header claims an extra field reaching past the end
        lambda ds: _set_u16(_zip(ds), 28, 60000),
        "unreadable archive member: compressed data ends early, the archive looks truncated",
    ),
    (
        "duplicate-member",  # the zip library would silently read the last copy
        lambda ds: _duplicate(ds, MEMBER[ds]),
        "archive holds 2 members named '{member}'",
    ),
    (
        "duplicate-member-through-a-nul-byte",  # the name is cut at the NUL when read back
        lambda ds: _duplicate(ds, MEMBER[ds] + "\0.bak"),
        "archive holds 2 members named '{member}'",
    ),
    ("empty-file", lambda ds: b"", "empty file, not a zip archive"),
]


@pytest.mark.parametrize("dataset", ["qampari", "webqsp"])
@pytest.mark.parametrize(("cid", "damage", "message"), ZIP_DAMAGE, ids=[c[0] for c in ZIP_DAMAGE])
def test_damaged_zip_release_names_the_archive_and_the_problem(tmp_path, dataset, cid, damage, message):
    path = tmp_path / ARCHIVE[dataset]
    path.write_bytes(bytes(damage(dataset)))
    out = tmp_path / "out" / "train.jsonl"
    with pytest.raises(DataFormatError) as err:
        normalize_file(dataset, "train", path, out)
    text = str(err.value)
    assert text.startswith((f"{path}: ", f"{path}/{MEMBER[dataset]}: ")), text
    assert message.format(member=MEMBER[dataset]) in text, text
    assert not out.exists()


def test_an_intact_archive_reads_and_a_duplicate_of_another_member_does_not_matter(tmp_path):
    path = tmp_path / "qampari.zip"
    with pytest.warns(UserWarning, match="Duplicate name"):
        path.write_bytes(
            bytes(_zip("qampari", extra=[("qampari_data/README", b"a"), ("qampari_data/README", b"b")]))
        )
    assert normalize_file("qampari", "train", path, tmp_path / "out.jsonl").kept == 300


def test_the_cli_prints_one_line_for_a_damaged_archive(tmp_path):
    path = tmp_path / "qampari.zip"
    path.write_bytes(bytes(_method(_zip("qampari"), 99)))
    proc = subprocess.run(
        [sys.executable, "-m", "spader.data", "normalize", "--dataset", "qampari", "--split", "train",
         "--input", str(path), "--output", str(tmp_path / "out.jsonl")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"error: {path}/qampari_data/train_data.jsonl: compression method 99" in proc.stderr


# ------------------------------------------------------------------------------------------------
# The chunked Wikipedia dump (.tar.gz)
# ------------------------------------------------------------------------------------------------
def _chunks(i: int) -> bytes:
    lines = [
        json.dumps({"id": f"{i}__{j}", "contents": f"Page {i} chunk {j} " + "text " * 40}) for j in range(200)
    ]
    return ("\n".join(lines) + "\n").encode()


def _tar() -> bytes:
    """Three chunk files, plain ustar headers (no pax records), uncompressed."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(3):
            data = _chunks(i)
            info = tarfile.TarInfo(f"wikipedia_chunks/chunks_v5/wikipedia_chunks_{i}.jsonl")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _header(raw: bytes, i: int) -> int:
    return raw.index(f"wikipedia_chunks/chunks_v5/wikipedia_chunks_{i}.jsonl".encode())


def _edit(raw: bytes, offset: int, data: bytes) -> bytes:
    return raw[:offset] + data + raw[offset + len(data) :]


def _flip_gz_tail() -> bytes:
    """One byte of the compressed stream changed near its end, where the tar archive only holds
    its closing zero blocks: every member reads back whole, only the gzip checksum tells."""
    data = bytearray(_gz(_tar()))
    data[-12] ^= 0x01
    return bytes(data)


TAR_DAMAGE: list[tuple[str, Callable[[], bytes], str]] = [
    (
        "truncated-gzip",
        lambda: _gz(_tar())[: len(_gz(_tar())) // 2],
        "it ends early, as a truncated download does",
    ),
    ("gzip-trailer-missing", lambda: _gz(_tar())[:-4], "it ends early"),
    ("gzip-checksum-mismatch", _flip_gz_tail, "damaged archive (after member"),
    ("truncated-tar-in-whole-gzip", lambda: _gz(_tar()[: len(_tar()) // 2]), "unexpected end of data"),
    (
        "bad-header-checksum",
        lambda: _gz(_edit(_tar(), _header(_tar(), 1) + 148, b"99999999")),
        "damaged archive",
    ),
    (
        "zeroed-header",  # reads as the end of the archive: the third member would be lost silently
        lambda: _gz(_edit(_tar(), _header(_tar(), 1), b"\0" * 1024)),
        "damaged archive",
    ),
    ("not-an-archive", lambda: b"plain text, not a tar.gz" * 40, "is neither a directory nor a tar archive"),
    ("empty-file", lambda: b"", "is neither a directory nor a tar archive"),
]


@pytest.mark.parametrize(("cid", "damage", "message"), TAR_DAMAGE, ids=[c[0] for c in TAR_DAMAGE])
def test_damaged_corpus_archive_names_the_archive(tmp_path, cid, damage, message):
    path = tmp_path / "chunked_wikipedia.tar.gz"
    path.write_bytes(damage())
    with pytest.raises(CorpusFormatError) as err:
        sum(1 for _ in ChunkReader(path))
    assert str(path) in str(err.value) and message in str(err.value), str(err.value)


def test_invalid_utf8_in_the_corpus_names_member_and_line(tmp_path):
    raw = _tar()
    at = raw.index(b"chunk 7 ", _header(raw, 2))
    path = tmp_path / "chunked_wikipedia.tar.gz"
    path.write_bytes(_gz(_edit(raw, at, b"\xff")))
    with pytest.raises(CorpusFormatError) as err:
        sum(1 for _ in ChunkReader(path))
    assert str(err.value).startswith(
        f"{path}:wikipedia_chunks/chunks_v5/wikipedia_chunks_2.jsonl:8: invalid UTF-8"
    )


def test_an_intact_corpus_archive_reads_every_line(tmp_path):
    path = tmp_path / "chunked_wikipedia.tar.gz"
    path.write_bytes(_gz(_tar()))
    reader = ChunkReader(path)
    assert sum(1 for _ in reader) == 600 and len(reader.members) == 3


@pytest.mark.slow
def test_the_index_build_reports_a_damaged_dump(tmp_path):
    """Through the indexer (its reader thread hands the error over): no index is left behind."""
    from spader.retrieval.index import build_bm25_index

    path = tmp_path / "chunked_wikipedia.tar.gz"
    path.write_bytes(_flip_gz_tail())
    with pytest.raises(CorpusFormatError, match="damaged archive"):
        build_bm25_index(path, tmp_path / "bm25", threads=1)
    assert not (tmp_path / "bm25").exists() and not (tmp_path / "bm25.building").exists()
