"""The log records and their JSON-line encoding; no other module touches the bytes.

A line is one JSON object, ``"type"`` first, no spaces, UTF-8, ending in ``\\n``.
The records of one group commit (``append_many`` of n > 1) are framed: each of their
lines ends with ``"part":i,"parts":n``, so a reader can tell a whole group from a cut
one. Every line the store writes ends with ``"crc":N``, the CRC-32 of every byte of
the log before N (``worker.store.format.line_checksums`` checks the chain). Decoding is strict
and canonical: a line is accepted only if it is exactly the bytes the writer would
write for the record it decodes to, so unknown types, missing or extra fields,
ill-typed values, duplicate keys, spaces and other spellings are all refused with a
reason, so that ``open`` can report ``path:line: why``. One exception, for open's
speed: ``decode_lines_fast`` lets a matching checksum stand for a line's spelling
unless asked for ``canonical`` (``loopd verify``; docs/format.md, "What each reader
checks").
"""

from __future__ import annotations

import json
import operator
import re
import zlib
from _json import make_encoder
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring
from typing import Final

from worker.store.errors import InvalidRecord, quote
from worker.store.format.record_codecs import DECODERS as _DECODERS
from worker.store.format.record_codecs import ENCODERS as _ENCODERS
from worker.store.format.record_fields import FIELD_KINDS, Part, why_fields_wrong
from worker.store.format.record_types import (
    RECORD_TYPES,
    AppChanged,
    Assistant,
    EpochEnd,
    Handoff,
    Owner,
    Record,
    Schedule,
    SessionStart,
    ToolResult,
    Unschedule,
    Usage,
    User,
    utc_now,
)

__all__ = [
    "RECORD_TYPES",
    "AppChanged",
    "Assistant",
    "EpochEnd",
    "Handoff",
    "Owner",
    "Record",
    "Schedule",
    "SessionStart",
    "ToolResult",
    "Unschedule",
    "Usage",
    "User",
    "decode_line",
    "decode_line_checksum",
    "decode_lines_fast",
    "decode_record",
    "encode_appended",
    "encode_lines",
    "encode_record",
    "encode_records",
    "record_document",
    "utc_now",
    "without_checksums",
]


_LINE_PREFIX: Final = b'{"type":"'
_JOINED_PREFIX: Final = b',\n{"type":"'
_JSON_LINE: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_CRC_FIELD: Final = b',"crc":"'
_CRC_FIELD_TEXT: Final = ',"crc":"'
_CRC_SUFFIX: Final = re.compile(rb',"crc":"[0-9a-f]{8}"}$', re.MULTILINE)
_HAS_CRC: Final = operator.methodcaller("__contains__", "crc")


def _compact_encoder() -> Callable[[object], str]:
    """``_JSON_LINE.encode`` without rebuilding its C encoder on every call.

    ``JSONEncoder.encode`` makes a new C encoder per call (``_json.make_encoder``),
    which costs about as much as encoding a record; this one is made once, with the
    same arguments ``_JSON_LINE`` would pass. Records hold no containers, so no cycle
    check (``markers``) is needed.
    """
    chunks = make_encoder(
        None, _JSON_LINE.default, encode_basestring, None, ":", ",", False, False, True
    )

    def encode(value: object) -> str:
        return "".join(chunks(value, 0))

    return encode


_encode: Final = _compact_encoder()


def _document(record: Record) -> dict[str, object]:
    """Return the record as the dict its line encodes; InvalidRecord if a field is wrong."""
    document = _ENCODERS[record.TYPE](record)
    if document is None:
        values = {name: getattr(record, name) for name, _kind in FIELD_KINDS[record.TYPE][1]}
        raise InvalidRecord(record.TYPE, why_fields_wrong(record.TYPE, values))
    return document


def _line(type_name: str, document: dict[str, object]) -> bytes:
    try:
        return (_encode(document) + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate has no UTF-8 form; writing it escaped would not round-trip.
        raise InvalidRecord(type_name, f"text is not valid Unicode: {exc.reason}") from exc


def _checksummed(type_name: str, document: dict[str, object], crc: int) -> tuple[bytes, int]:
    """The line of ``document`` ending in ``"crc":"N"`` after a log whose CRC-32 is ``crc``.

    N (8 lowercase hex digits) is the CRC-32 of every byte of the log before N: the
    earlier lines whole, and this line up to ``"crc":"``. Returns the line and the
    log's CRC-32 after it.
    """
    try:
        head = (_encode(document)[:-1] + _CRC_FIELD_TEXT).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRecord(type_name, f"text is not valid Unicode: {exc.reason}") from exc
    value = zlib.crc32(head, crc)
    tail = b'%08x"}\n' % value
    return head + tail, zlib.crc32(tail, value)


def encode_lines(records: Iterable[Record], crc: int) -> tuple[bytes, int]:
    """The lines the store appends for ``records`` after a log whose CRC-32 is ``crc``.

    One record is written alone; more are one group commit, framed (line i of n ends
    with ``"part":i,"parts":n``). Every line ends with its checksum. Returns the bytes
    and the CRC-32 of the log once they follow it.
    """
    batch = list(records)
    if len(batch) == 1:
        record = batch[0]
        return _checksummed(record.TYPE, _document(record), crc)
    lines = []
    for part, record in enumerate(batch, start=1):
        document = _document(record)
        document["part"] = part
        document["parts"] = len(batch)
        line, crc = _checksummed(record.TYPE, document, crc)
        lines.append(line)
    return b"".join(lines), crc


def encode_appended(log: bytes, record: Record) -> bytes:
    """The line a writer appends for ``record`` after the log bytes ``log`` (checksummed)."""
    return encode_lines((record,), zlib.crc32(log))[0]


def without_checksums(data: bytes) -> bytes:
    """``data``'s lines as a loopd from before checksums wrote them (for old-format homes)."""
    return _CRC_SUFFIX.sub(b"}", data)


def record_document(record: Record) -> dict[str, object]:
    """The record as the JSON object its line holds (``"type"`` first), for readers."""
    return dict(_document(record))


def encode_record(record: Record) -> bytes:
    """Return the record's line without a checksum, as a loopd before checksums wrote it.

    ``"type"`` first, compact, UTF-8, ending in ``\\n``. The store writes with
    ``encode_lines``; this is the line's form for readers and for old-format logs.
    """
    return _line(record.TYPE, _document(record))


def encode_records(records: Iterable[Record]) -> bytes:
    """Return the log lines of ``records`` joined, for one write (group commit).

    A group of more than one record is framed: line i of n ends with
    ``"part":i,"parts":n``, so that a reader knows whether the whole group reached
    the disk. A single record is written alone, unframed. No checksums (the old form;
    the store writes ``encode_lines``).
    """
    batch = list(records)
    if len(batch) == 1:
        return encode_record(batch[0])
    lines = []
    for part, record in enumerate(batch, start=1):
        document = _document(record)
        document["part"] = part
        document["parts"] = len(batch)
        lines.append(_line(record.TYPE, document))
    return b"".join(lines)


class _DuplicateKey(ValueError):
    """Valid JSON, but not a line the writer writes: told as such, not as invalid JSON."""


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(f"duplicate key {quote(key, 40)} in one object")
            seen.add(key)
    return document


def decode_line(line: bytes) -> tuple[Record, Part | None]:
    """Decode one log line (without its newline) into its record and its group part.

    Raises ValueError naming what is wrong; a line is accepted only if it is exactly
    the canonical encoding of the record it holds (the writer's own bytes). Its
    checksum, if it has one, is not checked here (it depends on the lines before it:
    ``decode_line_checksum`` gives it).
    """
    record, part, _crc = decode_line_checksum(line)
    return record, part


def decode_line_checksum(line: bytes) -> tuple[Record, Part | None, str | None]:
    """``decode_line``, and the line's checksum (None for a line written without one)."""
    if not line.startswith(_LINE_PREFIX):
        raise ValueError('line does not start with {"type":"')
    try:
        values = json.loads(line, object_pairs_hook=_refuse_duplicate_keys)
    except RecursionError as exc:
        raise ValueError("not valid JSON: values nested too deeply") from exc
    except _DuplicateKey:
        raise
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueError
        raise ValueError(f"not valid JSON: {exc}") from exc
    record = _record_from(values)
    try:
        canonical = _encode(values).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode: {exc.reason}") from exc
    if canonical != line:
        raise ValueError(
            "not the canonical encoding of its record (spacing, escapes or number "
            "format differ from what the writer writes, or two values share a line)"
        )
    crc = values.get("crc")
    if "part" in values:
        return record, (values["part"], values["parts"]), crc
    return record, None, crc


def decode_record(line: bytes) -> Record:
    """Decode one log line (without its newline); raise ValueError naming what is wrong."""
    return decode_line(line)[0]


def _record_from(values: object) -> Record:
    if type(values) is not dict:
        raise ValueError("not a JSON object")
    type_name = values.get("type")
    decoder = _DECODERS.get(type_name) if type(type_name) is str else None
    if decoder is None:
        raise ValueError(f"unknown record type {quote(type_name, 40)}")
    record = decoder(values)
    if record is None:
        rest = dict(values)
        del rest["type"]
        raise ValueError(why_fields_wrong(str(type_name), rest))
    return record


def decode_lines_fast(
    data: bytes, lines: list[bytes], *, canonical: bool = False
) -> tuple[list[Record], int] | None:
    """Decode a log's lines with one ``json.loads``; None when the caller must go line by line.

    ``lines`` are ``data`` split at its newlines (``data`` ends with one). Returns the
    records and the CRC-32 of ``data`` only when every line is the writer's and every
    group commit in the lines is whole (parts 1..n on consecutive lines); otherwise the
    line-by-line path finds and names the first problem.

    Joining with ``,\\n`` keeps each line's attribution sound: JSON strings cannot hold a
    raw newline, so every join point is a comma between tokens, and a line starting with
    ``{"type":"`` can only follow a comma inside an array. Records hold no arrays, so if
    the count matches and every element decodes as a record, element i is line i.

    That every line is the writer's own bytes is proven two ways. Lines with a checksum
    (the store's lines end with ``"crc":"N"``, and once one has it every later line
    has): the last line's N must be the CRC-32 of all of ``data`` before N, and the
    bytes after it exactly N, ``"}`` and the newline; every earlier line's bytes are
    inside that CRC. Lines without one (written before checksums): one encode of their elements
    must give back exactly those lines joined by ``,``, the proof that each, alone, is
    the canonical encoding of its record.

    A checksum proves only that a line is the one written, not that the writer wrote
    it: with ``canonical`` (``loopd verify``) the lines with one are proven the same
    way, by one encode, so that a forged line whose checksum was made to match but
    whose bytes are not the writer's (a duplicate key, a space, an escape) goes to the
    line-by-line path, which names it.
    """
    joined = b",\n".join(lines)
    # Lines hold no newline (they were split on it), so ",\n" occurs only where they
    # were joined: counting it before the prefix checks every line's start in C.
    if not joined.startswith(_LINE_PREFIX) or joined.count(_JOINED_PREFIX) != len(lines) - 1:
        return None
    try:
        values = json.loads(b"[" + joined + b"]")
    except (ValueError, RecursionError):
        return None
    if len(values) != len(lines):
        return None
    records: list[Record] = []
    append = records.append
    decoders = _DECODERS
    expect = size = 0  # the next part of the open group, and its size (0: none open)
    for value in values:
        # A forged line's element may be no object, or its "type" no string: the
        # line-by-line path then names it (never a KeyError out of open).
        name = value.get("type") if type(value) is dict else None
        decoder = decoders.get(name) if type(name) is str else None
        record = decoder(value) if decoder is not None else None
        if record is None:
            return None
        append(record)
        part = value.get("part")
        if part is None:
            if expect:
                return None
        elif part == 1 and not expect:
            size, expect = value["parts"], 2
        elif part == expect and value["parts"] == size:
            expect = 0 if part == size else part + 1
        else:
            return None
    if expect:
        return None
    # ',"crc":"' can only be a key: a quote inside a string is always escaped.
    first = joined.find(_CRC_FIELD)
    unsummed = len(lines) if first < 0 else joined.count(b"\n", 0, first)
    proven = len(lines) if canonical else unsummed  # the lines proven by encoding them
    if proven:
        try:
            encoded = _encode(values[:proven]).encode("utf-8")
        except UnicodeEncodeError:
            return None
        if encoded != b"[" + b",".join(lines[:proven]) + b"]":
            return None
    if first < 0:
        return records, zlib.crc32(data)
    summed = len(lines) - unsummed
    if joined.count(_CRC_FIELD, first) != summed or sum(map(_HAS_CRC, values[unsummed:])) != summed:
        return None  # a line without one after a line with one, or one with two
    at = data.rfind(_CRC_FIELD) + len(_CRC_FIELD)
    view = memoryview(data)
    before = zlib.crc32(view[:at])
    if data[at:] != b'%08x"}\n' % before:
        return None
    return records, zlib.crc32(view[at:], before)
