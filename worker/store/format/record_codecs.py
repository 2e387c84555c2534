"""The per-type codecs of the log records, compiled from the field tables on first use.

A decoder takes the dict ``json.loads`` made of one line and returns the record, or
None when a value or the key order does not fit (the slow path in ``records`` then
says why); an encoder returns the dict a record's line encodes, or None. Every check
is inlined, so that ``open`` of a large log costs little more than its ``json.loads``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from worker.store.format.record_fields import (
    CHECKS,
    CRC_KEY,
    GROUP_KEYS,
    WRITTEN_ALONE,
    field_kinds,
    line_shapes,
)
from worker.store.format.record_types import RECORD_TYPES, Record

Decoder = Callable[[dict[str, object]], Record | None]
Encoder = Callable[[Record], dict[str, object] | None]
_FRAME_OK: Final = (
    'type(d["part"]) is int and type(d["parts"]) is int '
    'and 1 <= d["part"] <= d["parts"] and d["parts"] >= 2'
)
_CRC_OK: Final = 'type(d["crc"]) is str and len(d["crc"]) == 8'


def _shape(kinds: list[tuple[int, str, str]]) -> tuple[str, str, str, str]:
    """Source fragments (loads, tests, build, dict) for the fields ``(index, name, kind)``."""
    return (
        "; ".join(f"a{i} = d[{name!r}]" for i, name, _kind in kinds),
        " and ".join(CHECKS[kind][2].replace("v", f"a{i}") for i, _name, kind in kinds),
        ", ".join(f"{name}=a{i}" for i, name, _kind in kinds),
        ", ".join(f"{name!r}: a{i}" for i, name, _kind in kinds),
    )


def _compile_codecs(cls: type[Record]) -> tuple[Decoder, Encoder]:
    """Compile a decoder and an encoder for ``cls`` with every check inlined.

    Both return None when a value does not fit; the slow path then says why. Inlined
    checks make ``open`` of a large log cost little more than its ``json.loads``. The
    decoder also requires the canonical key order of one of the line's shapes (every
    field, or without its later optional blocks: ``line_shapes``), alone or followed by
    the group keys, and either followed by the checksum (tried first: what the store
    writes today).
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
        namespace[f"C{number}"] = (*keys, CRC_KEY)
        namespace[f"G{number}"] = (*keys, *group, CRC_KEY) if group else never
        decode_branches.append(f"""
    {"if" if number == 0 else "elif"} keys == C{number}:
        if not ({_CRC_OK}):
            return None{body}
    elif keys == G{number}:
        if not ({_FRAME_OK} and {_CRC_OK}):
            return None{body}
    elif keys == K{number}:{body}
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


def _compile_into_tables(cls: type[Record]) -> tuple[Decoder, Encoder]:
    """Compile ``cls``'s codecs and put them in ``DECODERS`` and ``ENCODERS`` for good."""
    decode, encode = _compile_codecs(cls)
    DECODERS[cls.TYPE] = decode
    ENCODERS[cls.TYPE] = encode
    return decode, encode


def _stand_ins(cls: type[Record]) -> tuple[Decoder, Encoder]:
    """A decoder and an encoder that compile ``cls``'s codecs on first use, then call them.

    Compiling every type at import cost more than the rest of ``import worker`` (issue
    32): an interpreter that never reads or writes a record (the CLI, a client, the
    rig's parent) never pays it, and one that does pays once per type it meets, after
    which the tables hold the compiled functions themselves. Two threads racing here
    compile the same functions twice; either pair is the codec.
    """

    def decode(d: dict[str, object]) -> Record | None:
        return _compile_into_tables(cls)[0](d)

    def encode(r: Record) -> dict[str, object] | None:
        return _compile_into_tables(cls)[1](r)

    return decode, encode


def compile_every_codec() -> None:
    """Compile the codecs of every record type now (a process about to fork workers)."""
    for cls in RECORD_TYPES:
        if DECODERS[cls.TYPE] is _STAND_INS[cls.TYPE][0]:
            _compile_into_tables(cls)


_STAND_INS: Final = {cls.TYPE: _stand_ins(cls) for cls in RECORD_TYPES}
DECODERS: Final[dict[object, Decoder]] = {name: c[0] for name, c in _STAND_INS.items()}
"""Each record type's decoder, by type name (compiled on the first line of its type)."""
ENCODERS: Final[dict[str, Encoder]] = {name: c[1] for name, c in _STAND_INS.items()}
"""Each record type's encoder, by type name (compiled on the first record of its type)."""
