"""What open's scan read of a log, kept so that the next open scans only what came after.

Open proves the newest log and scans all of its bytes (``worker.store.format.line_scan``);
for a session of 10,000 records that is most of a restart. The scan's result for a
prefix of the log (each line's record class, the ToolResults' calls, the Users' lines
and keys) is a pure function of the prefix's bytes, so it is kept in a summary (a
cache, ``worker.store.disk.scan_file``), and the next open takes it for the prefix
when the bytes it reads there are those bytes, and scans only the lines after it.

It is trusted only for the very bytes it was made of. The summary names its epoch,
its prefix's length, CRC-32 and Adler-32 (64 bits between them, each of every byte),
and the prefix's first line (the epoch's ``SessionStart``, with its time); the prefix
ends with a newline and with a whole group commit (a scan proved the whole log it was
made of). Anything else, or a summary that does not decode, is no summary: the log is
scanned whole, as without one. Every check open makes of the values the scan read
(calls, keys, structure) is still made on the prefix's values too, and the last line's
checksum is still the CRC-32 of every byte before it. docs/format.md, "The scan
summary".
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Final

from worker.store.format.dataclass_methods import MutableValue
from worker.store.format.record_types import RECORD_TYPES, Record

FORMAT: Final = 1
SUMMARY_AFTER: int = 64 << 10  # not Final: the chaos rig sets it to 0
"""An open that scanned at least this many bytes keeps a summary (about 450 lines of
the default App's; below it a scan costs well under a millisecond)."""
_CLASSES: Final[dict[str, type[Record]]] = {cls.TYPE: cls for cls in RECORD_TYPES}
_NAMES: Final = [cls.TYPE for cls in RECORD_TYPES]
_INDEX: Final[dict[type[Record], int]] = {cls: n for n, cls in enumerate(RECORD_TYPES)}
_CALL: Final = "q"  # a call number, 8 bytes
_LINE: Final = "I"  # a line number, 4 bytes (a log of 2**32 lines is not one open reads)
_MAX_LINES: Final = 1 << 32
_KEY_TYPES: Final = frozenset((str, type(None)))


@dataclass(slots=True, repr=False, eq=False)
class ScanSummary(MutableValue):
    """A scan's result for the first ``size`` bytes of epoch ``epoch``'s log.

    ``types``: each line's record class; ``calls``: the ToolResults' call numbers in
    line order; ``users``: the line numbers (from 1) of the User records, ``keys``
    their request keys (None: sent without one); ``crc`` and ``adler``: the CRC-32 and
    Adler-32 of the prefix's bytes; ``first``: its first line, newline included.
    """

    epoch: int
    size: int
    crc: int
    adler: int
    first: bytes
    types: list[type[Record]]
    calls: list[int]
    users: list[int]
    keys: list[str | None]

    def covers(self, data: bytes, epoch: int) -> bool:
        """True if this summary is of the first ``size`` bytes of ``data`` (epoch ``epoch``'s
        log): the same epoch, first line, length, CRC-32 and Adler-32, ending a line."""
        size = self.size
        if epoch != self.epoch or not 0 < size <= len(data) or data[size - 1] != 0x0A:
            return False
        if not data.startswith(self.first):
            return False
        prefix = memoryview(data)[:size]
        return zlib.crc32(prefix) == self.crc and zlib.adler32(prefix) == self.adler


def encode(summary: ScanSummary) -> bytes:
    """The summary's bytes: msgpack, then the CRC-32 of those bytes (4 bytes, big-endian)."""
    import msgpack  # noqa: PLC0415 - the worker has it already; `import worker` stays without

    body: bytes = msgpack.packb(
        [
            FORMAT,
            summary.epoch,
            summary.size,
            summary.crc,
            summary.adler,
            summary.first,
            _NAMES,
            bytes(map(_INDEX.__getitem__, summary.types)),
            array(_CALL, summary.calls).tobytes(),
            array(_LINE, summary.users).tobytes(),
            summary.keys,
        ],
        use_bin_type=True,
    )
    return body + zlib.crc32(body).to_bytes(4, "big")


def decode(blob: bytes) -> ScanSummary | None:
    """The summary in ``blob``, or None for anything that is not one this code wrote whole."""
    body, trailer = blob[:-4], blob[-4:]
    if len(blob) < 5 or zlib.crc32(body).to_bytes(4, "big") != trailer:
        return None
    import msgpack  # noqa: PLC0415 - as in encode

    try:
        fields: Any = msgpack.unpackb(body, raw=False, use_list=True)
    except Exception:  # noqa: BLE001 - a summary that does not decode is no summary
        return None
    if not isinstance(fields, list) or len(fields) != 11 or fields[0] != FORMAT:
        return None
    _format, epoch, size, crc, adler, first, names, types, calls, users, keys = fields
    if not (
        all(type(n) is int for n in (epoch, size, crc, adler))
        and all(type(b) is bytes for b in (first, types, calls, users))
        and isinstance(names, list)
        and isinstance(keys, list)
        and len(types) < _MAX_LINES
    ):
        return None
    classes = [_CLASSES.get(name) if type(name) is str else None for name in names]
    try:
        lines = list(itemgetter(*types)(classes)) if len(types) > 1 else [classes[types[0]]]
        call_numbers = _numbers(_CALL, calls)
        user_lines = _numbers(_LINE, users)
    except (IndexError, ValueError):
        return None
    if None in lines or len(user_lines) != len(keys) or not _all_keys(keys):
        return None
    return ScanSummary(epoch, size, crc, adler, first, lines, call_numbers, user_lines, keys)


def _numbers(code: str, data: bytes) -> list[int]:
    numbers = array(code)
    numbers.frombytes(data)  # ValueError when not a whole number of items
    return numbers.tolist()


def _all_keys(keys: list[object]) -> bool:
    return _KEY_TYPES.issuperset(map(type, keys))
