"""The fields each record type has, how each is checked, and why a line's fields fail.

The per-type codecs in ``records`` are compiled from these tables; when a fast codec
refuses a line, ``why_fields_wrong`` names the first rule it breaks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import fields
from typing import Final

from worker.store.errors import quote
from worker.store.format.record_types import (
    RECORD_TYPES,
    AppChanged,
    EpochEnd,
    Handoff,
    Owner,
    Record,
    SessionStart,
    ToolResult,
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
CHECKS: Final[dict[str, tuple[_Check, str, str]]] = {
    "str": (_is_str, "a string", "type(v) is str"),
    "str | None": (_is_opt_str, "a string or null", "(v is None or type(v) is str)"),
    "bool": (_is_bool, "a boolean", "type(v) is bool"),
    "int": (_is_count, "an integer >= 0", "(type(v) is int and v >= 0)"),
    "call": (_is_call, "an integer >= 1", "(type(v) is int and v >= 1)"),
}


def optional_blocks(cls: type[Record]) -> tuple[tuple[str, ...], ...]:
    """The blocks of optional fields of ``cls``, each in a line whole or not at all.

    A line holds the first k blocks for some k (none, the first, the first two, ...):
    a block added later is absent from every line written before it existed.
    """
    blocks: tuple[tuple[str, ...], ...] = getattr(cls, "OPTIONAL", ())
    return blocks


def free_blocks(cls: type[Record]) -> tuple[tuple[str, ...], ...]:
    """The blocks of ``cls`` that may join any of its shapes, each whole or not at all
    (SessionStart's App: written in every epoch's, epoch 0's included)."""
    blocks: tuple[tuple[str, ...], ...] = getattr(cls, "FREE", ())
    return blocks


def carried_fields(cls: type[Record]) -> tuple[str, ...]:
    """Every optional field of ``cls`` (SessionStart's carried state and App, EpochEnd's digest)."""
    return tuple(name for block in optional_blocks(cls) + free_blocks(cls) for name in block)


def line_shapes(cls: type[Record]) -> list[list[str]]:
    """The field names a line of ``cls`` may hold, in order: every field first, the base last.

    Each shape of the optional blocks comes with every choice of the free blocks, the
    one with all of them first.
    """
    names = [f.name for f in fields(cls)]
    blocks = optional_blocks(cls)
    free = free_blocks(cls)
    choices = [
        {name for block in left_out for name in block}
        for size in range(len(free) + 1)
        for left_out in itertools.combinations(free, size)
    ]
    shapes = []
    for kept in range(len(blocks), -1, -1):
        absent = {name for block in blocks[kept:] for name in block}
        for without in choices:
            shapes.append([name for name in names if name not in absent | without])
    return shapes


def field_kinds(cls: type[Record]) -> tuple[tuple[str, str], ...]:
    """Return (field name, check kind) for each field of ``cls``, in order.

    An optional field's kind is that of its value when present (``int | None`` ->
    ``int``): absent, its whole block is left out of the line.
    """
    carried = carried_fields(cls)
    kinds = []
    for f in fields(cls):
        kind = str(f.type)
        if cls is ToolResult and f.name == "call":
            kind = "call"
        elif f.name in carried:
            kind = kind.removesuffix(" | None")
        kinds.append((f.name, kind))
    return tuple(kinds)


FIELD_KINDS: Final = {cls.TYPE: (cls, field_kinds(cls)) for cls in RECORD_TYPES}
GROUP_KEYS: Final = ("part", "parts")
"""The keys that frame a line of a group commit: its place (from 1) and the group's size."""
CRC_KEY: Final = "crc"
"""The last key of every line the store writes: the CRC-32 of the log before its value."""
WRITTEN_ALONE: Final = (SessionStart, EpochEnd, Owner, Handoff, AppChanged)
"""Records that are always written alone, never in a group commit."""

Part = tuple[int, int]
"""A framed line's ``(part, parts)``; None stands for a line written alone."""


def why_fields_wrong(type_name: str, values: dict[str, object]) -> str:
    """Return why ``values`` (without "type") do not fit the record type ``type_name``."""
    cls, kinds = FIELD_KINDS[type_name]
    if cls in WRITTEN_ALONE and "part" in values:
        return f"{type_name} is written alone, never in a group"
    names = [name for name, _kind in kinds]
    shapes = line_shapes(cls)
    accepted = [
        shape + extra + crc
        for shape in shapes
        for extra in ([], [*GROUP_KEYS])
        for crc in ([], [CRC_KEY])
    ]
    keys = list(values)
    if {*keys} not in [{*shape} for shape in accepted]:
        missing = sorted({*shapes[-1]} - values.keys())
        extra = sorted(values.keys() - {*names, *GROUP_KEYS, CRC_KEY})
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("unknown " + ", ".join(quote(name, 40) for name in extra[:5]))
        if not parts:
            blocks = [", ".join(block) for block in optional_blocks(cls)]
            free = [", ".join(block) for block in free_blocks(cls)]
            parts.append(
                "'part' and 'parts' come together or not at all"
                + (f", and so do {'; and '.join(blocks + free)}" if blocks else "")
                + (" (each after the one before)" if len(blocks) > 1 else "")
                + (f" ({'; '.join(free)} with any of them)" if free else "")
            )
        return f"{type_name}: " + "; ".join(parts)
    if keys not in accepted:
        return (
            f"{type_name}: fields are not in the writer's order ({', '.join(names)}, "
            "then part and parts, then crc)"
        )
    for name, kind in kinds:
        check, what, _expression = CHECKS[kind]
        if name in values and not check(values[name]):
            return f"{type_name}.{name} must be {what}, got {quote(values[name])}"
    if keys[-1] == CRC_KEY:
        crc = values[CRC_KEY]
        if not (type(crc) is str and len(crc) == 8):
            return f"{type_name}: crc must be 8 hexadecimal digits, got {quote(crc, 40)}"
    if "parts" in keys:
        place, size = values["part"], values["parts"]
        if not (type(place) is int and type(size) is int and 1 <= place <= size and size >= 2):
            return (
                f"{type_name}: part must be an integer from 1 to parts, and parts >= 2; "
                f"got part {quote(place, 40)} of {quote(size, 40)}"
            )
    return f"{type_name}: does not fit its fields"
