"""The log records and their JSON-line encoding; no other module touches the bytes.

A line is one JSON object, ``"type"`` first, no spaces, UTF-8, ending in ``\\n``.
The records of one group commit (``append_many`` of n > 1) are framed: each of their
lines ends with ``"part":i,"parts":n``, so a reader can tell a whole group from a cut
one. Decoding is strict and canonical: a line is accepted only if it is exactly the
bytes the writer would write for the record it decodes to, so unknown types, missing
or extra fields, ill-typed values, duplicate keys, spaces and other spellings are all
refused with a reason, so that ``open`` can report ``path:line: why``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Final

from worker.store.errors import InvalidRecord, quote
from worker.store.record_fields import (
    CHECKS,
    FIELD_KINDS,
    GROUP_KEYS,
    WRITTEN_ALONE,
    Part,
    field_kinds,
    line_shapes,
    why_fields_wrong,
)
from worker.store.record_types import (
    RECORD_TYPES,
    Assistant,
    EpochEnd,
    Handoff,
    Owner,
    Record,
    SessionStart,
    ToolResult,
    Usage,
    User,
    utc_now,
)

__all__ = [
    "RECORD_TYPES",
    "Assistant",
    "EpochEnd",
    "Handoff",
    "Owner",
    "Record",
    "SessionStart",
    "ToolResult",
    "Usage",
    "User",
    "decode_line",
    "decode_lines_fast",
    "decode_record",
    "encode_record",
    "encode_records",
    "record_document",
    "utc_now",
]


_Decoder = Callable[[dict[str, object]], Record | None]
_Encoder = Callable[[Record], dict[str, object] | None]
_FRAME_OK: Final = (
    'type(d["part"]) is int and type(d["parts"]) is int '
    'and 1 <= d["part"] <= d["parts"] and d["parts"] >= 2'
)


def _shape(kinds: list[tuple[int, str, str]]) -> tuple[str, str, str, str]:
    """Source fragments (loads, tests, build, dict) for the fields ``(index, name, kind)``."""
    return (
        "; ".join(f"a{i} = d[{name!r}]" for i, name, _kind in kinds),
        " and ".join(CHECKS[kind][2].replace("v", f"a{i}") for i, _name, kind in kinds),
        ", ".join(f"{name}=a{i}" for i, name, _kind in kinds),
        ", ".join(f"{name!r}: a{i}" for i, name, _kind in kinds),
    )


def _compile_codecs(cls: type[Record]) -> tuple[_Decoder, _Encoder]:
    """Compile a decoder and an encoder for ``cls`` with every check inlined.

    Both return None when a value does not fit; the slow path then says why. Inlined
    checks make ``open`` of a large log cost little more than its ``json.loads``. The
    decoder also requires the canonical key order of one of the line's shapes (every
    field, or without its later optional blocks: ``line_shapes``), alone or followed by
    the group keys.
    """
    every = [(i, name, kind) for i, (name, kind) in enumerate(field_kinds(cls))]
    shapes = [[f for f in every if f[1] in shape] for shape in line_shapes(cls)]
    # SessionStart, EpochEnd, Owner and Handoff are written alone: no framed shape.
    group = () if cls in WRITTEN_ALONE else GROUP_KEYS
    never = ("",)  # matches no line's keys
    namespace: dict[str, object] = {
        "cls": cls,
        "new": object.__new__,
        **{f"s{i}": getattr(cls, name).__set__ for i, name, _kind in every},
    }
    decode_branches: list[str] = []
    encode_branches: list[str] = []
    for number, shape in enumerate(shapes):
        loads, tests, _build, as_dict = _shape(shape)
        present = {name for _i, name, _kind in shape}
        # Built without calling the dataclass's __init__: its frozen-field setattrs cost
        # more than the rest of decoding a line. The slots' own descriptors set each
        # field (what __init__ ends up doing), every value already checked above.
        sets = "; ".join(
            f"s{i}(r, a{i})" if name in present else f"s{i}(r, None)" for i, name, _kind in every
        )
        body = f"""
        {loads}
        if not ({tests}):
            return None
        r = new(cls); {sets}
        return r"""
        keys = ("type", *(name for _i, name, _kind in shape))
        namespace[f"K{number}"] = keys
        namespace[f"F{number}"] = keys + group if group else never
        decode_branches.append(f"""
    {"if" if number == 0 else "elif"} keys == K{number}:{body}
    elif keys == F{number}:
        if not ({_FRAME_OK}):
            return None{body}""")
        absent = [f"a{i} is None" for i, name, _kind in every if name not in present]
        encode_branches.insert(
            0,
            f"""
    {f"if {' and '.join(absent)}:" if absent else "if True:"}
        if not ({tests}):
            return None
        return {{"type": {cls.TYPE!r}, {as_dict}}}""",
        )
    gets = "; ".join(f"a{i} = r.{name}" for i, name, _kind in every)
    source = f"""
def decode(d):
    keys = tuple(d){"".join(decode_branches)}
    return None

def encode(r):
    {gets}{"".join(encode_branches)}
"""
    exec(compile(source, f"<codec {cls.TYPE}>", "exec"), namespace)  # noqa: S102 - built above from field names only
    decode, encode = namespace["decode"], namespace["encode"]
    return decode, encode  # type: ignore[return-value]


_CODECS: Final = {cls.TYPE: _compile_codecs(cls) for cls in RECORD_TYPES}
_DECODERS: Final[dict[object, _Decoder]] = {name: c[0] for name, c in _CODECS.items()}
_LINE_PREFIX: Final = b'{"type":"'
_JOINED_PREFIX: Final = b',\n{"type":"'
_JSON_LINE: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _document(record: Record) -> dict[str, object]:
    """Return the record as the dict its line encodes; InvalidRecord if a field is wrong."""
    document = _CODECS[record.TYPE][1](record)
    if document is None:
        values = {name: getattr(record, name) for name, _kind in FIELD_KINDS[record.TYPE][1]}
        raise InvalidRecord(record.TYPE, why_fields_wrong(record.TYPE, values))
    return document


def _line(type_name: str, document: dict[str, object]) -> bytes:
    try:
        return (_JSON_LINE.encode(document) + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate has no UTF-8 form; writing it escaped would not round-trip.
        raise InvalidRecord(type_name, f"text is not valid Unicode: {exc.reason}") from exc


def record_document(record: Record) -> dict[str, object]:
    """The record as the JSON object its line holds (``"type"`` first), for readers."""
    return dict(_document(record))


def encode_record(record: Record) -> bytes:
    """Return the record's log line (``"type"`` first, compact, UTF-8, ending in ``\\n``)."""
    return _line(record.TYPE, _document(record))


def encode_records(records: Iterable[Record]) -> bytes:
    """Return the log lines of ``records`` joined, for one write (group commit).

    A group of more than one record is framed: line i of n ends with
    ``"part":i,"parts":n``, so that a reader knows whether the whole group reached
    the disk. A single record is written alone, unframed.
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


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {quote(key, 40)} in one object")
            seen.add(key)
    return document


def decode_line(line: bytes) -> tuple[Record, Part | None]:
    """Decode one log line (without its newline) into its record and its group part.

    Raises ValueError naming what is wrong; a line is accepted only if it is exactly
    the canonical encoding of the record it holds (the writer's own bytes).
    """
    if not line.startswith(_LINE_PREFIX):
        raise ValueError('line does not start with {"type":"')
    try:
        values = json.loads(line, object_pairs_hook=_refuse_duplicate_keys)
    except RecursionError as exc:
        raise ValueError("not valid JSON: values nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueError
        raise ValueError(f"not valid JSON: {exc}") from exc
    record = _record_from(values)
    try:
        canonical = _JSON_LINE.encode(values).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode: {exc.reason}") from exc
    if canonical != line:
        raise ValueError(
            "not the canonical encoding of its record (spacing, escapes or number "
            "format differ from what the writer writes, or two values share a line)"
        )
    if "part" in values:
        return record, (values["part"], values["parts"])
    return record, None


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


def decode_lines_fast(lines: list[bytes]) -> list[Record] | None:
    """Decode many lines with one ``json.loads``; None when the caller must go line by line.

    Returns the records only when every line is canonical and every group commit in
    the lines is whole (parts 1..n on consecutive lines); otherwise the line-by-line
    path finds and names the first problem.

    Joining with ``,\\n`` keeps each line's attribution sound: JSON strings cannot hold a
    raw newline, so every join point is a comma between tokens, and a line starting with
    ``{"type":"`` can only follow a comma inside an array. Records hold no arrays, so if
    the count matches and every element decodes as a record, element i is line i. Then
    one encode of all elements must give back exactly the lines joined by ``,``: the
    proof that every line, alone, is the canonical encoding of its record.
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
    # Every element is an object: each starts a line, and every line starts with "{".
    for value in values:
        decoder = decoders.get(value["type"])
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
    try:
        canonical = _JSON_LINE.encode(values).encode("utf-8")
    except UnicodeEncodeError:
        return None
    if canonical != b"[" + b",".join(lines) + b"]":
        return None
    return records
