"""Reading release files: JSON Lines and JSON documents, plain or inside a zip, with line numbers.

Every malformed input becomes a :class:`~spader.data.records.DataFormatError` that names the file
(``archive.zip/member`` for zip members) and the line: a truncated or otherwise invalid JSON line,
invalid UTF-8, a value nested too deeply for the decoder, an integer too long to convert, a wrong
top-level type, a missing or mistyped field (named by its path in the record, e.g.
``answer_list[0].aliases[1]``), text holding a lone surrogate escape, a number that is not finite where a number is read (``NaN``,
``Infinity`` and literals such as ``1e999`` that overflow to infinity). Records of JSON documents
(Mintaka's array, WebQSP's ``Questions``) are decoded one by one with ``raw_decode`` so that each
carries the line it starts on, too.

A damaged zip archive is reported as ``archive: what is wrong`` (or ``archive/member: ...``), never
as the archive library's own exception: a truncated archive (no end-of-central-directory record), a
damaged central directory, damaged compressed data (deflate, bzip2, lzma), a checksum mismatch, an
unsupported compression method, an encrypted member, and a member name the archive holds more than
once (which copy is meant is ambiguous; the zip library would silently read the last one).
"""

from __future__ import annotations

import contextlib
import json
import lzma
import math
import os
import re
import sys
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from spader.data.records import DataFormatError
from spader.infra.lines import MAX_LINE_BYTES, LineTooLongError, bounded_lines, read_bounded

__all__ = [
    "Source",
    "check_type",
    "has_lone_surrogate",
    "iter_json_records",
    "iter_jsonl",
    "lone_surrogate_path",
    "looks_like_zip",
    "open_release",
    "optional",
    "require",
]

_BOM = b"\xef\xbb\xbf"
_WS = re.compile(r"[ \t\n\r]*")


class _DuplicateKey(ValueError):
    """An object of the JSON text names one key twice (found while decoding, located afterwards)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing an object that names a key twice: Python's decoder would keep
    the last value silently (WebQSP's ``Questions`` twice would lose the first array)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey()
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


class _Repeated:
    """Stands for an object that names ``key`` twice, while its place in the record is sought."""

    def __init__(self, key: str):
        self.key = key


def _mark_repeats(pairs: list[tuple[str, Any]]) -> Any:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Repeated(key)
        seen.add(key)
    return dict(pairs)


def _repeated_key_path(text: str, start: int = 0) -> str:
    """Path in the record of the first key named twice in one object (``answer_list[0].aliases``)."""
    value, _ = json.JSONDecoder(object_pairs_hook=_mark_repeats).raw_decode(text, start)
    stack: list[tuple[str, Any]] = [("", value)]  # depth first, in document order
    while stack:
        path, node = stack.pop()
        if isinstance(node, _Repeated):
            return f"{path}.{node.key}" if path else node.key
        if isinstance(node, dict):
            stack.extend(reversed([(f"{path}.{k}" if path else str(k), v) for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(f"{path}[{i}]", v) for i, v in enumerate(node)]))
    return "?"


def _repeated_key_message(path: str) -> str:
    return f"field '{path}' is given twice in one object (which value is meant is ambiguous)"


class Source:
    """Where records come from: ``name`` for messages, ``member_name`` for ``meta.source_file``."""

    def __init__(self, path: str | os.PathLike, member: str | None = None):
        self.path = Path(path)
        self.member = member
        self.name = f"{self.path}/{member}" if member else str(self.path)
        self.member_name = member or self.path.name

    def where(self, line: int | None) -> str:
        return f"{self.name}, line {line}" if line is not None else self.name


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; the end record of an empty archive
# Errors the zip library raises while reading a member's bytes: a damaged archive, never bad records.
_MEMBER_READ_ERRORS = (zipfile.BadZipFile, EOFError, OSError, zlib.error, lzma.LZMAError)


def looks_like_zip(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a zip archive, readable or not: its end record is found, it starts like
    one (a truncated download keeps its head and loses the central directory at its end), or it is
    named ``*.zip``."""
    path = Path(path)
    if path.suffix.lower() == ".zip" or zipfile.is_zipfile(path):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) in _ZIP_MAGIC
    except OSError:
        return False


def _archive_problem(exc: BaseException) -> str:
    """What a zip library exception says about the archive, in words."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, zlib.error | lzma.LZMAError) or (isinstance(exc, OSError) and "stream" in detail):
        return f"damaged compressed data ({detail})"
    if isinstance(exc, EOFError):
        return f"compressed data ends early, the archive looks truncated ({detail})"
    return f"damaged archive ({detail})"


def _open_zip(src: Source) -> zipfile.ZipFile:
    """The archive, or a DataFormatError saying why it cannot be read."""
    if not zipfile.is_zipfile(src.path):
        if src.path.stat().st_size == 0:
            raise DataFormatError(str(src.path), None, "empty file, not a zip archive")
        if looks_like_zip(src.path):
            raise DataFormatError(
                str(src.path),
                None,
                "truncated or damaged zip archive: its end-of-central-directory record is missing "
                "(an interrupted download?)",
            )
        raise DataFormatError(
            str(src.path), None, f"member '{src.member}' requested but the file is not a zip archive"
        )
    try:
        return zipfile.ZipFile(src.path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise DataFormatError(str(src.path), None, f"unreadable zip archive: {_archive_problem(e)}") from e


def _member_info(zf: zipfile.ZipFile, src: Source) -> zipfile.ZipInfo:
    """The one entry named ``src.member``, checked before any byte of it is read."""
    member = src.member
    infos = [i for i in zf.infolist() if i.filename == member]
    if not infos:
        names = [i.filename for i in zf.infolist()]
        listed = ", ".join(n for n in names if not n.endswith("/"))[:500]
        raise DataFormatError(str(src.path), None, f"archive has no member '{member}' (members: {listed})")
    if len(infos) > 1:
        raise DataFormatError(
            str(src.path),
            None,
            f"archive holds {len(infos)} members named '{member}' (a damaged or altered archive: which "
            "one is meant is ambiguous)",
        )
    info = infos[0]
    if info.is_dir():
        raise DataFormatError(src.name, None, "is a directory of the archive, not a release file")
    if info.flag_bits & 0x1:
        raise DataFormatError(
            src.name, None, "member is encrypted (password-protected); release files are not"
        )
    if info.compress_type not in _ZIP_METHODS:
        raise DataFormatError(
            src.name,
            None,
            f"compression method {info.compress_type} is not supported "
            "(stored, deflate, bzip2 and lzma are); a damaged or unusual archive",
        )
    return info


_ZIP_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


@contextlib.contextmanager
def open_release(path: str | os.PathLike, member: str | None = None) -> Iterator[tuple[IO[bytes], Source]]:
    """Open a release file, or one member of a zip archive, as a binary stream.

    Args:
        path: the file (``.jsonl``, ``.json``) or a zip archive.
        member: path inside the archive; required for archives, refused for plain files.
    Yields:
        ``(stream, source)``.
    Raises:
        DataFormatError naming the file (``archive/member`` for members) and what is wrong: a
        missing file, an archive without the member, a damaged archive (also while the member is
        read: damaged compressed data, a checksum mismatch).
    """
    src = Source(path, member)
    if src.path.is_dir():
        raise DataFormatError(str(src.path), None, "is a directory, not a release file")
    if not src.path.is_file():
        raise DataFormatError(str(src.path), None, "file not found")
    if member is None:
        if looks_like_zip(src.path):
            raise DataFormatError(str(src.path), None, "is a zip archive: name the member to read (--member)")
        with open(src.path, "rb") as f:
            yield f, src
        return
    with _open_zip(src) as zf:
        info = _member_info(zf, src)
        try:
            stream = zf.open(info)
        except (*_MEMBER_READ_ERRORS, NotImplementedError, RuntimeError) as e:
            raise DataFormatError(src.name, None, f"unreadable archive member: {_archive_problem(e)}") from e
        with stream:
            try:
                yield stream, src
            except _MEMBER_READ_ERRORS as e:
                raise DataFormatError(
                    src.name, None, f"unreadable archive member: {_archive_problem(e)}"
                ) from e


def _decode_line(raw: bytes, src: Source, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFormatError(
            src.name, lineno, f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line)"
        ) from None


def iter_jsonl(stream: IO[bytes], src: Source) -> Iterator[tuple[int, dict]]:
    """Records of a JSON Lines stream with their 1-based line numbers (blank lines skipped).

    Raises:
        DataFormatError for invalid UTF-8, a line that is not valid JSON (e.g. truncated), a line
        whose value is not an object, or a line longer than ``MAX_LINE_BYTES`` (read no further).
    """
    lines = bounded_lines(stream, MAX_LINE_BYTES)
    while True:
        try:
            lineno, raw = next(lines)
        except StopIteration:
            return
        except LineTooLongError as e:
            raise DataFormatError(src.name, e.line, str(e)) from None
        if lineno == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        text = _decode_line(raw, src, lineno).strip()
        if not text:
            continue
        try:
            obj = _DECODER.decode(text)
        except json.JSONDecodeError as e:
            hint = "; the line looks truncated" if _at_end(e, text) else ""
            raise DataFormatError(
                src.name, lineno, f"invalid JSON ({e.msg}, column {e.colno}){hint}"
            ) from None
        except _DuplicateKey:
            raise DataFormatError(src.name, lineno, _repeated_key_message(_repeated_key_path(text))) from None
        except (RecursionError, ValueError) as e:
            raise DataFormatError(src.name, lineno, _limit_message(e)) from None
        if not isinstance(obj, dict):
            raise DataFormatError(src.name, lineno, f"expected a JSON object, got {_kind(obj)}")
        yield lineno, obj


_DIGITS = re.compile(r"value has (\d+) digits")


def _limit_message(err: Exception) -> str:
    """What a decoder failure other than a syntax error means: the stdlib decoder recurses once per
    nesting level (RecursionError) and refuses integers longer than ``sys.get_int_max_str_digits()``
    (a plain ValueError). Neither is a property of valid release data."""
    if isinstance(err, RecursionError):
        return "invalid JSON: a value is nested too deeply (hundreds of levels of arrays or objects)"
    digits = _DIGITS.search(str(err))
    if digits:
        return (
            f"invalid JSON: a number with {digits.group(1)} digits "
            f"(more than the {sys.get_int_max_str_digits()} digits an integer may have)"
        )
    return f"invalid JSON ({err})"


def _at_end(err: json.JSONDecodeError, text: str) -> bool:
    """Whether a decode error comes from input that stops early (an unterminated string or
    container): the usual signature of an interrupted download."""
    return err.msg.startswith("Unterminated string") or err.pos >= len(text.rstrip()) - 1


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


#: The largest JSON document read whole (Mintaka's and WebQSP's files are a few tens of MB).
MAX_DOCUMENT_BYTES = 1 << 30


def _read_text(stream: IO[bytes], src: Source) -> str:
    data = read_bounded(stream, MAX_DOCUMENT_BYTES)
    if data is None:
        raise DataFormatError(
            src.name,
            None,
            f"a JSON document larger than {MAX_DOCUMENT_BYTES:,} bytes (read no further; release "
            "documents are a few tens of MB: a damaged or wrong file?)",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataFormatError(src.name, line, f"invalid UTF-8 (byte 0x{data[e.start]:02x})") from None


class _Cursor:
    """Position in a JSON text with incremental line counting."""

    def __init__(self, text: str, src: Source):
        self.text, self.src = text, src
        self.pos = 0
        self._line_pos, self._line = 0, 1

    def line(self, pos: int | None = None) -> int:
        pos = self.pos if pos is None else pos
        if pos < self._line_pos:  # only moves forward in practice
            self._line_pos, self._line = 0, 1
        self._line += self.text.count("\n", self._line_pos, pos)
        self._line_pos = pos
        return self._line

    def skip_ws(self) -> str:
        self.pos = _WS.match(self.text, self.pos).end()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def fail(self, message: str) -> DataFormatError:
        return DataFormatError(self.src.name, self.line(), message)

    def value(self) -> Any:
        try:
            obj, self.pos = _DECODER.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as e:
            hint = "; the file looks truncated" if _at_end(e, self.text) else ""
            raise DataFormatError(
                self.src.name, e.lineno, f"invalid JSON ({e.msg}, column {e.colno}){hint}"
            ) from None
        except _DuplicateKey:  # the line the value starts on
            raise self.fail(_repeated_key_message(_repeated_key_path(self.text, self.pos))) from None
        except (RecursionError, ValueError) as e:  # no position is known: the line the value starts on
            raise self.fail(_limit_message(e)) from None
        return obj

    def expect(self, chars: str, what: str) -> str:
        c = self.skip_ws()
        if not c:
            raise self.fail(f"unexpected end of file, expected {what} (the file looks truncated)")
        if c not in chars:
            raise self.fail(f"expected {what}, found {c!r}")
        self.pos += 1
        return c


def _iter_array(cur: _Cursor) -> Iterator[tuple[int, Any]]:
    cur.expect("[", "'['")
    if cur.skip_ws() == "]":
        cur.pos += 1
        return
    while True:
        cur.skip_ws()
        line = cur.line()
        yield line, cur.value()
        if cur.expect(",]", "',' or ']'") == "]":
            return


def iter_json_records(stream: IO[bytes], src: Source, *, key: str | None = None) -> Iterator[tuple[int, Any]]:
    """Elements of a JSON document's record array, each with the line it starts on.

    Args:
        stream: the document (UTF-8, optional BOM).
        src: for messages.
        key: ``None`` when the document is an array of records (Mintaka), otherwise the top-level
            object's key that holds the array (WebQSP: ``"Questions"``).
    Raises:
        DataFormatError for invalid UTF-8, invalid or truncated JSON, a wrong top-level type or a
        missing ``key``.
    """
    cur = _Cursor(_read_text(stream, src), src)
    first = cur.skip_ws()
    if key is None:
        if first != "[":
            raise cur.fail(f"expected a JSON array of records at the top level, got {_first_kind(first)}")
        yield from _iter_array(cur)
    else:
        if first != "{":
            raise cur.fail(
                f"expected a JSON object with a '{key}' array at the top level, got {_first_kind(first)}"
            )
        cur.pos += 1
        found = False
        names: set[str] = set()
        if cur.skip_ws() == "}":
            cur.pos += 1
        else:
            while True:
                cur.skip_ws()
                name = cur.value()
                if name in names:
                    raise cur.fail(
                        f"top-level field '{name}' is given twice (which value is meant is ambiguous)"
                    )
                names.add(name)
                cur.expect(":", "':'")
                if name == key:
                    if cur.skip_ws() != "[":
                        raise cur.fail(f"field '{key}' must be an array of records")
                    found = True
                    yield from _iter_array(cur)
                else:
                    cur.skip_ws()
                    cur.value()
                if cur.expect(",}", "',' or '}'") == "}":
                    break
        if not found:
            raise DataFormatError(src.name, None, f"missing required top-level field '{key}'")
    if cur.skip_ws():
        raise cur.fail("unexpected content after the end of the JSON document")


def _first_kind(c: str) -> str:
    return {"{": "an object", "[": "an array", '"': "a string", "": "an empty file"}.get(c, "a scalar")


_TYPE_NAMES = {
    str: "a string",
    list: "an array",
    dict: "an object",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
}


def _wanted(types: tuple[type, ...], nullable: bool) -> str:
    return " or ".join([*(_TYPE_NAMES.get(t, t.__name__) for t in types), *(["null"] if nullable else [])])


def check_type(
    value: Any, types: type | tuple[type, ...], src: Source, line: int, path: str, *, nullable: bool = False
) -> Any:
    """``value`` (found at ``path`` inside the record) checked for its JSON type; a float must be
    finite (``NaN``, ``Infinity``, ``1e999`` are refused).

    Args:
        value: the value.
        types: accepted Python types (``bool`` is never an ``int`` here unless listed).
        src, line: where the record is, for the message.
        path: the value's place in the record, e.g. ``answer_list[0].aliases[1]``.
        nullable: whether ``null`` is accepted.
    Returns:
        ``value``.
    Raises:
        DataFormatError naming the file, the line and ``path``.
    """
    types = _as_tuple(types)
    if value is None and nullable:
        return None
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise DataFormatError(
            src.name, line, f"field '{path}' must be {_wanted(types, nullable)}, got {_kind(value)}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        # Python's decoder reads NaN, Infinity and overflowing literals such as 1e999 as floats;
        # JSON has no such numbers, and str() would turn them into the answers "nan" and "inf".
        raise DataFormatError(
            src.name, line, f"field '{path}' is {_non_finite(value)}, not a finite number (not valid JSON)"
        )
    return value


def _non_finite(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def require(
    obj: dict,
    key: str,
    types: type | tuple[type, ...],
    src: Source,
    line: int,
    *,
    nullable: bool = False,
    at: str = "",
) -> Any:
    """``obj[key]`` checked for presence and type.

    Args:
        at: path of ``obj`` inside the record (``"answer."``), prefixed to ``key`` in messages.
    Raises:
        DataFormatError naming the file, the line and the field.
    """
    if not isinstance(obj, dict):
        raise DataFormatError(src.name, line, f"expected a JSON object, got {_kind(obj)}")
    if key not in obj:
        raise DataFormatError(src.name, line, f"missing required field '{at}{key}'")
    return check_type(obj[key], types, src, line, f"{at}{key}", nullable=nullable)


def optional(
    obj: dict, key: str, types: type | tuple[type, ...], src: Source, line: int, *, at: str = ""
) -> Any:
    """``obj[key]`` when present and not null (type-checked), else None."""
    return check_type(obj.get(key), types, src, line, f"{at}{key}", nullable=True)


# Strings decoded from JSON hold a surrogate code point only when the file escapes half of a pair
# (``"\ud800"``): not valid Unicode, and unencodable when the record is written back as UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_path(value: Any, path: str = "", *, among: set[str] | None = None) -> str | None:
    """Path of the first string inside ``value`` that holds a lone surrogate (and, with ``among``,
    is one of those strings), or None."""
    stack: list[tuple[str, Any]] = [(path, value)]  # depth first, in document order
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node) and (among is None or node in among):
                return where
        elif isinstance(node, dict):
            stack.extend(reversed([(f"{where}.{k}" if where else str(k), v) for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(f"{where}[{i}]", v) for i, v in enumerate(node)]))
    return None


def has_lone_surrogate(texts: list[str]) -> bool:
    """Whether any of ``texts`` holds a lone surrogate (one regex pass over all of them)."""
    return _SURROGATE.search("\x00".join(texts)) is not None


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)
