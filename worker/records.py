"""The six log records and their JSON-line encoding; no other module touches the bytes.

A line is one JSON object, ``"type"`` first, no spaces, UTF-8, ending in ``\\n``.
Decoding is strict: unknown types, missing or extra fields and ill-typed values are
refused with a reason, so that ``open`` can report ``path:line: why``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import ClassVar, Final

from worker.errors import InvalidRecord


def utc_now() -> str:
    """Return the current time as RFC 3339 UTC with microseconds, e.g. ``...T20:17:57.123456Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


_CHECK_BY_ANNOTATION: Final[dict[str, _Check]] = {
    "str": _is_str,
    "str | None": _is_opt_str,
    "bool": _is_bool,
    "int": _is_count,
}
_WHAT: Final[dict[_Check, str]] = {
    _is_str: "a string",
    _is_opt_str: "a string or null",
    _is_bool: "a boolean",
    _is_count: "an integer >= 0",
    _is_call: "an integer >= 1",
}


def _schema(cls: type[Record]) -> tuple[tuple[str, _Check], ...]:
    checks = []
    for f in fields(cls):
        check = _is_call if (cls is ToolResult and f.name == "call") else None
        checks.append((f.name, check or _CHECK_BY_ANNOTATION[str(f.type)]))
    return tuple(checks)


_SCHEMAS: Final[dict[str, tuple[type[Record], tuple[tuple[str, _Check], ...], frozenset[str]]]] = {
    cls.TYPE: (cls, _schema(cls), frozenset(f.name for f in fields(cls))) for cls in RECORD_TYPES
}
_LINE_PREFIX: Final = b'{"type":"'


def _why_fields_wrong(type_name: str, values: dict[str, object]) -> str | None:
    """Return why ``values`` do not fit the record type ``type_name``, or None if they do."""
    _cls, checks, names = _SCHEMAS[type_name]
    if values.keys() != names:
        missing = sorted(names - values.keys())
        extra = sorted(values.keys() - names)
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("unknown " + ", ".join(extra))
        return f"{type_name}: " + "; ".join(parts)
    for name, check in checks:
        if not check(values[name]):
            return f"{type_name}.{name} must be {_WHAT[check]}, got {values[name]!r}"
    return None


def encode_record(record: Record) -> bytes:
    """Return the record's log line (``"type"`` first, compact, UTF-8, ending in ``\\n``)."""
    type_name = record.TYPE
    values = {f.name: getattr(record, f.name) for f in fields(record)}
    why = _why_fields_wrong(type_name, values)
    if why is not None:
        raise InvalidRecord(type_name, why)
    text = json.dumps({"type": type_name, **values}, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError as exc:
        # A lone surrogate has no UTF-8 form; writing it escaped would not round-trip.
        raise InvalidRecord(type_name, f"text is not valid Unicode: {exc.reason}") from exc


def encode_records(records: Iterable[Record]) -> bytes:
    """Return the log lines of ``records`` joined, for one write (group commit)."""
    return b"".join(encode_record(r) for r in records)


def decode_record(line: bytes) -> Record:
    """Decode one log line (without its newline); raise ValueError naming what is wrong."""
    if not line.startswith(_LINE_PREFIX):
        raise ValueError('line does not start with {"type":"')
    try:
        values = json.loads(line)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueError
        raise ValueError(f"not valid JSON: {exc}") from exc
    return _record_from(values)


def _record_from(values: object) -> Record:
    if type(values) is not dict:
        raise ValueError("not a JSON object")
    type_name = values.pop("type", None)
    schema = _SCHEMAS.get(type_name) if type(type_name) is str else None
    if schema is None:
        raise ValueError(f"unknown record type {type_name!r}")
    cls, checks, names = schema
    if values.keys() != names:
        raise ValueError(_why_fields_wrong(type_name, values))
    for name, check in checks:
        if not check(values[name]):
            raise ValueError(_why_fields_wrong(type_name, values))
    return cls(**values)


def decode_lines_fast(lines: list[bytes]) -> list[Record] | None:
    """Decode many lines with one ``json.loads``; None when the caller must go line by line.

    Joining with ``,\\n`` keeps each line's attribution sound: JSON strings cannot hold a
    raw newline, so every join point is a comma between tokens, and a line starting with
    ``{"type":"`` can only follow a comma inside an array. Records hold no arrays, so if
    the count matches and every element decodes as a record, element i is line i.
    """
    if not all(line.startswith(_LINE_PREFIX) for line in lines):
        return None
    try:
        values = json.loads(b"[" + b",\n".join(lines) + b"]")
    except ValueError:
        return None
    if len(values) != len(lines):
        return None
    try:
        return [_record_from(v) for v in values]
    except ValueError:
        return None
