"""The six log records and their JSON-line encoding; no other module touches the bytes.

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
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import ClassVar, Final

from worker.errors import InvalidRecord, quote


def utc_now() -> str:
    """Return the current time as RFC 3339 UTC with microseconds, e.g. ``...T20:17:57.123456Z``."""
    # time.gmtime + an f-string is about four times cheaper than datetime.strftime, and
    # every record pays for it on the append path.
    now_ns = time.time_ns()
    seconds, nanos = divmod(now_ns, 1_000_000_000)
    t = time.gmtime(seconds)
    return (
        f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T"
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{nanos // 1000:06d}Z"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionStart:
    """First record of every epoch log: names the session, the epoch, slot and baseline hash."""

    TYPE: ClassVar[str] = "SessionStart"
    time: str = field(default_factory=utc_now)
    session: str
    epoch: int
    slot: int
    baseline: str


@dataclass(frozen=True, slots=True, kw_only=True)
class User:
    """A user's message; ``key`` is the client's request key (None when it gave none)."""

    TYPE: ClassVar[str] = "User"
    time: str = field(default_factory=utc_now)
    text: str
    untrusted: bool = False
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Assistant:
    """The assistant's reply text."""

    TYPE: ClassVar[str] = "Assistant"
    time: str = field(default_factory=utc_now)
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """The result of tool call number ``call`` (>= 1, unique across all epochs)."""

    TYPE: ClassVar[str] = "ToolResult"
    time: str = field(default_factory=utc_now)
    call: int
    tool: str
    output: str
    ok: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token accounting after a turn; ``context_tokens`` drives the automatic epoch commit."""

    TYPE: ClassVar[str] = "Usage"
    time: str = field(default_factory=utc_now)
    prompt_tokens: int
    completion_tokens: int
    context_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochEnd:
    """Last record of a closed epoch: the next epoch's number and the carried summary."""

    TYPE: ClassVar[str] = "EpochEnd"
    time: str = field(default_factory=utc_now)
    next: int
    summary: str


Record = SessionStart | User | Assistant | ToolResult | Usage | EpochEnd
RECORD_TYPES: Final[tuple[type[Record], ...]] = (
    SessionStart,
    User,
    Assistant,
    ToolResult,
    Usage,
    EpochEnd,
)

_Check = Callable[[object], bool]


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_opt_str(value: object) -> bool:
    return value is None or type(value) is str


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _is_count(value: object) -> bool:
    # type() rather than isinstance(): True is an int to isinstance, never a count here.
    return type(value) is int and value >= 0


def _is_call(value: object) -> bool:
    return type(value) is int and value >= 1


# Each check with its description and the same test as a Python expression of ``v``,
# from which the fast per-type codecs below are compiled.
_CHECKS: Final[dict[str, tuple[_Check, str, str]]] = {
    "str": (_is_str, "a string", "type(v) is str"),
    "str | None": (_is_opt_str, "a string or null", "(v is None or type(v) is str)"),
    "bool": (_is_bool, "a boolean", "type(v) is bool"),
    "int": (_is_count, "an integer >= 0", "(type(v) is int and v >= 0)"),
    "call": (_is_call, "an integer >= 1", "(type(v) is int and v >= 1)"),
}


def _kinds(cls: type[Record]) -> tuple[tuple[str, str], ...]:
    """Return (field name, check kind) for each field of ``cls``, in order."""
    return tuple(
        (f.name, "call" if (cls is ToolResult and f.name == "call") else str(f.type))
        for f in fields(cls)
    )


_FIELD_KINDS: Final = {cls.TYPE: (cls, _kinds(cls)) for cls in RECORD_TYPES}
GROUP_KEYS: Final = ("part", "parts")
"""The keys that frame a line of a group commit: its place (from 1) and the group's size."""

Part = tuple[int, int]
"""A framed line's ``(part, parts)``; None stands for a line written alone."""

_Decoder = Callable[[dict[str, object]], Record | None]
_Encoder = Callable[[Record], dict[str, object] | None]


def _compile_codecs(cls: type[Record]) -> tuple[_Decoder, _Encoder]:
    """Compile a decoder and an encoder for ``cls`` with every check inlined.

    Both return None when a value does not fit; the slow path then says why. Inlined
    checks make ``open`` of a large log cost little more than its ``json.loads``. The
    decoder also requires the canonical key order, alone or followed by the group keys.
    """
    kinds = _kinds(cls)
    names = [name for name, _kind in kinds]
    tests = " and ".join(
        _CHECKS[kind][2].replace("v", f"a{i}") for i, (_name, kind) in enumerate(kinds)
    )
    loads = "; ".join(f"a{i} = d[{name!r}]" for i, name in enumerate(names))
    gets = "; ".join(f"a{i} = r.{name}" for i, name in enumerate(names))
    build = ", ".join(f"{name}=a{i}" for i, name in enumerate(names))
    as_dict = ", ".join(f"{name!r}: a{i}" for i, name in enumerate(names))
    source = f"""
def decode(d):
    keys = tuple(d)
    if keys != KEYS:
        if keys != FRAMED:
            return None
        p = d["part"]
        n = d["parts"]
        if not (type(p) is int and type(n) is int and 1 <= p <= n and n >= 2):
            return None
    {loads}
    if not ({tests}):
        return None
    return cls({build})

def encode(r):
    {gets}
    if not ({tests}):
        return None
    return {{"type": {cls.TYPE!r}, {as_dict}}}
"""
    keys = ("type", *names)
    namespace: dict[str, object] = {"cls": cls, "KEYS": keys, "FRAMED": keys + GROUP_KEYS}
    exec(compile(source, f"<codec {cls.TYPE}>", "exec"), namespace)  # noqa: S102 - built above from field names only
    decode, encode = namespace["decode"], namespace["encode"]
    return decode, encode  # type: ignore[return-value]


_CODECS: Final = {cls.TYPE: _compile_codecs(cls) for cls in RECORD_TYPES}
_DECODERS: Final[dict[object, _Decoder]] = {name: c[0] for name, c in _CODECS.items()}
_LINE_PREFIX: Final = b'{"type":"'
_JOINED_PREFIX: Final = b',\n{"type":"'
_JSON_LINE: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _why_fields_wrong(type_name: str, values: dict[str, object]) -> str:
    """Return why ``values`` (without "type") do not fit the record type ``type_name``."""
    _cls, kinds = _FIELD_KINDS[type_name]
    names = [name for name, _kind in kinds]
    framed = [*names, *GROUP_KEYS]
    keys = list(values)
    if set(keys) not in ({*names}, {*framed}):
        missing = sorted({*names} - values.keys())
        extra = sorted(values.keys() - {*framed})
        if not extra and not missing:
            return f"{type_name}: 'part' and 'parts' come together or not at all"
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("unknown " + ", ".join(quote(name, 40) for name in extra[:5]))
        return f"{type_name}: " + "; ".join(parts)
    if keys not in (names, framed):
        return f"{type_name}: fields are not in the writer's order ({', '.join(names)})"
    for name, kind in kinds:
        check, what, _expression = _CHECKS[kind]
        if not check(values[name]):
            return f"{type_name}.{name} must be {what}, got {quote(values[name])}"
    if keys == framed:
        place, size = values["part"], values["parts"]
        if not (type(place) is int and type(size) is int and 1 <= place <= size and size >= 2):
            return (
                f"{type_name}: part must be an integer from 1 to parts, and parts >= 2; "
                f"got part {quote(place, 40)} of {quote(size, 40)}"
            )
    return f"{type_name}: does not fit its fields"


def _document(record: Record) -> dict[str, object]:
    """Return the record as the dict its line encodes; InvalidRecord if a field is wrong."""
    document = _CODECS[record.TYPE][1](record)
    if document is None:
        values = {name: getattr(record, name) for name, _kind in _FIELD_KINDS[record.TYPE][1]}
        raise InvalidRecord(record.TYPE, _why_fields_wrong(record.TYPE, values))
    return document


def _line(type_name: str, document: dict[str, object]) -> bytes:
    try:
        return (_JSON_LINE.encode(document) + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate has no UTF-8 form; writing it escaped would not round-trip.
        raise InvalidRecord(type_name, f"text is not valid Unicode: {exc.reason}") from exc


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
        raise ValueError(_why_fields_wrong(str(type_name), rest))
    return record


def decode_lines_fast(lines: list[bytes]) -> tuple[list[Record], list[tuple[int, int, int]]] | None:
    """Decode many lines with one ``json.loads``; None when the caller must go line by line.

    Returns the records and, for each framed line, ``(index, part, parts)``.

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
    records = []
    framed: list[tuple[int, int, int]] = []
    decoders = _DECODERS
    for index, value in enumerate(values):
        if type(value) is not dict:
            return None
        decoder = decoders.get(value.get("type", ""))
        record = decoder(value) if decoder is not None else None
        if record is None:
            return None
        if "part" in value:
            framed.append((index, value["part"], value["parts"]))
        records.append(record)
    try:
        canonical = _JSON_LINE.encode(values).encode("utf-8")
    except UnicodeEncodeError:
        return None
    if canonical != b"[" + b",".join(lines) + b"]":
        return None
    return records, framed
