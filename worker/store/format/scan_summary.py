"""What open's scan read of a log, kept so that the next open scans only what came after.

Open proves the newest log and scans all of its bytes (``worker.store.format.line_scan``);
for a session of 10,000 records that is most of a restart. The scan's result for a
prefix of the log (each line's record class, the ToolResults' calls, the Users' keys)
is a pure function of the prefix's bytes, so it is kept in a summary (a cache,
``worker.store.disk.scan_file``), and the next open takes it for the prefix when the
bytes it reads there are those bytes, and scans only the lines after it.

It is taken only for the very bytes it was made of: the same epoch, the log at least as
long, a newline at the prefix's end, the same first line (the epoch's ``SessionStart``,
with its time), the same CRC-32 and Adler-32 of the prefix, as many lines. Its lists
are built only then, each bounded by the prefix it stands for, and must agree with one
another (a class per line, the first a SessionStart, a call per ToolResult, a key per
User). Anything else, or a summary that does not decode, is no summary: the log is
scanned whole, as without one. Every check open makes of the values the scan read
(calls, keys, structure, fence) is still made on the prefix's values too, and the last
line's checksum is still the CRC-32 of every byte before it. docs/format.md, "The scan
summary", says what a summary is trusted for.
"""

from __future__ import annotations

import functools
import json
import re
import struct
import zlib
from array import array
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import is_, itemgetter
from typing import Final

from worker.store.format.dataclass_methods import MutableValue
from worker.store.format.record_types import RECORD_TYPES, Record, SessionStart, ToolResult, User

FORMAT: Final = 2
"""Bumped whenever what open accepts changes: a summary of another format is no summary."""
SUMMARY_AFTER: int = 64 << 10  # not Final: the chaos rig sets it to 0
"""An open that scanned at least this many bytes keeps a summary (about 450 lines of
the default App's; below it a scan costs well under a millisecond)."""
_CLASSES: Final[dict[str, type[Record]]] = {cls.TYPE: cls for cls in RECORD_TYPES}
_NAMES: Final = [cls.TYPE for cls in RECORD_TYPES]
_INDEX: Final[dict[type[Record], int]] = {cls: n for n, cls in enumerate(RECORD_TYPES)}
_CALL: Final = "q"  # a call number, 8 bytes
_CALL_SIZE: Final = array(_CALL).itemsize
_KEY_TYPES: Final = frozenset((str, type(None)))


@dataclass(slots=True, repr=False, eq=False)
class Summarized(MutableValue):
    """What a summary says of the lines it covers (``LineScan``'s lists for them)."""

    types: list[type[Record]]
    calls: list[int]
    users: list[int]
    keys: list[str | None]


@dataclass(slots=True, repr=False, eq=False)
class ScanSummary(MutableValue):
    """A scan's result for the first ``size`` bytes (``lines`` lines) of epoch ``epoch``'s log.

    ``crc`` and ``adler``: the CRC-32 and Adler-32 of those bytes; ``first``: their first
    line, newline included; ``types``: a byte a line, the index of its record class in
    ``names``; ``calls``: the ToolResults' call numbers in line order (8 bytes each);
    ``keys``: the Users' request keys in line order, a JSON array (null: sent without one).
    """

    epoch: int
    size: int
    crc: int
    adler: int
    first: bytes
    lines: int
    names: list[str]
    types: bytes
    calls: bytes
    keys: bytes

    @classmethod
    def of(
        cls, epoch: int, data: bytes, crc: int, adler: int, summarized: Summarized
    ) -> ScanSummary | None:
        """The summary of a scan of ``data`` (a whole log); None if it cannot say it."""
        try:
            calls = array(_CALL, summarized.calls).tobytes()
        except OverflowError:
            return None  # a call number past 8 bytes: scanned whole each time, as before
        return cls(
            epoch, len(data), crc, adler, data[: data.find(b"\n") + 1], len(summarized.types),
            _NAMES, bytes(map(_INDEX.__getitem__, summarized.types)), calls,
            json.dumps(summarized.keys).encode(),  # ASCII: a lone surrogate is escaped
        )  # fmt: skip

    def followed_by(
        self, tail: bytes, types: list[type[Record]], calls: list[int], keys: list[str | None]
    ) -> ScanSummary | None:
        """The summary of this one's bytes and then ``tail`` (whole lines a writer appended
        after them, whose scan read ``types``, ``calls`` and ``keys``): its parts joined, no
        list of the bytes before rebuilt; None if it cannot say it (another class table,
        a call number past 8 bytes)."""
        if self.names != _NAMES:
            return None  # made by other code: the next open scans and makes a new one
        try:
            more_calls = array(_CALL, calls).tobytes()
        except OverflowError:
            return None
        keys_json = self.keys
        if keys:
            more = json.dumps(keys).encode()  # ASCII, as ``of`` writes them
            keys_json = more if keys_json == b"[]" else keys_json[:-1] + b"," + more[1:]
        return ScanSummary(
            self.epoch, self.size + len(tail), zlib.crc32(tail, self.crc),
            zlib.adler32(tail, self.adler), self.first, self.lines + len(types), _NAMES,
            self.types + bytes(map(_INDEX.__getitem__, types)), self.calls + more_calls,
            keys_json,
        )  # fmt: skip

    @property
    def weight(self) -> int:
        """About how many bytes this summary takes (its parts)."""
        return len(self.first) + len(self.types) + len(self.calls) + len(self.keys)

    def covers(self, data: bytes, epoch: int) -> bool:
        """True if this summary is of the first ``size`` bytes of ``data`` (epoch ``epoch``'s
        log): the same epoch, first line, length, CRC-32, Adler-32 and number of lines,
        ending a line that ends a group commit; its parts bounded by those bytes."""
        size, lines = self.size, self.lines
        if epoch != self.epoch or not 0 < size <= len(data) or data[size - 1] != 0x0A:
            return False
        # Each key's JSON here is at most 3 times its bytes in the log (a 4-byte character
        # is 12 bytes escaped), and a call number 8 bytes where the log spells it in more.
        if len(self.types) != lines or len(self.keys) > 3 * size or len(self.calls) > size:
            return False
        if not data.startswith(self.first):
            return False
        last = data.rfind(b"\n", 0, size - 1) + 1
        if not _ends_group(data[last:size]):
            return False
        prefix = memoryview(data)[:size]
        if zlib.crc32(prefix) != self.crc or zlib.adler32(prefix) != self.adler:
            return False
        return data.count(b"\n", 0, size) == lines

    def read(self) -> Summarized | None:
        """The lists this summary holds, or None if they do not agree with one another
        (ask only once it ``covers`` the log: they are bounded by its bytes then)."""
        classes = [_CLASSES.get(name) if type(name) is str else None for name in self.names]
        codes = self.types
        try:
            types = list(itemgetter(*codes)(classes)) if len(codes) > 1 else [classes[codes[0]]]
            numbers = array(_CALL)
            numbers.frombytes(self.calls)  # ValueError when not a whole number of items
            keys = json.loads(self.keys)
        except (IndexError, ValueError, RecursionError):  # RecursionError: nested arrays
            return None
        if None in types or types[0] is not SessionStart or types.count(SessionStart) != 1:
            return None
        if not isinstance(keys, list) or not _KEY_TYPES.issuperset(map(type, keys)):
            return None
        calls = numbers.tolist()
        if len(calls) != types.count(ToolResult) or len(keys) != types.count(User):
            return None
        users = list(compress(count(1), map(is_, types, repeat(User))))
        return Summarized(types, calls, users, keys)  # type: ignore[arg-type]  # None refused


def _ends_group(line: bytes) -> bool:
    """True if ``line`` (with its newline) is written alone or is the last of its group."""
    framed, alone = _end_patterns()
    found = framed.search(line)
    if found is not None:
        return found[1] == found[2]
    return alone.search(line) is not None


@functools.cache
def _end_patterns() -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """A framed line's end (its part, its group's size) and any line's end; compiled on
    first use, not at import (issue 32)."""
    crc = rb',"crc":"[0-9a-f]{8}"\}\n\Z'
    return re.compile(rb',"part":(\d+),"parts":(\d+)' + crc), re.compile(crc)


_MAGIC: Final = b"loopdscan\n"
_HEAD: Final = struct.Struct("<QQIIQIIIII")  # epoch size crc adler lines, then 5 lengths
_MAX_NAMES: Final = 4096


def encode(summary: ScanSummary) -> bytes:
    """The summary's bytes: a magic and format number, a fixed header (its numbers and the
    length of each part), its parts (the first line, the class names, the classes, the
    calls, the keys), then the CRC-32 of all that (4 bytes, big-endian). No container to
    unpack: reading one costs its length, whatever it holds."""
    names = ",".join(summary.names).encode("ascii")
    parts = (summary.first, names, summary.types, summary.calls, summary.keys)
    head = _HEAD.pack(
        summary.epoch, summary.size, summary.crc, summary.adler, summary.lines,
        *map(len, parts),
    )  # fmt: skip
    body = b"".join((_MAGIC, FORMAT.to_bytes(2, "big"), head, *parts))
    return body + zlib.crc32(body).to_bytes(4, "big")


def decode(blob: bytes) -> ScanSummary | None:
    """The summary in ``blob``, or None for anything that is not one this code wrote whole.

    Cheap whatever ``blob`` holds: its lists stay bytes until ``ScanSummary.read``."""
    start = len(_MAGIC) + 2
    body, trailer = blob[:-4], blob[-4:]
    if len(blob) < start + _HEAD.size + 4 or not blob.startswith(_MAGIC):
        return None
    if int.from_bytes(blob[len(_MAGIC) : start], "big") != FORMAT:
        return None
    if zlib.crc32(body).to_bytes(4, "big") != trailer:
        return None
    epoch, size, crc, adler, lines, *lengths = _HEAD.unpack_from(blob, start)
    at = start + _HEAD.size
    if at + sum(lengths) != len(body) or lengths[1] > _MAX_NAMES:
        return None
    parts = []
    for length in lengths:
        parts.append(blob[at : at + length])
        at += length
    first, names, types, calls, keys = parts
    if len(calls) % _CALL_SIZE or not names.isascii():
        return None
    return ScanSummary(
        epoch, size, crc, adler, first, lines, names.decode("ascii").split(","), types, calls, keys
    )
