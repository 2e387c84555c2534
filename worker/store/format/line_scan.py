"""What open needs of a log's lines, read from their bytes without decoding a record.

``scan_lines`` proves a log the way ``decode_lines_fast`` does (every line the store's,
ending in its checksum, the last checksum the CRC-32 of every byte before it, every
group commit whole) and reads, in a few C-speed passes of ``re`` and ``bytes`` over the
whole log, what open checks and keeps: each line's record type, the call number of
each ``ToolResult``, the key of each ``User``. The records themselves are decoded when
something asks for them (``worker.store.format.epoch_records``).

It never names a problem: on anything it does not recognise (a line without a
checksum, an unknown type, a field out of the writer's order, a group cut short) it
returns None, and the caller decodes the log line by line, which names the first bad
line exactly as before. docs/format.md, "What each reader checks".

Why the patterns are sound on the store's lines: a line is one JSON object of strings,
numbers, booleans and nulls, written compactly with ``"type"`` first; a ``"`` inside a
string is always escaped, so ``,"key":"`` or ``{"type":"`` can only be a key's start,
and a raw newline only ends a line.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from dataclasses import dataclass
from itertools import compress, count
from operator import is_
from typing import Final

from worker.store.format.dataclass_methods import MutableValue
from worker.store.format.record_fields import WRITTEN_ALONE
from worker.store.format.record_types import (
    RECORD_TYPES,
    Record,
    SessionStart,
    ToolResult,
    User,
)
from worker.store.format.scan_summary import ScanSummary, Summarized

_START: Final = b'{"type":"'
_CRC_FIELD: Final = b',"crc":"'
_PARTS: Final = b',"parts":'


@functools.cache
def _patterns() -> tuple[re.Pattern[bytes], ...]:
    """The scan's patterns, compiled on the first scan rather than at import (issue 32).

    Each is anchored at a line's start (the newline before it: the scan reads
    ``b"\\n" + data``), so a match belongs to the line it starts, and one that a line
    does not give makes the count differ (the scan declines). In order: each line's
    type, or b"" for a line that does not start with one (a match at every line's
    start: their count is the lines', with no pass of its own to count them); each
    line's end, its checksum after its place in a group commit when it has
    one (one group, ``b'2,"parts":4'``, or b"" alone); whole groups of 2 to 9 lines,
    each line's place as the end reads it and ";" (";" alone); a ToolResult's call (its
    fields in the writer's order are type, time, call); a User's key (a string or
    null), its last field but the group's and the checksum: a User spelled otherwise
    does not match.
    """
    groups = b"|".join(
        b"".join(b"%d%s%d;" % (i, _PARTS, n) for i in range(1, n + 1)) for n in range(2, 10)
    )
    place = rb'(?=,"part":\d+,"parts":\d+,"crc":"|,"crc":")'
    return (
        re.compile(rb'\n\{"type":"(\w+)"|\n'),
        re.compile(rb',"part":(\d+,"parts":\d+),"crc":"[0-9a-f]{8}"\}\n|,"crc":"[0-9a-f]{8}"\}\n'),
        re.compile(rb"(?:;|" + groups + rb")*"),
        re.compile(rb'\n\{"type":"ToolResult","time":"[^"\\\n]*","call":(\d+)[,}]'),
        re.compile(rb'\n\{"type":"User",[^\n]*,"key":("(?:[^"\\\n]|\\.)*"|null)' + place),
    )


_ALONE_LATER: Final = tuple(cls for cls in WRITTEN_ALONE if cls is not SessionStart)
_KEY_TYPES: Final = frozenset((str, type(None)))
_CLASSES: Final[dict[bytes, type[Record]]] = {cls.TYPE.encode(): cls for cls in RECORD_TYPES}


@dataclass(slots=True, repr=False, eq=False)
class LineScan(MutableValue):
    """One log's lines as open needs them, none decoded.

    ``types`` holds each line's record class; ``calls`` the ToolResults' call numbers
    in line order; ``users`` the line numbers (from 1) of the User records and
    ``keys`` their request keys (None: sent without one); ``crc`` the CRC-32 of all
    the log's bytes, ``adler`` their Adler-32; ``scanned`` how many of its bytes were
    scanned (the rest was taken from a summary of the scan of them).
    """

    types: list[type[Record]]
    calls: list[int]
    users: list[int]
    keys: list[str | None]
    crc: int
    adler: int
    scanned: int

    def summary(self, epoch: int, data: bytes) -> ScanSummary | None:
        """This scan as a summary of ``data`` (the log it read), for the next open; None
        if a summary cannot say it (a call number past 8 bytes)."""
        said = Summarized(self.types, self.calls, self.users, self.keys)
        return ScanSummary.of(epoch, data, self.crc, self.adler, said)


def scan_lines(data: bytes, known: ScanSummary | None = None, epoch: int = 0) -> LineScan | None:
    """Read ``data`` (a whole log, ending in a newline) as open needs it; None to decode it.

    None unless every line is one the store wrote with its checksum, the last line's
    checksum is the CRC-32 of the bytes before it, and every group commit is whole.
    With ``known``, a summary of a scan of the first bytes of epoch ``epoch``'s log,
    those bytes are not scanned again when they are the very bytes it was made of
    (``ScanSummary.covers``): only the lines after them are.
    """
    if not data.endswith(b"\n") or not data.startswith(_START):
        return None
    taken = known.read() if known is not None and known.covers(data, epoch) else None
    if taken is None:
        known = None
    start = 0 if known is None else known.size
    at = data.rfind(_CRC_FIELD) + len(_CRC_FIELD)
    view = memoryview(data)
    if known is not None and at > start:  # the prefix's CRC-32 is known: go on from it
        before = zlib.crc32(view[start:at], known.crc)
    else:
        before = zlib.crc32(view[:at])
    if data[at:] != b'%08x"}\n' % before:
        return None
    crc = zlib.crc32(view[at:], before)
    adler = zlib.adler32(view[start:], 1 if known is None else known.adler)
    if known is None or taken is None:
        part = _scan_part(data, first=True)
        if part is None:
            return None
        types, calls, keys = part
        users = _users(types, 1)
        return LineScan(types, calls, users, keys, crc, adler, len(data))
    if start == len(data):
        return LineScan(taken.types, taken.calls, taken.users, taken.keys, crc, adler, 0)
    part = _scan_part(data[start:], first=False)
    if part is None:
        return None
    types, calls, keys = part
    users = _users(types, len(taken.types) + 1)
    return LineScan(
        taken.types + types, taken.calls + calls, taken.users + users, taken.keys + keys,
        crc, adler, len(data) - start,
    )  # fmt: skip


def summary_after(known: ScanSummary | None, tail: bytes, epoch: int) -> ScanSummary | None:
    """The summary of epoch ``epoch``'s log whose first bytes ``known`` is of (None: none,
    ``tail`` is the whole log) and whose other bytes are ``tail``, scanning ``tail`` alone.

    For a writer that keeps the summary as its log grows (``store.format.kept_scan``):
    ``known`` was made or taken by it for those very bytes, and it appended ``tail`` itself,
    so the prefix is not read again. The next open still takes the summary only for
    the bytes it reads (``ScanSummary.covers``). None if the lines are not all the
    writer's (the next open then scans them, and says what is wrong).
    """
    if known is None:
        scan = scan_lines(tail)
        return None if scan is None else scan.summary(epoch, tail)
    if not tail.endswith(b"\n"):
        return None
    part = _scan_part(tail, first=False)
    if part is None:
        return None
    return known.followed_by(tail, *part)


def _scan_part(
    data: bytes, *, first: bool
) -> tuple[list[type[Record]], list[int], list[str | None]] | None:
    """Each line's class, the ToolResults' calls and the Users' keys of ``data`` (whole
    lines of a log, the first of them its first line when ``first``); None to decode."""
    type_of, end_of, _groups, call_of, key_of = _patterns()
    lined = b"\n" + data  # every line, the first too, after a newline
    # One type a line (each newline but the last starts one): b"", and so None, for a
    # line that does not start with ``{"type":"<word>"``.
    types = list(map(_CLASSES.get, type_of.findall(lined, 0, len(lined) - 1)))
    lines = len(types)
    kinds = set(types)  # asked about below in one hash each, not one pass of the list each
    if None in kinds:
        return None
    ends = end_of.findall(data)
    if len(ends) != lines or not _whole_groups(ends):
        return None
    if any(ends[i] for i in _written_alone(types, kinds, first=first)):  # type: ignore[arg-type]
        return None
    calls = call_of.findall(lined)
    if len(calls) != types.count(ToolResult):
        return None
    keys = key_of.findall(lined)
    if len(keys) != types.count(User):
        return None
    try:
        decoded: list[str | None] = json.loads(b"[" + b",".join(keys) + b"]")
    except ValueError:
        return None
    if not _KEY_TYPES.issuperset(map(type, decoded)):  # each a string or null
        return None
    return types, list(map(int, calls)), decoded  # type: ignore[return-value]  # None refused above


def _users(types: list[type[Record]], first: int) -> list[int]:
    """The line numbers of the User records among ``types``, the first line numbered ``first``."""
    return list(compress(count(first), map(is_, types, [User] * len(types))))


def _whole_groups(ends: list[bytes]) -> bool:
    """True if the lines' group places (b"" when a line is alone) make only whole groups."""
    if _patterns()[2].fullmatch(b";".join(ends) + b";"):
        return True  # in C: groups of up to 9 lines, the common case
    expect = 0  # the next part of the open group (0: none open)
    size = b""
    for end in ends:
        part, _, parts = end.partition(_PARTS)
        if not part:
            if expect:
                return False
        elif not expect:
            if part != b"1" or parts == b"1":
                return False
            size, expect = parts, 2
        elif part != b"%d" % expect or parts != size:
            return False
        else:
            expect = 0 if part == parts else expect + 1
    return not expect


def _written_alone(
    types: list[type[Record]], kinds: set[type[Record]], *, first: bool
) -> list[int]:
    """The indexes of the lines whose records are written alone, never in a group
    (``kinds``: the classes among ``types``; ``first``: the lines start the log)."""
    if first:
        alone_later = not kinds.isdisjoint(_ALONE_LATER)
        if types[0] is SessionStart and not alone_later and types.count(SessionStart) == 1:
            return [0]  # the common case, in C: only the first line's SessionStart
    elif kinds.isdisjoint(WRITTEN_ALONE):
        return []  # lines after a summary's: none of them, in C
    return [i for i, cls in enumerate(types) if cls in WRITTEN_ALONE]
